"""SparseSpec-L's entropy controller against fixed draft lengths and a hindsight oracle, greedy and
sampled, with its calibration by entropy bin and a test of the independence its acceptance model
assumes.

    python -m sparsespec.experiments entropy_controller --ctx 4k,16k,32k --out results/controller.json

Per context and decoding mode (greedy, sampled), on each held-out window and from one shared prefill:
ar, sparsespec_l at each fixed k and at k_max, and sparsespec_l with its entropy controller (the
default candidate lengths, and a set that reaches small k). Every run decodes the same number of
tokens; speedups are ar's decoding time over the run's on the same window.

The oracle: the k_max run's rounds, each charged as if it had drafted exactly the drafts it had
accepted (k = accepted; 0 = a plain target step). Under greedy decoding such a round emits the same
tokens (the target's token after the last accepted draft is the one that replaced the rejected
draft), so the oracle decodes the run's output in sum_r T(k_r), where T(k) is the time of a round of
k drafts measured by the fixed-k runs on the same window (interpolated between the measured k; T(0)
is ar's step). It is the best any controller can do on those round boundaries, knowing the future.
Under sampling, a round cut at its last accepted draft would draw its final token from the target
rather than from the residual distribution; the charge is the same, the tokens may differ.

Independence: in the k_max run, the share of rounds whose draft i is accepted given draft i-1 was
(i = 1: the first draft's rate). A controller that multiplies per-token estimates assumes these
rates are those of the tokens alone; rates that rise with i mean acceptances come in runs.
Each finished (window, mode) is kept beside --out; `--resume` picks a stopped run up there.
`markdown` and `plot` render a saved report (no torch needed); docs/benchmarks.md shows them.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

from sparsespec.eval.summary import ctx_label
from sparsespec.experiments import ExperimentError, int_list
from sparsespec.experiments.common.figures import pyplot, save_png

MODES = {"greedy": 0.0, "sampled": 1.0}  # temperature
log = logging.getLogger(__name__)
OPTIONS = {"ctx": "4k,16k,32k", "new_tokens": 96, "books": 2, "model": None, "data": None}
RESUME = ("ctx", "ks", "k_max", "small", "new_tokens", "data", "model")


def arguments(p) -> None:
    p.add_argument("--ks", default="1,2,4,8", help="fixed draft lengths")
    p.add_argument("--k-max", type=int, default=16, help="the oracle's round length (also run as a fixed k)")
    p.add_argument("--small", default="1,2,4,8,12,16", help="the entropy controller's candidates that reach small k")


def check(args) -> None:
    args.ks, args.small = int_list("ks", args.ks), int_list("small", args.small)
    if min(args.ks + args.small) < 1 or max(args.ks) > args.k_max or args.new_tokens < 8:
        raise ExperimentError("--ks and --small take positive lengths, --ks at most --k-max; --new-tokens at least 8")


def specs(ks: list[int], k_max: int, small: list[int]) -> dict[str, str]:
    """label -> method spec (timing.our_method): ar, each fixed k and k_max, the entropy controller
    with its default candidates and with `small` ones."""
    fixed = sorted({*ks, k_max})
    return {"ar": "ar", **{f"k={k}": f"sparsespec_l:controller=fixed:k={k}" for k in fixed},
            "entropy": "sparsespec_l",
            "entropy, small k": "sparsespec_l:candidates=[" + ",".join(map(str, sorted(small))) + "]"}


def run(method, target, prompt: list[int], n: int, shared, temperature: float, seed: int) -> dict:
    """One run from the shared cache (cropped back after): time, rounds and the controller's report."""
    from sparsespec.decoding.sampling import Sampling
    from sparsespec.experiments.common.runner import decode

    res = decode(method.build(target), prompt, n, shared, sampling=Sampling(temperature=temperature), seed=seed)
    out = {"output_ids": res.output_ids, "wall_s": res.wall_s, "rounds": [list(r) for r in res.rounds]}
    if res.drafted:
        out.update(alpha=res.acceptance_rate, gamma=res.gamma, k_mean=res.drafted / len(res.rounds))
    for key in ("calibration", "calibration_bins", "prefix_acceptance"):
        if key in res.extra:
            out[key] = res.extra[key]
    return out


def round_cost(per_round: dict[int, float], ar_step: float):
    """T(k): seconds of a round of k drafts, linear between the measured k (T(0) = ar's step)."""
    points = sorted({0: ar_step, **per_round}.items())

    def cost(k: int) -> float:
        for (k0, t0), (k1, t1) in zip(points, points[1:], strict=False):
            if k <= k1:
                return t0 + (t1 - t0) * (k - k0) / (k1 - k0)
        raise ValueError(f"k={k} beyond the measured {points[-1][0]}")

    return cost


def oracle(rounds: list[list[int]], cost) -> dict:
    """The hindsight oracle on these (drafted, accepted) rounds: its time and mean draft length."""
    ks = [a for _, a in rounds]
    return {"wall_s": sum(cost(k) for k in ks), "k_mean": statistics.fmean(ks)}


def conditional(rounds: list[list[int]], k_max: int) -> list[float | None]:
    """P(draft i accepted | draft i-1 accepted) for i = 1..k_max, over rounds that drafted i."""
    out = []
    for i in range(1, k_max + 1):
        reached = [a for d, a in rounds if d >= i and a >= i - 1]
        out.append(sum(a >= i for a in reached) / len(reached) if reached else None)
    return out


def window_rows(runs: dict[str, dict], ctx: int, sample: str, mode: str, k_max: int, new_tokens: int) -> list[dict]:
    """Rows of one window and mode: each run against ar, then the oracle."""
    ar = runs["ar"]
    per_round = {int(label[2:]): r["wall_s"] / len(r["rounds"]) for label, r in runs.items() if label.startswith("k=")}
    cost = round_cost(per_round, ar["wall_s"] / (new_tokens - 1))
    rows = []
    for label, r in runs.items():
        row = {"ctx": ctx, "sample": sample, "mode": mode, "method": label, "wall_s": r["wall_s"],
               "speedup": ar["wall_s"] / r["wall_s"], "identical_ar": r["output_ids"] == ar["output_ids"],
               **{k: v for k, v in r.items() if k not in ("output_ids", "wall_s", "rounds")}}
        if label == f"k={k_max}":
            row["conditional"] = conditional(r["rounds"], k_max)
        rows.append(row)
    best = oracle(runs[f"k={k_max}"]["rounds"], cost)
    rows.append({"ctx": ctx, "sample": sample, "mode": mode, "method": "oracle", "wall_s": best["wall_s"],
                 "speedup": ar["wall_s"] / best["wall_s"], "k_mean": best["k_mean"],
                 "round_s": {str(k): t for k, t in sorted(per_round.items())}})
    return rows


def measure(args, checkpoint) -> dict:
    """{k_max, rows}: window_rows for every held-out window, context and mode."""
    from sparsespec.experiments.common.agreement import book_title, held_out_samples
    from sparsespec.experiments.common.runner import our_method, prefill_once
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    say = log.info
    ks, k_max, small, new_tokens = args.ks, args.k_max, args.small, args.new_tokens
    labels = specs(ks, k_max, small)
    rows = []
    for ctx in args.ctx:
        loaded = load_model(args.model, "float32", ctx=ctx + new_tokens, device="cpu")
        target = CausalLM(loaded.model)
        methods = {label: our_method(spec) for label, spec in labels.items()}
        for sample in held_out_samples(loaded.tokenizer, ctx, args.books, args.data):
            title = book_title(sample)
            todo = [m for m in MODES if not checkpoint.rows(ctx, f"{title}/{m}", [*labels, "oracle"])]
            rows += [r for m in MODES for r in checkpoint.rows(ctx, f"{title}/{m}", [*labels, "oracle"])]
            if not todo:
                continue
            shared, prefill_s = prefill_once(target, sample, new_tokens)
            say(f"ctx {ctx_label(ctx)} {title}: prefill {prefill_s:.0f} s")
            run(methods["ar"], target, sample.prompt_ids, 8, shared, 0.0, 0)  # warm-up, not timed
            for mode in todo:
                t0 = time.perf_counter()
                runs = {label: run(m, target, sample.prompt_ids, new_tokens, shared, MODES[mode], 0)
                        for label, m in methods.items()}
                got = window_rows(runs, ctx, f"{title}/{mode}", mode, k_max, new_tokens)
                if mode == "greedy" and not all(r.get("identical_ar", True) for r in got):
                    raise ExperimentError(f"ctx {ctx} {title}: a greedy run differs from ar")
                checkpoint.add(got)
                rows += got
                say(f"ctx {ctx_label(ctx)} {title} {mode} ({time.perf_counter() - t0:.0f} s): " + ", ".join(
                    f"{r['method']} {r['speedup']:.2f}x" for r in got if r["method"] != "ar"))
            del shared
    return {"k_max": k_max, "ks": ks, "small": small, "new_tokens": new_tokens, "rows": rows}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _groups(report: dict) -> dict[tuple[int, str, str], list[dict]]:
    groups: dict[tuple[int, str, str], list[dict]] = {}
    for r in report["rows"]:
        groups.setdefault((r["ctx"], r["mode"], r["method"]), []).append(r)
    return groups


def markdown(report: dict) -> str:
    groups = _groups(report)
    ctxs = sorted({c for c, _, _ in groups})
    methods = list(dict.fromkeys(m for _, _, m in groups if m != "ar"))
    n_win = len(groups[(ctxs[0], "greedy", "ar")])
    lines = [f"{n_win} held-out window(s) per context, {report['new_tokens']} tokens each; speedup over ar on the "
             "same window (mean ± std over windows); α accepted / drafted, k the mean draft length.", "",
             "| ctx | mode | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for c in ctxs:
        for mode in MODES:
            cells = []
            for m in methods:
                rs = groups.get((c, mode, m), [])
                if not rs:
                    cells.append("")
                    continue
                s, sd = _mean_std([r["speedup"] for r in rs])
                k = statistics.fmean(r["k_mean"] for r in rs)
                alpha = f", α {statistics.fmean(r['alpha'] for r in rs):.2f}" if "alpha" in rs[0] else ""
                cells.append(f"{s:.2f} ± {sd:.2f} (k {k:.1f}{alpha})")
            lines.append(f"| {ctx_label(c)} | {mode} | " + " | ".join(cells) + " |")
    lines += ["", "The entropy controller's calibration: predicted (p(H)) and observed acceptance of its labelled "
              "draft tokens by entropy bin, pooled over windows (default candidates).", ""]
    bins = None
    for c in ctxs:
        for mode in MODES:
            pooled = _pool_bins([r["calibration_bins"] for r in groups.get((c, mode, "entropy"), [])])
            if bins is None:
                bins = [f"H {b['lo']:g}–{b['hi']:g}" if b["hi"] is not None else f"H ≥ {b['lo']:g}" for b in pooled]
                lines += ["| ctx | mode | " + " | ".join(bins) + " |", "|---|---|" + "---|" * len(bins)]
            lines.append(f"| {ctx_label(c)} | {mode} | " + " | ".join(
                f"{b['predicted']:.2f} / {b['observed']:.2f} (n {b['n']})" if b["n"] else "" for b in pooled) + " |")
    k_max = report["k_max"]
    depths = [i for i in (1, 2, 3, 4, 8, 16) if i <= k_max]
    lines += ["", f"Independence: in the k = {k_max} runs, P(draft i accepted | draft i−1 accepted), mean over "
              "windows (i = 1: the first draft's rate).", "",
              "| ctx | mode | " + " | ".join(f"i = {i}" for i in depths) + " |", "|---|---|" + "---|" * len(depths)]
    for c in ctxs:
        for mode in MODES:
            rs = groups.get((c, mode, f"k={k_max}"), [])
            cells = []
            for i in depths:
                vals = [r["conditional"][i - 1] for r in rs if r["conditional"][i - 1] is not None]
                cells.append(f"{statistics.fmean(vals):.2f}" if vals else "")
            lines.append(f"| {ctx_label(c)} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pool_bins(per_run: list[list[dict]]) -> list[dict]:
    pooled = [{**b, "predicted": 0.0, "observed": 0.0, "n": 0} for b in per_run[0]]
    for bins in per_run:
        for p, b in zip(pooled, bins, strict=True):
            p["predicted"] += b["predicted"] * b["n"]
            p["observed"] += b["observed"] * b["n"]
            p["n"] += b["n"]
    for p in pooled:
        if p["n"]:
            p["predicted"] /= p["n"]
            p["observed"] /= p["n"]
    return pooled


def plot(report: dict, path: Path) -> None:
    """Speedup over ar against context per method, one panel per mode."""
    plt = pyplot()
    groups = _groups(report)
    ctxs = sorted({c for c, _, _ in groups})
    methods = list(dict.fromkeys(m for _, _, m in groups if m != "ar"))
    fig, axes = plt.subplots(1, len(MODES), figsize=(10, 4), sharey=True)
    for ax, mode in zip(axes, MODES, strict=True):
        for m in methods:
            pts = [(i, _mean_std([r["speedup"] for r in groups[(c, mode, m)]])) for i, c in enumerate(ctxs)
                   if (c, mode, m) in groups]
            style = {"oracle": dict(color="k", ls="--"), "entropy": dict(color="C6", lw=2.5),
                     "entropy, small k": dict(color="C6", ls=":", lw=2.5)}.get(m, {})
            ax.errorbar([p[0] for p in pts], [p[1][0] for p in pts], yerr=[p[1][1] for p in pts], marker="o",
                        ms=3, capsize=2, label=m, **style)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(ctxs)), [ctx_label(c) for c in ctxs])
        ax.set(title=f"sparsespec_l, {mode}", xlabel="context")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup over ar")
    axes[-1].legend(fontsize=7)
    save_png(fig, path)
