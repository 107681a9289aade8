"""Micro-benchmarks behind the choices in docs/performance.md, on synthetic tensors shaped like
SmolLM2-135M's cache, calling the library's own kernels (KVCache.gather) so that what is timed is
what decoding runs. Used by scripts/microbench.py."""

from __future__ import annotations

import torch

from sparsespec.kernels.cpu_attention import median_ms
from sparsespec.kv.cache import KVCache
from sparsespec.reports import Say

LAYERS, HKV, HQ, D = 30, 3, 9, 64  # SmolLM2-135M: layers, KV heads, query heads, head dim


def bench_gather(ctx: int, repeats: int, say: Say) -> None:
    """A 10% sparse view copied into the reused compact cache: torch.gather (the index expanded over
    head_dim) against index_select of whole rows per head, which KVCache.gather does."""
    cache = KVCache(LAYERS, HKV, D, capacity=ctx + 64)
    for layer in range(LAYERS):
        cache.k[layer].normal_()
        cache.v[layer].normal_()
    cache.length = ctx
    budget = ctx // 10
    idx = torch.rand(LAYERS, HKV, ctx).topk(budget, dim=-1, sorted=False).indices.sort(-1).values
    out = cache.gather(idx, extra=9)

    def expanded_gather():
        for layer in range(LAYERS):
            i = idx[layer].unsqueeze(-1).expand(-1, -1, D)
            torch.gather(cache.k[layer], 1, i, out=out.k[layer][:, :budget])
            torch.gather(cache.v[layer], 1, i, out=out.v[layer][:, :budget])

    say(f"gather, budget {budget}: torch.gather {median_ms(expanded_gather, repeats):.1f} ms, "
        f"index_select (KVCache.gather) {median_ms(lambda: cache.gather(idx, extra=9, out=out), repeats):.1f} ms")

