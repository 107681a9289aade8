"""A CPU kernel for a few query rows against a long KV cache (decode, draft and verification steps,
and the recall index's refresh), built from cpu_attention.cpp on first use.

PyTorch's CPU attention and its skinny matrix products read a long cache well below the machine's
bandwidth when only a few query rows meet it (docs/performance.md). The kernel scores all the rows
of a KV head against each key as it streams past and keeps an online softmax per block of keys,
so every key and value is read once. It is compiled with the C++ compiler PyTorch's extension
builder finds, for this machine's processor, into the user's cache; where that is impossible (no
compiler, no ninja, a failed build) `available()` logs one line and returns False, and callers keep
PyTorch's path. SPARSESPEC_CPU_KERNEL=0 turns the kernel off (the fallback, for comparison).

Layout: q [Hkv, R, D] float32 with a KV head's rows ordered (query head in the group, new token):
row g * n + i is new token i of n, which sees keys [0, T - n + i]; k, v [Hkv, T, D] float32 or
bfloat16 with contiguous rows (a cache's [:, :T] slice is fine).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_suffix(".cpp")
HEAD_SIZES = (16, 32, 64, 128)  # the head sizes it is compiled for
ENV = "SPARSESPEC_CPU_KERNEL"  # "0": never use the kernel
_state: dict[str, object] = {}  # "ops": the loaded ops, or "error": why not


@contextmanager
def switched_off() -> Iterator[None]:
    """Within: PyTorch's path, as if the kernel could not be built (for side-by-side timing)."""
    before = os.environ.get(ENV)
    os.environ[ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = before


def _cache_dir() -> Path:
    """`$SPARSESPEC_CACHE/kernels`, beside the embedded model (default `~/.cache/sparsespec`)."""
    root = os.environ.get("SPARSESPEC_CACHE") or Path.home() / ".cache" / "sparsespec"
    return Path(root).expanduser() / "kernels"


def _machine_tag() -> str:
    """The build is for this processor (-march=native): its name carries the CPU's feature flags."""
    flags = ""
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        pass
    source = SOURCE.read_bytes()
    return hashlib.sha1(flags.encode() + source + torch.__version__.encode()).hexdigest()[:10]


def _build() -> None:
    from torch.utils import cpp_extension

    # ninja from the environment's own scripts folder (the `ninja` package) when it is not on PATH
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), scripts])
    build = _cache_dir() / f"cpu_attention_{_machine_tag()}"
    build.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name="sparsespec_cpu_attention", sources=[str(SOURCE)], build_directory=str(build),
                       extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffp-contract=fast", "-fno-math-errno"],
                       extra_ldflags=["-fopenmp"],
                       is_python_module=False, verbose=False)


def available() -> bool:
    """Whether the kernel is loaded, building it on the first call (once per process)."""
    if os.environ.get(ENV, "1") == "0":
        return False
    if "ops" not in _state and "error" not in _state:
        if sys.platform == "win32":
            _state["error"] = "not built on Windows"
        else:
            try:
                _build()
                _state["ops"] = torch.ops.sparsespec_cpu
            except Exception as e:  # no compiler, no ninja, a failed build: PyTorch's path serves
                _state["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        if "error" in _state:
            log.warning("CPU attention kernel unavailable (%s); using PyTorch's attention", _state["error"])
    return "ops" in _state


def _ops():
    if not available():
        raise RuntimeError(f"the CPU attention kernel is not available ({_state.get('error', f'{ENV}=0')})")
    return _state["ops"]


def applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the kernel serves these tensors: CPU, K/V in float32 or bfloat16, a head size it is
    compiled for, no gradient wanted (it has no backward), and built."""
    return (q.device.type == "cpu" and k.dtype in (torch.float32, torch.bfloat16) and k.stride(-1) == 1
            and q.shape[-1] in HEAD_SIZES and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
            and available())


def _rows(q: torch.Tensor, hkv: int) -> torch.Tensor:
    """q [Hq, n, D] as the kernel takes it: [Hkv, G * n, D] float32, row g * n + i = head g's token i."""
    hq, n, d = q.shape
    return q.float().reshape(hkv, hq // hkv * n, d).contiguous()


def few_rows_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of n new tokens (the last n positions of the keys, causal among themselves) over
    k, v [Hkv, T, D]: q [Hq, n, D] -> (out [Hq, n, D] in q's dtype, lse [Hq, n] float32)."""
    hq, n, d = q.shape
    out, lse = _ops().few_rows_attention(_rows(q, k.shape[0]), k, v, float(scale), n)
    return out.to(q.dtype).reshape(hq, n, d), lse.reshape(hq, n)


def attention_mass(q: torch.Tensor, lse: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """exp(q.k * scale - lse) of c queries (the last c positions of k), summed over each KV head's
    query heads: q [Hq, c, D], lse [Hq, c] -> [Hkv, c, T] float32 (zero where a query cannot see)."""
    hq, c, _ = q.shape
    hkv = k.shape[0]
    return _ops().attention_mass(_rows(q, hkv), lse.float().reshape(hkv, hq // hkv * c).contiguous(), k, float(scale), c)
