"""SparseSpec-L's recallable per-head sparse index.

For every layer and KV head the draft attends to K_sink sinks, K_recent recent positions and the
top-scoring historical positions, scored by the attention mass that the last W *verification*
queries put on them (summed over the query heads of each GQA group). The statistics come from the
verification pass the engine runs anyway (a `Capture`), so refreshing costs no target
forward; the dense cache is never discarded, so a position dropped now can be recalled later.

Prefill seeds the index from the last W prompt queries. With `refresh=False` the index stays at
its prefill scores: a SnapKV-style static view.

How it is captured: during verification the fused attention kernel only hands back, per layer,
the queries and the log-sum-exp of their scores (no probabilities, no second pass in the forward).
Once the verifier has decided, `ingest` recovers exact probabilities, exp(q.k * scale - lse), for
the n_accepted + 1 queries that became real (rejected drafts never enter the window): one matmul
over each layer's keys. The window is a ring of W rows with a running sum, so a refresh touches
only the rows that enter and leave.

Its cost (`index_update_s`, `index_seed_s`) is device time (`sparsespec.clock`): on a GPU the
host returns from the refresh's launches long before the work ends. The spans are read when the
index reports, after the generation, so timing them adds no wait to a round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sparsespec.clock import DeviceClock
from sparsespec.kv.capture import Capture, attention_mass
from sparsespec.kv.footprint import F32, Part, Shape, Sizing
from sparsespec.kv.policies import KVPolicy, KVPolicySettingError, PolicyState

ALL_QUERIES = 1 << 30


class _Spans(list):
    """(what, clock, start, end) marks not yet read. A copy of the index for another sequence of a
    batch starts with none (CUDA events cannot be copied, and the spans are this one's)."""

    def __deepcopy__(self, memo) -> _Spans:
        return _Spans()


@dataclass
class RecallIndex(KVPolicy):
    k_sink: int = 16
    k_recent: int | None = 64
    window: int = 16  # W: verification queries whose attention scores the history
    refresh: bool = True
    # Verification rounds per refresh. 1 (the paper): after every round. R > 1 batches the accepted
    # queries of R rounds into one pass over the keys (they are consecutive positions, so the
    # probabilities are the same); the index then lags by up to R - 1 rounds. The pass over the
    # keys is most of a refresh's cost and grows little with the number of queries (docs/performance.md).
    refresh_every: int = 1
    # running state (per generation)
    _rows: torch.Tensor | None = field(default=None, repr=False)  # [layers, W, Hkv, cap] ring of query rows
    _sum: torch.Tensor | None = field(default=None, repr=False)  # [layers, Hkv, cap] sum over the ring
    _slot: int = field(default=0, repr=False)  # the ring's oldest row
    _pending: dict = field(default_factory=dict, repr=False)  # layer -> (q, lse) of the last forward
    _waiting: list = field(default_factory=list, repr=False)  # accepted (q, lse) per layer, per round not yet ingested
    update_s: float = field(default=0.0, init=False, repr=False)  # refreshes after verification (decode time)
    updates: int = field(default=0, init=False, repr=False)
    seed_s: float = field(default=0.0, init=False, repr=False)  # the prefill seeding (part of prefill time)
    _spans: _Spans = field(default_factory=_Spans, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("window", "refresh_every"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise KVPolicySettingError(key, value, f"is out of range: a positive integer ({type(self).__name__})")

    # -- capture hooks used by the engine -------------------------------------------------------
    def prefill_capture(self) -> Capture:
        self._rows, self._sum, self._slot = None, None, 0
        self._pending, self._waiting, self.update_s, self.updates, self.seed_s = {}, [], 0.0, 0, 0.0
        self._spans = _Spans()
        return Capture(self.window, self._collect)

    def verify_capture(self) -> Capture | None:
        return Capture(ALL_QUERIES, self._collect) if self.refresh else None

    def _collect(self, layer: int, q: torch.Tensor, lse: torch.Tensor) -> None:
        # Only queries and log-sum-exps are kept during the forward: which of the verified queries
        # become real (the accepted ones) is known only afterwards, so probabilities are computed then.
        self._pending[layer] = (q.clone(), lse)  # a copy: a view would keep the whole chunk's q alive

    def start(self, state: PolicyState) -> None:
        """After prefill: seed the window with the last W prompt queries."""
        clock = DeviceClock(state.cache.k[0].device)
        t0 = clock.mark()
        self._ingest(state, [self._pending])
        self._spans.append(("seed", clock, t0, clock.mark()))
        self._pending = {}

    def update(self, state: PolicyState, n_accepted: int) -> None:
        """After verification: the pending token and the accepted drafts were real queries."""
        if not (self.refresh and self._pending):
            return
        self._waiting.append({i: (q[:, : n_accepted + 1], lse[:, : n_accepted + 1])
                              for i, (q, lse) in self._pending.items()})
        self._pending = {}
        if len(self._waiting) >= self.refresh_every:
            self.ingest(state, self._waiting)
            self._waiting = []

    def ingest(self, state, batches: list[dict]) -> None:
        """Add captured queries to the window: `batches` (oldest first) of {layer: (q, lse)}, whose
        queries together are the last positions of the target cache (every real token is a query
        exactly once, so the accepted queries of consecutive rounds are consecutive positions).
        Their attention over the cache is recovered from their LSE."""
        clock = DeviceClock(state.cache.k[0].device)
        t0 = clock.mark()
        self._ingest(state, batches)
        self._spans.append(("update", clock, t0, clock.mark()))
        self.updates += 1

    def _ingest(self, state, batches: list[dict]) -> None:
        cache, window = state.cache, self.window
        n_keys = cache.length
        if self._rows is None or self._rows.shape[-1] < n_keys:
            self._grow(cache.n_layers, cache.n_kv_heads, n_keys, cache.k[0].device)
        n_queries = sum(next(iter(b.values()))[1].shape[1] for b in batches)
        skip = max(0, n_queries - window)  # rows that would leave the window at once
        c = n_queries - skip
        first = (self._slot + skip) % window
        slots = (torch.arange(c, device=cache.k[0].device) + first) % window  # made on the device: no copy
        for layer in batches[0]:
            q = torch.cat([b[layer][0] for b in batches], 1)[:, skip:]
            lse = torch.cat([b[layer][1] for b in batches], 1)[:, skip:]
            mass = attention_mass(q, lse, cache.k[layer][:, :n_keys], state.target.scale).transpose(0, 1)
            rows = self._rows[layer]  # mass: [c, Hkv, n_keys]
            # rows only ever grow (the cache does), so a slot's old row is zero past its length
            old = rows[..., :n_keys].index_select(0, slots)
            self._sum[layer, :, :n_keys] += mass.sum(0) - old.sum(0)
            rows[slots, :, :n_keys] = mass
        self._slot = (self._slot + n_queries) % window

    def _grow(self, n_layers: int, n_kv: int, n_keys: int, device: torch.device) -> None:
        cap = max(n_keys + 1024, 2 * (self._rows.shape[-1] if self._rows is not None else 0))
        rows = torch.zeros(n_layers, self.window, n_kv, cap, device=device)
        total = torch.zeros(n_layers, n_kv, cap, device=device)
        if self._rows is not None:
            old = self._rows.shape[-1]
            rows[..., :old], total[..., :old] = self._rows, self._sum
        self._rows, self._sum = rows, total

    # -- the policy ------------------------------------------------------------------------------
    def score(self, state: PolicyState) -> torch.Tensor:
        if self._sum is None:
            raise RuntimeError("RecallIndex has no attention statistics: run prefill with its capture")
        return self._sum[..., : state.cache.length]

    def memory(self, model: Shape, at: Sizing) -> list[Part]:
        # the ring and its sum (_grow: float32, the keys plus 1024 of room), from the seeding on
        ring = model.n_layers * (self.window + 1) * model.n_kv_heads * (at.tokens + 1024) * F32
        return [*super().memory(model, at), Part(type(self).__name__, ring)]

    def _read_spans(self) -> None:
        for what, clock, t0, t1 in self._spans:
            if what == "seed":
                self.seed_s += clock.seconds(t0, t1)
            else:
                self.update_s += clock.seconds(t0, t1)
        self._spans = _Spans()

    def report(self) -> dict:
        self._read_spans()
        return {"index_update_s": self.update_s, "index_updates": self.updates, "index_seed_s": self.seed_s}
