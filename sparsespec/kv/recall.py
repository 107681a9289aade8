"""SparseSpec-L's recallable per-head sparse index.

For every layer and KV head the draft attends to K_sink sinks, K_recent recent positions and the
top-scoring historical positions, scored by the attention mass that the last W *verification*
queries put on them (summed over the query heads of each GQA group). The statistics come from the
verification pass the engine runs anyway (the runner's `Capture`), so refreshing costs no target
forward; the dense cache is never discarded, so a position dropped now can be recalled later.

How it is captured: during verification the fused attention kernel only hands back, per layer,
the queries and the log-sum-exp of their scores (no probabilities, no second pass in the forward).
Once the verifier has decided, `ingest` recovers exact probabilities, exp(q.k * scale - lse), for
the n_accepted + 1 queries that became real (rejected drafts never enter the window): one matmul
over each layer's keys. The window is a ring of W rows with a running sum, so a refresh touches
only the rows that enter and leave.
Prefill seeds the index from the last W prompt queries. With `refresh=False` the index stays at
its prefill scores: a SnapKV-style static view.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from sparsespec.kv.views import KVView
from sparsespec.models.attention import attention_mass
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
    _sum: torch.Tensor | None = field(default=None, repr=False)  # [layers, Hkv, cap] sum over the ring
    _slot: int = field(default=0, repr=False)  # the ring's oldest row
    _pending: dict = field(default_factory=dict, repr=False)  # layer -> (q, lse) of the last forward
    update_s: float = field(default=0.0, repr=False)  # refreshes after verification (decode time)
    updates: int = field(default=0, repr=False)
    seed_s: float = field(default=0.0, repr=False)  # the prefill seeding (part of prefill time)

    def __post_init__(self) -> None:
        if self.budget is None and self.ratio is None:
            self.ratio = 0.10
        super().__post_init__()
        if self.window <= 0:
            raise ValueError(f"method.window must be a positive number of queries, got {self.window}")

    # -- capture hooks used by the engine -------------------------------------------------------
    def prefill_capture(self) -> Capture:
        self._rows, self._sum, self._slot = None, None, 0
        self._pending, self.update_s, self.updates, self.seed_s = {}, 0.0, 0, 0.0
        return Capture(self.window, self._collect)

    def verify_capture(self) -> Capture | None:
        return Capture(ALL_QUERIES, self._collect) if self.refresh else None

    def _collect(self, layer: int, q: torch.Tensor, lse: torch.Tensor) -> None:
        # Only queries and log-sum-exps are kept during the forward: which of the verified queries
        # become real (the accepted ones) is known only afterwards, so probabilities are computed then.
        self._pending[layer] = (q, lse)

    def start(self, state) -> None:
        """After prefill: seed the window with the last W prompt queries."""
        t0 = time.perf_counter()
        self.ingest(state, next(iter(self._pending.values()))[1].shape[1])
        self.seed_s, self.update_s, self.updates = time.perf_counter() - t0, 0.0, 0

    def update(self, state, n_accepted: int) -> None:
        """After verification: the pending token and the accepted drafts were real queries."""
        if self.refresh and self._pending:
            self.ingest(state, n_accepted + 1)

    def ingest(self, state, n_queries: int) -> None:
        """Add the first n_queries captured queries (now the last n_queries positions of the target
        cache) to the window: their attention over the cache, recovered from their LSE."""
        t0 = time.perf_counter()
        cache, window = state.cache, self.window
        n_keys = cache.length
        if self._rows is None or self._rows.shape[-1] < n_keys:
            self._grow(cache.n_layers, cache.n_kv_heads, n_keys)
        skip = max(0, n_queries - window)  # rows that would leave the window at once
        c = n_queries - skip
        first = (self._slot + skip) % window
        slots = torch.tensor([(first + j) % window for j in range(c)])
        for layer, (q, lse) in self._pending.items():
            mass = attention_mass(q[:, skip:n_queries], lse[:, skip:n_queries], cache.k[layer][:, :n_keys],
                                  state.target.scale).transpose(0, 1)  # [c, Hkv, n_keys]
            rows = self._rows[layer]
            # rows only ever grow (the cache does), so a slot's old row is zero past its length
            old = rows.index_select(0, slots)[..., :n_keys]
            self._sum[layer, :, :n_keys] += mass.sum(0) - old.sum(0)
            rows[slots, :, :n_keys] = mass
        self._slot = (self._slot + n_queries) % window
        self._pending = {}
        self.update_s += time.perf_counter() - t0
        self.updates += 1

    def _grow(self, n_layers: int, n_kv: int, n_keys: int) -> None:
        cap = max(n_keys + 1024, 2 * (self._rows.shape[-1] if self._rows is not None else 0))
        rows = torch.zeros(n_layers, self.window, n_kv, cap)
        total = torch.zeros(n_layers, n_kv, cap)
        if self._rows is not None:
            old = self._rows.shape[-1]
            rows[..., :old], total[..., :old] = self._rows, self._sum
        self._rows, self._sum = rows, total

    # -- the view --------------------------------------------------------------------------------
    def score(self, length: int) -> torch.Tensor:
        if self._sum is None:
            raise RuntimeError("RecallIndex has no attention statistics: run prefill with its capture")
        return self._sum[..., :length]

    def report(self) -> dict:
        return {"index_update_s": self.update_s, "index_updates": self.updates, "index_seed_s": self.seed_s}
