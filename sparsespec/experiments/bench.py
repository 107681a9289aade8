"""Side-by-side decoding benchmark: Hugging Face generate / assisted / prompt lookup vs this
project's methods, in one process, on the same prompts.

    python -m sparsespec.experiments bench --ctx 4k,8k,16k,32k --new-tokens 128 --repeats 3 --out results/decode.json

Protocol (docs/benchmarks.md repeats it next to the numbers):
- prompts: windows of `--ctx` tokens from PG-19 books (the six shipped with the package by default);
- our methods: the target cache is prefilled once per prompt (all but the last 64 tokens) and
  reused, so a run times its decoding only: decode tok/s = (new_tokens - 1) / wall_s;
- HF `generate()`: given the same prefilled cache as a DynamicCache (it runs the last 64 prompt
  tokens itself), decode tok/s = (N - 1) / (t(N) - t(1)): the first token, produced by the
  prefill, is excluded on both sides;
- HF assisted / prompt lookup (which re-prefill their own state): (N - 1) / (t(N) - t(1)) with a
  full prefill in both calls, only at ctx <= --hf-full-max (their prefills dominate the run);
- bandwidth floor: (weight bytes + KV bytes read per token) / the read bandwidth measured here;
- peak memory: the process' peak RSS so far (monotone over the run);
- each method on each prompt: --warmup untimed runs of --warmup-tokens, then --repeats timed runs;
- each finished prompt is checkpointed beside --out; `--resume` picks a stopped run up there.
Every speculative method's greedy output is compared with our ar and with HF generate. The tables:
decode speed per ctx and method against HF generate() and our ar, the bandwidth floor, where a
round's time goes, the spread over samples and the acceptance by quarter of the output.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from sparsespec.eval.summary import ctx_label, distinct_by_part
from sparsespec.experiments import ExperimentError
from sparsespec.experiments.common.cells import fmt, mean, mean_std
from sparsespec.experiments.common.figures import pyplot, save_png
from sparsespec.provenance import provenance_line

log = logging.getLogger(__name__)
HF_METHODS = ("hf", "hf_assisted", "hf_lookup")  # run by Hugging Face's generate(), not our engine
REPREFILLING = ("hf_assisted", "hf_lookup")  # keep their own state: their prefill dominates a long run

OPTIONS = {"ctx": "4k,8k,16k,32k", "new_tokens": 128, "repeats": 3, "books": 1, "model": None, "dtype": "float32",
           "data": None}
# the settings a resumed run must share with the run that wrote its checkpoint
RESUME = ("new_tokens", "model", "dtype", "drafter", "data", "split", "repeats", "warmup", "warmup_tokens")


def arguments(p) -> None:
    p.add_argument("--methods", default="hf,hf_assisted,hf_lookup,ar,sd,magicdec,sparsespec_l,budgetdraft",
                   help="comma-separated; a method may carry overrides: sparsespec_l:controller=fixed:k=8")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each method before its repeats, each "
                   "decoding --warmup-tokens (threads, allocator and kernels warm up; the tokens are not needed)")
    p.add_argument("--warmup-tokens", type=int, default=32)
    p.add_argument("--drafter", default=None,
                   help="drafter for sd / budgetdraft / hf_assisted (default: latest train.py export)")
    p.add_argument("--split", default="test", choices=("test", "train", "eval"),
                   help="PG-19 books: test = all, eval = the 2 held out from drafter training (use it when a "
                        "trained drafter runs: its training windows start where these prompts do)")
    p.add_argument("--hf-full-max", default="8k", help="largest ctx for HF assisted / prompt lookup")


def check(args) -> None:
    from sparsespec.experiments.driver import contexts

    args.methods = [s for s in args.methods.split(",") if s] if isinstance(args.methods, str) else args.methods
    args.hf_full_max = contexts(args.hf_full_max)[0] if isinstance(args.hf_full_max, str) else args.hf_full_max


def _methods_at(args, ctx: int) -> list[str]:
    return [s for s in args.methods if not (s in REPREFILLING and ctx > args.hf_full_max)]


def _drafter_path(args, ours: dict):
    """The drafter directory the methods need (None where none needs one)."""
    if not any(m.needs_drafter_model for m in ours.values()) and "hf_assisted" not in args.methods:
        return None
    if args.drafter is not None:
        return args.drafter
    from sparsespec.models.exports import latest_drafter_path

    path = latest_drafter_path()
    if path is None:
        raise ExperimentError("no drafter: pass --drafter DIR or run `python train.py budget=multi` first")
    return path


def _runner(spec: str, method, hf_models: tuple, our_models: tuple, prompt: list[int], shared) -> Callable[[int], dict]:
    """One run of `spec` decoding n tokens from the shared cache: HF's generate() for the HF methods
    (`hf_models`: target and drafter), else our engine (`our_models`)."""
    from sparsespec.experiments.common.hf import run_hf
    from sparsespec.experiments.common.runner import run_ours

    if spec in HF_METHODS:
        hf, drafter_hf = hf_models
        return lambda n: run_hf(spec, hf, drafter_hf, prompt, n, shared, hf.config)
    target, drafter = our_models
    return lambda n: run_ours(method, target, drafter, prompt, n, shared)


def measure(args, checkpoint) -> dict:
    """{bandwidth_gbs, weight_bytes, rows}: a row per (ctx, sample, method) with its decode rate
    (mean and std over the timed runs), the bandwidth floor, prefill times and the per-run stats,
    each compared with HF generate() and our ar on the same prompt."""
    from sparsespec.data import load_samples
    from sparsespec.experiments.common.hf import load_for_generate, prefill_seconds
    from sparsespec.experiments.common.probes import BandwidthFloor
    from sparsespec.experiments.common.runner import bench_row, compare, our_method, prefill_once, timed_runs
    from sparsespec.models.runner import CausalLM

    say = log.info
    ours = {s: our_method(s) for s in args.methods if s not in HF_METHODS}
    drafter_path = _drafter_path(args, ours)

    def models_for(ctx: int):
        return load_for_generate(args.model, args.dtype, ctx + args.new_tokens, drafter_path)

    hf, _, _ = load_for_generate(args.model, args.dtype, min(args.ctx) + args.new_tokens)
    floor = BandwidthFloor.measure(hf, CausalLM(hf))
    say(f"read bandwidth {floor.bandwidth_gbs:.1f} GB/s; weights {floor.weight_bytes / 1e6:.0f} MB; "
        f"KV {floor.kv_per_token / 1e3:.1f} KB/token")
    rows = []
    for ctx in args.ctx:
        hf, tok, drafter_hf = models_for(ctx)
        target, drafter = CausalLM(hf), CausalLM(drafter_hf) if drafter_hf is not None else None
        here = _methods_at(args, ctx)
        for sample in load_samples("pg19", tok, ctx, path=args.data, limit=args.books, split=args.split):
            done = checkpoint.rows(ctx, sample.sample_id, here)
            if done:
                say(f"ctx {ctx} {sample.sample_id}: resumed from {checkpoint.path}")
                rows += done
                continue
            prompt = sample.prompt_ids
            shared, prefill_s = prefill_once(target, sample, args.new_tokens)
            hf_prefill_s = prefill_seconds(hf, prompt[: shared.length]) if ctx <= args.hf_full_max else None
            say(f"ctx {ctx} {sample.sample_id}: prefill ours {prefill_s:.1f} s, HF "
                + (f"{hf_prefill_s:.1f} s" if hf_prefill_s else "-"))
            measured = {"floor_tok_s": floor.tok_s(len(prompt) + args.new_tokens // 2), "prefill_s": prefill_s,
                        "hf_prefill_s": hf_prefill_s}
            sample_rows = []
            for spec in here:
                run = _runner(spec, ours.get(spec), (hf, drafter_hf), (target, drafter), prompt, shared)
                runs = timed_runs(run, args.new_tokens, args.repeats, args.warmup, args.warmup_tokens)
                del run  # it holds the shared cache
                head = {"ctx": ctx, "sample": sample.sample_id, "method": spec, "prompt_tokens": len(prompt)}
                row = bench_row(head, runs, **measured)
                sample_rows.append(row)
                alpha = f"{row['acceptance']:.2f}" if row["acceptance"] is not None else "-"
                say(f"ctx {ctx} {spec:<28} {row['tok_s']:6.2f} ± {row['tok_s_std']:.2f} tok/s  α={alpha}")
            checkpoint.add(sample_rows)
            rows += sample_rows
            del shared  # free this prompt's cache before the next prefill
    compare(rows)
    return {"bandwidth_gbs": floor.bandwidth_gbs, "weight_bytes": floor.weight_bytes, "rows": rows}


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
        raise ExperimentError(f"no method of this report has a '{suffix}' run beside it")
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
            raise ExperimentError(f"methods={','.join(unknown)}: not in this report (it has {', '.join(every)})")
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
    """Everything a bench run measured."""
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

