"""A recall index with one set of positions per layer, shared by every KV head (Vegas's selection).

`RecallIndex` keeps, for every layer and KV head, the positions its own query heads attended to
most. Vegas (arXiv 2602.07223) ranks the positions of a layer once, by the attention weights of all
its query heads together, and every KV head's draft attention reads that one set; its budget has a
floor (`min_budget` tokens) under the share of the context. Everything else (the window of the last
verification queries, the refresh after every round, sinks and recent positions) is the recall
index's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsespec.kv.policies import KVPolicySettingError, PolicyState
from sparsespec.kv.recall import RecallIndex


@dataclass
class LayerRecallIndex(RecallIndex):
    # tokens kept at least (short contexts), where `budget` is not set; 0: the share of the context only
    min_budget: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.min_budget, int) or isinstance(self.min_budget, bool) or self.min_budget < 0:
            raise KVPolicySettingError("min_budget", self.min_budget,
                                       f"is out of range: a number of tokens >= 0 ({type(self).__name__})")

    def budget_for(self, length: int) -> int:
        share = super().budget_for(length)
        return share if self.budget is not None else max(share, min(self.min_budget, length))

    def score(self, state: PolicyState) -> torch.Tensor:
        """Every KV head of a layer gets the layer's score: the attention mass of all its query heads."""
        per_head = super().score(state)  # [layers, kv_heads, length]
        return per_head.sum(1, keepdim=True).expand_as(per_head)

    def select(self, state: PolicyState) -> torch.Tensor | None:
        idx = super().select(state)
        # one set per layer: the first KV head's (ties broken once, not per head)
        return None if idx is None else idx[:, :1].expand_as(idx).contiguous()
