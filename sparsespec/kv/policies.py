"""KV policies: which cached positions a drafter attends to.

A policy is a small dataclass with one method of its own, `score(state)`: the importance of every
cached position, `[layers, kv_heads, length]` (higher = keep), computed from whatever the policy
likes to read (the cache's keys in `state.cache`, statistics it gathered through its hooks). The
shared base turns scores into per-layer, per-KV-head index sets of a fixed budget:

    sinks [0, k_sink)  +  recent [L - k_recent, L)  +  top-(budget - k_sink - k_recent) by score

A position-only policy (streaming) does not override `score`, so its recent window takes the whole
remaining budget. A policy that learns from the target's attention overrides the hooks too (every
hook does nothing by default, so the engine calls them unconditionally): see `RecallIndex`.

Two ways a policy is applied (both give the same key sets; the parity tests check it):
- `select(state)`: indices into an existing cache, gathered into a compact cache once per draft
  round (self-speculation over the target's own cache: magicdec, sparsespec_l);
- `mask(start, n, total)`: a visibility mask for a drafter that computes its own KV under a
  position-only policy (sd_sparse, budgetdraft), which is also exactly the training-time mask.

Adding a policy: subclass `KVPolicy` in any module, implement `score`, and name the class in a
method file's `drafter.policy._target_` (docs/architecture.md has a worked example).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from sparsespec.checks import SettingError
from sparsespec.kv.cache import KVCache
from sparsespec.kv.capture import Capture
from sparsespec.kv.footprint import Part, Shape, Sizing, capture_parts, refuse_memory_bytes


class PolicyState(Protocol):
    """What a policy may read: the target's cache (its `k` / `v` per layer, `length`). The engine's
    DecodeState also carries the target model (`state.target`), for policies that need its scale."""

    cache: KVCache


class KVPolicyError(ValueError):
    """A KV policy that cannot work: a bad setting (KVPolicySettingError), or a policy used where it
    does not fit (a score of the wrong shape, a scored policy for a drafter's own cache)."""


class KVPolicySettingError(KVPolicyError, SettingError):
    """A policy's setting out of range, as its key, value and reason: the method names it at the key
    the user set (`method.drafter.policy.budget=0 ...`)."""


@dataclass
class KVPolicy:
    budget: int | None = None  # tokens kept per KV head, sinks and recent included; wins over ratio
    ratio: float = 0.10  # else a share of the current context (the papers' default)
    k_sink: int = 16
    k_recent: int | None = None  # None: all of the budget that scores do not fill

    def __post_init__(self) -> None:
        name = type(self).__name__  # ends each reason: the class the node's _target_ built
        for key in ("budget", "k_sink", "k_recent"):
            value = getattr(self, key)
            if (value is None and key == "k_sink") or (value is not None and (not isinstance(value, int)
                                                                         or isinstance(value, bool))):
                raise KVPolicySettingError(key, value, f"has the wrong type: expected an integer ({name})")
        if self.budget is not None and self.budget <= 0:
            raise KVPolicySettingError("budget", self.budget, f"is out of range: a positive number of tokens ({name})")
        if isinstance(self.ratio, bool) or not (isinstance(self.ratio, int | float) and 0 < self.ratio <= 1):
            raise KVPolicySettingError("ratio", self.ratio,
                                       f"is out of range: (0, 1], the share of the context kept ({name})")
        for key in ("k_sink", "k_recent"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise KVPolicySettingError(key, value, f"is out of range: a number of tokens >= 0 ({name})")
        floor = self.k_sink + (self.k_recent or 0)
        if self.budget is not None and self.budget < floor:
            raise KVPolicySettingError(
                "budget", self.budget, f"is smaller than k_sink + k_recent = {floor}; raise the budget or lower "
                f"k_sink / k_recent ({name})")

    # -- what a policy overrides -------------------------------------------------------------
    def score(self, state: PolicyState) -> torch.Tensor | None:
        """Importance of the cached positions [0, state.cache.length): [layers, kv_heads, length],
        or None for a position-only policy."""
        return None

    # -- hooks: the engine calls them all, a policy overrides those it needs ---------------------
    def prefill_capture(self) -> Capture | None:
        """What the prompt's prefill should report to this policy (None: nothing)."""
        return None

    def verify_capture(self) -> Capture | None:
        """What every verification pass should report (None: nothing)."""
        return None

    def start(self, state: PolicyState) -> None:
        """After prefill, before the first round."""

    def update(self, state: PolicyState, n_accepted: int) -> None:
        """After each verification: the pending token and `n_accepted` drafts are now in the cache."""

    def report(self) -> dict:
        """Extra fields for the result row (`engine_<key>`)."""
        return {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        refuse_memory_bytes(cls, "memory(model, at)")

    def memory(self, model: Shape, at: Sizing) -> list[Part]:
        """What this policy allocates over `model`'s cache in the run `at` (the memory guard adds it
        up; kv/footprint.py), asked of a fresh policy before the run. The base answers for the
        prefill capture the policy asks for, if any; a policy that keeps state of its own adds its
        parts to these."""
        capture = self.prefill_capture()
        return [] if capture is None else capture_parts(model, capture, at)

    # -- shared mechanism ---------------------------------------------------------------------
    @property
    def position_only(self) -> bool:
        return type(self).score is KVPolicy.score

    def budget_for(self, length: int) -> int:
        if self.budget is not None:
            return self.budget
        return max(self.k_sink + (self.k_recent or 0) + 1, math.ceil(self.ratio * length))

    def covers(self, length: int) -> bool:
        """True when the budget keeps every position: the view is the full cache."""
        return self.budget_for(length) >= length

    def select(self, state: PolicyState) -> torch.Tensor | None:
        """Indices [layers, kv_heads, budget] (sorted) of the kept positions, or None if all are kept."""
        cache = state.cache
        length, n_layers, n_kv = cache.length, cache.n_layers, cache.n_kv_heads
        device = cache.k[0].device
        budget = self.budget_for(length)
        if budget >= length:
            return None
        scores = None if self.position_only else self.score(state)
        if scores is None:
            recent = budget - self.k_sink
            keep = torch.cat([torch.arange(self.k_sink, device=device), torch.arange(length - recent, length, device=device)])
            return keep.expand(n_layers, n_kv, budget).contiguous()
        if tuple(scores.shape) != (n_layers, n_kv, length):
            raise KVPolicyError(
                f"{type(self).__name__}.score returned shape {tuple(scores.shape)}; expected "
                f"[layers, kv_heads, length] = {[n_layers, n_kv, length]} (one score per cached position)")
        k_recent = self.k_recent if self.k_recent is not None else 0
        fixed = torch.cat([torch.arange(self.k_sink, device=device), torch.arange(length - k_recent, length, device=device)])
        middle = scores[..., self.k_sink : length - k_recent]
        top = middle.topk(budget - fixed.numel(), dim=-1, sorted=False).indices + self.k_sink  # sorted below
        idx = torch.cat([fixed.expand(n_layers, n_kv, -1), top], dim=-1)
        return idx.sort(dim=-1).values

    def mask(self, start: int, n: int, total: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """[n, total] visibility for queries at positions start..start+n-1 of a drafter whose own
        KV is computed under this policy (position-only policies). None means plain causal."""
        return self.visible(torch.arange(start, start + n, device=device), torch.arange(total, device=device))

    def visible(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """[n, m] visibility of the keys at positions `keys` ([m]) to the queries at positions
        `queries` ([n]), for a drafter whose own KV is computed under this (position-only) policy and
        may hold only some positions (a windowed cache). None means plain causal."""
        if not self.position_only:
            raise KVPolicyError(f"{type(self).__name__} scores the target's cache; a drafter with its own "
                                "KV takes a position-only policy (StreamingKV or FullKV)")
        # The query at position p has p earlier tokens, so it keeps budget_for(p) of them: the same
        # set select() gathers for a first draft token at p. Per-query, so chunking cannot change it.
        q = queries[:, None]
        if self.budget is not None:
            recent = torch.full_like(queries, self.budget - self.k_sink)
        else:
            floor = self.k_sink + (self.k_recent or 0) + 1
            recent = (self.ratio * queries.double()).ceil().long().clamp(min=floor) - self.k_sink
        j = keys[None, :]
        return (j <= q) & ((j < self.k_sink) | (j >= q - recent[:, None]))

    def window_start(self, position: int) -> int:
        """The oldest non-sink position the query at `position` sees under `visible` (queries at
        later positions see no older one): what a windowed drafter cache must still hold."""
        return position - (self.budget_for(position) - self.k_sink)


@dataclass
class FullKV(KVPolicy):
    """Every position (the `sd` baseline, or a drafter without a sparse view)."""

    ratio: float = 1.0

    def select(self, state: PolicyState) -> None:
        return None

    def mask(self, start: int, n: int, total: int, device: torch.device | str = "cpu") -> None:
        return None

    def visible(self, queries: torch.Tensor, keys: torch.Tensor) -> None:
        return None

    def window_start(self, position: int) -> int:
        return 0


@dataclass
class StreamingKV(KVPolicy):
    """StreamingLLM: attention sinks plus a recent window (MagicDec's static self-speculation)."""
