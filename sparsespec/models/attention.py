"""Grouped-query attention over a KV cache, with the log-sum-exp that lets the recall index recover
attention probabilities afterwards.

Why our own: the engine needs three things transformers' attention path does not give cheaply — no
repeat_kv copy of the keys for GQA, a causal block of q new tokens at the end of an arbitrary
(possibly gathered, per-head) key set, and the attention mass per KV head that the recall index
reuses from verification at no extra forward. The fused kernel never materialises probabilities,
but it returns each query's log-sum-exp; `kv.capture.attention_mass` turns that back into exact probabilities
for just the queries that were accepted, one matmul over the keys (docs/performance.md).

The fast path (CPU, default causal-block visibility) splits the keys in two, as LongSpec does:
- the prefix [0, T - n), visible to every new query: one fused flash-attention call in which the
  G query heads of a KV group are folded into its query rows, so every key is read once per KV
  head and no mask over the whole context is built;
- the block [T - n, T) of the new tokens, causal among themselves: small, computed directly.
The two partial results are merged by their log-sum-exp. Measured in isolation per layer, the
decode step is 1.25x (fp32) to 8x (bf16, 32k keys) faster than the explicit-probabilities path it
replaced, which remains as the reference (docs/performance.md). Other devices and explicit masks (sparse
views computed by a drafter, training parity) take the reference path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparsespec.kv.capture import causal_block_mask

# Up to this many queries the reference path materialises the scores (decode, drafting,
# verification); above it (prefill chunks) SDPA's fused kernel keeps memory at O(n) not O(n * T).
SMALL_QUERY_BLOCK = 64
# Key ranges a decode step's prefix is cut into (see _attend_split).
PREFIX_SPLITS = 4
# ...from this many keys on (below it the split's extra ops cost more than the idle thread).
SPLIT_FROM = 4096

# The fused CPU kernel that also returns the log-sum-exp of each query row (private aten op, present
# since torch 2.2); without it every call takes the reference path.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    lse_rows: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of n queries over T cached keys, the queries being the last n entries of the cache.

    q: [Hq, n, D]; k, v: [Hkv, T, D]; mask: optional [n, T] bool (True = visible) replacing the
    default causal-block mask. Returns (out [Hq, n, D], lse) where lse is None unless lse_rows > 0,
    then [Hq, min(lse_rows, n)] float32: the log-sum-exp of the scaled scores of the last lse_rows
    queries. With it, `attention_mass` recovers those queries' probabilities later, for the rows
    that turn out to matter, without the fused kernel ever materialising them.
    """
    c = min(lse_rows, q.shape[1])
    if mask is None and _FLASH_CPU is not None and q.device.type == "cpu":
        out, lse = _attend_split(q, k, v, scale)
        return out, (lse[:, q.shape[1] - c :] if c else None)
    return _attend_reference(q, k, v, scale, mask, c)


def _attend_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal-block attention as prefix (flash, GQA folded into rows) + block, merged by LSE.
    Returns (out [Hq, n, D], lse [Hq, n] float32)."""
    hq, n, d = q.shape
    hkv, total, _ = k.shape
    group = hq // hkv
    if n == 1:  # a decode / draft step sees every key: one call, nothing to merge
        splits = PREFIX_SPLITS if total >= SPLIT_FROM else 1
        if total % splits == 0:
            return _flash_prefix(q, k, v, scale, splits, n)
    prefix = total - n
    # A decode/verify step has only Hkv * 1 work items for the kernel's threads (3 for SmolLM2 on 2
    # cores: one idles a third of the time); cutting the prefix into key ranges balances them.
    splits = PREFIX_SPLITS if n <= SMALL_QUERY_BLOCK and prefix >= SPLIT_FROM else 1
    prefix -= prefix % splits  # the remainder joins the directly computed block
    kb, vb = k[:, prefix:], v[:, prefix:]
    m = total - prefix  # block keys: the remainder (visible to all) and the n new tokens (causal)
    if n <= SMALL_QUERY_BLOCK:
        s = (q.reshape(hkv, group * n, d) @ kb.transpose(1, 2)).float() * scale  # [Hkv, G*n, m]
        s = s.view(hkv, group, n, m).masked_fill(~causal_block_mask(n, m, q.device), float("-inf"))
        lse_b = torch.logsumexp(s, -1)
        out_b = ((s - lse_b[..., None]).exp().to(v.dtype).view(hkv, group * n, m) @ vb)
        lse_b = lse_b.view(hkv, group * n)
    else:  # a prefill chunk (m == n): its own causal flash call
        out_b, lse_b = _FLASH_CPU(q[None], kb.repeat_interleave(group, 0)[None],
                                  vb.repeat_interleave(group, 0)[None], is_causal=True, scale=scale)
        out_b, lse_b = out_b[0].reshape(hkv, group * n, d), lse_b[0].reshape(hkv, group * n)
    if prefix == 0:
        return out_b.reshape(hq, n, d), lse_b.float().reshape(hq, n)
    out_p, lse_p = _flash_prefix(q, k[:, :prefix], v[:, :prefix], scale, splits, n, merge=False)
    # merge every partial result by its log-sum-exp, vectorised: [Hkv, parts, G*n, (D)]
    out, lse = _merge(torch.cat([out_p, out_b[:, None]], 1), torch.cat([lse_p, lse_b[:, None]], 1))
    return out.to(q.dtype).reshape(hq, n, d), lse.reshape(hq, n)


def _merge(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine partial attentions over disjoint key sets, [.., parts, rows, D] with their LSEs
    [.., parts, rows], into one over their union (weights exp(lse_i - lse_all)); returns the
    output and the union's LSE, both float32."""
    top = lses.float().amax(1, keepdim=True)
    w = (lses - top).exp()
    total = w.sum(1)
    return (outs.float() * w[..., None]).sum(1) / total[..., None], top[:, 0] + total.log()


def _flash_prefix(q, k, v, scale, splits, n, merge=True):
    """Flash attention of all n queries over all of k (len divisible by splits), GQA folded into rows.
    merge=True: the output [Hq, n, D] and LSE [Hq, n]; else per-split outputs and LSEs [Hkv, S, G*n, (D)]."""
    hq, _, d = q.shape
    hkv, total, _ = k.shape
    rows = hq // hkv * n
    qp = q.reshape(hkv, 1, rows, d).expand(hkv, splits, rows, d)
    kp = k.reshape(hkv, splits, total // splits, d)
    vp = v.reshape(hkv, splits, total // splits, d)
    out, lse = _FLASH_CPU(qp, kp, vp, scale=scale)  # [Hkv, S, G*n, D], [Hkv, S, G*n]
    if not merge:
        return out, lse
    if splits > 1:
        out, lse = _merge(out, lse)
        return out.to(q.dtype).reshape(hq, n, d), lse.reshape(hq, n)
    return out.reshape(hq, n, d), lse.float().reshape(hq, n)


def _attend_reference(q, k, v, scale, mask, lse_rows=0):
    """Masked attention: explicit probabilities for small blocks, SDPA for prefill chunks.
    Returns (out [Hq, n, D], the LSE [Hq, lse_rows] of the last lse_rows queries, or None)."""
    hq, n, d = q.shape
    hkv, total, _ = k.shape
    group = hq // hkv
    if n > SMALL_QUERY_BLOCK:
        if mask is None and n == total:  # plain causal: SDPA needs no mask
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=True)
        else:
            m = causal_block_mask(n, total, q.device) if mask is None else mask
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=m, scale=scale, enable_gqa=True)
        if not lse_rows:
            return out[0], None
        # SDPA keeps no LSE: one pass over the keys for the captured rows only (the last lse_rows
        # rows of the causal mask are causal_block_mask(lse_rows, total))
        rows = causal_block_mask(lse_rows, total, q.device) if mask is None else mask[n - lse_rows :]
        scores = _scores(q[:, n - lse_rows :], k, scale, rows, group)
        return out[0], torch.logsumexp(scores, -1).reshape(hq, lse_rows)
    m = causal_block_mask(n, total, q.device) if mask is None else mask
    scores = _scores(q, k, scale, m, group)  # [Hkv, G, n, T]
    out = (torch.softmax(scores, dim=-1).to(v.dtype).reshape(hkv, group * n, total) @ v).reshape(hq, n, d)
    if not lse_rows:
        return out, None
    return out, torch.logsumexp(scores[:, :, n - lse_rows :], -1).reshape(hq, lse_rows)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, mask: torch.Tensor, group: int) -> torch.Tensor:
    """Masked, scaled q k^T per KV head without repeating keys: [Hkv, G, n, T] in float32."""
    hq, n, d = q.shape
    hkv, total, _ = k.shape
    scores = (q.reshape(hkv, group * n, d) @ k.transpose(1, 2)).reshape(hkv, group, n, total)
    scores = scores.float() * scale
    return scores.masked_fill(~mask, float("-inf"))
