"""scripts/plot.py on result directories shaped as hgbench writes them: every figure's legend lies
inside the saved image, entries use display names, models are told apart by line style, the swept
strategy parameter is the x axis, single-point figures have no geomean group, and a directory
without successful rows is an error. Exit 77 (skipped) without matplotlib."""
import json
import os
import sys
import tempfile

try:
    import matplotlib  # noqa: F401
    import yaml  # noqa: F401
except ImportError:
    print("matplotlib or yaml missing (apt-get install python3-matplotlib): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import plot  # noqa: E402

STRATEGIES = ["full", "flexgen", "moe_lightning", "h2o", "keyformer", "streamingllm", "infinigen", "hybridgen"]


def write_dir(d, name, points, strategies=STRATEGIES, status="ok", time_basis="modeled (dry)"):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.yaml"), "w") as f:
        yaml.safe_dump({"name": name, "strategies": strategies, "baseline": "full"}, f)
    with open(os.path.join(d, "rows.jsonl"), "w") as f:
        for pi, p in enumerate(points):
            for j, s in enumerate(strategies):
                point = {"model": "synthetic:llama-3.2-1b", "prompt_tokens": 1024, "decode_tokens": 16, "batch": 1,
                         "platform": "machine-a", "strategy_params": {}}
                point.update(p)
                row = {"point_index": pi, "point_id": f"p{pi}", "label": s, "strategy": s, "status": status,
                       "time_basis": time_basis, "point": point,
                       "figures": {"time_s": 1.0 + 0.1 * j + 0.01 * pi, "time_metric": "end_to_end"},
                       "work_per_step": {"accel": {"flops": 1e9, "gpu_bytes": 2e9}, "cpu": {"flops": 1e8, "dram_bytes": 1e9}},
                       "link_bytes_per_step": {"dram->gpu": 5e8}}
                f.write(json.dumps(row) + "\n")


def check_legends(figs, what):
    failures = []
    for stem, fig in figs.items():
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        tight = fig.get_tightbbox(r)  # inches: what bbox_inches="tight" saves
        tx0, ty0, tx1, ty1 = (v * fig.dpi for v in (tight.x0, tight.y0, tight.x1, tight.y1))
        for ax in fig.axes:
            lg = ax.get_legend()
            if lg is None:
                continue
            b = lg.get_window_extent(r)
            if b.x0 < tx0 - 1 or b.y0 < ty0 - 1 or b.x1 > tx1 + 1 or b.y1 > ty1 + 1:
                failures.append(f"{what}/{stem}: legend {b} outside the saved image {tight}")
            texts = [t.get_text() for t in lg.get_texts()]
            if len(set(texts)) != len(texts):
                failures.append(f"{what}/{stem}: legend entries repeat: {texts}")
            if any(t in STRATEGIES[1:] for t in texts):
                failures.append(f"{what}/{stem}: raw strategy names in the legend: {texts}")
        title = fig.axes[0].get_title() + (fig._suptitle.get_text() if fig._suptitle else "")
        if "MODELED" not in title or "machine-a" not in title:
            failures.append(f"{what}/{stem}: title does not say MODELED and the platform: {title!r}")
    return failures


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        # quickstart-like: one point.
        d = os.path.join(tmp, "quickstart")
        write_dir(d, "quickstart", [{}])
        figs = plot.figures(d)
        failures += check_legends(figs, "quickstart")
        labels = [t.get_text() for t in figs["normalized"].axes[0].get_xticklabels()]
        if any("geo" in t.lower() or t == "point" for t in labels):
            failures.append(f"quickstart: single-point groups {labels}")
        # seqlen-like: two models × three lengths.
        d = os.path.join(tmp, "seqlen")
        write_dir(d, "seqlen", [{"model": m, "prompt_tokens": n} for m in ("synthetic:llama-3.1-8b", "synthetic:qwen2.5-7b")
                                for n in (1024, 4096, 16384)])
        figs = plot.figures(d)
        failures += check_legends(figs, "seqlen")
        ax = figs["speedup_seqlen"].axes[0]
        styles = {ln.get_label(): ln.get_linestyle() for ln in ax.get_lines()}
        if len({s for l, s in styles.items() if "llama" in l}) != 1 or len(set(styles.values())) < 2:
            failures.append(f"seqlen: models not told apart by line style: {styles}")
        if not any("HybridGen" in l and "qwen2.5-7b" in l for l in styles):
            failures.append(f"seqlen: legend does not name strategy and model: {list(styles)}")
        # kv_ratio-like: the swept strategy parameter is the x axis.
        d = os.path.join(tmp, "kv_ratio")
        write_dir(d, "kv_ratio", [{"strategy_params": {"hybridgen": {"kv_ratio": str(r)}, "h2o": {"kv_ratio": str(r)}}}
                                  for r in (0.1, 0.2, 0.4)])
        figs = plot.figures(d)
        failures += check_legends(figs, "kv_ratio")
        if "speedup_strategy_params" not in figs:
            failures.append(f"kv_ratio: no figure against the swept ratio ({list(figs)})")
        else:
            ax = figs["speedup_strategy_params"].axes[0]
            if ax.get_xlabel() != "kv_ratio":
                failures.append(f"kv_ratio: x axis {ax.get_xlabel()!r}")
        # estimate-like: traffic and FLOPs stacks.
        d = os.path.join(tmp, "estimate")
        write_dir(d, "estimate", [{"prompt_tokens": n} for n in (1024, 4096)])
        figs = plot.figures(d)
        failures += check_legends(figs, "estimate")
        if "traffic_flops" not in figs:
            failures.append(f"estimate: no traffic/FLOPs figure ({list(figs)})")
        # Saved PNGs exist and are images.
        rc = plot.main(d)
        with open(os.path.join(d, "normalized.png"), "rb") as f:
            if rc != 0 or f.read(8) != b"\x89PNG\r\n\x1a\n":
                failures.append("estimate: normalized.png was not written")
        # A compare directory: B ÷ A bars, legend kept.
        d = os.path.join(tmp, "compare")
        os.makedirs(d)
        with open(os.path.join(d, "compare.csv"), "w") as f:
            f.write("point_id,point,label,a_time_s,b_time_s,b_over_a,a_decode_token_s,b_decode_token_s,b_over_a_decode_token\n")
            for pt in ("1024", "4096"):
                for l in ("full", "hybridgen"):
                    f.write(f"p{pt},{pt},{l},1,2,2,0.1,0.1,1\n")
        figs = plot.compare_figures(d)
        for stem, fig in figs.items():
            fig.canvas.draw()
            lg = fig.axes[1].get_legend()
            texts = [t.get_text() for t in lg.get_texts()]
            if texts != ["Full KV (oracle)", "HybridGen"]:
                failures.append(f"compare: legend {texts}")
        if plot.main(d) != 0 or not os.path.exists(os.path.join(d, "compare.png")):
            failures.append("compare: compare.png was not written")
        # All rows failed: an error, exit 2.
        d = os.path.join(tmp, "failed")
        write_dir(d, "failed", [{}], status="failed")
        if plot.main(d) != 2:
            failures.append("a directory without successful rows did not exit 2")
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
