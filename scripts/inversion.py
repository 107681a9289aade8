"""Efficiency inversion (SparseSpec-L, referee objection on the speedup model): sweep a fixed draft
length k at one budget and context, and compare the measured speedup with S = (αk + 1) / (kγ + 1).

    python scripts/inversion.py --ctx 16k --ratio 0.10 --ks 1,2,4,8,12,16,20 --write docs/benchmarks.md

Longer drafts pay γ per token but the share of them accepted falls; once the acceptance α of the
drafted tokens drops below γ a longer draft costs more than it returns, and the speedup turns
down. The plot marks the first k where α < γ. The entropy controller's run is shown for reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

log = logging.getLogger("inversion")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="16k")
    p.add_argument("--ratio", type=float, default=0.10)
    p.add_argument("--method", default="sparsespec_l", help="self-speculative method whose k is swept")
    p.add_argument("--ks", default="1,2,4,8,12,16,20")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--model-path", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="outputs/inversion", help="directory for inversion.png / .json")
    p.add_argument("--write", default=None, help="markdown file for the table (section 'inversion')")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from sparsespec.config import parse_ctx
    from sparsespec.data import load_samples
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = parse_ctx(args.ctx)
    loaded = load_model(args.model_path, args.dtype, ctx=ctx + args.new_tokens)
    target = CausalLM(loaded.model)
    ks = [int(k) for k in args.ks.split(",")]
    specs = ["ar"] + [f"{args.method}:controller=fixed:k={k}:ratio={args.ratio}" for k in ks] + [
        f"{args.method}:ratio={args.ratio}"]
    methods = {s: bench.our_method(s) for s in specs}
    rows = []
    for sample in load_samples("pg19", loaded.tokenizer, ctx, path=args.data, limit=args.samples):
        prompt = sample.prompt_ids
        shared, prefill_s = bench.prefill_once(target, sample, args.new_tokens)
        log.info("%s: prefill %.1f s", sample.sample_id, prefill_s)
        walls: dict[str, list[float]] = {}
        stats: dict[str, list[dict]] = {}
        for rep in range(args.repeats + 1):  # run 0 warms up
            for spec in specs:  # interleaved, so drift in machine load hits every k alike
                r = bench.run_ours(methods[spec], target, None, prompt, args.new_tokens, shared)
                if rep:
                    walls.setdefault(spec, []).append(r["decode_s"])
                    stats.setdefault(spec, []).append(r)
        ar = walls["ar"]
        for spec in specs[1:]:
            speedups = [a / w for a, w in zip(ar, walls[spec], strict=True)]
            alpha = statistics.fmean(r["acceptance"] for r in stats[spec])
            gamma = statistics.fmean(r["gamma"] for r in stats[spec])
            k = statistics.fmean(r["k_mean"] for r in stats[spec])
            rows.append({"sample": sample.sample_id, "method": spec, "k": k, "fixed": "fixed" in spec,
                         "alpha": alpha, "gamma": gamma, "speedup": statistics.fmean(speedups),
                         "speedup_std": statistics.stdev(speedups) if len(speedups) > 1 else 0.0,
                         "predicted": (alpha * k + 1) / (k * gamma + 1)})
            log.info("%-40s k=%.1f α=%.2f γ=%.3f S=%.2f Ŝ=%.2f", spec, k, alpha, gamma, rows[-1]["speedup"],
                     rows[-1]["predicted"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "rows": rows,
              "command": "python scripts/inversion.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    (out / "inversion.json").write_text(json.dumps(report, indent=1))
    plot(rows, out / "inversion.png", f"{args.method}, ctx {args.ctx}, ratio {args.ratio}")
    table = to_markdown(report, out / "inversion.png")
    print(table)
    if args.write:
        bench.write_section(Path(args.write), "inversion", table)
    return report


def _by_k(rows: list[dict]) -> list[dict]:
    """Mean over samples per swept k (fixed rows only), in k order."""
    ks = sorted({r["k"] for r in rows if r["fixed"]})
    out = []
    for k in ks:
        rs = [r for r in rows if r["fixed"] and r["k"] == k]
        out.append({key: statistics.fmean(r[key] for r in rs) for key in
                    ("k", "alpha", "gamma", "speedup", "speedup_std", "predicted")})
    return out


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = _by_k(rows)
    ks = [p["k"] for p in pts]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.errorbar(ks, [p["speedup"] for p in pts], yerr=[p["speedup_std"] for p in pts], marker="o", label="measured")
    a.plot(ks, [p["predicted"] for p in pts], marker="s", ls="--", label="(αk+1)/(kγ+1)")
    ctrl = [r for r in rows if not r["fixed"]]
    if ctrl:
        a.scatter([statistics.fmean(r["k"] for r in ctrl)], [statistics.fmean(r["speedup"] for r in ctrl)],
                  marker="*", s=150, color="C3", label="entropy controller", zorder=3)
    a.axhline(1.0, color="grey", lw=0.8)
    a.set(xlabel="draft length k", ylabel="speedup over ar", title=title)
    a.legend()
    b.plot(ks, [p["alpha"] for p in pts], marker="o", label="α (accepted / drafted)")
    b.plot(ks, [p["gamma"] for p in pts], marker="s", label="γ (draft step / verify pass)")
    cross = next((p["k"] for p in pts if p["alpha"] < p["gamma"]), None)
    if cross is not None:
        b.axvline(cross, color="C3", ls=":", label=f"α < γ from k={cross:g}")
    b.set(xlabel="draft length k", ylim=(0, 1.05))
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def to_markdown(report: dict, png: Path) -> str:
    lines = [f"Command: `{report['command']}`", "", "| k | α | γ | measured speedup | predicted (αk+1)/(kγ+1) |",
             "|---|---|---|---|---|"]
    for p in _by_k(report["rows"]):
        lines.append(f"| {p['k']:g} | {p['alpha']:.2f} | {p['gamma']:.3f} | {p['speedup']:.2f} ± "
                     f"{p['speedup_std']:.2f} | {p['predicted']:.2f} |")
    ctrl = [r for r in report["rows"] if not r["fixed"]]
    if ctrl:
        m = lambda key: statistics.fmean(r[key] for r in ctrl)  # noqa: E731
        lines.append(f"| entropy ({m('k'):.1f}) | {m('alpha'):.2f} | {m('gamma'):.3f} | {m('speedup'):.2f} | "
                     f"{m('predicted'):.2f} |")
    lines += ["", f"Plot: `{png}`"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
