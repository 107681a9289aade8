"""Summaries of results.jsonl: per method x dataset x ctx, mean ± std, as JSON, Markdown and plots."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from sparsespec.eval.results import write_atomic

METRICS = ("tokens_per_s", "speedup", "acceptance_rate", "mean_accepted_tokens", "gamma", "k_mean",
           "predicted_speedup", "prefill_s", "wall_s", "score", "exact_match_ar")


def _stats(values: list) -> dict | None:
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "n": len(vals)}


def summarize(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["dataset"], r["ctx"])].append(r)
    out = []
    for (method, dataset, ctx), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        entry = {"method": method, "dataset": dataset, "ctx": ctx, "n": len(rs)}
        for m in METRICS:
            entry[m] = _stats([r.get(m) for r in rs])
        out.append(entry)
    return out


def _fmt(s: dict | None, digits: int = 2) -> str:
    if s is None:
        return "—"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}" if s["n"] > 1 else f"{s['mean']:.{digits}f}"


def to_markdown(summary: list[dict]) -> str:
    head = ("| method | dataset | ctx | n | tokens/s | speedup vs ar | α (acceptance) | τ (tokens/round) "
            "| γ | k | predicted S | identical to ar | score |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for e in summary:
        lines.append(
            f"| {e['method']} | {e['dataset']} | {e['ctx']} | {e['n']} | {_fmt(e['tokens_per_s'])} "
            f"| {_fmt(e['speedup'])} | {_fmt(e['acceptance_rate'])} | {_fmt(e['mean_accepted_tokens'])} "
            f"| {_fmt(e['gamma'], 3)} | {_fmt(e['k_mean'], 1)} | {_fmt(e['predicted_speedup'])} "
            f"| {_fmt(e['exact_match_ar'])} | {_fmt(e['score'])} |"
        )
    return head + "\n".join(lines) + "\n"


def write_reports(rows: list[dict], out_dir: str | Path) -> dict:
    out_dir = Path(out_dir)
    summary = summarize(rows)
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2))
    write_atomic(out_dir / "summary.md", to_markdown(summary))
    plot_paths = write_plots(rows, summary, out_dir)
    return {"summary": summary, "plots": plot_paths}


def write_plots(rows: list[dict], summary: list[dict], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    spec = [e for e in summary if e["speedup"] is not None and e["method"] != "ar"]
    if spec:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for method in sorted({e["method"] for e in spec}):
            es = sorted((e for e in spec if e["method"] == method), key=lambda e: e["ctx"])
            ax.errorbar([e["ctx"] for e in es], [e["speedup"]["mean"] for e in es],
                        yerr=[e["speedup"]["std"] for e in es], marker="o", capsize=3, label=method)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("speedup vs ar")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(_save(fig, out_dir / "speedup_vs_ctx.png"))
        plt.close(fig)
    accepted = [a for r in rows for a in r.get("accepted_per_round") or []]
    if accepted:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for method in sorted({r["method"] for r in rows if r.get("accepted_per_round")}):
            vals = [a for r in rows if r["method"] == method for a in r["accepted_per_round"]]
            ax.hist(vals, bins=range(0, max(vals) + 2), alpha=0.5, label=method, align="left")
        ax.set_xlabel("draft tokens accepted per round")
        ax.set_ylabel("rounds")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(_save(fig, out_dir / "accepted_hist.png"))
        plt.close(fig)
    return paths


def _save(fig, path: Path) -> str:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    return str(path)
