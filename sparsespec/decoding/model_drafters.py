"""Model drafters: a separate small LM sharing the target's tokenizer, drafting from a cache of its
own. The cache is of the kind the drafter's KV policy needs, one class each:

- `FullCacheDrafter` (FullKV): every position (classic speculative decoding, `sd`);
- `WindowDrafter` (a position-only sparse policy, StreamingKV): only the sinks and the window,
  evicted as it moves on (kv/window.py), so its size and a draft step's cost are flat in the
  context (`sd_sparse`, `budgetdraft`);
- `ScoredDrafter` (a policy that scores positions, the recall index): every position, scored from
  the drafter's own attention; each round drafts from the positions the policy selects (`sd_recall`).

`ModelDrafter(model, policy)` builds the one its policy needs, so method files name `ModelDrafter`
and a policy (conf/method/sd_sparse.yaml).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from sparsespec.decoding.drafters import DecodeState, DraftSteps, WeightFormatDrafter, selected_steps
from sparsespec.kv.cache import KVCache
from sparsespec.kv.footprint import Part, Sizing, kv_bytes
from sparsespec.kv.policies import FullKV, KVPolicy, KVPolicyError, KVPolicySettingError
from sparsespec.kv.quantized import DraftView
from sparsespec.kv.quantized import new_cache as new_view_cache
from sparsespec.kv.window import DRAFT_ROOM, EVICT_EVERY, WindowedCache
from sparsespec.models.footprint import (
    forward_transient_bytes,
    largest_tensor_bytes,
    logits_bytes,
    mask_bytes,
)
from sparsespec.models.runner import Block, CausalLM


def cache_kind(policy: KVPolicy | None) -> type[ModelDrafter]:
    """The model drafter whose cache `policy` needs."""
    if policy is None or isinstance(policy, FullKV):
        return FullCacheDrafter
    return WindowDrafter if policy.position_only else ScoredDrafter


@dataclass
class ModelDrafter(WeightFormatDrafter):
    """A small LM with its own cache (`cache`), drafting through `policy`; its weights and the K/V
    its steps read in the draft formats of WeightFormatDrafter. `ModelDrafter(...)` builds the
    subclass that holds the cache `policy` needs."""

    needs_model: ClassVar[bool] = True
    masked: ClassVar[bool] = False  # whether its blocks carry a visibility mask (memory sizing)
    cache_format: ClassVar[str] = "view"  # the cache is the view its steps read (in the kv format), or "fp"
    # model and prefill_chunk come from the harness (drafter.path, runtime.prefill_chunk), not the
    # method file: repr=False keeps them out of the generated config node
    model: CausalLM | None = field(default=None, repr=False)
    policy: KVPolicy = field(default_factory=FullKV)
    prefill_chunk: int = field(default=1024, repr=False)
    cache: KVCache | None = field(default=None, repr=False)
    _peak: int = field(default=0, repr=False)  # most entries per layer held at once

    def __new__(cls, *args, **kwargs) -> ModelDrafter:
        if cls is ModelDrafter:  # the fields' order: model, policy
            cls = cache_kind(kwargs["policy"] if "policy" in kwargs else args[1] if len(args) > 1 else None)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        super().__post_init__()
        kind = cache_kind(self.policy)
        if not isinstance(self, kind):
            policy = type(self.policy)
            raise KVPolicySettingError("policy._target_", f"{policy.__module__}.{policy.__qualname__}",
                                       f"needs a cache {type(self).__name__} does not hold; use {kind.__name__} "
                                       "(or ModelDrafter, which picks it)")

    @property
    def seen(self) -> int:
        """Tokens the drafter has processed: the next one's position."""
        return self.cache.length

    def held_entries(self, tokens: int) -> int:
        """The most entries per layer the cache holds between blocks at a context of `tokens`."""
        return tokens

    def capacity(self, prompt: int) -> int:
        """The cache allocated at start: what is held after the prompt and room for the first drafts."""
        return self.held_entries(prompt) + DRAFT_ROOM

    def _begin(self, state: DecodeState, fmt: str) -> CausalLM:
        """A fresh cache (held in `fmt`) for this generation; the model its passes run."""
        if self.model is None:
            raise KVPolicyError("ModelDrafter needs its model: load one with drafter.path (evaluate.py) or "
                                "pass model=CausalLM(...)")
        m, self._peak = self.model, 0
        self.cache = new_view_cache(fmt, m.n_layers, m.n_kv_heads, m.head_dim, m.dtype, m.device,
                                    self.capacity(state.prompt_len))
        self._start_reads(m, self.cache.dtype)
        return self.draft_model(m)  # every pass of the drafter, its own prefill included

    def prepare(self, target: CausalLM) -> None:
        if self.model is not None:
            self.draft_model(self.model)

    def report(self) -> dict:
        return {"drafter_kv_tokens": self._peak, **self._reads()}

    def memory(self, target: CausalLM, at: Sizing) -> list[Part]:
        """The weights copy; its cache (doubling once if the output outgrows it), its prefill chunk
        (under the policy's mask if it has one) and a draft step."""
        if self.model is None:
            return self._copy_parts(target)
        m, fmt = self.model, self.kv if self.cache_format == "view" else "fp"
        capacity, held, rows = self.capacity(at.prompt), self.held_entries(at.tokens), at.kmax + 1
        n, keys = min(at.chunk, at.prompt), min(at.prompt, capacity)  # a prefill chunk and the keys it sees
        prefill = forward_transient_bytes(m, n, keys, masked=self.masked)
        parts = [*self._copy_parts(m),
                 Part("drafter KV cache", kv_bytes(m, capacity, fmt)),
                 Part("drafter prefill chunk", max(prefill, mask_bytes(n, keys) if self.masked else 0),
                      "drafter start", False, largest_tensor_bytes(m, n, keys, self.masked)),
                 Part("decode step (drafter)", forward_transient_bytes(m, rows, held, self.masked) + logits_bytes(m, 1),
                      "decode", False)]
        if at.new_tokens is None or held + rows > capacity:
            parts.append(Part("drafter KV cache growth", kv_bytes(m, capacity, fmt), "decode"))
        return parts


@dataclass
class FullCacheDrafter(ModelDrafter):
    """Every position in its cache: a round catches up on the tokens it has not processed and drafts
    on into the cache; the verifier's rejections are cropped off."""

    def start(self, state: DecodeState) -> None:
        model, n = self._begin(state, self.kv), state.prompt_len
        for start in range(0, n, self.prefill_chunk):
            model.forward_many([self._block(state.tokens[start : min(start + self.prefill_chunk, n)], logits="none")])

    def _block(self, ids: torch.Tensor | list[int], logits: str = "last") -> Block:
        n, seen = len(ids), self.cache.length
        self._peak = max(self._peak, seen + n)
        return Block(ids, self.cache, positions=torch.arange(seen, seen + n, device=self.model.device), logits=logits)

    def steps(self, state: DecodeState, kmax: int) -> DraftSteps:
        self._count_read(self.cache)
        # the first step catches up on every token the drafter has not processed (the pending one,
        # plus the verifier's correction or the last draft when all were accepted)
        return DraftSteps(self.draft_model(self.model), state.tokens[self.seen :], kmax, self._block,
                          vocab=state.target.vocab_size)

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:
        # keep only the entries on the kept sequence (the drafts past it are the last ones)
        valid = len(state.tokens) - 1
        if self.cache.length > valid:
            self.cache.crop(valid)


@dataclass
class WindowDrafter(FullCacheDrafter):
    """Under a position-only sparse policy (StreamingKV) its cache holds only the sinks and the window
    of the next query (kv/window.py: WindowedCache), each block masked by the policy's visibility
    over the positions held; rounds run as in FullCacheDrafter."""

    masked: ClassVar[bool] = True
    EVICT_EVERY: ClassVar[int] = EVICT_EVERY  # entries evicted at once (an instance may set its own)
    _kept: WindowedCache | None = field(default=None, repr=False)

    @property
    def _window(self) -> int:
        """The first non-sink position the cache holds."""
        return self._kept.first

    @property
    def seen(self) -> int:
        return self._kept.seen

    def held_entries(self, tokens: int) -> int:
        return WindowedCache.held_entries(self.policy, tokens, self.EVICT_EVERY)

    def capacity(self, prompt: int) -> int:
        """Also room for a prefill chunk while the window has not moved on yet."""
        return WindowedCache.capacity(self.policy, prompt, self.prefill_chunk, self.EVICT_EVERY)

    def start(self, state: DecodeState) -> None:
        model, n = self._begin(state, self.kv), state.prompt_len
        self._kept = WindowedCache(self.policy, self.cache, self.EVICT_EVERY)
        for start in range(0, n, self.prefill_chunk):  # evicting as it goes: the prompt is never held whole
            model.forward_many([self._block(state.tokens[start : min(start + self.prefill_chunk, n)], logits="none")])
            self._evict()

    def _block(self, ids: torch.Tensor | list[int], logits: str = "last") -> Block:
        positions, mask = self._kept.next_block(len(ids))
        self._peak = max(self._peak, self.cache.length + len(ids))
        return Block(ids, self.cache, positions=positions, mask=mask, logits=logits)

    def _evict(self) -> None:
        self._kept.evict()

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:
        self._kept.keep(len(state.tokens) - 1)


@dataclass
class ScoredDrafter(ModelDrafter):
    """Under a policy that scores positions (the recall index; with refresh off, a SnapKV-style static
    view) its cache keeps every position, as the model computes it, and the policy scores it from the
    drafter's own attention: its prefill's last queries and, after each verification, the queries of
    the accepted tokens it catches up on (with full attention). Each round drafts from the positions
    the policy selects, in the draft KV format, as SelfDrafter does over the target's cache."""

    cache_format: ClassVar[str] = "fp"
    _own: DecodeState | None = field(default=None, repr=False)  # the drafter's cache, as the policy reads it
    _view: DraftView | None = field(default=None, repr=False)  # the rounds' view of that cache

    def start(self, state: DecodeState) -> None:
        model, n = self._begin(state, "fp"), state.prompt_len
        self._view = DraftView(self.kv)
        self._own = DecodeState(model, self.cache, state.tokens, n)
        model.prefill(state.tokens[:n], self.cache, self.prefill_chunk, capture=self.policy.prefill_capture())
        self.policy.start(self._own)
        self._peak = self.cache.length

    def steps(self, state: DecodeState, kmax: int) -> DraftSteps:
        round_, view = selected_steps(self._own, self.policy, kmax, self._view)
        round_.vocab = state.target.vocab_size
        self._count_read(view)
        return round_

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:
        # run the new real tokens through the drafter; its policy sees their queries
        new = state.tokens[self.cache.length : len(state.tokens) - 1]
        if new:
            self.draft_model(self.model).forward(new, self.cache, capture=self.policy.verify_capture(), logits="none")
            self.policy.update(self._own, len(new) - 1)
        self._own.tokens = state.tokens
        self._peak = max(self._peak, self.cache.length)

    def report(self) -> dict:
        return {"drafter_kv_tokens": self._peak, **self.policy.report(), **self._reads()}

    def memory(self, target: CausalLM, at: Sizing) -> list[Part]:
        """Also the policy's own state over the drafter's cache (prefilled at drafter start) and the view."""
        parts = super().memory(target, at)
        if self.model is None:
            return parts
        view = DraftView.memory(self.kv, self.model, self.policy, at, self.capacity(at.prompt) + at.kmax + 1,
                                prefix="drafter ")
        return [*parts, *self.policy.memory(self.model, dataclasses.replace(at, prefill_phase="drafter start")), *view]
