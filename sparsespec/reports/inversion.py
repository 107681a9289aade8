"""scripts/inversion.py's k sweep: runs turned into rows (measured speedup beside the speedup model
S = (αk + 1) / (kγ + 1)), and the report as a table and a plot marking where α falls below γ."""

from __future__ import annotations

import statistics
from pathlib import Path

from sparsespec.reports.figures import pyplot, save_png


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


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Measured and predicted speedup against k (the controller as a star), and α and γ against k."""
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


def markdown(report: dict, png: Path) -> str:
    """The sweep per k and the controller's run, with the command and where the plot is."""
    lines = [f"Command: `{report['command']}`", "", "| k | α | γ | measured speedup | predicted (αk+1)/(kγ+1) |",
             "|---|---|---|---|---|"]
    for p in by_k(report["rows"]):
        lines.append(f"| {p['k']:g} | {p['alpha']:.2f} | {p['gamma']:.3f} | {p['speedup']:.2f} ± "
                     f"{p['speedup_std']:.2f} | {p['predicted']:.2f} |")
    m = _controller(report["rows"])
    if m:
        lines.append(f"| entropy ({m['k']:.1f}) | {m['alpha']:.2f} | {m['gamma']:.3f} | {m['speedup']:.2f} | "
                     f"{m['predicted']:.2f} |")
    lines += ["", f"Plot: `{png}`"]
    return "\n".join(lines)
