"""Matrix products of low-precision operands taken in float32, for the numbers that decide which
token or which cached position wins (the logits, the recall index's attention mass): rounding a
product to bfloat16 moves it by up to 2^-8 of its size, enough to reorder near-ties.

CUDA's matmul can accumulate bf16/fp16 operands and return float32 (`out_dtype`), with no float32
copy of either operand. Where the device or this torch has no such kernel (the CPU), the operands
are upcast instead: the same numbers, one extra read of the upcast operand, said once per device.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

# devices (by type) whose matmul has no float32 output for low-precision operands: learnt on first use
_NO_OUT_DTYPE: set[str] = set()


def matmul_fp32(a: torch.Tensor, b: torch.Tensor, what: str = "a product", chunk: int | None = None) -> torch.Tensor:
    """a @ b in float32 (2-D or batched 3-D), products accumulated and returned in float32.
    `what` names the product in the one line logged when this device falls back to upcasting;
    `chunk`: on that path, upcast b this many columns at a time (bounds its float32 copy)."""
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        return a @ b
    device = a.device.type
    if device not in _NO_OUT_DTYPE:
        try:
            op = torch.mm if a.dim() == 2 else torch.bmm
            return op(a, b, out_dtype=torch.float32)
        except (TypeError, NotImplementedError):  # an older torch (no keyword) or a device without the kernel
            _NO_OUT_DTYPE.add(device)
            log.info("%s: no float32-output %s matmul on %s in torch %s; the operands are upcast to float32 "
                     "instead (same numbers, an extra read of them)", what, a.dtype, device, torch.__version__)
    a = a.float()
    if chunk is None or b.shape[-1] <= chunk:
        return a @ b.float()
    return torch.cat([a @ part.float() for part in b.split(chunk, dim=-1)], dim=-1)
