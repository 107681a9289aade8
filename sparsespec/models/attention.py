"""Grouped-query attention over a KV cache, with the log-sum-exp that lets the recall index recover
attention probabilities afterwards.

Why our own: the engine needs three things transformers' attention path does not give cheaply — no
repeat_kv copy of the keys for GQA, a causal block of q new tokens at the end of an arbitrary
(possibly gathered, per-head) key set, and the attention mass per KV head that the recall index
reuses from verification at no extra forward. The fused kernel never materialises probabilities,
but it returns each query's log-sum-exp; `kv.capture.attention_mass` turns that back into exact probabilities
for just the queries that were accepted, one matmul over the keys (docs/performance.md).

The fast path (default causal-block visibility, on the CPU and on CUDA) splits the keys in two,
as LongSpec does:
- the prefix [0, T - n), visible to every new query: one fused attention call that returns the
  LSE, in which the G query heads of a KV group are folded into its query rows, so every key is
  read once per KV head and no mask or score tensor over the whole context is built;
- the block [T - n, T) of the new tokens, causal among themselves: small, computed directly (or
  by a fused causal call for a prefill chunk).
The two partial results are merged by their log-sum-exp. On the CPU, a step of at most
SMALL_QUERY_BLOCK new tokens (decode, draft, verification) goes to sparsespec.kernels.cpu_attention
instead where it could be built and was measured at least as fast (a calibration per processor): it streams each key and value once for all the rows of a KV head,
where PyTorch's kernels read a long cache well below the machine's bandwidth. The fused kernel is chosen by device
(`fused_kernel`): PyTorch's CPU flash kernel; on CUDA its FlashAttention-2 kernel (fp16/bf16) or
its memory-efficient kernel (fp32). With flash-attn installed (the `gpu` extra) a CUDA call in
fp16/bf16 is one `flash_attn_func` call instead (GQA and the bottom-right causal block natively).
Whether flash-attn is used is decided once per process (`flash_attn_func`): a build that does not
import (compiled for another torch) or is older than 2.1 (which aligns a causal block of fewer
queries than keys to the top left, so verification would attend to the wrong keys) is logged once
and PyTorch's kernels run instead.
Explicit masks (the sparse views of small drafters, training parity) take the reference path,
which also serves as the oracle in tests.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from sparsespec.kernels import cpu_attention
from sparsespec.kv.capture import causal_block_mask
from sparsespec.kv.quantized import Int8Rows

log = logging.getLogger(__name__)

# Up to this many queries the causal block of new tokens is computed directly (decode, drafting,
# verification: a few rows over n keys); above it (prefill chunks) by a fused causal call.
SMALL_QUERY_BLOCK = 64
# Key ranges a CPU decode step's prefix is cut into (see _attend_split).
PREFIX_SPLITS = 4
# ...from this many keys on (below it the split's extra ops cost more than the idle thread).
SPLIT_FROM = 4096

# A fused kernel over [B, H, S, D] tensors with the same head count for q and k, visibility
# "all" (causal=False) or square causal: (q, k, v, scale, causal) -> (out [B, H, S, D], lse [B, H, S] fp32).
Fused = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor]]

# The fused CPU kernel that also returns the log-sum-exp of each query row (private aten op, present
# since torch 2.2); without it every CPU call takes the reference path.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# flash-attn aligns a causal block of fewer queries than keys to the bottom right from 2.1 on
FLASH_ATTN_MIN = (2, 1)


@functools.cache
def flash_attn_func() -> Callable | None:
    """flash-attn's `flash_attn_func` where it can run our calls correctly, else None: decided (and
    imported) once per process, with one logged line naming why it is not used."""
    if importlib.util.find_spec("flash_attn") is None:  # not installed (the `gpu` extra): nothing to say
        return None
    try:
        import flash_attn
        from flash_attn import flash_attn_func as func
    except Exception as e:  # a build for another torch or CUDA fails here (undefined symbol, OSError)
        log.warning("flash-attn is installed but cannot be imported (%s: %s); PyTorch's attention kernels run "
                    "instead", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None
    version = str(getattr(flash_attn, "__version__", "0"))
    if _version_tuple(version) < FLASH_ATTN_MIN:
        log.warning("flash-attn %s is older than %d.%d, which aligns a causal block of fewer queries than keys to "
                    "the top left (verification would be wrong); PyTorch's attention kernels run instead",
                    version, *FLASH_ATTN_MIN)
        return None
    return func


def _version_tuple(version: str) -> tuple[int, ...]:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        return (0,)


def _fused_cpu(q, k, v, scale, causal):
    return _FLASH_CPU(q, k, v, is_causal=causal, scale=scale)[:2]


def _fused_cuda_flash(q, k, v, scale, causal):
    # PyTorch's own FlashAttention-2 (fp16/bf16): returns the LSE as its second output
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]


def _fused_cuda_efficient(q, k, v, scale, causal):
    # the memory-efficient kernel (any dtype, fp32 included); its LSE rows are padded to a block
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal,
                                                                      scale=scale)[:2]
    return out, lse[..., : q.shape[-2]]


_flash_attn_failed: list[str] = []  # why flash-attn's first call failed, once it has


def flash_attn_applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `attend` hands the default visibility to flash-attn (installed, CUDA, fp16/bf16)."""
    return (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and not _flash_attn_failed
            and flash_attn_func() is not None)


def _flash_attn_call_failed(e: RuntimeError) -> None:
    # a build that imports but cannot run here (a GPU older than it supports, kernels compiled for
    # another architecture) fails on its first call: said once, then PyTorch's kernels serve
    _flash_attn_failed.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    log.warning("flash-attn failed on its first call here (%s); PyTorch's attention kernels run instead",
                _flash_attn_failed[0])


def fused_kernel(q: torch.Tensor) -> Fused | None:
    """The fused kernel with LSE for q's device and dtype, or None (then the reference path runs)."""
    if q.device.type == "cpu":
        return _fused_cpu if _FLASH_CPU is not None else None
    if q.device.type == "cuda":
        if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
            return _fused_cuda_flash
        return _fused_cuda_efficient
    return None


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
    if isinstance(k, Int8Rows) or k.dtype != q.dtype:  # a draft's view in a draft KV format
        return _attend_view(q, k, v, scale, mask, lse_rows)
    c = min(lse_rows, q.shape[1])
    if mask is None:
        if q.shape[1] <= SMALL_QUERY_BLOCK and cpu_attention.applies(q, k, "attention", _pytorch_few_rows):
            out, lse = cpu_attention.few_rows_attention(q, k, v, scale)
            return out, (lse[:, q.shape[1] - c :] if c else None)
        if flash_attn_applies(q.device, q.dtype):
            try:
                out, lse = _attend_flash_attn(q, k, v, scale)
            except torch.cuda.OutOfMemoryError:
                raise
            except RuntimeError as e:
                _flash_attn_call_failed(e)
            else:
                return out, (lse[:, q.shape[1] - c :] if c else None)
        kernel = fused_kernel(q)
        if kernel is not None:
            out, lse = _attend_split(q, k, v, scale, kernel, split_keys=q.device.type == "cpu")
            return out, (lse[:, q.shape[1] - c :] if c else None)
    return _attend_reference(q, k, v, scale, mask, c)


def _attend_view(q: torch.Tensor, k: torch.Tensor | Int8Rows, v: torch.Tensor | Int8Rows, scale: float,
                 mask: torch.Tensor | None, lse_rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`attend` over a draft's view held in fewer bytes than the queries (kv/quantized.py): bf16
    keys and values, or int8 ones with per-row scales. The CPU kernel reads them as stored (a few
    rows, the default visibility); any other path dequantizes them to q's dtype first, which reads
    and writes the view once more, so there the format saves memory but no time."""
    c = min(lse_rows, q.shape[1])
    if mask is None and q.shape[1] <= SMALL_QUERY_BLOCK:
        if isinstance(k, Int8Rows):
            if cpu_attention.applies(q, k.data, "attention"):
                out, lse = cpu_attention.few_rows_attention_int8(q, k.data, k.scale, v.data, v.scale, scale)
                return out, (lse[:, q.shape[1] - c :] if c else None)
        elif cpu_attention.applies(q, k, "attention", _pytorch_few_rows):
            out, lse = cpu_attention.few_rows_attention(q, k, v, scale)
            return out, (lse[:, q.shape[1] - c :] if c else None)

    def dense(x: torch.Tensor | Int8Rows) -> torch.Tensor:
        return x.dequantize(q.dtype) if isinstance(x, Int8Rows) else x.to(q.dtype)

    return attend(q, dense(k), dense(v), scale, mask, lse_rows)


def _pytorch_few_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What serves a CPU step where the CPU kernel does not (the baseline it is calibrated against)."""
    kernel = fused_kernel(q)
    if kernel is None:
        return _attend_reference(q, k, v, scale, None, q.shape[1])
    return _attend_split(q, k, v, scale, kernel, split_keys=True)


def _attend_flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attn (the `gpu` extra) in one call: GQA natively, the causal block aligned to the end of
    the keys (flash-attn >= 2.1), the LSE returned. Its layout is [B, S, H, D]: views, no copies."""
    out, lse, _ = flash_attn_func()(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                  softmax_scale=scale, causal=True, return_attn_probs=True)
    return out[0].transpose(0, 1), lse[0].float()


def _attend_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  kernel: Fused, split_keys: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal-block attention as prefix (fused, GQA folded into rows) + block, merged by LSE.
    split_keys: cut a long prefix into key ranges for the CPU's threads (a GPU kernel splits the
    keys itself). Returns (out [Hq, n, D], lse [Hq, n] float32)."""
    hq, n, d = q.shape
    hkv, total, _ = k.shape
    group = hq // hkv
    # A CPU decode/verify step has only Hkv * 1 work items for the kernel's threads (3 for SmolLM2
    # on 2 cores: one idles a third of the time); cutting the prefix into key ranges balances them.
    split = split_keys and n <= SMALL_QUERY_BLOCK
    if n == 1:  # a decode / draft step sees every key: one call, nothing to merge
        splits = PREFIX_SPLITS if split and total >= SPLIT_FROM else 1
        if total % splits == 0:
            return _fused_prefix(q, k, v, scale, splits, n, kernel)
    prefix = total - n
    splits = PREFIX_SPLITS if split and prefix >= SPLIT_FROM else 1
    prefix -= prefix % splits  # the remainder joins the directly computed block
    kb, vb = k[:, prefix:], v[:, prefix:]
    m = total - prefix  # block keys: the remainder (visible to all) and the n new tokens (causal)
    if n <= SMALL_QUERY_BLOCK:
        s = (q.reshape(hkv, group * n, d) @ kb.transpose(1, 2)).float() * scale  # [Hkv, G*n, m]
        s = s.view(hkv, group, n, m).masked_fill(~causal_block_mask(n, m, q.device), float("-inf"))
        lse_b = torch.logsumexp(s, -1)
        out_b = ((s - lse_b[..., None]).exp().to(v.dtype).view(hkv, group * n, m) @ vb)
        lse_b = lse_b.view(hkv, group * n)
    else:  # a prefill chunk (m == n: no split): its own causal fused call over its n keys
        out_b, lse_b = kernel(q[None], kb.repeat_interleave(group, 0)[None], vb.repeat_interleave(group, 0)[None],
                              scale, True)
        out_b, lse_b = out_b[0].reshape(hkv, group * n, d), lse_b[0].reshape(hkv, group * n)
    if prefix == 0:
        return out_b.reshape(hq, n, d), lse_b.float().reshape(hq, n)
    out_p, lse_p = _fused_prefix(q, k[:, :prefix], v[:, :prefix], scale, splits, n, kernel, merge=False)
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


def _fused_prefix(q, k, v, scale, splits, n, kernel, merge=True):
    """Fused attention of all n queries over all of k (len divisible by splits), GQA folded into rows.
    merge=True: the output [Hq, n, D] and LSE [Hq, n]; else per-split outputs and LSEs [Hkv, S, G*n, (D)]."""
    hq, _, d = q.shape
    hkv, total, _ = k.shape
    rows = hq // hkv * n
    qp = q.reshape(hkv, 1, rows, d).expand(hkv, splits, rows, d)
    kp = k.reshape(hkv, splits, total // splits, d)
    vp = v.reshape(hkv, splits, total // splits, d)
    out, lse = kernel(qp, kp, vp, scale, False)  # [Hkv, S, G*n, D], [Hkv, S, G*n]
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
        if mask is None and n == total:  # plain causal: SDPA needs no mask (and its flash kernel does GQA)
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale,
                                                 enable_gqa=True)[0]
        else:
            # SDPA with a mask and enable_gqa takes the math backend, which repeats K and V G times and
            # builds the scores; the G query heads of a KV group folded into its rows instead (row
            # g * n + i is head g's query i, so the mask repeats G times) give one fused call that
            # reads every key once per KV head
            m = causal_block_mask(n, total, q.device) if mask is None else mask
            rows = m if group == 1 else m.repeat(group, 1)  # [G*n, T] bool: G*n bytes per key
            out = F.scaled_dot_product_attention(q.reshape(hkv, group * n, d)[None], k[None], v[None],
                                                 attn_mask=rows, scale=scale)[0].reshape(hq, n, d)
        if not lse_rows:
            return out, None
        # SDPA keeps no LSE: one pass over the keys for the captured rows only (the last lse_rows
        # rows of the causal mask are causal_block_mask(lse_rows, total))
        rows = causal_block_mask(lse_rows, total, q.device) if mask is None else mask[n - lse_rows :]
        scores = _scores(q[:, n - lse_rows :], k, scale, rows, group)
        return out, torch.logsumexp(scores, -1).reshape(hq, lse_rows)
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
