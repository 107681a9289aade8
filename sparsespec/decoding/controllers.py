"""Length controllers: how many tokens to draft this round.

The engine asks `max_draft()` before a round, `keep_drafting()` after every drafted token (so a
controller may stop early on a low-confidence token), and reports the verified round to `observe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundStats:
    drafted: int
    accepted: int
    entropies: list[float]
    draft_s: float
    verify_s: float


@dataclass
class FixedK:
    """Always draft k tokens (the classic speculative decoding setting)."""

    k: int = 4
    history: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if int(self.k) <= 0:
            raise ValueError(f"method.k must be a positive draft length, got {self.k}")

    def max_draft(self) -> int:
        return self.k

    def keep_drafting(self, n_drafted: int, entropies: list[float]) -> bool:
        return n_drafted < self.k

    def observe(self, stats: RoundStats) -> None:
        self.history.append(stats.drafted)

    def report(self) -> dict:
        return {"controller": "fixed", "k": self.k}
