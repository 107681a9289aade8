"""Micro-benchmarks behind the choices in docs/performance.md, on synthetic tensors shaped like
SmolLM2-135M's cache (30 layers, 3 KV heads of 64, 9 query heads) at one context length.

    .venv/bin/python scripts/microbench.py --ctx 32k            # gather, attention mass, key read

- gather: a 10% sparse view copied into the reused compact cache, torch.gather (the index
  expanded over head_dim) vs index_select of whole rows per head (what KVCache.gather does);
- attention mass: the recall index's pass over the keys for c accepted queries
  (kv.capture.attention_mass), against a plain streaming read of the same keys (K.sum()), and
  the share of it that is the query-key product alone.
Prints the median of --repeats timed calls after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsespec.config import parse_ctx  # noqa: E402
from sparsespec.kv.cache import KVCache  # noqa: E402
from sparsespec.kv.capture import attention_mass  # noqa: E402

LAYERS, HKV, HQ, D = 30, 3, 9, 64


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def bench_gather(ctx: int, repeats: int) -> None:
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

    print(f"gather, budget {budget}: torch.gather {median_ms(expanded_gather, repeats):.1f} ms, "
          f"index_select (KVCache.gather) {median_ms(lambda: cache.gather(idx, extra=9, out=out), repeats):.1f} ms")


def bench_mass(ctx: int, repeats: int) -> None:
    keys = [torch.randn(HKV, ctx, D) for _ in range(LAYERS)]
    read = median_ms(lambda: [k.sum() for k in keys], repeats)
    gb = LAYERS * HKV * ctx * D * 4 / 1e9
    print(f"plain read of the keys ({gb * 1000:.0f} MB): {read:.1f} ms ({gb / read * 1000:.1f} GB/s)")
    for c in (1, 5, 16):
        q, lse = torch.randn(HQ, c, D), torch.full((HQ, c), 5.0)
        ms = median_ms(lambda q=q, lse=lse: [attention_mass(q, lse, k, 0.125) for k in keys], repeats)
        print(f"attention_mass, {c:2d} queries: {ms:.1f} ms ({gb / ms * 1000:.1f} GB/s of keys)")
        # where it goes: the [G*c, D] x [D, T] product alone (FLOPs, not bytes, bound it: G*c rows
        # reuse every key), then everything after it (exp, group sum, causal tail)
        qs = q.reshape(HKV, HQ // HKV * c, D)
        mm = median_ms(lambda qs=qs: [qs @ k.transpose(1, 2) for k in keys], repeats)
        gflop = 2 * LAYERS * HQ * c * D * ctx / 1e9
        print(f"  of which the product: {mm:.1f} ms ({gflop / mm * 1000:.0f} GFLOP/s), the rest {ms - mm:.1f} ms")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="32k")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    ctx = parse_ctx(args.ctx)
    bench_gather(ctx, args.repeats)
    bench_mass(ctx, args.repeats)


if __name__ == "__main__":
    main()
