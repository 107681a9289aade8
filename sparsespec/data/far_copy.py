"""Far-copy text: a window whose last stretch repeats the text D tokens back.

A model that can copy predicts every token of the stretch from a few tokens in, and only while the
source D tokens back is in its view; plain book text rarely needs a token that far back. The
budget control (the budget_control study) and the training windows' far-copy mixing
(`corpus.far_copy_share`) both build such text with this one function.
"""

from __future__ import annotations

import random


def far_copy(ids: list[int], distance: int, span: int) -> list[int]:
    """`ids` with each of its last `span` tokens replaced by the token `distance` positions back (in
    the new text: a distance shorter than the span repeats the copy)."""
    n = len(ids)
    if not 1 <= distance <= n - span:
        raise ValueError(f"distance {distance}: needs 1 <= distance <= {n - span} for a {n}-token window "
                         f"whose last {span} tokens are copied")
    out = list(ids[: n - span])
    for p in range(n - span, n):
        out.append(out[p - distance])
    return out


def mix_far_copies(windows: list[list[int]], share: float, distances: list[int], span: int,
                   salt: str = "") -> list[list[int]]:
    """`windows` with about `share` of them (chosen by a fixed draw from `salt` and each window's
    index, not by the training seed: every seed then trains on the same windows and shares one
    teacher cache) turned into far copies at a distance drawn from `distances`."""
    rng = random.Random(f"far-copy:{salt}")
    out = []
    for w in windows:
        pick, d = rng.random(), rng.choice(distances)
        out.append(far_copy(w, d, span) if pick < share else list(w))
    return out
