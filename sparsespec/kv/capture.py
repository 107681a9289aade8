"""What a target forward reports to a KV policy, and how the report becomes attention probabilities.

A policy that scores the cache by attention (the recall index) asks a forward for a `Capture`: per
layer, the last queries after RoPE and the log-sum-exp of their scores, which the fused attention
kernel returns anyway. `attention_mass` recovers those queries' exact probabilities over the keys
afterwards, for just the queries that turned out to matter (one matmul over the keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sparsespec.kernels import cpu_attention
from sparsespec.precision import matmul_fp32

KEY_CHUNK = 8192  # keys upcast at a time where the device has no float32-output matmul


@dataclass
class Capture:
    """Ask a forward to report attention: `observe(layer, q, lse)` gets, for every layer, the last
    `last` queries after RoPE, [n_heads, c, head_dim], and the log-sum-exp of their scores, [n_heads, c]
    (c = min(last, n)). `attention_mass` turns them into probabilities over the cache's
    keys when (and for whichever of them) they are needed."""

    last: int
    observe: Callable[[int, torch.Tensor, torch.Tensor], None]


def causal_block_mask(n: int, total: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[n, total] bool mask: query i (the i-th of the last n entries) sees keys <= total - n + i."""
    return torch.ones(n, total, dtype=torch.bool, device=device).tril(total - n)


def attention_mass(q: torch.Tensor, lse: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention probabilities of c queries that were the last c positions of the keys k, summed
    over the query heads of each KV group: [Hkv, c, T] float32.

    q: [Hq, c, D] (after RoPE, as attended); lse: [Hq, c] from `attend(lse_rows=...)`; k: [Hkv, T, D].
    exp(q.k * scale - lse) is each probability exactly, so no max/sum pass over the keys is needed:
    one matmul over the keys, one exp, one sum over the group. The scores are accumulated in
    float32 whatever the cache's dtype (as the CPU kernel does): rounded to bfloat16 before the exp,
    they would pick other top-k positions than the same index on the CPU.
    """
    hq, c, d = q.shape
    hkv, total, _ = k.shape
    if c <= total and cpu_attention.applies(q, k, "mass", _pytorch_mass):  # one streaming pass over the keys
        return cpu_attention.attention_mass(q, lse, k, scale)
    return _pytorch_mass(q, lse, k, scale)


def _pytorch_mass(q: torch.Tensor, lse: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """`attention_mass` in PyTorch's operations (where the CPU kernel does not serve; its calibration's baseline)."""
    hq, c, d = q.shape
    hkv, total, _ = k.shape
    group = hq // hkv
    s = matmul_fp32(q.reshape(hkv, group * c, d), k.transpose(1, 2), "the recall index's attention mass",
                    chunk=KEY_CHUNK)  # [Hkv, G*c, T]
    s = s.mul_(scale).sub_(lse.reshape(hkv, group * c, 1)).exp_().view(hkv, group, c, total)
    tail = min(c, total)  # query j (of c) sees keys up to total - c + j: zero the later ones
    s[..., total - tail :].masked_fill_(~causal_block_mask(c, tail, q.device)[-c:], 0.0)
    return s.sum(1)
