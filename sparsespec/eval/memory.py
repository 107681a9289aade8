"""Memory guard: estimate what a run at this context will allocate on its device and refuse before
prefill, instead of being killed by the OS (or running out of GPU memory) halfway through a long
benchmark.

The harness calls the guard after the target and any drafter model are loaded, so the weights are
already resident: what the device reports as available no longer includes them, and the estimate
lists them apart (`MemoryEstimate.resident`), not in what the run still needs. What a run then
allocates is a list of parts (`Part`, kv/footprint.py), each held (allocated once and kept) or
transient (allocated and freed within one step). The guard counts the target's own: its KV cache,
its prefill chunk, the prompt's logits and a verification step (models/footprint.py); everything
else is what the method's parts declare (`Drafter.memory`, which asks its KV policy and its view:
a weights copy, a drafter model's cache and passes, the recall index's ring, a compact view). A
part that allocates declares it next to the code that allocates; the guard only adds up.

A generation runs in three phases (`PHASES`): the target's prefill, the start of its drafter and
decoding. Held parts accumulate from the phase that allocates them; within a phase steps run one
after another, so only the largest transient counts. The peak is the largest phase, for the method
whose peak is largest (methods run one after another and share the target's cache).
docs/reliability.md derives each term and compares the estimate with measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparsespec.kv.footprint import PHASES, Part, Sizing, kv_bytes
from sparsespec.models.footprint import (
    forward_transient_bytes,
    largest_tensor_bytes,
    logits_bytes,
    logits_largest,
    mask_bytes,
    weight_bytes,
)
from sparsespec.models.runner import CausalLM

# what scripts and tests read from here
__all__ = ["PHASES", "MemoryEstimate", "Part", "available_bytes", "check_memory", "estimate_bytes",
           "forward_transient_bytes", "host_available_bytes", "kv_bytes", "largest_tensor_bytes", "logits_bytes",
           "mask_bytes", "weight_bytes"]

GiB = 1024**3
_MMAP_THRESHOLD_MAX = 32 * 1024**2  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def host_available_bytes() -> int:
    """MemAvailable, capped by a cgroup limit when one is set."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            avail = min(avail or 1 << 62, int(limit) - used)
    except (OSError, ValueError):
        pass
    return avail if avail is not None else 1 << 62


def available_bytes(device: torch.device | str = "cpu") -> int:
    """Bytes this process can still allocate on `device`. CUDA: the device's free memory
    (`torch.cuda.mem_get_info`) plus what PyTorch's caching allocator has reserved but not handed
    out (free to reuse, though the driver counts it as used). Elsewhere: host memory."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        return int(free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index))
    return host_available_bytes()


@dataclass
class MemoryEstimate:
    """What a run allocates, by part. `resident`: already allocated when the guard runs (the loaded
    weights). `peak`: the largest phase: the held parts allocated by then plus its largest transient.
    `needed`: what the run still allocates (+ the weights when they are not loaded yet)."""

    device: str
    method: str | None  # the method whose parts are counted: the one with the largest peak
    parts: list[Part] = field(default_factory=list)
    resident: dict[str, int] = field(default_factory=dict)
    weights_loaded: bool = True
    batch_size: int = 1  # sequences decoded together: each holds its own caches and index

    def _bytes(self, part: Part) -> int:
        # prefill runs one sequence at a time: its transients do not scale with the batch
        scaled = part.per_sequence and (part.held or part.phase == "decode")
        return part.nbytes * (self.batch_size if scaled else 1)

    def phase_bytes(self, phase: str) -> tuple[list[Part], Part | None]:
        """(held parts alive in `phase`, its largest transient)."""
        held = [p for p in self.parts if p.alive(phase)]
        transient = [p for p in self.parts if not p.held and p.phase == phase]
        return held, max(transient, key=lambda p: p.nbytes, default=None)

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self._phase_total)

    def _phase_total(self, phase: str) -> int:
        held, top = self.phase_bytes(phase)
        return sum(self._bytes(p) for p in held) + (self._bytes(top) if top else 0)

    @property
    def peak(self) -> int:
        """What the run allocates at its peak, beyond the weights."""
        return self._phase_total(self.peak_phase)

    @property
    def needed(self) -> int:
        return self.peak + (0 if self.weights_loaded else sum(self.resident.values()))

    def __getitem__(self, key: str) -> int:
        """A part's bytes (the largest of that name), or a resident entry."""
        sizes = [p.nbytes for p in self.parts if p.name == key]
        if sizes:
            return max(sizes)
        return self.resident[key]

    def describe(self) -> str:
        """The peak in one line: the held parts alive then, the phase's largest transient, the weights."""
        held, top = self.phase_bytes(self.peak_phase)

        def size(p: Part) -> str:
            n = self._bytes(p) // p.nbytes if p.nbytes else 1
            return f"{n} x {p.nbytes / GiB:.2f} GiB" if n > 1 else f"{p.nbytes / GiB:.2f} GiB"

        items = [f"{p.name} {size(p)}" for p in held]
        if top is not None and top.nbytes:
            items.append(f"{top.name} {size(top)} (transient)")
        weights = sum(self.resident.values())
        if weights:
            items.append(f"weights {weights / GiB:.2f} GiB" + (" (loaded, not counted)" if self.weights_loaded else ""))
        return f"peak during {self.peak_phase}: " + ", ".join(items)


def _method_parts(method: Any, target: CausalLM, drafter_model: CausalLM | None, tokens: int,
                  chunk: int, new_tokens: int | None) -> list[Part]:
    """The target's transients under one method, and the parts the method's drafter declares."""
    engine = method.build(None, drafter_model, chunk)  # its parts, without the target: nothing is allocated
    drafter = engine.drafter
    kmax = engine.controller.max_draft() if drafter is not None or engine.prompt_lookup is not None else 0
    n = min(chunk, tokens)
    parts = [Part("prefill chunk", forward_transient_bytes(target, n, tokens), "prefill", False,
                  largest_tensor_bytes(target, n, tokens)),
             Part("prompt logits", logits_bytes(target, 1), "prefill", False, logits_largest(target, 1)),
             Part("decode step", forward_transient_bytes(target, kmax + 1, tokens) + logits_bytes(target, kmax + 1),
                  "decode", False, logits_largest(target, kmax + 1))]
    if drafter is not None:
        parts += drafter.memory(target, Sizing(tokens, new_tokens, chunk, kmax))
    return parts


def estimate_bytes(target: CausalLM, tokens: int, methods: list[Any], drafter: CausalLM | None, chunk: int,
                   new_tokens: int | None = None, weights_loaded: bool = True, batch_size: int = 1) -> MemoryEstimate:
    """What a run of `methods` allocates on the target's device at a context of `tokens` (prompt +
    new tokens; `new_tokens` of them generated), prefilled in chunks of `chunk` tokens, by part.
    Each method's drafter is asked for its own memory (`Drafter.memory`); the method with the
    largest peak is the one reported."""
    target_kv = Part("target KV cache", kv_bytes(target, tokens + 64), "prefill", True)
    resident = {"target weights": weight_bytes(target)}
    if drafter is not None:
        resident["drafter weights"] = weight_bytes(drafter)
    best: MemoryEstimate | None = None
    for method in methods or [None]:
        if method is None:  # no method given: a plain prefill and decode
            n = min(chunk, tokens)
            parts = [Part("prefill chunk", forward_transient_bytes(target, n, tokens), "prefill", False,
                          largest_tensor_bytes(target, n, tokens))]
        else:
            parts = _method_parts(method, target, drafter, tokens, chunk, new_tokens)
        if target.device.type == "cpu":
            # glibc's malloc serves a block below its mmap threshold from the heap, and raises the
            # threshold to the size of each mmap'd block freed (up to 32 MiB); the heap keeps up to
            # twice the threshold free before giving memory back. So freed transients stay resident:
            # from none to about twice the largest transient tensor; the middle is counted
            # (docs/reliability.md has the measured spread; the guard's headroom covers the rest).
            largest = max((p.largest for p in parts), default=0)
            parts.append(Part("host allocator slack", min(largest, _MMAP_THRESHOLD_MAX), "prefill", True,
                              per_sequence=False))
        est = MemoryEstimate(str(target.device), getattr(method, "name", None), [target_kv, *parts], resident,
                             weights_loaded, batch_size)
        if best is None or est.needed > best.needed:
            best = est
    assert best is not None
    return best


def check_memory(target: CausalLM, tokens: int, methods: list[Any], drafter: CausalLM | None, chunk: int,
                 error: type[BaseException] = MemoryError, headroom: float = 0.85, new_tokens: int | None = None,
                 weights_loaded: bool = True, batch_size: int = 1) -> MemoryEstimate:
    """Raise `error` with one line (the estimate by part, what the device has available, the fixes)
    when the run would need more than `headroom` of the available memory; else return the estimate.
    With batch_size > 1 the fix names the largest batch that fits."""
    est = estimate_bytes(target, tokens, methods, drafter, chunk, new_tokens, weights_loaded, batch_size)
    avail = available_bytes(target.device)
    if est.needed > headroom * avail:
        where = f"{target.device}" + (" (GPU memory)" if target.device.type == "cuda" else " (host RAM)")
        fewer = f"fewer methods ({est.method} needs the most), " if est.method and len(methods) > 1 else ""
        kv = "model.dtype=bfloat16 (halves the KV cache), " if target.dtype == torch.float32 else ""
        fits = next((b for b in range(batch_size - 1, 0, -1)
                     if estimate_bytes(target, tokens, methods, drafter, chunk, new_tokens, weights_loaded,
                                       b).needed <= headroom * avail), None)
        batch = (f"gen.batch_size={fits} (the largest batch that fits), " if fits else
                 "gen.batch_size=1, " if batch_size > 1 else "")
        raise error(
            f"this run needs about {est.needed / GiB:.2f} GiB on {where} but {avail / GiB:.2f} GiB is available "
            f"there (the guard uses at most {headroom:.0%} of it); {est.describe()}. To fit: {batch}a smaller ctx, "
            f"{fewer}a smaller runtime.prefill_chunk (the prefill transients), {kv}a device with more memory, or "
            "runtime.memory_guard=false to skip this check"
        )
    return est
