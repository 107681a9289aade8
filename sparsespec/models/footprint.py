"""What a model's own passes allocate: its weights, and the transients of a forward of n queries over
a cache of `total` keys and of its logits, derived from the code (runner.forward with
models.attention.attend) term by term. Parts that run a model (a drafter model's prefill and draft
steps) declare these through their `memory` (kv/footprint.py); the memory guard counts the target's.
docs/reliability.md compares them with measured peaks.
"""

from __future__ import annotations

import torch

from sparsespec.kv.footprint import F32
from sparsespec.models.attention import SMALL_QUERY_BLOCK, flash_attn_applies, fused_kernel
from sparsespec.models.runner import CausalLM

# The CPU flash kernel's per-thread blocks: a q block of up to 256 rows against a kv block of 512
# keys, float32 scores plus the q block's accumulator (aten/native/cpu/FlashAttentionKernel.cpp).
_CPU_FLASH_Q_BLOCK, _CPU_FLASH_KV_BLOCK = 256, 512


def weight_bytes(model: CausalLM) -> int:
    """The model's parameters and buffers (tied weights once)."""
    seen: set[int] = set()
    total = 0
    for t in [*model.hf.parameters(), *model.hf.buffers()]:
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _intermediate(model: CausalLM) -> int:
    mlp = model.layers[0].mlp
    proj = getattr(mlp, "up_proj", None) or getattr(mlp, "gate_proj", None)
    if proj is not None:
        return int(proj.out_features)
    return int(getattr(model.config, "intermediate_size", 4 * model.config.hidden_size))


def _stream_bytes(model: CausalLM, n: int) -> int:
    """The residual stream x and norm(x), [n, hidden] each."""
    return 2 * n * model.config.hidden_size * model.lm_head.weight.element_size()


def mask_bytes(n: int, total: int) -> int:
    """Building a chunk's [n, total] bool visibility mask (KVPolicy.mask): the comparison, the
    window test and their union exist at once, while the previous chunk's mask is still held."""
    return 4 * n * total


def forward_transient_bytes(model: CausalLM, n: int, total: int, masked: bool = False,
                            threads: int | None = None) -> int:
    """Bytes a forward of `n` queries over `total` keys allocates and frees again (runner.forward with
    models.attention.attend), at its largest point: the attention step or the MLP step of one layer,
    whichever is larger. Derived from the code, term by term:

    - both steps: the residual stream x and its norm, [n, hidden] each;
    - attention: the fused qkv projection [n, (Hq + 2 Hkv) D] and the rotated q, k
      [(Hq + Hkv), n, D]; then, on the fused path (no mask: `fused_kernel` on the CPU and CUDA),
      `_attend_split` for a prefill chunk: the chunk's own causal block (its keys and values repeated
      to Hq heads, 2 Hq n D, while its output Hq n D exists), the prefix's output (Hq n D), both
      concatenated (2 Hq n D) and merged by LSE in float32 (a float32 copy when the dtype is not,
      the weighted partials 2 Hq n D and their sum Hq n D); no [n, total] tensor. With flash-attn
      in fp16/bf16 on CUDA one call returns Hq n D. The CPU flash kernel adds per-thread blocks.
      With a mask (a drafter model under a sparse position-only policy, or a device without a fused
      kernel): the [n, total] bool mask, held through the forward, and for a prefill chunk SDPA,
      which converts it to an additive [n, total] mask in the model dtype; for a few queries the
      reference path's float32 scores [Hq, n, total] (scaled, masked, softmaxed: three at once);
    - MLP: gate and up in one [n, 2 I] product, act(gate) [n, I] and act(gate) * up [n, I].
    """
    e = model.lm_head.weight.element_size()
    hq, hkv, d = model.n_heads, model.n_kv_heads, model.head_dim
    cuda = model.device.type == "cuda"
    stream = _stream_bytes(model, n)
    mlp = stream + 4 * n * _intermediate(model) * e
    proj = n * (hq + 2 * hkv) * d * e + n * (hq + hkv) * d * e  # qkv, rotated q and k
    # CUDA always has a fused kernel (flash or memory-efficient); the CPU one where torch has it
    fused = cuda or (model.device.type == "cpu" and fused_kernel(torch.empty(1, 1, d, dtype=model.dtype)) is not None)
    rows = hq * n * d
    if masked or not fused:
        if n > SMALL_QUERY_BLOCK:
            scores = n * total * e + rows * e  # SDPA: the mask in the model dtype, the output
        else:
            scores = 3 * hq * n * total * F32 + rows * e
        return max(stream + proj + n * total + scores, mlp + n * total)
    if flash_attn_applies(model.device, model.dtype):
        attn = stream + proj + rows * e + hq * n * F32
    else:
        if n > SMALL_QUERY_BLOCK:
            block = 2 * rows * e + rows * e  # repeated k, v of the chunk and the block's output
        else:  # a few queries: their scores over the block, [Hkv, G n, block] float32
            block = rows * e + hq * n * (n + SMALL_QUERY_BLOCK) * F32
        upcast = 2 * rows * F32 if e != F32 else 0
        merge = rows * e + 2 * rows * e + upcast + 2 * rows * F32 + rows * F32
        attn = stream + proj + max(block, merge)
        if not cuda:
            t = threads if threads is not None else torch.get_num_threads()
            q_block = min(_CPU_FLASH_Q_BLOCK, n * (hq // hkv))
            attn += t * (q_block * (_CPU_FLASH_KV_BLOCK + d + 2)) * F32
    return max(attn, mlp)


def largest_tensor_bytes(model: CausalLM, n: int, total: int, masked: bool = False) -> int:
    """The largest single tensor of such a forward: the MLP's gate-and-up product [n, 2 I], or with a
    mask the [n, total] mask SDPA converts to the model dtype (reference path: [Hq, n, total] fp32)."""
    e = model.lm_head.weight.element_size()
    big = n * 2 * _intermediate(model) * e
    if masked:
        big = max(big, n * total * e if n > SMALL_QUERY_BLOCK else model.n_heads * n * total * F32)
    return big


def logits_largest(model: CausalLM, rows: int) -> int:
    """The largest single tensor of `logits_bytes`."""
    if model.device.type != "cuda" and model.dtype != torch.float32:
        return model.lm_head.weight.numel() * F32
    return rows * model.vocab_size * F32


def logits_bytes(model: CausalLM, rows: int) -> int:
    """float32 logits [rows, V] and their probabilities; on the CPU a model in bf16/fp16 upcasts the
    lm_head weight for them (runner._logits: the CPU has no bf16 x bf16 -> fp32 matmul)."""
    out = 2 * rows * model.vocab_size * F32
    if model.device.type != "cuda" and model.dtype != torch.float32:
        out += model.lm_head.weight.numel() * F32
    return out
