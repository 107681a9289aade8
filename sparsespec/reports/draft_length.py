"""The draft length in the real loop: on held-out prompts, ar and the budgetdraft method (its drafter
model replaced by each group's, its KV budget and fixed k set per run) through the method builder,
greedy and exact (every run asserted token-identical to ar), timed from the harness' shared prefill
of each prompt. Used by scripts/budgetdraft_results.py."""

from __future__ import annotations

import json
import statistics

import torch

from sparsespec.config import load_method
from sparsespec.eval.prefill import SharedPrefill
from sparsespec.eval.summary import distinct_by_part
from sparsespec.models.runner import CausalLM
from sparsespec.reports import ReportError, Say, silent
from sparsespec.reports.agreement import book_title, held_out_samples
from sparsespec.reports.cells import mean_and_std
from sparsespec.reports.timing import our_method


@torch.inference_mode()
def engine_rows(target, tok, models: dict[str, list], ctx: int, *, drafters: list[str], ks: list[int], budget: int,
                books: int, repeats: int, new_tokens: int, data: str | None = None, say: Say = silent) -> list[dict]:
    """AR, then the first seed of each group in `drafters` at each k (budgetdraft's view at `budget`),
    `repeats` runs each. Rows aggregate over prompts and repeats, each run against AR on its own
    prompt; `ar_distinct` (distinct tokens / tokens of AR's output, mean over prompts) flags
    degenerate loops, where every drafter scores alike."""
    for label in drafters:
        if label not in models:
            raise ReportError(f"--engine-drafters {label}: not among the drafter groups {list(models)}")
    tlm = CausalLM(target)
    ar_method = load_method("ar")
    methods = {k: our_method(f"budgetdraft:k={k}:budget={budget}") for k in ks}
    runs: dict[tuple[str, int], list] = {}
    distinct, titles = [], []
    for sample in held_out_samples(tok, ctx, books, data):
        title, ids = book_title(sample), sample.prompt_ids
        cache, _ = SharedPrefill(tlm, chunk=1024).get(sample, new_tokens)  # every run crops it back
        head = cache.length if cache is not None else 0

        def run(engine, ids=ids, cache=cache, head=head):
            res = engine.generate(ids, new_tokens, cache=cache)
            if cache is not None:
                cache.crop(head)
            return res

        ar = [run(ar_method.build(tlm)) for _ in range(repeats)]
        ar_tps = statistics.mean(r.tokens_per_s for r in ar)
        distinct.append(distinct_by_part(ar[0].output_ids, 1)[0])
        titles.append(title)
        runs.setdefault(("ar", 0), []).extend((r, ar_tps) for r in ar)
        for label in drafters:
            model = CausalLM(models[label][0])
            for k in ks:
                for _ in range(repeats):
                    r = run(methods[k].build(tlm, model))
                    if r.output_ids != ar[0].output_ids:
                        raise AssertionError(f"{label} k={k} at ctx {ctx} ({title}): speculative output differs from AR")
                    runs.setdefault((label, k), []).append((r, ar_tps))
        say(f"ctx {ctx}: engine on {title} done")
    rows = []
    for (label, k), rs in runs.items():
        tok_s, tok_s_std = mean_and_std([r.tokens_per_s for r, _ in rs])
        speedup, speedup_std = mean_and_std([r.tokens_per_s / a for r, a in rs])
        row = {"ctx": ctx, "drafter": label, "budget": "-" if label == "ar" else budget, "k": k,
               "tok_s": tok_s, "tok_s_std": tok_s_std, "speedup": speedup, "speedup_std": speedup_std,
               "n_prompts": len(titles), "books": titles, "ar_distinct": statistics.mean(distinct)}
        if label != "ar":
            row.update(alpha=statistics.mean(r.acceptance_rate or 0.0 for r, _ in rs),
                       tau=statistics.mean(r.mean_accepted_tokens for r, _ in rs),
                       gamma=statistics.mean(r.gamma for r, _ in rs),
                       same_as_ar=True)
        rows.append(row)
        say(json.dumps(row))
    return rows
