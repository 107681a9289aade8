"""The planner: every method's predicted speedup over `ar` for a model, context, batch and device,
from a cost model of a round (bytes and FLOPs), a device profile and measured acceptance curves.

    python -m sparsespec.plan model=llama-3.1-8b ctx=64k batch=1 profile=h100 dtype=bfloat16

docs/planning.md says how to measure a profile and acceptance, and what the columns mean. Names are
imported on first use, so `python -m sparsespec.plan.profile` and `.acceptance` run as scripts cleanly."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Acceptance": "acceptance", "AcceptanceError": "acceptance", "Curve": "acceptance", "load_acceptance": "acceptance",
    "Dtypes": "cost",
    "METHODS": "planner", "MethodSpec": "planner", "PlanError": "planner", "Prediction": "planner", "best": "planner",
    "plan": "planner", "predict": "planner", "planned": "planner", "spec_from_method": "planner",
    "DeviceProfile": "profile", "ProfileError": "profile", "load_profile": "profile",
    "KNOWN": "shapes", "ModelShape": "shapes", "ShapeError": "shapes", "load_shape": "shapes",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'sparsespec.plan' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sparsespec.plan.{_WHERE[name]}"), name)
