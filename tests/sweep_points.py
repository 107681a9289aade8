"""Points of a W&B sweep's parameter space, for tests that run an agent's command without a W&B server.

The installed wandb leaves choosing points to its server (or to the optional `sweeps` package behind
`wandb.controller`), so the tests draw their own: the grid product for `method: grid`, independent
draws for `random` and `bayes` (whose first proposals are random draws as well). Only the parameter
forms conf/sweep/*.yaml uses are supported.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any


def grid(spec: dict) -> list[dict]:
    """Every point of a grid sweep, in W&B's order (the last parameter varies fastest)."""
    params = spec["parameters"]
    choices = []
    for k, p in params.items():
        if not ("value" in p or "values" in p):
            raise ValueError(f"grid sweep: parameter {k} needs value or values, not a distribution")
        choices.append([p["value"]] if "value" in p else list(p["values"]))
    return [dict(zip(params, combo, strict=True)) for combo in itertools.product(*choices)]


def draw(p: dict, rng: random.Random) -> Any:
    if "value" in p:
        return p["value"]
    if "values" in p:
        return rng.choice(p["values"])
    lo, hi = p["min"], p["max"]
    dist = p.get("distribution") or ("int_uniform" if isinstance(lo, int) and isinstance(hi, int) else "uniform")
    if dist == "int_uniform":
        return rng.randint(int(lo), int(hi))
    if dist == "uniform":
        return rng.uniform(float(lo), float(hi))
    if dist == "log_uniform_values":
        return math.exp(rng.uniform(math.log(float(lo)), math.log(float(hi))))
    raise ValueError(f"distribution {dist!r}: not drawn by the tests")


def sample(spec: dict, n: int, seed: int = 0) -> list[dict]:
    """n points: the first n of the grid, or n random draws."""
    if spec["method"] == "grid":
        return grid(spec)[:n]
    rng = random.Random(seed)
    return [{k: draw(p, rng) for k, p in spec["parameters"].items()} for _ in range(n)]
