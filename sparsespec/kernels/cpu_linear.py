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
