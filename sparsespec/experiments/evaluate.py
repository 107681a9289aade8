"""evaluate.py's runs (the rows of their results files) as the tables of the docs: evaluate.py's own
summary with the sentences it prints under it, per task and ctx, per sampled seed, and the entropy
controller's calibration. evaluate.py measures; this module only renders (a doc section names an
evaluate.py run directory: its rows are `report["rows"]`)."""

from __future__ import annotations

from collections import defaultdict

from sparsespec.eval.summary import calibration_table as _calibration
from sparsespec.eval.summary import ctx_label, distinct_by_part, headline, summarize, to_markdown
from sparsespec.experiments.common.cells import fmt, mean, mean_std


def _by(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[tuple(r.get(k) for k in keys)].append(r)
    return dict(out)


def _sort_key(key: tuple) -> tuple:
    return tuple((0, v) if isinstance(v, int | float) else (1, str(v)) for v in key)


def markdown(report: dict) -> str:
    """evaluate.py's own summary table and the sentences it prints under it."""
    rows = report["rows"]
    return to_markdown(summarize(rows)).rstrip("\n") + "\n\n" + "\n\n".join(headline(rows))


def tasks_table(report: dict) -> str:
    """One row per (task, ctx) of a benchmark: ar's task score and speed, then each method's speed as a
    multiple of ar's with its α and τ, and whether every method's outputs (and so its score) are ar's."""
    rows = report["rows"]
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "ar"]
    head = "| task | ctx | samples | score (ar) | ar tok/s | " + " | ".join(f"{m}: × ar (α, τ)" for m in methods)
    lines = [head + " | same outputs and score as ar |", "|---|---|---|---|---|" + "---|" * len(methods) + "---|"]
    for (task, ctx), rs in sorted(_by(rows, "task", "ctx").items(), key=lambda kv: _sort_key(kv[0])):
        ar = {r["sample_id"]: r for r in rs if r["method"] == "ar"}
        if not ar:
            continue
        ar_rows = list(ar.values())
        score = mean_std([r.get("score") for r in ar_rows])
        tok_s = sum(r["new_tokens"] for r in ar_rows) / sum(r["wall_s"] for r in ar_rows)
        cells, same = [], []
        for m in methods:
            mine = [r for r in rs if r["method"] == m]
            if not mine:
                cells.append("—")
                continue
            cells.append(f"{mean_std([r.get('speedup') for r in mine])} ({fmt(mean(r.get('acceptance_rate') for r in mine))}, "
                         f"{fmt(mean(r.get('mean_accepted_tokens') for r in mine))})")
            same += [r.get("exact_match_ar") is True and r.get("score") == ar[r["sample_id"]].get("score")
                     for r in mine if r["sample_id"] in ar]
        verdict = ("yes" if all(same) else f"NO ({same.count(False)} of {len(same)})") if same else "—"
        lines.append(f"| {task or '—'} | {ctx_label(ctx)} | {len(ar_rows)} | {score} | {tok_s:.2f} | "
                     + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def calibration_table(report: dict) -> str:
    """The entropy controller's calibration by entropy bin, as evaluate.py's summary.md gives it."""
    return _calibration(report["rows"]).rstrip("\n")


def sampling_table(report: dict) -> str:
    """Sampled runs over several seeds: each method's speed against ar on the same prompt and seed,
    its acceptance overall and by quarter of the output, and ar's distinct-token share by quarter."""
    rows = report["rows"]
    seeds = sorted({r.get("seed") for r in rows})
    lines = [f"Mean ± std over {len(seeds)} seeds × samples (each ratio against ar on the same prompt and seed).", "",
             "| ctx | method | runs | tok/s | × ar | α | α by quarter | distinct-token share by quarter |",
             "|---|---|---|---|---|---|---|---|"]
    for (ctx, method), rs in sorted(_by(rows, "ctx", "method").items(),
                                    key=lambda kv: (kv[0][0], kv[0][1] != "ar", kv[0][1])):
        quarters = [_quarters(r) for r in rs if r.get("accepted_per_round")]
        by_q = " / ".join(mean_std([q[i] for q in quarters]) for i in range(4)) if quarters else "—"
        distinct = [distinct_by_part(r["output_ids"], 4) for r in rs]
        lines.append(f"| {ctx_label(ctx)} | {method} | {len(rs)} | {mean_std([r['tokens_per_s'] for r in rs])} | "
                     f"{'1.00' if method == 'ar' else mean_std([r.get('speedup') for r in rs])} | "
                     f"{mean_std([r.get('acceptance_rate') for r in rs])} | {by_q} | "
                     + " / ".join(mean_std([d[i] for d in distinct]) for i in range(4)) + " |")
    return "\n".join(lines)


def _quarters(row: dict) -> list[float | None]:
    """α in each quarter of a row's output from its per-round counts (GenerationResult.acceptance_by_part)."""
    from sparsespec.decoding.engine import GenerationResult  # torch: only for the sampled tables

    res = GenerationResult(output_ids=row["output_ids"], prompt_tokens=row["prompt_tokens"], prefill_s=0.0,
                           wall_s=1.0, rounds=list(zip(row["drafted_per_round"], row["accepted_per_round"], strict=True)))
    return res.acceptance_by_part(4) or [None] * 4
