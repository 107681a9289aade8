"""Memory guard: estimate what a run at this context will allocate on its device and refuse before
prefill, instead of being killed by the OS (or running out of GPU memory) halfway through a long
benchmark.

The harness calls the guard after the target and any drafter model are loaded, so the weights are
already resident: what the device reports as available no longer includes them, and the estimate
lists them apart (`MemoryEstimate.resident`), not in what the run still needs. What a run then
allocates is a list of parts (`Part`), each either

- held: allocated once and kept until the run ends: the target's KV cache, a drafter model's KV
  cache, the compact cache a sparse self-drafter gathers, and whatever a method's parts say they
  allocate (`Drafter.memory_bytes`, which asks its KV policy: the recall index's ring); or
- transient: allocated and freed within one step: a prefill chunk's activations and attention (the
  path `models.attention.attend` takes on the device), the logits, the probabilities a recall index
  recovers from its capture, a drafter model's own prefill chunk.

A generation runs in three phases: the target's prefill, the start of its drafter (after prefill,
before the first round: a recall index is seeded, a drafter model prefills its own cache) and
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

from sparsespec.kv.quantized import entry_bytes
from sparsespec.models.attention import SMALL_QUERY_BLOCK, flash_attn_applies, fused_kernel
from sparsespec.models.quantized import copy_bytes
from sparsespec.models.runner import CausalLM

GiB = 1024**3
F32 = 4  # bytes of a float32: LSEs, merged attention partials, logits and index rows are float32

# The CPU flash kernel's per-thread blocks: a q block of up to 256 rows against a kv block of 512
# keys, float32 scores plus the q block's accumulator (aten/native/cpu/FlashAttentionKernel.cpp).
_CPU_FLASH_Q_BLOCK, _CPU_FLASH_KV_BLOCK = 256, 512
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


def kv_bytes(model: CausalLM, tokens: int, fmt: str = "fp") -> int:
    """A KV cache of `tokens` entries for `model` (keys and values, every layer), in the model's
    dtype, or in a draft KV format `fmt` (bf16, int8 with its scales: kv/quantized.py)."""
    if fmt == "fp":
        elem = model.lm_head.weight.element_size()
        return 2 * model.n_layers * model.n_kv_heads * model.head_dim * elem * tokens
    return entry_bytes(fmt, model.n_layers, model.n_kv_heads, model.head_dim, model.dtype) * tokens


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


PHASES = ("prefill", "drafter start", "decode")


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


def _logits_largest(model: CausalLM, rows: int) -> int:
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


@dataclass(frozen=True)
class Part:
    """Bytes one part of a run allocates: from `phase` on until the run ends (held), or within one
    step of that phase (transient)."""

    name: str
    nbytes: int
    phase: str  # one of PHASES
    held: bool
    largest: int = 0  # a transient's largest single tensor (for the host allocator's slack)
    per_sequence: bool = True  # a batch of B sequences holds B of it (a decode step's transient: B times the rows)


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
        upto = PHASES[: PHASES.index(phase) + 1]
        held = [p for p in self.parts if p.held and p.phase in upto]
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
    """The parts one method allocates besides the target's cache, asked of the parts it builds."""
    engine = method.build(None)  # its parts, without a model: nothing is allocated
    drafter = engine.drafter
    kmax = engine.controller.max_draft() if drafter is not None or engine.lookup is not None else 0
    n = min(chunk, tokens)
    parts = [Part("prefill chunk", forward_transient_bytes(target, n, tokens), "prefill", False,
                  largest_tensor_bytes(target, n, tokens)),
             Part("prompt logits", logits_bytes(target, 1), "prefill", False, _logits_largest(target, 1)),
             Part("decode step", forward_transient_bytes(target, kmax + 1, tokens) + logits_bytes(target, kmax + 1),
                  "decode", False, _logits_largest(target, kmax + 1))]
    if drafter is None:
        return parts
    if getattr(drafter, "weights", "fp") != "fp" or getattr(drafter, "head_weights", None) not in (None, "fp"):
        # the draft's copy of the linear layers in a low-bit format, made once and shared by the batch
        own = drafter_model if drafter.needs_model and drafter_model is not None else target
        parts.append(Part("draft weights copy", copy_bytes(own, drafter.weights, drafter.head_weights,
                                                           drafter.weights_group), "prefill", True, per_sequence=False))
    policy = getattr(drafter, "policy", None)
    kv = getattr(drafter, "kv", "fp")  # the draft view's format
    model = drafter_model if drafter.needs_model and drafter_model is not None else target
    own = drafter.memory_bytes(model.n_layers, model.n_kv_heads, tokens)
    if own:  # a part's own state, allocated when the engine starts it
        parts.append(Part(type(policy).__name__ if policy is not None else type(drafter).__name__, own,
                          "drafter start", True))
    if drafter.needs_model:
        if drafter_model is not None:
            # its cache: what the policy still shows after the prompt (all of it under a full view),
            # room for a prefill chunk and the first drafts; it doubles once if the output outgrows that
            prompt = tokens - (new_tokens or 0)
            capacity = drafter.capacity(prompt) if hasattr(drafter, "capacity") else prompt + 65
            held = drafter.held_entries(tokens) if hasattr(drafter, "held_entries") else tokens
            scored = policy is not None and not policy.position_only
            own_kv = "fp" if scored else kv  # a scored policy's cache stays as computed; else it is the view
            if new_tokens is None or held + kmax + 1 > capacity:
                parts.append(Part("drafter KV cache growth", kv_bytes(drafter_model, capacity, own_kv), "decode",
                                  True))
            masked = policy is not None and policy.position_only and policy.mask(0, 1, 1, "cpu") is not None
            m = min(chunk, prompt)
            keys = min(prompt, capacity)  # the keys a prefill chunk attends to
            prefill = forward_transient_bytes(drafter_model, m, keys, masked=masked)
            parts += [Part("drafter KV cache", kv_bytes(drafter_model, capacity, own_kv), "drafter start", True),
                      Part("drafter prefill chunk", max(prefill, mask_bytes(m, keys) if masked else 0),
                           "drafter start", False, largest_tensor_bytes(drafter_model, m, keys, masked)),
                      Part("decode step (drafter)", forward_transient_bytes(drafter_model, kmax + 1, held, masked)
                           + logits_bytes(drafter_model, 1), "decode", False)]
            if scored and not policy.covers(tokens):
                # a scoring policy drafts from a compact copy of the entries it selects
                parts.append(Part("drafter compact KV cache",
                                  kv_bytes(drafter_model, policy.budget_for(tokens) + kmax + 1 + 64, kv), "decode",
                                  True))
            if scored and kv != "fp" and policy.covers(prompt + 1):
                # while the policy keeps every entry, the view is a copy of the whole cache in the format
                parts.append(Part("drafter KV copy", kv_bytes(drafter_model, capacity + kmax + 1, kv), "decode", True))
    elif policy is not None:
        prompt = tokens - (new_tokens or 0)
        if not policy.covers(tokens):
            # self-speculation through a sparse view: a compact copy of the kept entries (in the draft
            # KV format), gathered with room for a draft and 64 entries of slack; when the budget
            # outgrows it, the next copy is allocated while the old one still exists
            compact = kv_bytes(target, policy.budget_for(tokens) + kmax + 1 + 64, kv)
            parts.append(Part("compact KV cache", compact, "decode", True))
            if new_tokens is None or policy.budget_for(tokens) - policy.budget_for(prompt + 1) > 64:
                parts.append(Part("compact cache regrowth", compact, "decode", False,
                                  compact // (2 * target.n_layers)))
        if kv != "fp" and policy.covers(prompt + 1):
            # a full view in a draft KV format: a copy of the whole target cache in that format (its
            # capacity: the target cache's), kept in step with it
            parts.append(Part("draft KV copy", kv_bytes(target, tokens + 64, kv), "decode", True))
    capture = drafter.prefill_capture()
    if capture is not None:
        # The last prompt chunk's queries and LSEs are kept for every layer until the drafter reads
        # them (a view keeps its chunk's whole rotated q/k tensor alive); then, layer by layer,
        # turned into probabilities over the keys (kv.capture.attention_mass): q k^T for c queries,
        # [Hq, c, T] float32 (plus the product in the model dtype when that is not float32), their
        # sum per KV group [Hkv, c, T], while the previous layer's sum and the rows it replaces in
        # the index (both [c, Hkv, T]) still exist.
        e = target.lm_head.weight.element_size()
        c = min(capture.last, n)
        kept = target.n_layers * ((target.n_heads + target.n_kv_heads) * n * target.head_dim * e
                                  + target.n_heads * n * F32)
        scores = (target.n_heads * c * tokens * (F32 + (e if e != F32 else 0))
                  + 3 * target.n_kv_heads * c * tokens * F32)
        parts[0] = Part("prefill chunk", kept + parts[0].nbytes, "prefill", False, parts[0].largest)
        parts.append(Part("capture to probabilities", kept + scores, "drafter start", False,
                          target.n_heads * c * tokens * F32))
    return parts


def estimate_bytes(target: CausalLM, tokens: int, methods: list[Any], drafter: CausalLM | None, chunk: int,
                   new_tokens: int | None = None, weights_loaded: bool = True, batch_size: int = 1) -> MemoryEstimate:
    """What a run of `methods` allocates on the target's device at a context of `tokens` (prompt +
    new tokens; `new_tokens` of them generated), prefilled in chunks of `chunk` tokens, by part.
    Each method's parts are asked for their own memory (`Drafter.memory_bytes`, its policy's budget
    and mask, its prefill capture); the method with the largest peak is the one reported."""
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
