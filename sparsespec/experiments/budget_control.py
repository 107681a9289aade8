"""The positive control for BudgetDraft's budget effect: does a drafter lose agreement with the
target when the tokens it needs lie outside its streaming KV budget, and which drafters do?

No training: the drafters are layer-truncated copies of the target (its first N layers, the target's
own final norm and head; N = all layers is the target itself). On held-out book windows the last
`span` tokens are replaced by the tokens `distance` positions back (position p holds the token at
p - distance), so from a few tokens into the span the target can predict every next token by
copying, and a drafter can too only while position p - distance is inside its view. The same
positions of the unmodified window are the plain-text control (common.far_copy).

    python -m sparsespec.experiments budget_control --ctx 4k --out results/control.json

Scored per window, teacher-forced through the inference path (common.agreement): the target's
greedy token at each scored position, whether it is the copied token (the target copies), and each
drafter's greedy token under each budget (its own KV computed under the StreamingKV view, as
ModelDrafter does), agreeing with the target's or not. Each finished window is kept beside --out;
`--resume` picks a stopped run up there. `markdown` and `plot` render a saved report (no torch
needed); docs/training.md shows them.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from sparsespec.experiments import ExperimentError, int_list
from sparsespec.experiments.common import far_copy
from sparsespec.experiments.common.far_copy import PLAIN, labels
from sparsespec.experiments.common.figures import pyplot, save_png

OPTIONS = {"ctx": "4k", "books": 2, "model": None, "data": None}
RESUME = ("ctx", "distances", "layers", "budgets", "span", "warmup", "data", "model")


def arguments(p) -> None:
    p.add_argument("--layers", default="2,8,16,30", help="drafter depths N (the target's layer count = itself)")
    p.add_argument("--budgets", default="64,256,1024,full", help="streaming KV budgets (tokens, or full)")
    far_copy.arguments(p, offsets="0.02,0.3")


def check(args) -> None:
    if len(args.ctx) != 1:
        raise ExperimentError(f"--ctx: one window length, got {len(args.ctx)}")
    far_copy.check(args)
    args.layers, args.budgets = int_list("layers", args.layers), int_list("budgets", args.budgets, full=True)


def measure(args, checkpoint) -> dict:
    """{settings..., windows: [{ctx, sample, texts}]}: every window's counts (far_copy.score_window),
    the target at --model (default: the embedded model) in float32."""
    import logging

    from sparsespec.models.loading import load_model
    from sparsespec.training.drafters import truncated

    ctx, layers, budgets = args.ctx[0], args.layers, args.budgets

    tgt = load_model(args.model, "float32", ctx=ctx, device="cpu")
    total = tgt.model.config.num_hidden_layers
    if any(not 1 <= n <= total for n in layers):
        raise ExperimentError(f"--layers: each between 1 and the target's {total} layers")
    drafters = {n: tgt.model if n == total else truncated(tgt.model, n).eval() for n in layers}
    windows = far_copy.score_windows(tgt.model, tgt.tokenizer, drafters, ctx, method="control",
                                     distances=args.distances, span=args.span, warmup=args.warmup, budgets=budgets,
                                     offsets=args.offsets, books=args.books, data=args.data, checkpoint=checkpoint,
                                     say=logging.getLogger(__name__).info)
    if not windows:
        raise ExperimentError(f"no held-out window of {ctx} tokens")
    return {"ctx": ctx, "distances": args.distances, "layers": layers, "total_layers": total,
            "budgets": [b or "full" for b in budgets], "span": args.span, "warmup": args.warmup, "windows": windows}


def cells(report: dict) -> dict[tuple[int, str, str], dict]:
    """(N, text, budget) -> {acc, std (over windows), se (of the pooled positions), n}; and
    (0, text, "target") -> the target's copy rate."""
    out = {}
    keys = [(n, str(b)) for n in report["layers"] for b in report["budgets"]]
    for t in labels(report["distances"]):
        per = [w["texts"][t] for w in report["windows"]]
        for n, b in [*keys, (0, "target")]:
            hits = [c["target_copies"] if n == 0 else c["agree"][f"{n}/{b}"] for c in per]
            total = sum(c["n"] for c in per)
            p = sum(hits) / total
            rates = [h / c["n"] for h, c in zip(hits, per, strict=True)]
            out[(n, t, b)] = {"acc": p, "std": statistics.stdev(rates) if len(rates) > 1 else 0.0,
                              "se": math.sqrt(p * (1 - p) / total), "n": total}
    return out


def markdown(report: dict) -> str:
    c = cells(report)
    texts_ = labels(report["distances"])
    n_win = len(report["windows"])
    lines = [f"{n_win} held-out windows of {report['ctx']} tokens; the last {report['span']} tokens copied from "
             f"D back; {c[(0, PLAIN, 'target')]['n'] // n_win} scored positions per window and text (the first "
             f"{report['warmup']} of the span are not scored). Cells: agreement with the target's greedy token, "
             "± std over windows (± standard error of the pooled positions).", "",
             "The target copies (its greedy token is the copied one): "
             + ", ".join(f"{t} {c[(0, t, 'target')]['acc']:.3f}" for t in texts_[1:])
             + f"; on plain text its greedy token is the next book token at {c[(0, PLAIN, 'target')]['acc']:.3f}.",
             "", "| layers N | budget | " + " | ".join(texts_) + " |", "|---|---|" + "---|" * len(texts_)]
    for n in report["layers"]:
        for b in report["budgets"]:
            lines.append(f"| {n} | {b} | " + " | ".join(
                f"{c[(n, t, str(b))]['acc']:.3f} ± {c[(n, t, str(b))]['std']:.3f} ({c[(n, t, str(b))]['se']:.3f})"
                for t in texts_) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """One panel per drafter depth: agreement against the copy distance (plain text first), a line
    per budget, the target's copy rate dashed."""
    plt = pyplot()
    c = cells(report)
    texts_ = labels(report["distances"])
    layers = report["layers"]
    fig, axes = plt.subplots(1, len(layers), figsize=(3.2 * len(layers), 3.2), sharey=True)
    axes = axes if len(layers) > 1 else [axes]
    x = list(range(len(texts_)))
    for ax, n in zip(axes, layers, strict=True):
        for b in report["budgets"]:
            cell = [c[(n, t, str(b))] for t in texts_]
            ax.errorbar(x, [v["acc"] for v in cell], yerr=[v["std"] for v in cell], marker="o", ms=3,
                        capsize=2, label=f"B={b}")
        ax.plot(x[1:], [c[(0, t, "target")]["acc"] for t in texts_[1:]], "k--", lw=1, label="target copies")
        ax.set_title(f"N = {n} layers" + (" (the target)" if n == report["total_layers"] else ""), fontsize=9)
        ax.set_xticks(x, texts_, rotation=45, fontsize=7)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("agreement with the target")
    axes[-1].legend(fontsize=7, loc="lower left")
    save_png(fig, path)
