"""The gather of a sparse view, behind a choice in docs/performance.md: a 10% view copied into the
reused compact cache, torch.gather (the index expanded over head_dim) against index_select of whole
rows per head (what KVCache.gather does), on synthetic tensors shaped like SmolLM2-135M's cache
(30 layers, 3 KV heads of 64, 9 query heads), median of --repeats timed calls after one warm-up.

    python -m sparsespec.experiments gather --ctx 32k
"""

from __future__ import annotations

import torch

from sparsespec.experiments import Say
from sparsespec.kernels.cpu_attention import median_ms
from sparsespec.kv.cache import KVCache

LAYERS, HKV, HQ, D = 30, 3, 9, 64  # SmolLM2-135M: layers, KV heads, query heads, head dim
OPTIONS = {"ctx": "32k", "repeats": 7}


def measure(args, checkpoint) -> dict:
    """{rows}: bench_gather at every --ctx."""
    return {"rows": [bench_gather(ctx, args.repeats, print) for ctx in args.ctx]}


def markdown(report: dict) -> str:
    lines = ["| ctx | view tokens | torch.gather ms | index_select (KVCache.gather) ms |", "|---|---|---|---|"]
    lines += [f"| {r['ctx']} | {r['budget']} | {r['gather_ms']:.1f} | {r['index_select_ms']:.1f} |"
              for r in report["rows"]]
    return "\n".join(lines)


def bench_gather(ctx: int, repeats: int, say: Say) -> dict:
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

    row = {"ctx": ctx, "budget": budget, "gather_ms": median_ms(expanded_gather, repeats),
           "index_select_ms": median_ms(lambda: cache.gather(idx, extra=9, out=out), repeats)}
    say(f"gather, budget {budget}: torch.gather {row['gather_ms']:.1f} ms, "
        f"index_select (KVCache.gather) {row['index_select_ms']:.1f} ms")
    return row

