"""Grouped-query attention over a KV cache, with optional capture of attention probabilities.

Why our own: the engine needs three things transformers' attention path does not give cheaply — no
repeat_kv copy of the keys for GQA, a causal block of q new tokens at the end of an arbitrary
(possibly gathered, per-head) key set, and the attention mass per KV head that the recall index
reuses from verification at no extra forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Up to this many queries the scores are materialised (decode, drafting, verification); above it
# (prefill chunks) SDPA's fused CPU/GPU kernel keeps memory at O(n) instead of O(n * T).
SMALL_QUERY_BLOCK = 64


def causal_block_mask(n: int, total: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[n, total] bool mask: query i (the i-th of the last n entries) sees keys <= total - n + i."""
    return torch.ones(n, total, dtype=torch.bool, device=device).tril(total - n)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    capture_last: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of n queries over T cached keys, the queries being the last n entries of the cache.

    q: [Hq, n, D]; k, v: [Hkv, T, D]; mask: optional [n, T] bool (True = visible) replacing the
    default causal-block mask. Returns (out [Hq, n, D], probs) where probs is None unless
    capture_last > 0, then [Hkv, capture_last, T]: the attention probabilities of the last
    `capture_last` queries summed over the query heads of each KV group.
    """
    hq, n, d = q.shape
    hkv, total, _ = k.shape
    group = hq // hkv
    if n > SMALL_QUERY_BLOCK:
        if mask is None and n == total:
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=True)
        else:
            m = causal_block_mask(n, total, q.device) if mask is None else mask
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=m, scale=scale, enable_gqa=True)
        probs = None
        if capture_last:
            c = min(capture_last, n)
            m = causal_block_mask(n, total, q.device) if mask is None else mask
            probs = _probs(q[:, n - c :], k, scale, m[n - c :], group).sum(1)
        return out[0], probs

    m = causal_block_mask(n, total, q.device) if mask is None else mask
    p = _probs(q, k, scale, m, group)  # [Hkv, G, n, T]
    out = (p.to(v.dtype).reshape(hkv, group * n, total) @ v).reshape(hq, n, d)
    probs = p[:, :, n - min(capture_last, n) :].sum(1) if capture_last else None
    return out, probs


def _probs(q: torch.Tensor, k: torch.Tensor, scale: float, mask: torch.Tensor, group: int) -> torch.Tensor:
    """Softmax(q k^T) per KV head without repeating keys: [Hkv, G, n, T] in float32."""
    hq, n, d = q.shape
    hkv, total, _ = k.shape
    scores = (q.reshape(hkv, group * n, d) @ k.transpose(1, 2)).reshape(hkv, group, n, total)
    scores = scores.float() * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)
