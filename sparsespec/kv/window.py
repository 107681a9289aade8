"""A drafter model's own cache under a position-only sparse policy (StreamingKV): it holds only what
the policy can still show the next query, the sinks and the window, and evicts the rest as the
window moves on (in steps of `evict_every` entries, so a compaction is amortised), prefill included.
Its size, and a draft step's cost, are then flat in the context.

Entries keep their RoPE positions: the cache holds positions [0, k_sink) and then one contiguous run
[first, seen), and each block's mask is the policy's visibility over exactly those positions, which
is the mask over the whole cache restricted to what is kept (tests/test_exactness.py checks the two
give the same logits).
"""

from __future__ import annotations

import torch

from sparsespec.kv.cache import KVCache
from sparsespec.kv.policies import KVPolicy
from sparsespec.kv.quantized import QuantizedKVCache

EVICT_EVERY = 64  # entries dropped at once
DRAFT_ROOM = 65  # allocated beyond what is held after the prompt: the first rounds' drafts


class WindowedCache:
    """`cache` (a KVCache, in any draft KV format) holding the sinks and the window of `policy`."""

    def __init__(self, policy: KVPolicy, cache: KVCache, evict_every: int = EVICT_EVERY) -> None:
        self.policy, self.cache, self.evict_every = policy, cache, evict_every
        self.first = policy.k_sink  # the first non-sink position held: nothing evicted yet

    @property
    def seen(self) -> int:
        """Tokens processed: the next one's position."""
        return self.cache.length + self.first - self.policy.k_sink

    def next_block(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The positions of the next `n` entries and their visibility [n, held + n] over the positions
        the cache holds once they are written."""
        seen, sink, device = self.seen, self.policy.k_sink, self.cache.device
        positions = torch.arange(seen, seen + n, device=device)
        if self.first == sink:
            held = torch.arange(seen + n, device=device)
        else:
            held = torch.cat([torch.arange(sink, device=device), torch.arange(self.first, seen + n, device=device)])
        return positions, self.policy.visible(positions, held)

    def evict(self) -> None:
        """Drop the held positions no later query can see, once `evict_every` of them have gathered."""
        first = self.policy.window_start(self.seen)
        drop = first - self.first
        if drop < self.evict_every:
            return
        s, end = self.policy.k_sink, self.cache.length
        if isinstance(self.cache, QuantizedKVCache):  # its scales move with the entries
            self.cache.shift(s, end, drop)
        else:
            for store in (self.cache.k, self.cache.v):
                for t in store:
                    t[:, s : end - drop] = t[:, s + drop : end].clone()
        self.cache.crop(end - drop)
        self.first = first

    def keep(self, valid: int) -> None:
        """Keep the first `valid` positions (drop drafts the verifier rejected), then evict."""
        if self.seen > valid:
            self.cache.crop(self.cache.length - (self.seen - valid))
        self.evict()

    @staticmethod
    def held_entries(policy: KVPolicy, tokens: int, evict_every: int = EVICT_EVERY) -> int:
        """The most entries per layer held between blocks at a context of `tokens`."""
        return min(tokens, tokens - policy.window_start(tokens) + policy.k_sink + evict_every)

    @staticmethod
    def capacity(policy: KVPolicy, prompt: int, chunk: int, evict_every: int = EVICT_EVERY) -> int:
        """Entries to allocate at start: what is held after the prompt, room for a prefill chunk
        before the window moves on, and for the first drafts."""
        return WindowedCache.held_entries(policy, prompt, evict_every) + min(chunk, prompt) + DRAFT_ROOM
