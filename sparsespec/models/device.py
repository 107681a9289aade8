"""`model.device` and `model.dtype` settings -> a torch device and dtype the machine can run.

`auto` picks CUDA when it is available, else the CPU; `model.dtype=auto` picks bfloat16 on CUDA (what
long-context users run) and float32 on the CPU (where bf16 matmuls are slower, and fp32 is the dtype
in which every method's greedy output is token-identical to `ar`).
"""

from __future__ import annotations

import re

import torch

from sparsespec.checks import ConfigError

DEVICE_FORM = re.compile(r"auto|cpu|cuda(:\d+)?")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def check_device_form(key: str, value: object) -> None:
    """The spelling only (no CUDA query): settings are checked before anything touches the device."""
    if not isinstance(value, str) or not DEVICE_FORM.fullmatch(value):
        raise ConfigError(f"{key}={value!r}: expected auto, cpu, cuda or cuda:N")


def resolve_device(spec: str | torch.device | None = "auto", key: str = "model.device") -> torch.device:
    """The device `spec` names, checked against this machine (ConfigError naming `key` and the fix)."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = "auto" if spec is None else spec
    check_device_form(key, spec)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={spec}: CUDA is not available here (no GPU, or a CPU build of torch); "
                              f"use {key}=cpu or {key}=auto")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{key}={spec}: this machine has {count} visible GPU(s) (cuda:0..cuda:{count - 1}); "
                              "pick one of those, or check CUDA_VISIBLE_DEVICES")
    return device


def resolve_dtype(spec: str | torch.dtype | None, device: torch.device, key: str = "model.dtype") -> torch.dtype:
    """The dtype `spec` names on `device`; `auto` (or None): bfloat16 on CUDA, float32 elsewhere."""
    if isinstance(spec, torch.dtype):
        dtype = spec
    elif spec is None or str(spec).lower() == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        try:
            dtype = DTYPES[str(spec).lower()]
        except KeyError:
            raise ConfigError(f"{key}={spec!r}: expected auto, float32, bfloat16 or float16") from None
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"{key}=bfloat16: {torch.cuda.get_device_name(device)} cannot run bfloat16; "
                          f"use {key}=float16 or {key}=float32")
    return dtype


def to_device_ids(ids: list[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Token ids (or positions) on `device` without making the host wait: on CUDA a list goes through
    pinned memory with a non-blocking copy (a plain `torch.tensor(..., device="cuda")` copies from
    pageable memory, which synchronises with the GPU every time it is called)."""
    if isinstance(ids, torch.Tensor):
        return ids if ids.device == device else ids.to(device, non_blocking=True)
    t = torch.tensor(ids, dtype=torch.long, device="cpu")
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t if device.type == "cpu" else t.to(device)
