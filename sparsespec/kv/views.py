"""KV views: which cached positions a drafter may attend to.

A view is a small dataclass with one scoring method (`score`); the shared mechanism in `KVView`
turns scores into per-layer, per-KV-head index sets of a fixed budget:

    sinks [0, k_sink)  +  recent [L - k_recent, L)  +  top-(budget - k_sink - k_recent) by score

A position-only policy (streaming) returns no scores, so its recent window takes the whole
remaining budget. To add a policy: subclass KVView, implement `score`, add a conf/method file.

Two ways a view is applied (both produce the same key sets, which the parity tests check):
- `select(L)`: indices into an existing cache, gathered into a compact cache once per draft round
  (self-speculation over the target's own cache: magicdec, sparsespec_l);
- `mask(start, n, total)`: a visibility mask for a drafter that computes its own KV under the view
  (sd_sparse, budgetdraft), which is also exactly the training-time attention mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class KVView:
    budget: int | None = None  # tokens kept per KV head, sinks and recent included
    ratio: float | None = None  # or a share of the current context (the paper's default is 0.10)
    k_sink: int = 16
    k_recent: int | None = None  # None: all of the budget that scores do not fill

    def __post_init__(self) -> None:
        if (self.budget is None) == (self.ratio is None):
            raise ValueError(f"{type(self).__name__}: set exactly one of budget= (tokens) or ratio= (share)")
        if self.budget is not None and self.budget <= 0:
            raise ValueError(f"method.budget must be a positive number of tokens, got {self.budget}")
        if self.ratio is not None and not 0 < self.ratio <= 1:
            raise ValueError(f"method.ratio must be in (0, 1], got {self.ratio}")
        if self.k_sink < 0 or (self.k_recent is not None and self.k_recent < 0):
            raise ValueError("method.k_sink and method.k_recent must be >= 0")
        if self.budget is not None and self.budget < self.k_sink + (self.k_recent or 0):
            raise ValueError(
                f"method.budget={self.budget} is smaller than k_sink + k_recent = "
                f"{self.k_sink + (self.k_recent or 0)}; raise the budget or lower k_sink/k_recent"
            )

    # -- what a policy overrides -------------------------------------------------------------
    def score(self, length: int) -> torch.Tensor | None:
        """Importance of positions [0, length): [n_layers, n_kv_heads, length], or None."""
        return None

    # -- shared mechanism ---------------------------------------------------------------------
    def budget_for(self, length: int) -> int:
        if self.budget is not None:
            return self.budget
        return max(self.k_sink + (self.k_recent or 0) + 1, math.ceil(self.ratio * length))

    def covers(self, length: int) -> bool:
        """True when the budget keeps every position: the view is the full cache."""
        return self.budget_for(length) >= length

    def select(self, length: int, n_layers: int, n_kv_heads: int, device="cpu") -> torch.Tensor | None:
        """Indices [n_layers, n_kv_heads, budget] (sorted) of kept positions, or None if all are kept."""
        budget = self.budget_for(length)
        if budget >= length:
            return None
        scores = self.score(length)
        if scores is None:
            recent = budget - self.k_sink
            keep = torch.cat([torch.arange(self.k_sink), torch.arange(length - recent, length)]).to(device)
            return keep.expand(n_layers, n_kv_heads, budget).contiguous()
        k_recent = self.k_recent if self.k_recent is not None else 0
        fixed = torch.cat([torch.arange(self.k_sink), torch.arange(length - k_recent, length)]).to(device)
        middle = scores[..., self.k_sink : length - k_recent]
        top = middle.topk(budget - fixed.numel(), dim=-1, sorted=False).indices + self.k_sink  # sorted below
        idx = torch.cat([fixed.expand(n_layers, n_kv_heads, -1), top], dim=-1)
        return idx.sort(dim=-1).values

    def mask(self, start: int, n: int, total: int, device="cpu") -> torch.Tensor | None:
        """[n, total] visibility for queries at positions start..start+n-1 of a drafter whose own
        KV is computed under this view (position-only views). None means plain causal."""
        if self.score(total) is not None:
            raise NotImplementedError(f"{type(self).__name__} is score-based; apply it with select()")
        # The query at position p has p earlier tokens, so it keeps budget_for(p) of them: the same
        # set select(p) gathers for a first draft token at p. Per-query, so chunking cannot change it.
        q = torch.arange(start, start + n, device=device)[:, None]
        if self.budget is not None:
            recent = torch.full((n,), self.budget - self.k_sink, device=device)
        else:
            floor = self.k_sink + (self.k_recent or 0) + 1
            recent = (self.ratio * q[:, 0].double()).ceil().long().clamp(min=floor) - self.k_sink
        j = torch.arange(total, device=device)[None, :]
        return (j <= q) & ((j < self.k_sink) | (j >= q - recent[:, None]))


@dataclass
class FullView(KVView):
    """Every position (the `sd` baseline); budget/ratio are ignored."""

    ratio: float | None = 1.0

    def select(self, length, n_layers, n_kv_heads, device="cpu"):
        return None

    def mask(self, start, n, total, device="cpu"):
        return None


@dataclass
class StreamingView(KVView):
    """StreamingLLM: attention sinks plus a recent window (MagicDec's static self-speculation)."""
