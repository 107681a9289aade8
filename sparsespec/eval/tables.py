"""Markdown tables and plots of saved results: `scripts/bench.py` reports and evaluate.py runs.

Every function here is a pure function of the saved numbers, so `scripts/docs.py` can rebuild the
tables in README.md and docs/ from the committed files in results/ and a test can check that the
rebuild reproduces them exactly. A "±" is a standard deviation and appears only where there are at
least two values to take it over (repeats, samples or seeds; each table says which).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from sparsespec.eval.summary import ctx_label, distinct_by_part

HF_METHODS = ("hf", "hf_assisted", "hf_lookup")


def _fmt(v: float | None, spec: str = "{:.2f}") -> str:
    return "—" if v is None else spec.format(v)


def mean_std(values: list, digits: int = 2) -> str:
    """'mean ± sample std' of the values that are not None; the mean alone for one value; '—' for none."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.fmean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


# -- scripts/bench.py reports ---------------------------------------------------------------------


def _groups(report: dict, ctx: int | None = None) -> dict[tuple[int, str], list[dict]]:
    """(ctx, method) -> that method's rows, one per sample, in the report's order."""
    out: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for r in sorted(report["rows"], key=lambda r: r["ctx"]):
        if ctx is None or r["ctx"] == ctx:
            out[(r["ctx"], r["method"])].append(r)
    return dict(out)


def _repeats(report: dict) -> int:
    return int((report.get("args") or {}).get("repeats") or 1)


def _same(rs: list[dict], ref: str) -> str:
    flags = [r.get(f"identical_{ref}") for r in rs]
    if any(f is None for f in flags):
        return "—"
    return "yes" if all(flags) else "NO"


def bench_speed(report: dict, ctx: int | None = None) -> str:
    """Decode speed per (ctx, method): tokens/s, the ratios against HF generate() and our ar on the
    same prompt, acceptance and draft cost, and whether the greedy output was ar's."""
    reps = _repeats(report)
    samples = max(len(rs) for rs in _groups(report).values())
    spread = []
    if reps > 1:
        spread.append(f"tokens/s: mean over samples of {reps} timed runs each, ± the std over those runs")
    if samples > 1:
        spread.append(f"ratios, α and τ: mean ± std over the {samples} samples, each against ar on its own prompt")
    lines = (["" + "; ".join(spread) + ".", ""] if spread else []) + [
        "| ctx | method | decode tok/s | × HF generate | × our ar | α | τ | γ | k | same as ar |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for (c, method), rs in _groups(report, ctx).items():
        tok = statistics.fmean(r["tok_s"] for r in rs)
        std = statistics.fmean(r["tok_s_std"] for r in rs)
        speed = f"{tok:.2f} ± {std:.2f}" if reps > 1 else f"{tok:.2f}"
        ar = "1.00" if method == "ar" else mean_std([r.get("vs_ar") for r in rs])
        hf = "1.00" if method == "hf" else mean_std([r.get("vs_hf") for r in rs])  # itself: no spread
        lines.append(
            f"| {ctx_label(c)} | {method} | {speed} | {hf} | {ar} | "
            f"{mean_std([r.get('acceptance') for r in rs])} | {mean_std([r.get('tau') for r in rs])} | "
            f"{_fmt(_mean(r.get('gamma') for r in rs), '{:.3f}')} | {_fmt(_mean(r.get('k_mean') for r in rs), '{:.1f}')} | "
            f"{_same(rs, 'ar')} |")
    return "\n".join(lines)


def bench_machine(report: dict) -> str:
    """ar against the bandwidth floor, prefill times and peak memory, per ctx."""
    lines = [f"Read bandwidth {report['bandwidth_gbs']:.1f} GB/s (measured in the run); weights "
             f"{report['weight_bytes'] / 1e6:.0f} MB. Floor: bandwidth / (weight bytes + KV bytes read per token).", "",
             "| ctx | ar tok/s | floor tok/s | ar / floor | prefill s (ours) | prefill s (HF) | peak RSS GB |",
             "|---|---|---|---|---|---|---|"]
    for (c, method), rs in _groups(report).items():
        if method != "ar":
            continue
        tok, floor = statistics.fmean(r["tok_s"] for r in rs), statistics.fmean(r["floor_tok_s"] for r in rs)
        peak = max(r["peak_rss_gb"] for r in report["rows"] if r["ctx"] == c)
        lines.append(f"| {ctx_label(c)} | {tok:.2f} | {floor:.1f} | {floor / tok:.2f} | "
                     f"{statistics.fmean(r['prefill_s'] for r in rs):.1f} | "
                     f"{_fmt(_mean(r.get('hf_prefill_s') for r in rs), '{:.1f}')} | {peak:.1f} |")
    return "\n".join(lines)


def bench_split(report: dict) -> str:
    """Where a speculative round's time goes, in ms and in ar steps, the acceptance at which a round
    pays for itself, and what the speedup identity predicts from the same run's α, k and γ beside
    the measured ratio."""
    lines = ["ms per round, mean over samples: drafting all its tokens, the verification pass, the recall-index "
             "update, and the rest (sampling, bookkeeping, Python). In ar steps (1 / ar's tokens/s at that ctx): "
             "one draft token, the verification pass, and the index update. Break-even α: the acceptance at "
             "which a round of this k costs what its tokens cost ar, (k·draft + verify + index − 1) / k in ar "
             "steps. Predicted: S = (αk + 1) / (kγ + 1) from the row's own α, k and γ (verification costing "
             "one ar step).", "",
             "| ctx | method | draft | verify | index update | other | draft token (ar steps) | verify (ar steps) "
             "| index (ar steps) | α | break-even α | tokens / round | × our ar | predicted |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups = _groups(report)
    for (c, method), rs in groups.items():
        if not any(r.get("draft_ms") is not None for r in rs):
            continue
        ms = {k: statistics.fmean(r[k] for r in rs if r.get(k) is not None)
              for k in ("draft_ms", "verify_ms", "index_ms", "other_ms")}
        alpha, k, gamma = (_mean(r.get(key) for r in rs) for key in ("acceptance", "k_mean", "gamma"))
        predicted = (alpha * k + 1) / (k * gamma + 1) if None not in (alpha, k, gamma) else None
        ar = groups.get((c, "ar"))
        step = 1000 / statistics.fmean(r["tok_s"] for r in ar) if ar else None
        steps = {key: ms[key] / step if step else None for key in ("draft_ms", "verify_ms", "index_ms")}
        d = steps["draft_ms"] / k if step and k else None
        even = (k * d + steps["verify_ms"] + steps["index_ms"] - 1) / k if d is not None else None
        lines.append(f"| {ctx_label(c)} | {method} | {ms['draft_ms']:.1f} | {ms['verify_ms']:.1f} | "
                     f"{ms['index_ms']:.1f} | {ms['other_ms']:.1f} | {_fmt(d)} | {_fmt(steps['verify_ms'])} | "
                     f"{_fmt(steps['index_ms'])} | {_fmt(alpha)} | {_fmt(even)} | "
                     f"{_fmt(_mean(r.get('tau') for r in rs))} | {mean_std([r.get('vs_ar') for r in rs])} | "
                     f"{_fmt(predicted)} |")
    return "\n".join(lines)


def bench_spread(report: dict) -> str:
    """Per (ctx, method): the ratio against ar, α and τ, mean ± std over samples."""
    lines = ["| ctx | method | samples | × our ar | α | τ |", "|---|---|---|---|---|---|"]
    for (c, method), rs in _groups(report).items():
        lines.append(f"| {ctx_label(c)} | {method} | {len(rs)} | {mean_std([r.get('vs_ar') for r in rs])} | "
                     f"{mean_std([r.get('acceptance') for r in rs])} | {mean_std([r.get('tau') for r in rs])} |")
    return "\n".join(lines)


def bench_quarters(report: dict) -> str:
    """Acceptance in each quarter of the output, and ar's distinct-token share there ("" if none)."""
    groups = _groups(report)
    keys = [key for key, rs in groups.items() if any(r.get("acceptance_quarters") for r in rs)]
    if not keys:
        return ""
    lines = ["A round counts in the quarter where its first token falls; mean ± std over samples. The `ar` rows "
             "give the share of distinct tokens in each quarter of ar's own output: near 0.05 the greedy text is a "
             "loop, which any drafter predicts, so a high α there says nothing about long outputs of real text.", "",
             "| ctx | method | 1st | 2nd | 3rd | 4th |", "|---|---|---|---|---|---|"]
    for c in dict.fromkeys(c for c, _ in keys):
        ar = [r["output_ids"] for r in groups.get((c, "ar"), []) if r.get("output_ids")]
        if ar:
            shares = [distinct_by_part(ids, 4) for ids in ar]
            lines.append(f"| {ctx_label(c)} | ar (distinct-token share) | "
                         + " | ".join(mean_std([d[i] for d in shares]) for i in range(4)) + " |")
        for _, method in [k for k in keys if k[0] == c]:
            qs = [r["acceptance_quarters"] for r in groups[(c, method)] if r.get("acceptance_quarters")]
            lines.append(f"| {ctx_label(c)} | {method} | " + " | ".join(mean_std([q[i] for q in qs]) for i in range(4))
                         + " |")
    return "\n".join(lines)


def bench_pivot(report: dict) -> str:
    """One row per method, one column per ctx: decode speed as a multiple of our ar (mean ± std over
    samples), with ar's and HF generate()'s own tokens/s on top; the shortest summary of a report."""
    ctxs = sorted({r["ctx"] for r in report["rows"]})
    groups = _groups(report)
    methods = list(dict.fromkeys(r["method"] for r in report["rows"]))
    head = "| method | " + " | ".join(ctx_label(c) for c in ctxs) + " | same as ar |"
    lines = [head, "|---|" + "---|" * len(ctxs) + "---|"]
    for method in methods:
        cells, same = [], []
        for c in ctxs:
            rs = groups.get((c, method), [])
            if not rs:
                cells.append("—")
                continue
            same.append(_same(rs, "ar"))
            if method == "ar":
                cells.append(f"{statistics.fmean(r['tok_s'] for r in rs):.1f} tok/s")
            else:
                cells.append(mean_std([r.get("vs_ar") for r in rs]) + "×")
        verdict = "NO" if "NO" in same else "yes" if same and all(s == "yes" for s in same) else "—"
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def bench_markdown(report: dict) -> str:
    """Everything a bench run measured (what scripts/bench.py prints and writes with --write)."""
    parts = [f"Command: `{report['command']}`", bench_machine(report), bench_speed(report)]
    if max(len(rs) for rs in _groups(report).values()) > 1:
        parts.append("Spread over samples (every ratio against ar on the same sample):\n\n" + bench_spread(report))
    parts += [bench_quarters(report), bench_split(report)]
    return "\n\n".join(p for p in parts if p)


def bench_plot(report: dict, path: Path) -> None:
    """Decode tokens/s against context per method (mean over samples, error bar: repeat std), and
    ar's bandwidth floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        pts = sorted({r["ctx"] for r in rows if r["method"] == method})
        ys = [statistics.fmean(r["tok_s"] for r in rows if r["method"] == method and r["ctx"] == c) for c in pts]
        es = [statistics.fmean(r["tok_s_std"] for r in rows if r["method"] == method and r["ctx"] == c) for c in pts]
        ax.errorbar(pts, ys, yerr=es, marker="o", ls="--" if method in HF_METHODS else "-", label=method,
                    color=f"C{i % 10}")
    floors = sorted({(r["ctx"], r["floor_tok_s"]) for r in rows if r["method"] == "ar"})
    ax.plot([c for c, _ in floors], [f for _, f in floors], color="grey", lw=3, alpha=0.4, label="bandwidth floor (ar)")
    ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="decode tokens/s")
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ctxs = sorted({r["ctx"] for r in rows})
    ax.set_xticks(ctxs, [ctx_label(c) for c in ctxs])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ticks = [t for t in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
             if min(r["tok_s"] for r in rows) / 1.5 <= t <= max(r["floor_tok_s"] for r in rows) * 1.5]
    ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def save_png(fig, path: Path) -> None:
    """Write a figure so that the same numbers give the same bytes (no timestamp, no version)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110, metadata={"Software": None})
    tmp.replace(path)


# -- evaluate.py runs -----------------------------------------------------------------------------


def _by(rows: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[tuple(r.get(k) for k in keys)].append(r)
    return dict(out)


def _sort_key(key: tuple) -> tuple:
    return tuple((0, v) if isinstance(v, int | float) else (1, str(v)) for v in key)


def task_table(rows: list[dict]) -> str:
    """One row per (task, ctx) of a benchmark: ar's task score and speed, then each method's speed as a
    multiple of ar's with its α and τ, and whether every method's outputs (and so its score) are ar's."""
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
            cells.append(f"{mean_std([r.get('speedup') for r in mine])} ({_fmt(_mean(r.get('acceptance_rate') for r in mine))}, "
                         f"{_fmt(_mean(r.get('mean_accepted_tokens') for r in mine))})")
            same += [r.get("exact_match_ar") is True and r.get("score") == ar[r["sample_id"]].get("score")
                     for r in mine if r["sample_id"] in ar]
        verdict = ("yes" if all(same) else f"NO ({same.count(False)} of {len(same)})") if same else "—"
        lines.append(f"| {task or '—'} | {ctx_label(ctx)} | {len(ar_rows)} | {score} | {tok_s:.2f} | "
                     + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def sampling_table(rows: list[dict]) -> str:
    """Sampled runs over several seeds: each method's speed against ar on the same prompt and seed,
    its acceptance overall and by quarter of the output, and ar's distinct-token share by quarter."""
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
    from sparsespec.decoding.engine import GenerationResult

    res = GenerationResult(output_ids=row["output_ids"], prompt_tokens=row["prompt_tokens"], prefill_s=0.0,
                           wall_s=1.0, rounds=list(zip(row["drafted_per_round"], row["accepted_per_round"], strict=True)))
    return res.acceptance_by_part(4) or [None] * 4


# -- train.py runs --------------------------------------------------------------------------------


def train_metrics(summary: dict) -> str:
    """A training run's validation metrics before and after training (its metrics.json)."""
    final, untrained = summary["final"], summary.get("untrained") or {}
    keys = sorted(k for k in final if k.startswith("val/"))
    lines = [f"{summary['global_step']} steps in {summary['seconds'] / 60:.1f} min (teacher pass included: "
             f"{summary.get('teacher_shards_computed', 0)} shards computed). Teacher-forced on the held-out windows.", "",
             "| metric | untrained | trained |", "|---|---|---|"]
    for k in keys:
        before = untrained.get(k)
        lines.append(f"| `{k}` | {_fmt(before, '{:.3f}')} | {final[k]:.3f} |")
    return "\n".join(lines)
