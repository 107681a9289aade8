"""Far-copy text, scored: held-out book windows whose last `span` tokens are replaced by the tokens
`distance` positions back (position p holds the token at p - distance), so from a few tokens into
the span the target can predict every next token by copying, and a drafter can too only while
position p - distance is inside its view; the same positions of the unmodified window are the
plain-text control. Each window is scored teacher-forced through the inference path
(common.agreement). The budget_control and figure1 studies score their drafters this way."""

from __future__ import annotations

import time

from sparsespec.data.far_copy import far_copy
from sparsespec.experiments import ExperimentError, Say, float_list, int_list, silent

PLAIN = "plain"


def arguments(p, offsets: str) -> None:
    """The options of a study that scores far-copy windows of the held-out books: which windows,
    which copies, which positions."""
    p.add_argument("--distances", default="200,700,2000,3800", help="copy distances D, in tokens")
    p.add_argument("--span", type=int, default=256, help="copied tokens at the end of each window")
    p.add_argument("--warmup", type=int, default=16, help="first tokens of the span not scored")
    p.add_argument("--offsets", default=offsets, help="where the windows start in each book (fractions)")


def check(args) -> None:
    """`arguments`' options checked and turned into lists (args.offsets, args.distances)."""
    args.offsets = float_list("offsets", args.offsets)
    if not 0 <= args.warmup < args.span - 1:
        raise ExperimentError(f"--warmup: between 0 and --span - 2 ({args.span - 2})")
    args.distances = int_list("distances", args.distances)


def labels(distances: list[int]) -> list[str]:
    """The texts of a window: plain, then a far copy per distance."""
    return [PLAIN, *(f"D={d}" for d in distances)]


def texts(ids: list[int], distances: list[int], span: int) -> dict[str, list[int]]:
    """The plain window and its far-copy variants, by label."""
    try:
        copies = [far_copy(ids, d, span) for d in distances]
    except ValueError as e:
        raise ExperimentError(str(e)) from None
    return dict(zip(labels(distances), [ids, *copies], strict=True))


def score_window(target, drafters: dict[int, object], ids: list[int], *, distances: list[int], span: int,
                 warmup: int, budgets: list[int | None]) -> dict:
    """One window's counts: {text: {"n", "target_copies", "agree": {"N/B": count}}} over the
    predictions of the next token at the span's positions after the first `warmup` (the target
    cannot know a copy has started before it has seen a few of its tokens)."""
    import torch

    from sparsespec.experiments.common.agreement import greedy_on_spans, view_for

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


def score_windows(target, tokenizer, drafters: dict, ctx: int, *, method: str, distances: list[int], span: int,
                  warmup: int, budgets: list[int | None], offsets: list[float], books: int, data: str | None,
                  checkpoint, say: Say = silent) -> list[dict]:
    """Every held-out window's row {ctx, sample, method, texts: score_window's counts}, kept in the
    checkpoint as it finishes and taken from it where an earlier run finished it."""
    from sparsespec.experiments.common.agreement import book_title, held_out_samples

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


