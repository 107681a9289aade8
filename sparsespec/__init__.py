"""sparsespec: long-context speculative decoding (SparseSpec-L, BudgetDraft and their baselines).

`sparsespec.pipeline(method, model=None, **overrides).generate(prompt)` runs a method from Python;
`evaluate.py` and `train.py` are the command-line entry points.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Output", "Pipeline", "pipeline"]


def __getattr__(name: str) -> Any:  # the API loads torch and transformers: only when it is used
    if name in __all__:
        from sparsespec import api

        return getattr(api, name)
    raise AttributeError(f"module 'sparsespec' has no attribute {name!r}")
