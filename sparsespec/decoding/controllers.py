"""Length controllers: how many tokens to draft this round.

The engine asks `max_draft()` before a round, `keep_drafting()` after every drafted token (so a
controller may stop early on a low-confidence token), and reports the verified round to `observe`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from sparsespec.checks import SettingError


@dataclass
class RoundStats:
    drafted: int
    accepted: int
    entropies: list[float]  # empty when the controller does not read them
    draft_s: float
    verify_s: float


class Controller(ABC):
    """Decides each round's draft length. `max_draft` is the one method a controller must have."""

    # Whether keep_drafting/observe read the draft tokens' entropies. Reading one means waiting for
    # the GPU after every draft step; a controller that does not (FixedK) lets a greedy round run
    # with a single host synchronisation, at its acceptance decision.
    reads_entropy: ClassVar[bool] = True

    @abstractmethod
    def max_draft(self) -> int:
        """The most tokens this round may draft (asked before the round)."""

    def keep_drafting(self, n_drafted: int, entropies: list[float]) -> bool:
        """After each drafted token: draft another? (entropies: of every token drafted so far)."""
        return n_drafted < self.max_draft()

    def observe(self, stats: RoundStats) -> None:  # noqa: B027 (an optional hook)
        """After verification of a round this controller sized."""

    def report(self) -> dict:
        """Extra fields for the result row (`engine_<key>`)."""
        return {}


@dataclass
class FixedK(Controller):
    """Always draft k tokens (the classic speculative decoding setting)."""

    reads_entropy: ClassVar[bool] = False
    k: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k <= 0:
            raise SettingError("k", self.k, "is out of range: a positive draft length (>= 1)")

    def max_draft(self) -> int:
        return self.k

    def keep_drafting(self, n_drafted: int, entropies: list[float]) -> bool:
        return n_drafted < self.k

    def report(self) -> dict:
        return {"controller": "fixed", "k": self.k}


@dataclass
class EntropyController(Controller):
    """SparseSpec-L's controller: choose the draft length that maximises expected tokens per cost.

    Acceptance estimate of a draft token with entropy H: the two class centres H_acc and H_rej
    (EMAs of the entropy of accepted and of rejected draft tokens) split the line, and
        p(H) = |H - H_rej| / (|H - H_acc| + |H - H_rej|)   (clipped to [p_min, p_max]),
    i.e. 1 at the accepted centre and 0 at the rejected one. After each drafted token m that is a
    candidate length, the controller compares the efficiency
        eff(k) = (1 + sum_{j<=k} prod_{i<=j} p_i) / (1 + k * gamma)
    of stopping now with every longer candidate, predicting the unseen tokens' p by the last one,
    and stops when stopping now is best. gamma = (time of one draft step) / (time of one verify
    pass) is measured online (EMA). The product over p_i assumes independent acceptances, so
    `report()` returns the calibration needed to check it.
    """

    candidates: tuple[int, ...] = (4, 8, 12, 16, 20)
    beta: float = 0.9  # EMA coefficient: new = beta * old + (1 - beta) * observation
    h_acc_init: float = 0.5  # nats; the first rounds use these until tokens are observed
    h_rej_init: float = 3.0
    gamma_init: float = 0.2
    p_min: float = 0.01
    p_max: float = 0.99

    def __post_init__(self) -> None:
        if not self.candidates or any(not isinstance(c, int) or isinstance(c, bool) or c <= 0
                                      for c in self.candidates):
            raise SettingError("candidates", list(self.candidates), "is out of range: a non-empty list of "
                               "positive draft lengths")
        self.candidates = tuple(sorted(self.candidates))
        if not (isinstance(self.beta, int | float) and 0 <= self.beta < 1):
            raise SettingError("beta", self.beta, "is out of range: [0, 1)")
        for key in ("h_acc_init", "h_rej_init"):
            if not (isinstance(getattr(self, key), int | float) and getattr(self, key) >= 0):
                raise SettingError(key, getattr(self, key), "is out of range: an entropy in nats >= 0")
        if not (isinstance(self.gamma_init, int | float) and self.gamma_init > 0):
            raise SettingError("gamma_init", self.gamma_init, "is out of range: a cost ratio > 0")
        self.h_acc, self.h_rej, self.gamma = self.h_acc_init, self.h_rej_init, self.gamma_init
        self._p: list[float] = []
        self._h: list[float] = []
        # per round: the draft tokens' acceptance estimates, their entropies, and how many were accepted
        self.log: list[tuple[list[float], list[float], int]] = []
        self.chosen: list[int] = []

    def estimate(self, h: float) -> float:
        d_acc, d_rej = abs(h - self.h_acc), abs(h - self.h_rej)
        p = d_rej / (d_acc + d_rej) if d_acc + d_rej > 0 else 0.5
        if self.h_acc > self.h_rej:  # centres crossed (noisy start): fall back to a flat estimate
            p = 0.5
        return min(max(p, self.p_min), self.p_max)

    def efficiency(self, ps: list[float], k: int) -> float:
        """Expected tokens per unit cost when drafting k tokens with acceptance estimates ps
        (ps shorter than k: the last estimate repeats)."""
        expected, prod = 1.0, 1.0
        for j in range(k):
            prod *= ps[min(j, len(ps) - 1)]
            expected += prod
        return expected / (1 + k * self.gamma)

    def max_draft(self) -> int:
        self._p, self._h = [], []
        return self.candidates[-1]

    def keep_drafting(self, n_drafted: int, entropies: list[float]) -> bool:
        self._p.append(self.estimate(entropies[-1]))
        self._h.append(entropies[-1])
        if n_drafted not in self.candidates:
            return n_drafted < self.candidates[-1]
        longer = [k for k in self.candidates if k > n_drafted]
        if not longer:
            return False
        now = self.efficiency(self._p, n_drafted)
        return max(self.efficiency(self._p, k) for k in longer) > now

    def observe(self, stats: RoundStats) -> None:
        ps = self._p[: stats.drafted]
        self.log.append((ps, self._h[: stats.drafted], stats.accepted))
        self.chosen.append(stats.drafted)
        b = self.beta
        for h in stats.entropies[: stats.accepted]:
            self.h_acc = b * self.h_acc + (1 - b) * h
        if stats.accepted < stats.drafted:
            self.h_rej = b * self.h_rej + (1 - b) * stats.entropies[stats.accepted]
        if stats.drafted and stats.verify_s > 0:
            g = (stats.draft_s / stats.drafted) / stats.verify_s
            self.gamma = b * self.gamma + (1 - b) * g

    def report(self) -> dict:
        """Calibration: predicted vs observed acceptance of labelled draft tokens
        (tokens up to and including the first rejection), and observed P(first m accepted) vs
        the mean product of the per-token estimates."""
        pred, obs = [], []
        for ps, _, acc in self.log:
            for i, p in enumerate(ps[: acc + 1]):
                pred.append(p)
                obs.append(1.0 if i < acc else 0.0)
        chain = {}
        for m in (1, 2, 4, 8):
            rounds = [(ps, acc) for ps, _, acc in self.log if len(ps) >= m]
            if rounds:
                prod = [math.prod(ps[:m]) for ps, _ in rounds]
                chain[m] = {
                    "observed": sum(acc >= m for _, acc in rounds) / len(rounds),
                    "predicted": sum(prod) / len(prod),
                    "n": len(rounds),
                }
        return {
            "controller": "entropy",
            "k_mean": sum(self.chosen) / len(self.chosen) if self.chosen else None,
            "gamma": self.gamma,
            "h_acc": self.h_acc,
            "h_rej": self.h_rej,
            "calibration": {
                "predicted": sum(pred) / len(pred) if pred else None,
                "observed": sum(obs) / len(obs) if obs else None,
                "n": len(pred),
            },
            "prefix_acceptance": chain,
            "calibration_bins": self.calibration_bins(),
        }

    ENTROPY_BINS: ClassVar[tuple[float, ...]] = (0.25, 0.5, 1.0, 2.0, 3.0)  # nats; edges between the bins

    def calibration_bins(self) -> list[dict]:
        """Predicted vs observed acceptance of the labelled draft tokens by entropy bin: does the
        estimate p(H) follow the acceptance it predicts across the entropy range?"""
        edges = (0.0, *self.ENTROPY_BINS, None)  # None: no upper edge (a row stays plain JSON)
        bins = [{"lo": lo, "hi": hi, "predicted": 0.0, "observed": 0.0, "n": 0}
                for lo, hi in zip(edges, edges[1:], strict=False)]
        for ps, hs, acc in self.log:
            for i, (p, h) in enumerate(zip(ps[: acc + 1], hs, strict=False)):
                b = next(b for b in bins if b["hi"] is None or h < b["hi"])
                b["predicted"] += p
                b["observed"] += 1.0 if i < acc else 0.0
                b["n"] += 1
        for b in bins:
            if b["n"]:
                b["predicted"] /= b["n"]
                b["observed"] /= b["n"]
        return bins
