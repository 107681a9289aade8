"""Efficiency inversion: sweep a fixed draft length k of a self-speculative method at one budget and
context, and compare the measured speedup with the speedup model S = (αk + 1) / (kγ + 1).

    python -m sparsespec.experiments inversion --ctx 16k --ratio 0.10 --ks 1,2,4,8,12,16,20 --plot inversion.png

Longer drafts pay γ per token but the share of them accepted falls; once the acceptance α of the
drafted tokens drops below γ a longer draft costs more than it returns, and the speedup turns
down. The plot marks the first k where α < γ. The entropy controller's run is shown for reference.
The methods take turns within each repeat on one shared prefill (common.runner)."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

from sparsespec.experiments import ExperimentError, int_list
from sparsespec.experiments.common.figures import pyplot, save_png

log = logging.getLogger(__name__)
OPTIONS = {"ctx": "16k", "new_tokens": 128, "repeats": 2, "books": 1, "model": None, "dtype": "float32", "data": None}


def arguments(p) -> None:
    p.add_argument("--ratio", type=float, default=0.10, help="the drafter's KV ratio (its policy's `ratio`)")
    p.add_argument("--method", default="sparsespec_l", help="self-speculative method whose k is swept")
    p.add_argument("--ks", default="1,2,4,8,12,16,20", help="fixed draft lengths")


def check(args) -> None:
    if len(args.ctx) != 1:
        raise ExperimentError(f"--ctx: one context length, got {len(args.ctx)}")
    args.ks = int_list("ks", args.ks)


def measure(args, checkpoint) -> dict:
    """{rows}: per sample and method (each fixed k, then the method's own controller) the speedup
    over ar and what the model predicts from the same runs."""
    from sparsespec.data import load_samples
    from sparsespec.experiments.common.runner import interleaved_runs, our_method, prefill_once
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    ctx = args.ctx[0]
    loaded = load_model(args.model, args.dtype, ctx=ctx + args.new_tokens)
    target = CausalLM(loaded.model)
    methods = {s: our_method(s) for s in sweep_specs(args.method, args.ks, args.ratio)}
    rows = []
    for sample in load_samples("pg19", loaded.tokenizer, ctx, path=args.data, limit=args.books):
        shared, prefill_s = prefill_once(target, sample, args.new_tokens)
        log.info("%s: prefill %.1f s", sample.sample_id, prefill_s)
        # the methods take turns within each repeat, so drift in machine load hits every k alike
        runs = interleaved_runs(methods, target, sample.prompt_ids, args.new_tokens, shared, args.repeats)
        for r in sweep_rows(sample.sample_id, runs):
            rows.append(r)
            log.info("%-40s k=%.1f α=%.2f γ=%.3f S=%.2f Ŝ=%.2f", r["method"], r["k"], r["alpha"], r["gamma"],
                     r["speedup"], r["predicted"])
    return {"rows": rows}


def sweep_specs(method: str, ks: list[int], ratio: float) -> list[str]:
    """ar, `method` at each fixed k, then `method` with its own controller, all at the KV `ratio`
    (method specs as timing.our_method reads them)."""
    return ["ar", *(f"{method}:controller=fixed:k={k}:ratio={ratio}" for k in ks), f"{method}:ratio={ratio}"]


def sweep_rows(sample_id: str, runs: dict[str, list[dict]]) -> list[dict]:
    """Per method other than ar, its speedup over ar (each repeat against ar's run in the same round)
    and the speedup the model predicts from the same runs' α, γ and k."""
    ar = [r["decode_s"] for r in runs["ar"]]
    rows = []
    for spec, rs in runs.items():
        if spec == "ar":
            continue
        speedups = [a / r["decode_s"] for a, r in zip(ar, rs, strict=True)]
        alpha = statistics.fmean(r["acceptance"] for r in rs)
        gamma = statistics.fmean(r["gamma"] for r in rs)
        k = statistics.fmean(r["k_mean"] for r in rs)
        rows.append({"sample": sample_id, "method": spec, "k": k, "fixed": "fixed" in spec,
                     "alpha": alpha, "gamma": gamma, "speedup": statistics.fmean(speedups),
                     "speedup_std": statistics.stdev(speedups) if len(speedups) > 1 else 0.0,
                     "predicted": (alpha * k + 1) / (k * gamma + 1)})
    return rows


def by_k(rows: list[dict]) -> list[dict]:
    """Mean over samples per swept k (fixed rows only), in k order."""
    ks = sorted({r["k"] for r in rows if r["fixed"]})
    out = []
    for k in ks:
        rs = [r for r in rows if r["fixed"] and r["k"] == k]
        out.append({key: statistics.fmean(r[key] for r in rs) for key in
                    ("k", "alpha", "gamma", "speedup", "speedup_std", "predicted")})
    return out


def _controller(rows: list[dict]) -> dict[str, float] | None:
    """The entropy controller's run (the rows whose k was not fixed), averaged over samples."""
    ctrl = [r for r in rows if not r["fixed"]]
    if not ctrl:
        return None
    return {key: statistics.fmean(r[key] for r in ctrl) for key in ("k", "alpha", "gamma", "speedup", "predicted")}


def plot(report: dict, path: Path) -> None:
    """Measured and predicted speedup against k (the controller as a star), and α and γ against k."""
    args, rows = report.get("args") or {}, report["rows"]
    ctx = args.get("ctx") or ["?"]
    title = f"{args.get('method', '?')}, ctx {ctx[0] if isinstance(ctx, list) else ctx}, ratio {args.get('ratio', '?')}"
    plt = pyplot()
    pts = by_k(rows)
    ks = [p["k"] for p in pts]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.errorbar(ks, [p["speedup"] for p in pts], yerr=[p["speedup_std"] for p in pts], marker="o", label="measured")
    a.plot(ks, [p["predicted"] for p in pts], marker="s", ls="--", label="(αk+1)/(kγ+1)")
    ctrl = _controller(rows)
    if ctrl:
        a.scatter([ctrl["k"]], [ctrl["speedup"]], marker="*", s=150, color="C3", label="entropy controller", zorder=3)
    a.axhline(1.0, color="grey", lw=0.8)
    a.set(xlabel="draft length k", ylabel="speedup over ar", title=title)
    a.legend()
    b.plot(ks, [p["alpha"] for p in pts], marker="o", label="α (accepted / drafted)")
    b.plot(ks, [p["gamma"] for p in pts], marker="s", label="γ (draft step / verify pass)")
    cross = next((p["k"] for p in pts if p["alpha"] < p["gamma"]), None)
    if cross is not None:
        b.axvline(cross, color="C3", ls=":", label=f"α < γ from k={cross:g}")
    b.set(xlabel="draft length k", ylim=(0, 1.05))
    b.legend()
    save_png(fig, path)


def markdown(report: dict) -> str:
    """The sweep per k and the controller's run, with the command."""
    lines = [f"Command: `{report['command']}`", "", "| k | α | γ | measured speedup | predicted (αk+1)/(kγ+1) |",
             "|---|---|---|---|---|"]
    for p in by_k(report["rows"]):
        lines.append(f"| {p['k']:g} | {p['alpha']:.2f} | {p['gamma']:.3f} | {p['speedup']:.2f} ± "
                     f"{p['speedup_std']:.2f} | {p['predicted']:.2f} |")
    m = _controller(report["rows"])
    if m:
        lines.append(f"| entropy ({m['k']:.1f}) | {m['alpha']:.2f} | {m['gamma']:.3f} | {m['speedup']:.2f} | "
                     f"{m['predicted']:.2f} |")
    return "\n".join(lines)
