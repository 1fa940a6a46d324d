"""Plots of an hgbench result directory (called by scripts/plot)."""
import json
import math
import os
import sys
from collections import OrderedDict, defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402  (python3-yaml, a dependency of matplotlib's Debian package set)


def median(v):
    v = sorted(v)
    n = len(v)
    return float("nan") if n == 0 else v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def plot_accuracy(d, cfg, rows, labels, points, varying):
    """Accuracy runs: acc per point (task) and strategy with its standard error, mean last."""
    cell = {}
    for r in rows:
        if r.get("status") == "ok" and "accuracy" in r:
            cell.setdefault((r["point_index"], r["label"]), r["accuracy"])
    names = []
    for pi, p in points.items():
        parts = [str(p[k]).replace("synthetic:", "").split("?")[0].split("/")[-1] for k in varying if k != "strategy_params"]
        names.append("/".join(parts) or p.get("task", "point"))
    groups = names + ["mean"]
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(16, max(6, 0.15 * len(groups) * len(labels) + 2)), 4.5))
    for j, l in enumerate(labels):
        vals = [cell.get((pi, l), {}).get("acc", float("nan")) for pi in points]
        errs = [cell.get((pi, l), {}).get("acc_stderr", 0.0) for pi in points]
        finite = [v for v in vals if v == v]
        mean = sum(finite) / len(finite) if finite else float("nan")
        xs = [i + j * width for i in range(len(groups))]
        ax.bar(xs, vals + [mean], width, yerr=errs + [0.0], capsize=1.5, label=l)
    ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right")
    ax.set_ylabel("accuracy (acc, ± standard error)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{cfg['name']}: accuracy — measured", fontsize=9, pad=28)
    ax.legend(fontsize=7, ncol=min(8, len(labels)), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(d, f"accuracy.{ext}"))
    plt.close(fig)
    print(f"wrote accuracy.png/svg in {d}")


def main(d):
    rows = [json.loads(l) for l in open(os.path.join(d, "rows.jsonl")) if l.strip()]
    with open(os.path.join(d, "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    labels = [s if isinstance(s, str) else s.get("label", s["name"]) for s in cfg["strategies"]]
    baseline = cfg.get("baseline", labels[0])
    points = OrderedDict()
    times = defaultdict(list)
    acc = defaultdict(list)
    modeled = dry = e2e = False
    for r in rows:
        points.setdefault(r["point_index"], r["point"])
        if r.get("status") != "ok":
            continue
        times[(r["point_index"], r["label"])].append(r["figures"]["time_s"])
        e2e |= r["figures"].get("time_metric") == "end_to_end"
        if "accuracy" in r:
            acc[(r["point_index"], r["label"])].append(r["accuracy"].get("acc", float("nan")))
        modeled |= r.get("time_basis", "").startswith("modeled")
        dry |= r.get("time_basis", "") == "modeled (dry)"
    keys = list(next(iter(points.values())).keys()) if points else []
    varying = [k for k in keys if len({json.dumps(p.get(k)) for p in points.values()}) > 1]
    if acc:
        plot_accuracy(d, cfg, rows, labels, points, varying)
        return

    def name(p):
        parts = []
        for k in varying:
            v = p[k]
            if k == "model" and str(v).startswith("synthetic:"):
                v = v[len("synthetic:"):].split("?")[0]
            parts.append(str(v))
        return "/".join(parts) or "point"

    basis = "MODELED (dry execution)" if dry else "MODELED" if modeled else "measured"
    metric = "end-to-end latency" if e2e else "decode time"
    title = f"{cfg['name']}: {metric} normalised to {baseline} (lower is better) — {basis}"
    norm = {}
    for pi in points:
        b = median(times[(pi, baseline)])
        for l in labels:
            t = median(times[(pi, l)])
            norm[(pi, l)] = t / b if b == b and t == t and b > 0 else float("nan")
    groups = [name(points[pi]) for pi in points] + ["Geo."]
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(16, max(6, 0.12 * len(groups) * len(labels) + 2)), 4.5))
    for j, l in enumerate(labels):
        vals = [norm[(pi, l)] for pi in points]
        finite = [v for v in vals if v == v and v > 0]
        geo = math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else float("nan")
        xs = [i + j * width for i in range(len(groups))]
        ax.bar(xs, vals + [geo], width, label=l)
    ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right")
    ax.set_ylabel(f"{metric} / {baseline} (ratio)")
    ax.set_title(title, fontsize=9, pad=28)
    ax.legend(fontsize=7, ncol=min(8, len(labels)), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(d, f"normalized.{ext}"))
    written = ["normalized.png/svg"]
    plt.close(fig)

    if "prompt_tokens" in varying:
        fig, ax = plt.subplots(figsize=(6, 4))
        others = [k for k in varying if k != "prompt_tokens"]
        series = defaultdict(list)
        for pi, p in points.items():
            key = "/".join(str(p[k]).replace("synthetic:", "").split("?")[0] for k in others)
            for l in labels:
                if l == baseline:
                    continue
                n = norm[(pi, l)]
                series[(key, l)].append((p["prompt_tokens"], 1 / n if n == n and n > 0 else float("nan")))
        # Colour by strategy, line style by the other axes (the model).
        colours = {l: f"C{i % 10}" for i, l in enumerate(labels)}
        keys = sorted({key for key, _ in series})
        styles = {k: ["-", "--", ":", "-."][i % 4] for i, k in enumerate(keys)}
        for (key, l), pts in series.items():
            pts.sort()
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=colours[l], linestyle=styles[key],
                    label=f"{l} {key}".strip())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (prompt tokens)")
        ax.set_ylabel(f"speedup over {baseline} (×)")
        ax.set_title(f"{cfg['name']}: speedup against sequence length — {basis}", fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        for ext in ("png", "svg"):
            fig.savefig(os.path.join(d, f"speedup_seqlen.{ext}"))
        written.append("speedup_seqlen.png/svg")
        plt.close(fig)

    print(f"wrote {', '.join(written)} in {d}")


if __name__ == "__main__":
    main(sys.argv[1])
