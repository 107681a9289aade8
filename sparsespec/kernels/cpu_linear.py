"""y = x Wᵀ + b for a few rows on the CPU in float32 (decode, draft, verification and batched steps),
from cpu_linear.cpp, built and loaded with the attention kernel (sparsespec.kernels.cpu_attention:
the same builds, the same one-line fallback where it cannot be built, the same
SPARSESPEC_CPU_KERNEL=0 switch).

Why our own: MKL's products for one row and for a few rows read a model's weights well below the
machine's bandwidth (docs/performance.md), and take different code paths by row count, so that a
verification block's logits could differ in their last bits from those of one-token steps. This
kernel streams the weights once per call for all the rows, and computes every output the same way
whatever the number of rows and wherever its row sits: a row's result does not depend on the rows
computed with it, so a verification pass gives, bit for bit, the logits of one-token steps.
"""

from __future__ import annotations

import torch

from sparsespec.kernels import cpu_attention

MAX_ROWS = 32  # up to here the kernel was measured at least as fast as MKL (docs/performance.md)


def applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the kernel serves x [rows, in] against w [out, in]: CPU, float32, a few rows, rows of
    x and w contiguous, no gradient wanted (it has no backward), and built."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS and x.device.type == "cpu" and w.device.type == "cpu"
            and x.dtype == torch.float32 and w.dtype == torch.float32 and x.stride(-1) == 1 and w.is_contiguous()
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            and cpu_attention.available())


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, build: str = "native") -> torch.Tensor:
    """F.linear(x, w, b) for x [rows, in], w [out, in]: [rows, out] float32."""
    return cpu_attention.ops(build).few_rows_linear(x, w, b)


BLOCK = 32  # inputs a block of GGUF's Q4_1 / Q8_0 layouts
BLOCK_FORMATS = ("q4_1", "q8_0")


def pack_blocks(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """w [out, in] (in a multiple of 32) in blocks of 32 inputs, as GGUF quantizes them: q4_1 (4-bit
    codes on the block's min/max grid, an fp16 scale and minimum) or q8_0 (signed 8-bit codes, an fp16
    scale). Returns (codes uint8 [out, in / 32 * block bytes], scales fp16 [out, in / 32], minimums
    fp16 [out, in / 32] or None). A weight that was dequantized from these formats comes back exactly."""
    w = w.detach().float()
    out, k = w.shape
    if k % BLOCK:
        raise ValueError(f"{fmt}: the input size {k} is not a multiple of {BLOCK}")
    g = w.reshape(out, k // BLOCK, BLOCK)
    if fmt == "q4_1":
        lo, hi = g.amin(-1), g.amax(-1)
        d = ((hi - lo) / 15).half()
        m = lo.half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(lo))
        q = ((g - m.float()[..., None]) * inv[..., None]).round().clamp(0, 15).to(torch.uint8)
        codes = q[..., :16] | (q[..., 16:] << 4)  # byte i: input i low, input i + 16 high
        return codes.reshape(out, -1).contiguous(), d.contiguous(), m.contiguous()
    if fmt == "q8_0":
        d = (g.abs().amax(-1) / 127).half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(d.float()))
        q = (g * inv[..., None]).round().clamp(-127, 127).to(torch.int8)
        return q.reshape(out, k).view(torch.uint8).contiguous(), d.contiguous(), None
    raise ValueError(f"{fmt!r}: not a block format ({', '.join(BLOCK_FORMATS)})")


def unpack_blocks(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None) -> torch.Tensor:
    """The float32 weight [out, in] that packed blocks decode to (d * q + m, or d * q)."""
    out = codes.shape[0]
    if mins is not None:
        b = codes.reshape(out, -1, BLOCK // 2)
        q = torch.cat([b & 15, b >> 4], -1).float()
        return torch.addcmul(mins.float()[..., None], q, scales.float()[..., None]).reshape(out, -1)
    q = codes.view(torch.int8).reshape(out, -1, BLOCK).float()
    return (q * scales.float()[..., None]).reshape(out, -1)


def block_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
                 b: torch.Tensor | None = None, build: str = "native") -> torch.Tensor:
    """x [rows, in] float32 against packed blocks: [rows, out] float32, bit for bit what `linear`
    gives against the decoded weight."""
    return cpu_attention.ops(build).block_linear(x, codes, scales, mins, b)
