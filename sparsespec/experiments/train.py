"""A train.py run's metrics.json as the table of docs/training.md (train.py measures; this module
only renders)."""

from __future__ import annotations

from sparsespec.experiments.common.cells import fmt


def metrics_table(summary: dict) -> str:
    """A training run's validation metrics before and after training (its metrics.json)."""
    final, untrained = summary["final"], summary.get("untrained") or {}
    keys = sorted(k for k in final if k.startswith("val/"))
    lines = [f"{summary['global_step']} steps in {summary['seconds'] / 60:.1f} min (teacher pass included: "
             f"{summary.get('teacher_shards_computed', 0)} shards computed). Teacher-forced on the held-out windows.", "",
             "| metric | untrained | trained |", "|---|---|---|"]
    for k in keys:
        before = untrained.get(k)
        lines.append(f"| `{k}` | {fmt(before, '{:.3f}')} | {final[k]:.3f} |")
    return "\n".join(lines)
