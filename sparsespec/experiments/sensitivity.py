"""SparseSpec-L's sensitivity to its index budget and query window (the paper's ratio and W figure):
acceptance α, the draft/verify cost ratio γ and the speedup over ar, per (ratio, W), with the speedup
identity's prediction (αk + 1) / (kγ + 1) beside each measurement.

    python -m sparsespec.experiments sensitivity --ctx 16k,32k --out results/sensitivity.json

Per context and held-out window, from one shared prefill, ar and sparsespec_l at every (ratio, W)
take turns within each repeat (drift in the machine's load hits every setting alike); each speedup
is ar's decoding time over the setting's in the same repeat. Greedy, so every run must equal ar.
Each finished window of text is kept beside --out; `--resume` picks a stopped run up there.
`markdown` and `plot` render a saved report (no torch needed); docs/benchmarks.md shows them.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

from sparsespec.eval.summary import ctx_label
from sparsespec.experiments import ExperimentError, float_list, int_list
from sparsespec.experiments.common.cells import mean_and_std
from sparsespec.experiments.common.figures import pyplot, save_png

log = logging.getLogger(__name__)
OPTIONS = {"ctx": "16k,32k", "new_tokens": 96, "books": 2, "repeats": 1, "model": None, "data": None}
RESUME = ("ctx", "ratios", "windows", "new_tokens", "repeats", "data", "model")


def arguments(p) -> None:
    p.add_argument("--ratios", default="0.02,0.05,0.1,0.2", help="index budgets, as shares of the context")
    p.add_argument("--windows", default="4,16,64", help="verification queries W that score the index")


def check(args) -> None:
    args.ratios, args.windows = float_list("ratios", args.ratios), int_list("windows", args.windows)
    if not all(0 < r <= 1 for r in args.ratios) or min(args.windows) < 1 or args.new_tokens < 8:
        raise ExperimentError("--ratios take shares in (0, 1], --windows positive counts, --new-tokens at least 8")


def spec(ratio: float, window: int) -> str:
    """The method spec (timing.our_method) of sparsespec_l at this index ratio and query window."""
    return f"sparsespec_l:ratio={ratio}:window={window}"


def measure(args, checkpoint) -> dict:
    """{rows}: per (ctx, window of text, ratio, W) the speedup over ar, α, γ, k and the prediction."""
    from sparsespec.experiments.common.agreement import book_title, held_out_samples
    from sparsespec.experiments.common.runner import our_method, prefill_once, run_ours
    from sparsespec.experiments.inversion import sweep_rows
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    say = log.info
    new_tokens, repeats = args.new_tokens, args.repeats
    settings = {spec(r, w): (r, w) for r in args.ratios for w in args.windows}
    rows = []
    for ctx in args.ctx:
        loaded = load_model(args.model, "float32", ctx=ctx + new_tokens, device="cpu")
        target = CausalLM(loaded.model)
        methods = {"ar": our_method("ar"), **{s: our_method(s) for s in settings}}
        for sample in held_out_samples(loaded.tokenizer, ctx, args.books, args.data):
            title = book_title(sample)
            done = checkpoint.rows(ctx, title, list(settings))
            if done:
                rows += done
                continue
            shared, prefill_s = prefill_once(target, sample, new_tokens)
            say(f"ctx {ctx_label(ctx)} {title}: prefill {prefill_s:.0f} s")
            run_ours(methods["ar"], target, None, sample.prompt_ids, 8, shared)  # warm-up, not timed
            runs: dict[str, list[dict]] = {}
            for rep in range(repeats):
                for s, m in methods.items():
                    runs.setdefault(s, []).append(run_ours(m, target, None, sample.prompt_ids, new_tokens, shared))
                say(f"ctx {ctx_label(ctx)} {title}: repeat {rep + 1}/{repeats} done")
            for s, rs in runs.items():
                if any(r["output_ids"] != runs["ar"][0]["output_ids"] for r in rs):
                    raise ExperimentError(f"ctx {ctx} {title}: {s} differs from ar under greedy decoding")
            got = [{**r, "ctx": ctx, "ratio": settings[r["method"]][0], "window": settings[r["method"]][1]}
                   for r in sweep_rows(title, runs)]
            for r in got:
                r["sample"] = title
                say(f"  ratio {r['ratio']:<5} W {r['window']:<3} α {r['alpha']:.2f} γ {r['gamma']:.3f} "
                    f"k {r['k']:.1f} speedup {r['speedup']:.2f} (identity {r['predicted']:.2f})")
            checkpoint.add(got)
            rows += got
    return {"rows": rows}


def cells(report: dict) -> dict[tuple[int, float, int], dict]:
    """(ctx, ratio, W) -> means over windows of text, with the speedup's spread over windows and repeats."""
    out = {}
    for key in sorted({(r["ctx"], r["ratio"], r["window"]) for r in report["rows"]}):
        rs = [r for r in report["rows"] if (r["ctx"], r["ratio"], r["window"]) == key]
        speed, spread = mean_and_std([r["speedup"] for r in rs])
        within = statistics.fmean(r["speedup_std"] for r in rs)
        out[key] = {"n": len(rs), "speedup": speed, "spread": max(spread, within),
                    **{k: statistics.fmean(r[k] for r in rs) for k in ("alpha", "gamma", "k", "predicted")}}
    return out


def markdown(report: dict, ctx: int | None = None) -> str:
    """One table per context (`ctx`: that one alone): α, γ, k, measured and predicted speedup per
    (ratio, W)."""
    table = cells(report)
    n = max(v["n"] for v in table.values())
    reps = (report.get("args") or {}).get("repeats")
    lines = [f"Command: `{report['command']}`", "",
             f"Each cell: mean over {n} window(s) of text{f', {reps} timed run(s) each' if reps else ''}; the speedup's "
             "± is the larger of the std over windows and the mean std over runs.", ""]
    for here in sorted({c for c, _, _ in table if ctx is None or c == ctx}):
        lines += [f"**{ctx_label(here)}**", "", "| ratio | W | α | γ | mean k | speedup over ar | identity (αk+1)/(kγ+1) "
                  "| measured / identity |", "|---|---|---|---|---|---|---|---|"]
        for (c, ratio, w), v in table.items():
            if c == here:
                lines.append(f"| {ratio:g} | {w} | {v['alpha']:.2f} | {v['gamma']:.3f} | {v['k']:.1f} | "
                             f"{v['speedup']:.2f} ± {v['spread']:.2f} | {v['predicted']:.2f} | "
                             f"{v['speedup'] / v['predicted']:.2f} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def plot(report: dict, path: Path) -> None:
    """Per context: measured (solid) and predicted (dashed) speedup against ratio, one colour per W;
    and α against ratio."""
    plt = pyplot()
    from matplotlib.ticker import NullLocator

    table = cells(report)
    ctxs = sorted({c for c, _, _ in table})
    fig, axes = plt.subplots(2, len(ctxs), figsize=(5 * len(ctxs), 7), squeeze=False)
    for j, ctx in enumerate(ctxs):
        for i, w in enumerate(sorted({w for c, _, w in table if c == ctx})):
            pts = sorted((r, v) for (c, r, ww), v in table.items() if c == ctx and ww == w)
            xs = [r for r, _ in pts]
            axes[0][j].errorbar(xs, [v["speedup"] for _, v in pts], yerr=[v["spread"] for _, v in pts],
                                marker="o", color=f"C{i}", label=f"W={w} measured")
            axes[0][j].plot(xs, [v["predicted"] for _, v in pts], ls="--", marker="s", color=f"C{i}",
                            label=f"W={w} identity")
            axes[1][j].plot(xs, [v["alpha"] for _, v in pts], marker="o", color=f"C{i}", label=f"W={w}")
        ratios = sorted({r for c, r, _ in table if c == ctx})
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log")
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(ratios, [f"{r:g}" for r in ratios])
        axes[0][j].axhline(1.0, color="grey", lw=0.8)
        axes[0][j].set(title=f"sparsespec_l, ctx {ctx_label(ctx)}", ylabel="speedup over ar")
        axes[1][j].set(xlabel="index budget (share of the context)", ylabel="α (accepted / drafted)", ylim=(0, 1.05))
        axes[0][j].legend(fontsize=7)
        axes[1][j].legend(fontsize=7)
    save_png(fig, path)
