"""scripts/bench.py's report (its --json) as markdown tables and a plot: decode speed per ctx and
method against HF generate() and our ar, the bandwidth floor, where a round's time goes, the spread
over samples and the acceptance by quarter of the output."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from sparsespec.eval.summary import ctx_label, distinct_by_part
from sparsespec.provenance import provenance_line
from sparsespec.reports import ReportError
from sparsespec.reports.cells import fmt, mean, mean_std
from sparsespec.reports.figures import pyplot, save_png
from sparsespec.reports.sections import write_section

HF_METHODS = ("hf", "hf_assisted", "hf_lookup")  # run by Hugging Face's generate(), not our engine


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


def _ratio(groups: dict, ctx: int, method: str, ref: str, reps: int) -> str:
    """`method`'s speed as a multiple of `ref`'s at `ctx`: mean ± std over samples, or with one sample
    and several timed runs, ± the spread propagated from both methods' run-to-run std."""
    rs, peers = groups.get((ctx, method), []), groups.get((ctx, ref), [])
    if len(rs) != 1 or len(peers) != 1 or reps < 2:
        return mean_std([r.get(f"vs_{ref}") for r in rs])
    a, b = rs[0], peers[0]
    ratio = a["tok_s"] / b["tok_s"]
    return f"{ratio:.2f} ± {ratio * math.hypot(a['tok_s_std'] / a['tok_s'], b['tok_s_std'] / b['tok_s']):.2f}"


def speed_table(report: dict, ctx: int | None = None) -> str:
    """Decode speed per (ctx, method): tokens/s, the ratios against HF generate() and our ar on the
    same prompt, acceptance and draft cost, and whether the greedy output was ar's."""
    reps = _repeats(report)
    samples = max(len(rs) for rs in _groups(report).values())
    spread = []
    if reps > 1:
        spread.append(f"tokens/s: mean over samples of {reps} timed runs each, ± the std over those runs")
    if samples > 1:
        spread.append(f"ratios, α and τ: mean ± std over the {samples} samples, each against ar on its own prompt")
    elif reps > 1:
        spread.append("ratios: ± the spread of both methods' runs, propagated")
    lines = (["" + "; ".join(spread) + ".", ""] if spread else []) + [
        "| ctx | method | decode tok/s | × HF generate | × our ar | α | τ | γ | k | same as ar |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    groups = _groups(report)
    for (c, method), rs in _groups(report, ctx).items():
        tok = statistics.fmean(r["tok_s"] for r in rs)
        std = statistics.fmean(r["tok_s_std"] for r in rs)
        speed = f"{tok:.2f} ± {std:.2f}" if reps > 1 else f"{tok:.2f}"
        ar = "1.00" if method == "ar" else _ratio(groups, c, method, "ar", reps)
        hf = "1.00" if method == "hf" else _ratio(groups, c, method, "hf", reps)  # itself: no spread
        cells = [ctx_label(c), method, speed, hf, ar, mean_std([r.get("acceptance") for r in rs]),
                 mean_std([r.get("tau") for r in rs]), fmt(mean(r.get("gamma") for r in rs), "{:.3f}"),
                 fmt(mean(r.get("k_mean") for r in rs), "{:.1f}"), _same(rs, "ar")]
        lines.append(_row(cells))
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def machine_table(report: dict) -> str:
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
                     f"{fmt(mean(r.get('hf_prefill_s') for r in rs), '{:.1f}')} | {peak:.1f} |")
    return "\n".join(lines)


def split_table(report: dict) -> str:
    """Where a speculative round's time goes, in ms and in ar steps, the acceptance at which a round
    pays for itself, and what the speedup identity predicts from the same run's α, k and γ beside
    the measured ratio."""
    lines = ["ms per round, mean over samples: drafting all its tokens, the verification pass, the recall-index "
             "update, and the rest (sampling, bookkeeping, Python). In ar steps (1 / ar's tokens/s at that ctx): "
             "one draft token, the verification pass, and the index update. Break-even α: the acceptance at "
             "which a round of this k costs what its tokens cost ar, (k·draft + verify + index − 1) / k in ar "
             "steps. Predicted: S = (αk + 1) / (kγ + 1) from the row's own α, k and γ (γ: a draft step over a "
             "verification pass; the identity counts a round in verification passes and leaves the index update "
             "out). If verify = 1 step: the row's tokens a round over its measured drafts, one ar step of "
             "verification and its index update, (tokens / round) / (k·draft + 1 + index) in ar steps; and the "
             "same without the index update.", "",
             "| ctx | method | draft | verify | index update | other | draft token (ar steps) | verify (ar steps) "
             "| index (ar steps) | α | break-even α | tokens / round | × our ar | predicted | if verify = 1 step "
             "| … and no index update |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups = _groups(report)
    for (c, method), rs in groups.items():
        if not any(r.get("draft_ms") is not None for r in rs):
            continue
        ms = {k: statistics.fmean(r[k] for r in rs if r.get(k) is not None)
              for k in ("draft_ms", "verify_ms", "index_ms", "other_ms")}
        alpha, k, gamma = (mean(r.get(key) for r in rs) for key in ("acceptance", "k_mean", "gamma"))
        predicted = (alpha * k + 1) / (k * gamma + 1) if None not in (alpha, k, gamma) else None
        ar = groups.get((c, "ar"))
        step = 1000 / statistics.fmean(r["tok_s"] for r in ar) if ar else None
        steps = {key: ms[key] / step if step else None for key in ("draft_ms", "verify_ms", "index_ms")}
        d = steps["draft_ms"] / k if step and k else None
        even = (k * d + steps["verify_ms"] + steps["index_ms"] - 1) / k if d is not None else None
        tau = mean(r.get("tau") for r in rs)
        one_step = tau / (k * d + 1 + steps["index_ms"]) if d is not None and tau is not None else None
        no_index = tau / (k * d + 1) if d is not None and tau is not None else None
        cells = [ctx_label(c), method, *(f"{ms[key]:.1f}" for key in ("draft_ms", "verify_ms", "index_ms", "other_ms")),
                 fmt(d), fmt(steps["verify_ms"]), fmt(steps["index_ms"]), fmt(alpha), fmt(even),
                 fmt(tau), mean_std([r.get("vs_ar") for r in rs]), fmt(predicted), fmt(one_step), fmt(no_index)]
        lines.append(_row(cells))
    return "\n".join(lines)


def kernel_table(report: dict, suffix: str = ":attention=pytorch") -> str:
    """What a switch gives each method: its tokens/s over the same method's with `suffix` (by default
    the CPU attention kernel against PyTorch's attention), per ctx, from the same run."""
    groups = _groups(report)
    ctxs = sorted({c for c, _ in groups})
    bases = [m for m in dict.fromkeys(m for _, m in groups) if any((c, m + suffix) in groups for c in ctxs)]
    if not bases:
        raise ReportError(f"no method of this report has a '{suffix}' run beside it")
    lines = [f"tokens/s of each method over its own `{suffix.lstrip(':')}` run, same prompt, same process "
             f"(mean over samples of {_repeats(report)} timed run(s) each).", "",
             "| ctx | " + " | ".join(bases) + " |", "|---|" + "---|" * len(bases)]
    for c in ctxs:
        cells = []
        for m in bases:
            a, b = groups.get((c, m)), groups.get((c, m + suffix))
            cells.append(f"{statistics.fmean(r['tok_s'] for r in a) / statistics.fmean(r['tok_s'] for r in b):.2f}×"
                         if a and b else "—")
        lines.append(f"| {ctx_label(c)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread_table(report: dict) -> str:
    """Per (ctx, method): the ratio against ar, α and τ, mean ± std over samples."""
    lines = ["| ctx | method | samples | × our ar | α | τ |", "|---|---|---|---|---|---|"]
    for (c, method), rs in _groups(report).items():
        lines.append(f"| {ctx_label(c)} | {method} | {len(rs)} | {mean_std([r.get('vs_ar') for r in rs])} | "
                     f"{mean_std([r.get('acceptance') for r in rs])} | {mean_std([r.get('tau') for r in rs])} |")
    return "\n".join(lines)


def quarters_table(report: dict) -> str:
    """Acceptance in each quarter of the output, and ar's distinct-token share there ("" if none)."""
    groups = _groups(report)
    keys = [key for key, rs in groups.items() if any(r.get("acceptance_quarters") for r in rs)]
    if not keys:
        return ""
    args = report.get("args") or {}
    samples = max(len(groups[k]) for k in keys)
    made = (f"Quarters of the {args['new_tokens']} generated tokens, {samples} sample(s) per ctx"
            f"{'' if samples > 1 else ' (no spread)'}. " if args.get("new_tokens") else "")
    lines = [made + "A round counts in the quarter where its first token falls; mean ± std over samples. The `ar` rows "
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


def pivot_table(report: dict, methods: str | None = None) -> str:
    """One row per method (`methods`: only these, comma-separated), one column per ctx: decode speed
    as a multiple of our ar (mean ± std over samples), with ar's own tokens/s on top; the shortest
    summary of a report."""
    ctxs = sorted({r["ctx"] for r in report["rows"]})
    groups = _groups(report)
    every = list(dict.fromkeys(r["method"] for r in report["rows"]))
    if methods is not None:
        unknown = [m for m in methods.split(",") if m not in every]
        if unknown:
            raise ReportError(f"methods={','.join(unknown)}: not in this report (it has {', '.join(every)})")
    methods = every if methods is None else methods.split(",")
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
                cells.append(_ratio(groups, c, method, "ar", _repeats(report)) + "×")
        verdict = "NO" if "NO" in same else "yes" if same and all(s == "yes" for s in same) else "—"
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    """Everything a bench run measured (what scripts/bench.py prints and writes with --write)."""
    parts = [f"Command: `{report['command']}`", machine_table(report), speed_table(report)]
    if max(len(rs) for rs in _groups(report).values()) > 1:
        parts.append("Spread over samples (every ratio against ar on the same sample):\n\n" + spread_table(report))
    parts += [quarters_table(report), split_table(report), provenance_line(report)]
    return "\n\n".join(p for p in parts if p)


def plot(report: dict, path: Path) -> None:
    """Decode tokens/s against context per method (mean over samples, error bar: repeat std), and
    ar's bandwidth floor."""
    plt = pyplot()
    from matplotlib.ticker import NullLocator

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
    ax.xaxis.set_minor_locator(NullLocator())
    ctxs = sorted({r["ctx"] for r in rows})
    ax.set_xticks(ctxs, [ctx_label(c) for c in ctxs])
    ax.yaxis.set_minor_locator(NullLocator())
    ticks = [t for t in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
             if min(r["tok_s"] for r in rows) / 1.5 <= t <= max(r["floor_tok_s"] for r in rows) * 1.5]
    ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.legend(fontsize=7, ncol=2)
    save_png(fig, path)


def publish(report: dict, write: Path | None = None, name: str = "decode", png: Path | None = None) -> str:
    """The report's markdown, also put in `write`'s section `name` and drawn to `png` where given:
    a fresh run and a re-rendered saved report publish alike."""
    table = markdown(report)
    if write is not None:
        write_section(write, name, table)
    if png is not None:
        plot(report, png)
    return table
