"""The positive control for BudgetDraft's budget effect: does a drafter lose agreement with the
target when the tokens it needs lie outside its streaming KV budget, and which drafters do?

No training: the drafters are layer-truncated copies of the target (its first N layers, the target's
own final norm and head; N = all layers is the target itself). On held-out book windows the last
`span` tokens are replaced by the tokens `distance` positions back (position p holds the token at
p - distance), so from a few tokens into the span the target can predict every next token by
copying, and a drafter can too only while position p - distance is inside its view. The same
positions of the unmodified window are the plain-text control.

Scored per window, teacher-forced through the inference path (reports.agreement): the target's
greedy token at each scored position, whether it is the copied token (the target copies), and each
drafter's greedy token under each budget (its own KV computed under the StreamingKV view, as
ModelDrafter does), agreeing with the target's or not. `markdown` and `plot` render a saved report
(no torch needed).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

from sparsespec.data.far_copy import far_copy
from sparsespec.reports import ReportError, Say, int_list, silent
from sparsespec.reports.figures import pyplot, save_png

PLAIN = "plain"


def add_text_args(p: argparse.ArgumentParser, offsets: str) -> None:
    """The options of the scripts that score far-copy windows of the held-out books (control.py,
    figure1.py): which windows, which copies, which positions."""
    p.add_argument("--distances", default="200,700,2000,3800", help="copy distances D, in tokens")
    p.add_argument("--span", type=int, default=256, help="copied tokens at the end of each window")
    p.add_argument("--warmup", type=int, default=16, help="first tokens of the span not scored")
    p.add_argument("--offsets", default=offsets, help="where the windows start in each book (fractions)")
    p.add_argument("--books", type=int, default=2, help="held-out books")
    p.add_argument("--model", default=None, help="the target (default: the embedded model)")
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")


def text_args(args: argparse.Namespace) -> tuple[list[float], list[int]]:
    """The window offsets and copy distances of `add_text_args`' options, checked."""
    try:
        offsets = [float(o) for o in args.offsets.split(",")]
    except ValueError:
        raise ReportError(f"--offsets: comma-separated fractions, got {args.offsets!r}") from None
    if not 0 <= args.warmup < args.span - 1:
        raise ReportError(f"--warmup: between 0 and --span - 2 ({args.span - 2})")
    return offsets, int_list("distances", args.distances)


def labels(distances: list[int]) -> list[str]:
    """The texts of a window: plain, then a far copy per distance."""
    return [PLAIN, *(f"D={d}" for d in distances)]


def texts(ids: list[int], distances: list[int], span: int) -> dict[str, list[int]]:
    """The plain window and its far-copy variants, by label."""
    try:
        copies = [far_copy(ids, d, span) for d in distances]
    except ValueError as e:
        raise ReportError(str(e)) from None
    return dict(zip(labels(distances), [ids, *copies], strict=True))


def score_window(target, drafters: dict[int, object], ids: list[int], *, distances: list[int], span: int,
                 warmup: int, budgets: list[int | None]) -> dict:
    """One window's counts: {text: {"n", "target_copies", "agree": {"N/B": count}}} over the
    predictions of the next token at the span's positions after the first `warmup` (the target
    cannot know a copy has started before it has seen a few of its tokens)."""
    import torch

    from sparsespec.reports.agreement import greedy_on_spans, view_for

    variants = texts(ids, distances, span)
    prefix, spans = ids[: len(ids) - span], [seq[len(ids) - span :] for seq in variants.values()]
    gold = [g[warmup:-1] for g in greedy_on_spans(target, prefix, spans, view_for(None))]
    agree: dict[str, list[int]] = {}
    for n_layers, model in drafters.items():
        for b in budgets:
            preds = greedy_on_spans(model, prefix, spans, view_for(b))
            agree[f"{n_layers}/{b or 'full'}"] = [int((p[warmup:-1] == g).sum())
                                                  for p, g in zip(preds, gold, strict=True)]
    out = {}
    for i, (label, seq) in enumerate(variants.items()):
        nxt = torch.tensor(seq[len(seq) - span + warmup + 1 :])  # what the scored positions predict
        out[label] = {"n": int(gold[i].numel()), "target_copies": int((gold[i] == nxt).sum()),
                      "agree": {key: counts[i] for key, counts in agree.items()}}
    return out


def measure(ctx: int, *, distances: list[int], layers: list[int], budgets: list[int | None], span: int,
            warmup: int, offsets: list[float], books: int, data: str | None, checkpoint,
            model_path: str | None = None, say: Say = silent) -> dict:
    """{settings..., windows: [{ctx, sample, texts}]}: every window's counts (score_window), the
    target at `model_path` (default: the embedded model) in float32."""
    from sparsespec.models.loading import load_model
    from sparsespec.training.drafters import truncated

    tgt = load_model(model_path, "float32", ctx=ctx, device="cpu")
    total = tgt.model.config.num_hidden_layers
    if any(not 1 <= n <= total for n in layers):
        raise ReportError(f"--layers: each between 1 and the target's {total} layers")
    drafters = {n: tgt.model if n == total else truncated(tgt.model, n).eval() for n in layers}
    windows = score_windows(tgt.model, tgt.tokenizer, drafters, ctx, method="control", distances=distances, span=span,
                            warmup=warmup, budgets=budgets, offsets=offsets, books=books, data=data,
                            checkpoint=checkpoint, say=say)
    if not windows:
        raise ReportError(f"no held-out window of {ctx} tokens")
    return {"ctx": ctx, "distances": distances, "layers": layers, "total_layers": total,
            "budgets": [b or "full" for b in budgets], "span": span, "warmup": warmup, "windows": windows}


def score_windows(target, tokenizer, drafters: dict, ctx: int, *, method: str, distances: list[int], span: int,
                  warmup: int, budgets: list[int | None], offsets: list[float], books: int, data: str | None,
                  checkpoint, say: Say = silent) -> list[dict]:
    """Every held-out window's row {ctx, sample, method, texts: score_window's counts}, kept in the
    checkpoint as it finishes and taken from it where an earlier run finished it."""
    from sparsespec.reports.agreement import book_title, held_out_samples

    windows = []
    t0 = time.perf_counter()
    for offset in offsets:
        for sample in held_out_samples(tokenizer, ctx, books, data, offset=offset):
            sid = f"{book_title(sample)}@{offset}"
            done = checkpoint.rows(ctx, sid, [method])
            if done:
                windows.append(done[0])
                continue
            counts = score_window(target, drafters, sample.prompt_ids, distances=distances, span=span,
                                  warmup=warmup, budgets=budgets)
            row = {"ctx": ctx, "sample": sid, "method": method, "texts": counts}
            checkpoint.add([row])
            windows.append(row)
            copies = ", ".join(f"{t} {c['target_copies'] / c['n']:.2f}" for t, c in counts.items() if t != PLAIN)
            say(f"ctx {ctx}, {sid}: done in {time.perf_counter() - t0:.0f} s (target copies: {copies})")
    return windows


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
