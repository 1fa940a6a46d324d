"""Plots of an hgbench result directory (called by scripts/plot).

Every figure names the experiment, the platform and whether its times are measured or MODELED,
says which direction is better, uses the strategies' display names and is saved with its legend
inside the written image (bbox_inches="tight"). figures(d) returns the figures without writing
them (tests inspect their legends)."""
import json
import math
import os
import sys
from collections import OrderedDict, defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402  (python3-yaml, a dependency of matplotlib's Debian package set)

DISPLAY = {
    "full": "Full KV (oracle)",
    "flexgen": "FlexGen",
    "moe_lightning": "MoE-Lightning",
    "h2o": "H2O",
    "keyformer": "Keyformer",
    "streamingllm": "StreamingLLM",
    "infinigen": "InfiniGen",
    "hybridgen": "HybridGen",
    "null": "null (harness overhead)",
}
# Axis names as the figures print them.
AXES = {"prompt_tokens": "prompt tokens", "decode_tokens": "decode tokens", "batch": "batch size",
        "gpu_kv_bytes": "GPU KV bytes", "gpu_memory_bytes": "GPU memory bytes", "placement": "placement",
        "platform": "platform", "model": "model"}


class NoRows(Exception):
    pass


def display(label, strategy=None):
    """A label as the paper names its method: the strategy's display name, with the label when it differs."""
    s = strategy or label
    base = DISPLAY.get(s)
    if base is None:
        return label
    if label == s:
        return base
    if label.startswith(s):  # "keyformer@0.2" → "Keyformer @0.2"
        return f"{base} {label[len(s):].lstrip('-_ ')}"
    return f"{base} ({label})"


def median(v):
    v = sorted(v)
    n = len(v)
    return float("nan") if n == 0 else v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def model_name(v):
    v = str(v)
    if v.startswith("synthetic:"):
        return v[len("synthetic:"):].split("?")[0]
    return os.path.basename(v)


def value_text(k, v):
    if k == "model":
        return model_name(v)
    if k == "strategy_params":  # {"hybridgen": {"kv_ratio": "0.1"}, ...}: the swept values
        vals = sorted({f"{kk}={vv}" for p in (v or {}).values() for kk, vv in p.items()})
        return ", ".join(vals)
    return str(v)


def axis_label(k, points):
    """An axis as the figure names it; a swept strategy parameter by its own name (kv_ratio)."""
    if k == "strategy_params":
        return ", ".join(sorted({kk for p in points.values() for s in (p.get(k) or {}).values() for kk in s})) or k
    return AXES.get(k, k)


def load(d):
    path = os.path.join(d, "rows.jsonl")
    rows = [json.loads(l) for l in open(path) if l.strip()]
    with open(os.path.join(d, "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    if not any(r.get("status") == "ok" for r in rows):
        raise NoRows(f"{path}: no successful rows ({len(rows)} failed): nothing to plot")
    labels = [s if isinstance(s, str) else s.get("label", s["name"]) for s in cfg["strategies"]]
    strategy_of = {}
    for r in rows:
        strategy_of.setdefault(r["label"], r.get("strategy"))
    return rows, cfg, labels, strategy_of


def basis_of(rows):
    tb = {r.get("time_basis", "") for r in rows if r.get("status") == "ok"}
    if "modeled (dry)" in tb:
        return "MODELED (dry execution)"
    return "MODELED" if any(t.startswith("modeled") for t in tb) else "measured"


def platforms_of(rows):
    """Where the times come from: the platform profile, else the device the run measured."""
    def one(p):
        if p.get("platform"):
            return str(p["platform"])
        dev = p.get("device") or ""
        return "emulated accelerator, this machine" if dev == "emulated" else dev or "this machine"
    return ", ".join(sorted({one(r["point"]) for r in rows if r.get("status") == "ok"}))


def legend_right(ax, n):
    """The legend outside the axes on the right; saved whole with bbox_inches="tight"."""
    return ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, ncol=1 if n <= 14 else 2)


def accuracy_caption(rows):
    """The settings every accuracy row shares: model, context mode, shots, items per point."""
    acc = [r["accuracy"] for r in rows if r.get("status") == "ok" and "accuracy" in r]
    def one(key, fmt):
        vals = sorted({str(a[key]) for a in acc if key in a})
        return fmt.format(", ".join(vals)) if vals else None
    models = sorted({model_name(r["point"].get("model", "")) for r in rows})
    parts = [", ".join(models), one("context", "{} context"), one("shots", "{}-shot"), one("n", "n = {}")]
    return "; ".join(p for p in parts if p)


def accuracy_figure(cfg, rows, labels, strategy_of, points, varying):
    """Accuracy runs: acc per point (task) and strategy with its standard error, mean last."""
    cell = {}
    for r in rows:
        if r.get("status") == "ok" and "accuracy" in r:
            cell.setdefault((r["point_index"], r["label"]), r["accuracy"])
    names = ["/".join(value_text(k, p[k]) for k in varying) or p.get("task", "") for p in points.values()]
    groups = names + (["mean"] if len(names) > 1 else [])
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(16, max(6, 0.15 * len(groups) * len(labels) + 2)), 4.5))
    for j, l in enumerate(labels):
        vals = [cell.get((pi, l), {}).get("acc", float("nan")) for pi in points]
        errs = [cell.get((pi, l), {}).get("acc_stderr", 0.0) for pi in points]
        finite = [v for v in vals if v == v]
        extra = [sum(finite) / len(finite) if finite else float("nan")] if len(names) > 1 else []
        xs = [i + j * width for i in range(len(groups))]
        ax.bar(xs, vals + extra, width, yerr=errs + [0.0] * len(extra), capsize=1.5, label=display(l, strategy_of.get(l)))
    ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right")
    ax.set_xlabel(" / ".join(axis_label(k, points) for k in varying) or "task")
    ax.set_ylabel("accuracy (acc ± standard error), higher is better")
    ax.set_ylim(0, 1)
    ax.set_title(f"{cfg['name']}: accuracy — {accuracy_caption(rows)} — measured, {platforms_of(rows)}", fontsize=9)
    legend_right(ax, len(labels))
    return {"accuracy": fig}


NEEDLE_TASKS = ("passkey", "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")


def needle_figures(cfg, rows, labels, strategy_of):
    """Retrieval runs: per task, one heatmap per strategy of the match rate over prompt length
    (rows) and needle depth (columns); the agreement with the reference in each cell's text."""
    out = {}
    tasks = [t for t in NEEDLE_TASKS if any(r["point"].get("task") == t for r in rows)]
    for t in tasks:
        rs = [r for r in rows if r["point"].get("task") == t]
        lengths = sorted({r["point"]["needle_tokens"] for r in rs})
        depths = sorted({r["point"].get("depth", -1) for r in rs})  # -1: a task without a needle
        ncol = min(4, len(labels))
        nrow = (len(labels) + ncol - 1) // ncol
        fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol + 1.2, 2.6 * nrow + 0.8), squeeze=False)
        im = None
        for j, l in enumerate(labels):
            ax = axes[j // ncol][j % ncol]
            grid = [[float("nan")] * len(depths) for _ in lengths]
            agree = [[None] * len(depths) for _ in lengths]
            for r in rs:
                if r["label"] != l or r.get("status") != "ok":
                    continue
                i, k = lengths.index(r["point"]["needle_tokens"]), depths.index(r["point"].get("depth", -1))
                grid[i][k] = r["accuracy"]["acc"]
                f = r.get("fidelity")
                agree[i][k] = f.get("agreement") if isinstance(f, dict) else None
            im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
            for i in range(len(lengths)):
                for k in range(len(depths)):
                    v = grid[i][k]
                    txt = "failed" if v != v else f"{v:.2f}"
                    if agree[i][k] is not None:
                        txt += f"\nagr {agree[i][k]:.2f}"
                    ax.text(k, i, txt, ha="center", va="center", fontsize=6,
                            color="white" if v != v or v < 0.5 else "black")
            ax.set_xticks(range(len(depths)))
            ax.set_xticklabels([f"{d}%" if d >= 0 else "no needle" for d in depths], fontsize=7)
            ax.set_yticks(range(len(lengths)))
            ax.set_yticklabels([f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths], fontsize=7)
            ax.set_title(display(l, strategy_of.get(l)), fontsize=8)
            if j % ncol == 0:
                ax.set_ylabel("prompt length, tokens", fontsize=7)
            if j // ncol == nrow - 1:
                ax.set_xlabel("needle depth", fontsize=7)
        for j in range(len(labels), nrow * ncol):
            axes[j // ncol][j % ncol].axis("off")
        fig.suptitle(f"{cfg['name']}: {t}, match rate (higher is better; second line, agr: agreement with the "
                     f"reference's output) — measured, {platforms_of(rows)}", fontsize=8)
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="match rate")
        out[f"needle_{t}"] = fig
    return out


SHORT = {"full": "full", "flexgen": "FG", "moe_lightning": "MoE", "h2o": "H2O", "keyformer": "KF",
         "streamingllm": "SL", "infinigen": "IG", "hybridgen": "HG"}


def band_time(r, end):
    """A modeled row's end-to-end seconds at one end of its band (peak, achieved); None without one."""
    try:
        return r["figures"]["modeled"]["band"][end]["end_to_end_s"]
    except (KeyError, TypeError):
        return None


def map_figure(cfg, rows, labels, strategy_of):
    """The map (experiments/map.yaml): per model, KV budget and band end, a grid of (prompt, decode)
    × platform cells, each coloured by HybridGen's speedup over the fastest other method and
    labelled with the fastest method (equal attended fraction: every budgeted method at the same budget)."""
    from matplotlib.colors import TwoSlopeNorm
    cells = defaultdict(lambda: defaultdict(list))  # (model, share, prompt, decode, platform, end) → label → times
    for r in rows:
        if r.get("status") != "ok":
            continue
        p = r["point"]
        for end in ("peak", "achieved"):
            t = band_time(r, end)
            if t:
                key = (model_name(p.get("model", "")), p.get("gpu_kv_share", 0), p.get("prompt_tokens"),
                       p.get("decode_tokens"), p.get("platform"), end)
                cells[key][r["label"]].append(t)
    if not cells:
        raise NoRows("no modeled rows with a band: the map needs a modeled clock")
    models = sorted({k[0] for k in cells})
    shares = sorted({k[1] for k in cells})
    lengths_of = {m: sorted({(k[2], k[3]) for k in cells if k[0] == m}) for m in models}
    order = [p for p in OrderedDict.fromkeys(r["point"].get("platform") for r in rows)]
    panels = [(m, s) for m in models for s in shares]
    fig, axes = plt.subplots(len(panels), 2, figsize=(14, 1.5 + 2.6 * len(panels)), squeeze=False,
                             layout="constrained")
    norm = TwoSlopeNorm(vcenter=1.0, vmin=0.25, vmax=2.5)
    hg = [l for l in labels if strategy_of.get(l, l) == "hybridgen"]
    image = None
    for i, (m, s) in enumerate(panels):
        for j, end in enumerate(("peak", "achieved")):
            ax = axes[i][j]
            lengths = lengths_of[m]
            grid = [[float("nan")] * len(lengths) for _ in order]
            for y, plat in enumerate(order):
                for x, (pt, dt) in enumerate(lengths):
                    c = cells.get((m, s, pt, dt, plat, end))
                    if not c:
                        ax.text(x, y, "n/a", ha="center", va="center", fontsize=6, color="grey")
                        continue
                    t = {l: median(v) for l, v in c.items()}
                    best = min(t, key=t.get)
                    others = [v for l, v in t.items() if l not in hg]
                    mine = min((t[l] for l in hg if l in t), default=None)
                    if mine and others:
                        grid[y][x] = min(others) / mine
                    txt = SHORT.get(strategy_of.get(best, best), best)
                    if mine and others:
                        txt += f"\n{min(others) / mine:.2f}×"
                    ax.text(x, y, txt, ha="center", va="center", fontsize=6)
            image = ax.imshow(grid, cmap="RdBu", norm=norm, aspect="auto")
            ax.set_xticks(range(len(lengths)))
            ax.set_xticklabels([f"{pt // 1024 if pt % 1024 == 0 else pt / 1024:g}K\n+{dt}" for pt, dt in lengths],
                               fontsize=6)
            ax.set_yticks(range(len(order)))
            ax.set_yticklabels([str(p).replace("machine-a", "A").replace("?cpu=", " CPU×") for p in order], fontsize=6)
            budget = "KV fits (share 1)" if s >= 1 else f"budget {s:g} of the KV"
            ends = "datasheet peak, no fixed costs" if end == "peak" else "achieved rates + H200 fixed costs"
            ax.set_title(f"{m}, {budget}: {ends}", fontsize=7)
            ax.set_xlabel("prompt + decode tokens", fontsize=6)
    fig.colorbar(image, ax=axes, shrink=0.4, label="HybridGen speedup over the fastest other method (>1: HybridGen wins)")
    fig.suptitle(f"{cfg['name']}: fastest method per cell (label) and HybridGen's speedup over the best other "
                 f"(colour) — MODELED, dry", fontsize=9)
    return fig


def figures(d):
    """The figures of result directory d, by file stem."""
    rows, cfg, labels, strategy_of = load(d)
    baseline = cfg.get("baseline", labels[0])
    points = OrderedDict()
    times = defaultdict(list)
    e2e = False
    has_acc = False
    for r in rows:
        points.setdefault(r["point_index"], r["point"])
        if r.get("status") != "ok":
            continue
        times[(r["point_index"], r["label"])].append(r["figures"]["time_s"])
        e2e |= r["figures"].get("time_metric") == "end_to_end"
        has_acc |= "accuracy" in r
    keys = list(next(iter(points.values())).keys()) if points else []
    varying = [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in points.values()}) > 1]
    if has_acc and any(p.get("task") in NEEDLE_TASKS for p in points.values()):
        out = needle_figures(cfg, rows, labels, strategy_of)
        mc = [r for r in rows if r["point"].get("task") not in NEEDLE_TASKS]
        if mc:  # multiple-choice tasks beside them: their bars too
            mc_points = OrderedDict((pi, p) for pi, p in points.items() if p.get("task") not in NEEDLE_TASKS)
            out.update(accuracy_figure(cfg, mc, labels, strategy_of, mc_points, varying))
        return out
    if has_acc:
        return accuracy_figure(cfg, rows, labels, strategy_of, points, varying)
    if "platform" in varying and "gpu_kv_share" in keys and any(strategy_of.get(l, l) == "hybridgen" for l in labels):
        return {"map": map_figure(cfg, rows, labels, strategy_of)}

    def name(p):
        parts = [value_text(k, p[k]) for k in varying]
        if parts:
            return "/".join(parts)
        return f"prompt {p.get('prompt_tokens')}, batch {p.get('batch')}"

    basis = basis_of(rows)
    where = platforms_of(rows)
    metric = "end-to-end latency" if e2e else "decode time"
    out = {}
    norm = {}
    for pi in points:
        b = median(times[(pi, baseline)])
        for l in labels:
            t = median(times[(pi, l)])
            norm[(pi, l)] = t / b if b == b and t == t and b > 0 else float("nan")
    multi = len(points) > 1
    groups = [name(points[pi]) for pi in points] + (["geomean"] if multi else [])
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(16, max(6, 0.12 * len(groups) * len(labels) + 2)), 4.5))
    for j, l in enumerate(labels):
        vals = [norm[(pi, l)] for pi in points]
        finite = [v for v in vals if v == v and v > 0]
        geo = [math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else float("nan")] if multi else []
        xs = [i + j * width for i in range(len(groups))]
        ax.bar(xs, vals + geo, width, label=display(l, strategy_of.get(l)))
    ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30 if multi else 0, ha="right" if multi else "center")
    ax.set_xlabel(" / ".join(axis_label(k, points) for k in varying) if varying else "")
    ax.set_ylabel(f"{metric} ÷ {display(baseline, strategy_of.get(baseline))}\n(lower is better)")
    ax.set_title(f"{cfg['name']}: {metric} normalised to {display(baseline, strategy_of.get(baseline))} — {basis}, {where}",
                 fontsize=9)
    legend_right(ax, len(labels))
    out["normalized"] = fig

    # One axis swept besides the model (sequence length, batch, a strategy parameter): speedup
    # over the baseline against it, colour by strategy, line style by model.
    line_axes = [k for k in varying if k not in ("model", "platform")]
    if len(line_axes) == 1:
        ax_key = line_axes[0]
        fig, ax = plt.subplots(figsize=(6.5, 4))
        series = defaultdict(list)
        numeric = True
        for pi, p in points.items():
            v = p[ax_key]
            x = v if isinstance(v, (int, float)) else value_text(ax_key, v)
            if ax_key == "strategy_params":
                try:
                    x = float(x.split("=")[-1])
                except ValueError:
                    numeric = False
            elif not isinstance(x, (int, float)):
                numeric = False
            for l in labels:
                if l == baseline:
                    continue
                n = norm[(pi, l)]
                series[(model_name(p.get("model", "")), l)].append((x, 1 / n if n == n and n > 0 else float("nan")))
        colours = {l: f"C{i % 10}" for i, l in enumerate(labels)}
        models = sorted({m for m, _ in series})
        styles = {m: ["-", "--", ":", "-."][i % 4] for i, m in enumerate(models)}
        markers = {m: ["o", "s", "^", "D"][i % 4] for i, m in enumerate(models)}
        for (m, l), pts in series.items():
            pts.sort(key=lambda t: (str(type(t[0])), t[0]))
            lab = display(l, strategy_of.get(l)) + (f" — {m}" if len(models) > 1 else "")
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker=markers[m], color=colours[l], linestyle=styles[m],
                    label=lab)
        if numeric and ax_key in ("prompt_tokens", "batch", "gpu_kv_bytes"):
            ax.set_xscale("log", base=2)
            ticks = sorted({x for pts in series.values() for x, _ in pts})
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{x // 1024}K" if x >= 1024 and x % 1024 == 0 else f"{x:g}" for x in ticks])
            ax.minorticks_off()
        xlabel = axis_label(ax_key, points)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"speedup over {display(baseline, strategy_of.get(baseline))} (×), higher is better")
        ax.set_title(f"{cfg['name']}: speedup against {xlabel} — {basis}, {where}", fontsize=9)
        legend_right(ax, len(series))
        out["speedup_seqlen" if ax_key == "prompt_tokens" else f"speedup_{ax_key}"] = fig

    # Traffic and FLOPs per decode step (estimate.yaml, Figs. 4-7 and 9): bytes each side reads by
    # tier and link, and FLOPs, stacked per strategy for the first point of each group.
    work = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("work_per_step"):
            work.setdefault((r["point_index"], r["label"]), r)
    if work and cfg.get("name", "").startswith("estimate"):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
        cats = []
        for (pi, l), r in work.items():
            cats.append((name(points[pi]) + "\n" + display(l, strategy_of.get(l)), r))
        xs = range(len(cats))
        comps = [("accel", "gpu_bytes", "accelerator reads HBM"), ("cpu", "dram_bytes", "CPU reads DRAM"),
                 ("cpu", "far_bytes", "CPU reads far memory")]
        bottom = [0.0] * len(cats)
        for side, key, lab in comps:
            v = [r["work_per_step"].get(side, {}).get(key, 0.0) / 1e9 for _, r in cats]
            ax1.bar(xs, v, bottom=bottom, label=lab)
            bottom = [a + b for a, b in zip(bottom, v)]
        link = [sum(r.get("link_bytes_per_step", {}).values()) / 1e9 for _, r in cats]
        ax1.bar(xs, link, bottom=bottom, label="over the links")
        ax1.set_ylabel("GB per decode step (lower is better)")
        ax1.set_xticks(list(xs))
        ax1.set_xticklabels([c for c, _ in cats], rotation=60, ha="right", fontsize=6)
        legend_right(ax1, 4)
        bottom = [0.0] * len(cats)
        for side, lab in (("accel", "accelerator"), ("cpu", "CPU")):
            v = [r["work_per_step"].get(side, {}).get("flops", 0.0) / 1e12 for _, r in cats]
            ax2.bar(xs, v, bottom=bottom, label=lab)
            bottom = [a + b for a, b in zip(bottom, v)]
        ax2.set_ylabel("TFLOP per decode step")
        ax2.set_xticks(list(xs))
        ax2.set_xticklabels([c for c, _ in cats], rotation=60, ha="right", fontsize=6)
        legend_right(ax2, 2)
        fig.suptitle(f"{cfg['name']}: traffic and FLOPs per decode step — {basis}, {where}", fontsize=9)
        fig.tight_layout()
        out["traffic_flops"] = fig
    return out


def compare_figures(d):
    """A compare directory (hgbench compare -o DIR): B ÷ A per point and strategy, end-to-end and per
    decode token."""
    import csv
    with open(os.path.join(d, "compare.csv")) as f:
        recs = list(csv.DictReader(f))
    if not recs:
        raise NoRows(f"{d}/compare.csv: no matched cells: nothing to plot")
    title = ""
    if os.path.exists(os.path.join(d, "compare.txt")):
        title = next((l.strip() for l in open(os.path.join(d, "compare.txt")) if l.startswith("B = ")), "")
    points = list(OrderedDict((r["point"], None) for r in recs))
    labels = list(OrderedDict((r["label"], None) for r in recs))
    fig, axes = plt.subplots(1, 2, figsize=(min(18, max(9, 0.25 * len(points) * len(labels) + 4)), 4.5))
    width = 0.8 / max(1, len(labels))
    for ax, key, what in ((axes[0], "b_over_a", "end-to-end latency"), (axes[1], "b_over_a_decode_token", "decode time per token")):
        for j, l in enumerate(labels):
            vals = []
            for pt in points:
                v = [r[key] for r in recs if r["point"] == pt and r["label"] == l]
                vals.append(float(v[0]) if v and v[0] else float("nan"))
            ax.bar([i + j * width for i in range(len(points))], vals, width, label=display(l))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(points))])
        ax.set_xticklabels(points, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(f"{what}, B ÷ A (below 1: B is faster)")
    legend_right(axes[1], len(labels))
    fig.suptitle(title.split(";")[0], fontsize=8)
    fig.tight_layout()
    return {"compare": fig}


def main(d):
    try:
        figs = compare_figures(d) if os.path.exists(os.path.join(d, "compare.csv")) else figures(d)
    except NoRows as e:
        print(f"scripts/plot: {e}", file=sys.stderr)
        return 2
    written = []
    for stem, fig in figs.items():
        for ext in ("png", "svg"):
            fig.savefig(os.path.join(d, f"{stem}.{ext}"), bbox_inches="tight", dpi=150 if ext == "png" else None)
        written.append(f"{stem}.png/svg")
        plt.close(fig)
    print(f"wrote {', '.join(written)} in {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
