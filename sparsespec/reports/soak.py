"""scripts/soak.py's report (soak.json) as tables, a plot and the summary it prints: speed against
ar on the same prefill, acceptance by quarter of a long output, and whether memory stayed flat."""

from __future__ import annotations

from pathlib import Path

from sparsespec.eval.summary import ctx_label
from sparsespec.reports.figures import pyplot, save_png

SUMMARY_KEYS = ("ctx", "new_tokens", "acceptance_rate", "mean_accepted_tokens", "tokens_per_s", "speedup_vs_ar",
                "acceptance_by_quarter", "distinct_by_quarter", "rss_peak_mib", "decode_growth_mib", "bounded")


def _quarters(xs: list | None) -> str:
    return " / ".join("—" if x is None else f"{x:.2f}" for x in xs) if xs else "—"


def markdown(report: dict) -> str:
    """One row per ctx and method: speed against ar on the same prefill, acceptance overall and by
    quarter, ar's distinct-token share by quarter, and the memory the run held (from soak.json)."""
    lines = ["| ctx | method | tok/s | × ar | α | α by quarter | distinct-token share by quarter | same as ar |",
             "|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        entries = sorted([run, *run["compare"]], key=lambda e: e["method"] != "ar")
        ar = entries[0] if entries[0]["method"] == "ar" else None
        greedy = report["args"].get("temperature", 0.0) == 0
        for e in entries:
            ratio = "—" if ar is None else f"{e['tokens_per_s'] / ar['tokens_per_s']:.2f}"
            alpha = "—" if e.get("acceptance_rate") is None else f"{e['acceptance_rate']:.2f}"
            same = "—" if ar is None or e is ar or not greedy else "yes" if e["output_ids"] == ar["output_ids"] else "NO"
            lines.append(f"| {ctx_label(run['ctx'])} | {e['method']} | {e['tokens_per_s']:.2f} | {ratio} | {alpha} | "
                         f"{_quarters(e.get('acceptance_by_quarter'))} | {_quarters(e.get('distinct_by_quarter'))} | "
                         f"{same} |")
    lines += ["", "| ctx | prefill s | peak RSS GiB | RSS at decode start → end (MiB) | bounded |", "|---|---|---|---|---|"]
    for run in report["runs"]:
        lines.append(f"| {ctx_label(run['ctx'])} | {run['prefill_s']:.0f} | {run['rss_peak_mib'] / 1024:.2f} | "
                     f"{run['rss_decode_start_mib']:.0f} → {run['rss_decode_end_mib']:.0f} "
                     f"({run['decode_growth_mib']:+.0f}) | {'yes' if run['bounded'] else 'NO'} |")
    return "\n".join(lines)


def summary(runs: list[dict]) -> list[dict]:
    """Per run, the numbers scripts/soak.py prints at the end (the rest is in soak.json)."""
    return [{k: r[k] for k in SUMMARY_KEYS}
            | {f"{c['method']}_tok_s": c["tokens_per_s"] for c in r["compare"]}
            | {f"same_as_{c['method']}": c["same_output"] for c in r["compare"]} for r in runs]


def plot(runs: list[dict], path: Path) -> None:
    """Acceptance per verification round with its running mean, and RSS over time (decoding shaded)."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7))
    for run in runs:
        label = f"ctx {run['ctx']}"
        rs = run["rounds"]
        if rs:
            x = [r["tokens"] for r in rs]
            acc = [r["accepted"] / r["drafted"] if r["drafted"] else float("nan") for r in rs]
            ax1.plot(x, acc, ".", alpha=0.35)
            mean, num, den = [], 0, 0
            for r in rs:
                num, den = num + r["accepted"], den + r["drafted"]
                mean.append(num / den if den else float("nan"))
            ax1.plot(x, mean, "-", label=f"{label} (running mean)", color=ax1.lines[-1].get_color())
        mem = run["memory"]
        ax2.plot([m["t"] for m in mem], [m["rss_mib"] for m in mem], "-", label=label)
        dec = [m["t"] for m in mem if m["phase"] == "decode"]
        if dec:
            ax2.axvspan(min(dec), max(dec), alpha=0.08, color=ax2.lines[-1].get_color())
    ax1.set(xlabel="tokens generated", ylabel="accepted / drafted per round", ylim=(-0.05, 1.05),
            title=f"{runs[0]['method']}: acceptance per verification round")
    ax2.set(xlabel="seconds since start", ylabel="RSS (MiB)", title="memory (shaded: decoding)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_png(fig, path)
