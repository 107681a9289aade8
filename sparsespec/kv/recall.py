"""SparseSpec-L's recallable per-head sparse index.

For every layer and KV head the draft attends to K_sink sinks, K_recent recent positions and the
top-scoring historical positions, scored by the attention mass that the last W *verification*
queries put on them (summed over the query heads of each GQA group). The statistics come from the
verification pass the engine runs anyway (the runner's `Capture`), so refreshing costs no target
forward; the dense cache is never discarded, so a position dropped now can be recalled later.
Prefill seeds the index from the last W prompt queries. With `refresh=False` the index stays at
its prefill scores: a SnapKV-style static view.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from sparsespec.kv.views import KVView
from sparsespec.models.runner import Capture

ALL_QUERIES = 1 << 30


@dataclass
class RecallIndex(KVView):
    ratio: float | None = None  # default 0.10 (the paper's optimum) when no budget is given
    k_sink: int = 16
    k_recent: int | None = 64
    window: int = 16  # W: verification queries whose attention scores the history
    refresh: bool = True
    # running state (per generation)
    _rows: torch.Tensor | None = field(default=None, repr=False)  # [layers, W, Hkv, cap] ring of query rows
    _row_len: list[int] = field(default_factory=list, repr=False)
    _sum: torch.Tensor | None = field(default=None, repr=False)  # [layers, Hkv, cap] sum over the ring
    _slot: int = field(default=0, repr=False)
    _pending: dict = field(default_factory=dict, repr=False)
    update_s: float = field(default=0.0, repr=False)
    updates: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.budget is None and self.ratio is None:
            self.ratio = 0.10
        super().__post_init__()
        if self.window <= 0:
            raise ValueError(f"method.window must be a positive number of queries, got {self.window}")

    # -- capture hooks used by the engine -------------------------------------------------------
    def prefill_capture(self) -> Capture:
        self._rows, self._sum, self._row_len, self._slot = None, None, [], 0
        self._pending, self.update_s, self.updates = {}, 0.0, 0
        return Capture(self.window, self._collect)

    def verify_capture(self) -> Capture | None:
        return Capture(ALL_QUERIES, self._collect) if self.refresh else None

    def _collect(self, layer: int, probs: torch.Tensor) -> None:
        self._pending[layer] = probs

    def start(self, state) -> None:
        """After prefill: seed the window with the last W prompt queries."""
        self.ingest(self.window, state.cache.length)

    def ingest(self, n_queries: int, n_keys: int) -> None:
        """Add the first n_queries captured rows (over keys [0, n_keys)) to the window."""
        t0 = time.perf_counter()
        probs = torch.stack([self._pending[i] for i in sorted(self._pending)])  # [layers, Hkv, m, T]
        self._pending = {}
        probs = probs[:, :, :n_queries, :n_keys].float()
        n_layers, n_kv = probs.shape[:2]
        if self._rows is None or self._rows.shape[-1] < n_keys:
            self._grow(n_layers, n_kv, n_keys)
        for j in range(probs.shape[2]):
            old = self._row_len[self._slot]
            if old:
                self._sum[..., :old] -= self._rows[:, self._slot, :, :old]
            self._rows[:, self._slot, :, :n_keys] = probs[:, :, j]
            self._sum[..., :n_keys] += probs[:, :, j]
            self._row_len[self._slot] = n_keys
            self._slot = (self._slot + 1) % self.window
        self.update_s += time.perf_counter() - t0
        self.updates += 1

    def _grow(self, n_layers: int, n_kv: int, n_keys: int) -> None:
        cap = max(n_keys + 1024, 2 * (self._rows.shape[-1] if self._rows is not None else 0))
        rows = torch.zeros(n_layers, self.window, n_kv, cap)
        total = torch.zeros(n_layers, n_kv, cap)
        if self._rows is not None:
            old = self._rows.shape[-1]
            rows[..., :old], total[..., :old] = self._rows, self._sum
        else:
            self._row_len = [0] * self.window
        self._rows, self._sum = rows, total

    # -- the view --------------------------------------------------------------------------------
    def score(self, length: int) -> torch.Tensor:
        if self._sum is None:
            raise RuntimeError("RecallIndex has no attention statistics: run prefill with its capture")
        return self._sum[..., :length]

    def update(self, state, n_accepted: int) -> None:
        """After verification: the pending token and the accepted drafts were real queries."""
        if self.refresh and self._pending:
            self.ingest(n_accepted + 1, state.cache.length)

    def report(self) -> dict:
        return {"index_update_s": self.update_s, "index_updates": self.updates}
