"""A CPU kernel for a few query rows against a long KV cache (decode, draft and verification steps,
and the recall index's refresh), built from cpu_attention.cpp on first use.

PyTorch's CPU attention and its skinny matrix products read a long cache well below the machine's
bandwidth when only a few query rows meet it (docs/performance.md). The kernel scores all the rows
of a KV head against each key as it streams past and keeps an online softmax per block of keys,
so every key and value is read once. Its vector code is written for the processor's own register
width (8 floats with AVX2, 16 with AVX-512; why it matters is in the source's header).

Builds. The kernel is compiled with the C++ compiler PyTorch's extension builder finds, into the
user's cache, in one extension with the few-rows linear kernel (sparsespec.kernels.cpu_linear), in
up to two builds: "native" (-march=native, what the attention path uses) and, on
x86-64, "avx2" (-march=x86-64-v3: AVX2 + FMA, no AVX-512), so that a developer on either kind of
processor tests and measures both. Where a build is impossible (no compiler, no ninja, a failed
build) `available()` logs one line and returns False, and callers keep PyTorch's path.

Choice. SPARSESPEC_CPU_KERNEL=0 turns the kernel off (the fallback, for comparison); =1 uses it
wherever it applies. Unset (or "auto"), a caller that passes its PyTorch path to `applies` gets the
kernel only where it was measured at least as fast as that path on this processor: a one-time
calibration per operation, head size, group and row count, cold (synthetic keys and values larger
than the last-level cache), cached beside the build, so no processor gets a slower attention from
the kernel.

Layout: q [Hkv, R, D] float32 with a KV head's rows ordered (query head in the group, new token):
row g * n + i is new token i of n, which sees keys [0, T - n + i]; k, v [Hkv, T, D] float32 or
bfloat16 with contiguous rows (a cache's [:, :T] slice is fine), or int8 with a float32 scale per
row ([Hkv, T]: a draft's int8 view, `few_rows_attention_int8`), dequantized block by block as the
keys stream past.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_suffix(".cpp")
SOURCES = (SOURCE, SOURCE.with_name("cpu_linear.cpp"))  # one extension: the attention and linear kernels
HEAD_SIZES = (16, 32, 64, 128)  # the head sizes it is compiled for
ENV = "SPARSESPEC_CPU_KERNEL"  # "0": never; "1": wherever it applies; unset / "auto": where it is faster
MARCH = {"native": "native", "avx2": "x86-64-v3"}  # build -> the -march it is compiled for
_state: dict[str, dict[str, object]] = {}  # build -> {"ops": the loaded ops} or {"error": why not}
_calibration: dict[str, list[float]] = {}  # key -> [kernel ms, PyTorch ms], loaded from / saved to disk


def builds() -> tuple[str, ...]:
    """The builds this machine can make: the processor's own, and on x86-64 the AVX2 one beside it."""
    return ("native", "avx2") if platform.machine().lower() in ("x86_64", "amd64") else ("native",)


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
    """A native build is for this processor: its name carries the CPU's feature flags."""
    flags = ""
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        pass
    source = b"".join(path.read_bytes() for path in SOURCES)
    return hashlib.sha1(flags.encode() + source + torch.__version__.encode()).hexdigest()[:10]


def _build_dir(build: str) -> Path:
    return _cache_dir() / f"cpu_attention_{build}_{_machine_tag()}"


def _library(build: str) -> str:
    return f"sparsespec_cpu_{build}"


def _build(build: str = "native") -> None:
    from torch.utils import cpp_extension

    # ninja from the environment's own scripts folder (the `ninja` package) when it is not on PATH
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), scripts])
    where = _build_dir(build)
    where.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name=_library(build), sources=[str(path) for path in SOURCES], build_directory=str(where),
                       extra_cflags=["-O3", f"-march={MARCH[build]}", "-fopenmp", "-ffp-contract=fast",
                                     "-fno-math-errno", f"-DSPARSESPEC_LIB={_library(build)}"],
                       extra_ldflags=["-fopenmp"],
                       is_python_module=False, verbose=False)


def available(build: str = "native") -> bool:
    """Whether this build of the kernel is loaded, building it on the first call (once per process)."""
    if os.environ.get(ENV, "auto") == "0":
        return False
    state = _state.setdefault(build, {})
    if not state:
        if sys.platform == "win32":
            state["error"] = "not built on Windows"
        elif build not in builds():
            state["error"] = f"no {build} build on {platform.machine()}"
        else:
            try:
                _build(build)
                state["ops"] = getattr(torch.ops, _library(build))
            except Exception as e:  # no compiler, no ninja, a failed build: PyTorch's path serves
                state["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        if "error" in state:
            log.warning("CPU attention kernel (%s build) unavailable (%s); using PyTorch's attention", build,
                        state["error"])
    return "ops" in state


def ops(build: str = "native"):
    """The loaded ops of a build (few_rows_attention, attention_mass, few_rows_linear, vector_width);
    raises if unavailable."""
    if not available(build):
        raise RuntimeError(f"the CPU attention kernel ({build} build) is not available "
                           f"({_state.get(build, {}).get('error', f'{ENV}=0')})")
    return _state[build]["ops"]


def vector_width(build: str = "native") -> int:
    """Floats per vector register the build was compiled for: 8 (AVX2 and others) or 16 (AVX-512)."""
    return int(ops(build).vector_width())


def applies(q: torch.Tensor, k: torch.Tensor, op: str = "attention", pytorch: Callable | None = None) -> bool:
    """Whether the kernel serves these tensors: CPU, K/V in float32 or bfloat16 (int8: a draft's
    view, for `few_rows_attention_int8`), a head size it is compiled for, no gradient wanted (it has
    no backward), built, and, given the caller's PyTorch path for `op` ("attention": (q, k, v,
    scale), "mass": (q, lse, k, scale)), measured at least as fast as that path here (see the
    module's docstring). An int8 view is given no PyTorch path to compare with: that path would
    first dequantize the whole view, reading it and writing it in float32 again."""
    if not (q.device.type == "cpu" and k.dtype in (torch.float32, torch.bfloat16, torch.int8) and k.stride(-1) == 1
            and q.shape[-1] in HEAD_SIZES and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
            and available()):
        return False
    if pytorch is None or os.environ.get(ENV, "auto") == "1":
        return True
    return faster(op, q.shape[0] // k.shape[0], q.shape[1], q.shape[-1], k.dtype, pytorch)


# Calibration: the row counts measured, and the shape they are measured on. A call is judged by
# the first measured count at or above its own (the largest past the end). Attention is judged at
# one new token for every count: a verification pass must take the path of the one-token steps it
# reproduces (each path is batch-invariant only within itself), and the one-token step is the call
# that decides a decode's speed. The recall index's mass only ranks keys, so each count has its own.
CALIBRATED_ROWS = {"attention": (1,), "mass": (1, 2, 5, 9, 17, 33, 64)}
CALIBRATION_KEYS = 8192  # keys per head
CALIBRATION_HEADS = 2  # KV heads per layer
CALIBRATION_BYTES = 96 << 20  # cycle through at least this many bytes of K/V (beyond a last-level cache)


def _calibration_file() -> Path:
    return _build_dir("native") / "calibration.json"


def _bucket(op: str, n: int) -> int:
    rows = CALIBRATED_ROWS[op]
    return next((r for r in rows if r >= n), rows[-1])


def median_ms(fn: Callable[[], object], repeats: int = 3) -> float:
    """The median of `repeats` timed calls after one warm-up, in milliseconds."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def calibrate(op: str, group: int, n: int, d: int, dtype: torch.dtype, pytorch: Callable) -> list[float]:
    """[kernel ms, PyTorch ms] for `op` with `n` new tokens (or accepted queries), a group of `group`
    query heads per KV head and head size d, cold: CALIBRATION_HEADS heads of CALIBRATION_KEYS keys
    per layer, over as many layers as make CALIBRATION_BYTES."""
    layer_bytes = 2 * CALIBRATION_HEADS * CALIBRATION_KEYS * d * torch.empty((), dtype=dtype).element_size()
    layers = max(2, -(-CALIBRATION_BYTES // layer_bytes))
    gen = torch.Generator().manual_seed(0)
    ks = [torch.randn(CALIBRATION_HEADS, CALIBRATION_KEYS, d, generator=gen).to(dtype) for _ in range(layers)]
    q = torch.randn(CALIBRATION_HEADS * group, n, d, generator=gen).to(dtype)  # as a model of that dtype attends
    scale = d ** -0.5
    if op == "attention":
        vs = [torch.randn_like(k) for k in ks]

        def kernel():
            return [few_rows_attention(q, k, v, scale) for k, v in zip(ks, vs, strict=True)]

        def theirs():
            return [pytorch(q, k, v, scale) for k, v in zip(ks, vs, strict=True)]
    else:
        lse = torch.full((CALIBRATION_HEADS * group, n), 8.0)

        def kernel():
            return [attention_mass(q, lse, k, scale) for k in ks]

        def theirs():
            return [pytorch(q, lse, k, scale) for k in ks]
    with torch.no_grad():
        return [median_ms(kernel), median_ms(theirs)]


def faster(op: str, group: int, n: int, d: int, dtype: torch.dtype, pytorch: Callable) -> bool:
    """Whether the kernel was measured at least as fast as `pytorch` for this case on this processor,
    calibrating it on first sight (once per machine; cached beside the build)."""
    key = f"{op} g{group} n{_bucket(op, n)} d{d} {str(dtype).removeprefix('torch.')}"
    if not _calibration:
        try:
            _calibration.update(json.loads(_calibration_file().read_text()))
        except (OSError, ValueError):
            pass
    if key not in _calibration:
        _calibration[key] = calibrate(op, group, _bucket(op, n), d, dtype, pytorch)
        try:
            _calibration_file().write_text(json.dumps(_calibration, indent=1, sort_keys=True))
        except OSError as e:
            log.info("CPU attention kernel: calibration not saved (%s)", e)
        kernel_ms, pytorch_ms = _calibration[key]
        log.info("CPU attention kernel, %s: %.1f ms against PyTorch's %.1f ms: %s", key, kernel_ms, pytorch_ms,
                 "the kernel" if kernel_ms <= pytorch_ms else "PyTorch's path")
    kernel_ms, pytorch_ms = _calibration[key]
    return kernel_ms <= pytorch_ms


def _rows(q: torch.Tensor, hkv: int) -> torch.Tensor:
    """q [Hq, n, D] as the kernel takes it: [Hkv, G * n, D] float32, row g * n + i = head g's token i."""
    hq, n, d = q.shape
    return q.float().reshape(hkv, hq // hkv * n, d).contiguous()


def few_rows_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                       build: str = "native") -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of n new tokens (the last n positions of the keys, causal among themselves) over
    k, v [Hkv, T, D]: q [Hq, n, D] -> (out [Hq, n, D] in q's dtype, lse [Hq, n] float32)."""
    hq, n, d = q.shape
    out, lse = ops(build).few_rows_attention(_rows(q, k.shape[0]), k, v, float(scale), n)
    return out.to(q.dtype).reshape(hq, n, d), lse.reshape(hq, n)


def attention_mass(q: torch.Tensor, lse: torch.Tensor, k: torch.Tensor, scale: float,
                   build: str = "native") -> torch.Tensor:
    """exp(q.k * scale - lse) of c queries (the last c positions of k), summed over each KV head's
    query heads: q [Hq, c, D], lse [Hq, c] -> [Hkv, c, T] float32 (zero where a query cannot see)."""
    hq, c, _ = q.shape
    hkv = k.shape[0]
    return ops(build).attention_mass(_rows(q, hkv), lse.float().reshape(hkv, hq // hkv * c).contiguous(), k, float(scale), c)


def few_rows_attention_int8(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, v: torch.Tensor,
                            v_scale: torch.Tensor, scale: float, build: str = "native") -> tuple[torch.Tensor, torch.Tensor]:
    """`few_rows_attention` over an int8 view: k, v [Hkv, T, D] int8 with per-row float32 scales
    k_scale, v_scale [Hkv, T] (key (h, t) is k[h, t] * k_scale[h, t], as `Int8Rows.dequantize`)."""
    hq, n, d = q.shape
    out, lse = ops(build).few_rows_attention_int8(_rows(q, k.shape[0]), k, k_scale, v, v_scale, float(scale), n)
    return out.to(q.dtype).reshape(hq, n, d), lse.reshape(hq, n)
