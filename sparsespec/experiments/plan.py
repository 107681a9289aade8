"""The planner's results (python -m sparsespec.plan.maps writes results/plan_map.json) as the tables
of docs/planning.md: the predicted map, the ceilings' arithmetic, the published claims against
their ceilings, and the calibration of the predictions. The planner measures; this module only
renders (`plan.map`, `plan.ceilings`, `plan.claims`, `plan.calibration` in a doc section)."""

from __future__ import annotations


def map_table(report: dict) -> str:
    from sparsespec.plan.maps import maps_markdown

    return maps_markdown(report)


def ceilings_table(report: dict) -> str:
    from sparsespec.plan.maps import ceilings_markdown

    return ceilings_markdown(report)


def claims_table(report: dict) -> str:
    from sparsespec.plan.maps import claims_markdown

    return claims_markdown(report)


def calibration_table(report: dict) -> str:
    from sparsespec.plan.calibrate import summary_markdown

    return summary_markdown(report)
