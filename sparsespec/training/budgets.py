"""Which sparse views a training step sees, and the attention mask each one means.

A view's training mask is *the* inference mask: `StreamingKV(budget=B, k_sink).mask(0, n, n)`,
the visibility a drafter computing its own KV under that view uses at decode time (see
sparsespec/kv/policies.py), so the drafter is trained on exactly the keys it will see.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import torch

from sparsespec.kv.policies import StreamingKV

log = logging.getLogger(__name__)


def view_mask(budget: int, k_sink: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, 1, n, n] bool (True = visible) 4D mask for a HF forward over a length-n sequence."""
    return StreamingKV(budget=budget, k_sink=k_sink).mask(0, n, n, device=device)[None, None]


def sparse_rows(budget: int, n: int) -> int:
    """First query position whose streaming view is sparser than causal: a query at p keeps
    budget_for(p) = budget of its p earlier tokens plus itself, so rows p <= budget are full.
    Logits before this row equal the full branch's exactly (their keys are the same at every layer)."""
    return min(budget + 1, n)


@dataclass
class BudgetSampler:
    """conf/budget/*.yaml. mode: multi (sample per step), single (one fixed B), full (no sparse branch).

    `values` are budgets in tokens, or `ratios` shares of the training sequence length (the authors'
    rebuttal set {0.25, 0.5, 0.75}); `probs` the sampling distribution (null: uniform). Budgets that
    keep the whole training sequence are equivalent to the full branch and are dropped.
    """

    mode: str = "multi"
    values: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    ratios: list[float] | None = None
    probs: list[float] | None = None
    n_views: int = 1  # sparse branches per step (distinct budgets when possible)
    k_sink: int = 16
    eval_values: list[int] = field(default_factory=lambda: [256, 512, 1024])

    def __post_init__(self) -> None:
        if self.mode not in ("multi", "single", "full"):
            raise ValueError(f"budget.mode={self.mode!r}: use multi, single or full")
        if self.k_sink < 0:
            raise ValueError(f"budget.k_sink={self.k_sink}: allowed values >= 0")
        for b in self.values or []:
            if b <= self.k_sink:
                raise ValueError(f"budget.values={list(self.values)}: every budget must be > budget.k_sink="
                                 f"{self.k_sink} (tokens kept per view, sinks included)")
        for b in self.eval_values or []:
            if b <= self.k_sink:
                raise ValueError(f"budget.eval_values={list(self.eval_values)}: every budget must be > "
                                 f"budget.k_sink={self.k_sink}")
        for r in self.ratios or []:
            if not 0 < r <= 1:
                raise ValueError(f"budget.ratios={list(self.ratios)}: every ratio must be in (0, 1]")
        if self.mode != "full" and not (self.ratios or self.values):
            raise ValueError(f"budget.mode={self.mode} needs budget.values (tokens) or budget.ratios (shares)")
        if self.mode != "full" and self.n_views < 1:
            raise ValueError(f"budget.n_views={self.n_views}: allowed values >= 1 (sparse branches per step)")
        if self.probs is not None:
            probs = list(self.probs)
            if len(probs) != len(self.ratios or self.values):
                raise ValueError(f"budget.probs={probs} needs one probability per budget value/ratio "
                                 f"({len(self.ratios or self.values)})")
            if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
                raise ValueError(f"budget.probs={probs}: probabilities must be >= 0 and sum to 1 "
                                 f"(they sum to {sum(probs):.6g})")
        self._told: set[int] = set()  # seq_lens whose dropped budgets were already logged

    def candidates(self, seq_len: int) -> tuple[list[int], list[float]]:
        """(budgets, weights) usable at this sequence length."""
        if self.mode == "full":
            return [], []
        raw = [max(self.k_sink + 1, int(r * seq_len)) for r in self.ratios] if self.ratios else list(self.values)
        if self.mode == "single":
            raw = raw[:1]
        probs = list(self.probs) if self.probs is not None and self.mode == "multi" else [1.0] * len(raw)
        keep = [(b, p) for b, p in zip(raw, probs, strict=True) if self.k_sink < b < seq_len]
        if not keep:
            fallback = max(self.k_sink + 1, seq_len // 2)
            log.warning("budget values %s all cover seq_len=%d; using B=%d instead", raw, seq_len, fallback)
            return [fallback], [1.0]
        dropped = sorted(set(raw) - {b for b, _ in keep})
        if dropped and seq_len not in self._told:
            self._told.add(seq_len)
            log.info("budgets %s keep every position of a %d-token sequence (== full branch); not sampled",
                     dropped, seq_len)
        return [b for b, _ in keep], [p for _, p in keep]

    def sample(self, seq_len: int, rng: random.Random) -> list[int]:
        budgets, weights = self.candidates(seq_len)
        if not budgets:
            return []
        if self.mode == "single":
            return budgets[:1]
        k = min(self.n_views, len(budgets))
        chosen: list[int] = []
        pool, w = list(budgets), list(weights)
        for _ in range(k):  # weighted sampling without replacement
            b = rng.choices(pool, weights=w)[0]
            i = pool.index(b)
            pool.pop(i)
            w.pop(i)
            chosen.append(b)
        return sorted(chosen)

    def eval_budgets(self, seq_len: int) -> list[int]:
        return [b for b in self.eval_values if self.k_sink < b < seq_len]
