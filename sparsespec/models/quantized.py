"""A draft pass with low-bit weights: a copy of the target whose linear layers are held in a draft
weight format, while the verification pass keeps running the unmodified target.

A draft step at batch 1 is bound by reading the weights, so the draft's cost falls with their bytes:
int8 reads a quarter of float32's, int4 an eighth. The copy holds only the linear layers (the fused
q/k/v, o, the fused gate/up, down, and the lm_head by its own format); embeddings, norms, the rotary
embedding and every cache are the target's own. It is made once per (target, format) and shared by
every sequence of a batch, so the packed forward of a batch's drafts still reads each weight once.

Formats (`method.drafter.weights`):

- fp: the target's own weights (no copy).
- bf16: the weights rounded to bfloat16, products in bfloat16.
- int8: per output channel symmetric int8 (`torch.ops.aten._weight_int8pack_mm`).
- int4: groups of `group` weights along the input, each with a scale and a zero point, the
  asymmetric min/max grid of GGUF's Q4_1 (`torch.ops.aten._weight_int4pack_mm_for_cpu`).

Why torch's own packed ops: read cold over all of SmolLM2's linear layers, one row, 2 threads
(`python -m sparsespec.experiments weight_formats --threads 2 --torchao`, once, on this project's
2-core CPU while other work ran), a step took 73 ms in float32, 25 ms with bf16 `F.linear`, 12 ms through
`_weight_int8pack_mm` and 6.8 ms through `_weight_int4pack_mm_for_cpu`: the low-bit ops read
their bytes at least as fast as float32 reads its own, so the step's time falls with the format's
bytes. Both ops are built for bfloat16 activations, so the copy takes the draft's rows in bfloat16
and gives float32 back. torchao (0.18) installs here, but its weight-only int8 config took 65 ms in
the same run and it has no int4 packing for the CPU any more (its int4 layouts serve GPU kernels):
the ops themselves are faster and the smaller dependency. Group 32 by default: SmolLM2's hidden
size (576) is not a multiple of 128, and 32 is the embedded checkpoint's own block size.

Rows (`method.drafter.activations`): torch's int8 / int4 ops are fast only with bfloat16 rows, so
with a float32 target they round the draft's activations, and the draft drifts from the target
even where the weights are held exactly. The project's CPU block kernel (see `block_format`) takes
float32 rows: `auto` uses it where it runs, `fp32` insists on it, `bf16` always takes torch's ops.
docs/benchmarks.md measures the two end to end.

The output stays the target's: the verifier runs the unmodified target, and under sampling the
draft's q is the quantized draft's own distribution (speculative sampling needs only that q is what
the draft was drawn from).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sparsespec.checks import SettingError
from sparsespec.kernels import cpu_attention, cpu_linear
from sparsespec.models.runner import CausalLM

WEIGHT_FORMATS = ("fp", "bf16", "int8", "int4")
# the rows a low-bit product takes: auto (float32 where the project's block kernel runs, else
# bfloat16), fp32 (the block kernel: lossless for weights stored in its blocks), bf16 (torch's ops)
ACTIVATIONS = ("auto", "fp32", "bf16")
# the group sizes torch's CPU int4 kernel takes (a group is `group` consecutive input weights)
INT4_GROUPS = (32, 64, 128, 256)
# torch's int4 packing takes output features in multiples of this; the copy pads and drops the rest
INT4_ROWS = 16
PROJECTIONS = ("qkv", "o", "gate_up", "down")


class WeightFormatError(SettingError):
    """A draft weight setting this device, dtype or model cannot run, as its key (the drafter's
    field: weights, head_weights, weights_group, activations), value and reason; the reason names
    what works here. The method names it at the key the user set (`method.drafter.weights=...`)."""


def _probe(fmt: str, device: str, group: int = 32) -> str | None:
    """Why `fmt` cannot run on `device` (None: it runs): a tiny product through the real kernel."""
    try:
        w = torch.randn(INT4_ROWS, max(group, 64), device=device)
        PackedLinear.pack(w, None, fmt, group)(torch.randn(2, w.shape[1], device=device))
        return None
    except Exception as e:  # the kernel's own refusal, said in the error
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


@functools.cache
def format_problem(fmt: str, device: str, group: int = 32) -> str | None:
    """Why the draft weight format `fmt` cannot run on `device` (a device type such as "cpu"), or
    None when it can. Probed once per process by running the kernel on a tiny weight."""
    if fmt not in WEIGHT_FORMATS:
        return "not a draft weight format"
    if fmt in ("fp", "bf16"):
        return None
    why = _probe(fmt, device, group)
    return None if why is None else f"torch's {fmt} kernel does not run on {device}: {why}"


def working_formats(device: str = "cpu") -> list[str]:
    """The draft weight formats whose kernels run on `device`."""
    return [f for f in WEIGHT_FORMATS if format_problem(f, device) is None]


def format_label(fmt: str, dtype: torch.dtype, group: int, device: str = "cpu", activations: str = "auto") -> str:
    """A format as rows report it: fp32 / bf16 (the target's own), int8, int4-g32, or a block format
    the project's CPU kernel runs (int8-g32, int4-g32 with fp32 rows: see `block_format`); a low-bit
    format whose products take bf16 rows where the target's are float32 says so (`int4-g32 bf16-rows`)."""
    if fmt == "fp":
        return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))
    blocks = block_format(fmt, group, device, dtype, 0, activations)
    label = "int8-g32" if blocks == "q8_0" else f"int4-g{group}" if fmt == "int4" else fmt
    return label + " bf16-rows" if fmt in ("int8", "int4") and blocks is None and dtype == torch.float32 else label


def block_format(fmt: str, group: int, device: str, dtype: torch.dtype, inputs: int,
                 activations: str = "auto") -> str | None:
    """The GGUF block layout `fmt` runs in on this device and dtype, or None for torch's packed ops.

    On the CPU with a float32 target, int4 (groups of 32) is held as Q4_1 blocks and int8 as Q8_0
    blocks (groups of 32, one scale each) and their products run the project's float32 kernel
    (sparsespec.kernels.cpu_linear.block_linear): the rows stay in float32, and a checkpoint that was
    stored in these formats (the embedded SmolLM2: Q4_1 layers, a Q8_0 embedding shared with the
    lm_head) is held exactly, so the draft's products are the target's own bit for bit. Elsewhere
    (CUDA, a bf16 target, the kernel switched off, a layer of `inputs` not a multiple of 32) torch's
    packed ops with bf16 rows serve, and so they do wherever `activations` is "bf16"."""
    if activations == "bf16":
        return None
    if device != "cpu" or dtype != torch.float32 or inputs % cpu_linear.BLOCK or not cpu_attention.available():
        return None
    if fmt == "int4" and group == cpu_linear.BLOCK:
        return "q4_1"
    return "q8_0" if fmt == "int8" else None


@dataclass
class PackedLinear:
    """One linear layer's weight in a draft format: called on rows [n, in] of any float dtype, it
    gives [n, out] in that dtype."""

    fmt: str
    out_features: int
    weight: torch.Tensor  # bf16 [out, in]; int8 [out, in]; int4 packed [out padded, in / 2] uint8
    scales: torch.Tensor | None  # int8: [out] bf16; int4: [in / group, out padded, 2] bf16 (scale, zero)
    bias: torch.Tensor | None  # float32, added after the product
    group: int = 0
    mins: torch.Tensor | None = None  # q4_1 blocks: fp16 [out, in / 32]

    @classmethod
    def pack_blocks(cls, w: torch.Tensor, b: torch.Tensor | None, fmt: str) -> PackedLinear:
        """w [out, in] in a GGUF block format ("q4_1" or "q8_0") for the project's CPU kernel."""
        codes, scales, mins = cpu_linear.pack_blocks(w, fmt)
        bias = None if b is None else b.detach().float().contiguous()
        return cls(fmt, w.shape[0], codes, scales, bias, cpu_linear.BLOCK, mins)

    @classmethod
    def pack(cls, w: torch.Tensor, b: torch.Tensor | None, fmt: str, group: int = 32) -> PackedLinear:
        """w [out, in] (any float dtype) in `fmt` ("bf16", "int8" or "int4")."""
        w = w.detach().float()
        out = w.shape[0]
        bias = None if b is None else b.detach().float()
        if fmt == "bf16":
            return cls(fmt, out, w.to(torch.bfloat16), None, bias)
        if fmt == "int8":
            scale = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
            q = (w / scale.float()[:, None]).round().clamp(-128, 127).to(torch.int8)
            return cls(fmt, out, q, scale, bias)
        if fmt == "int4":
            if w.shape[1] % group:
                raise WeightFormatError("weights_group", group, f"does not fit this model: a layer has "
                                        f"{w.shape[1]} inputs, not a multiple of {group}")
            w = F.pad(w, (0, 0, 0, -out % INT4_ROWS))
            n, k = w.shape
            g = w.reshape(n, k // group, group)
            lo, hi = g.amin(-1), g.amax(-1)
            scale = ((hi - lo) / 15).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
            # the kernel computes (q - 8) * scale + zero: the grid's minimum is zero - 8 * scale
            zero = (lo + 8 * scale.float()).to(torch.bfloat16)
            lo = zero.float() - 8 * scale.float()
            q = ((g - lo[..., None]) / scale.float()[..., None]).round().clamp(0, 15).to(torch.int32)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k), 1)
            scales = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()  # [k / group, n, 2]
            return cls(fmt, out, packed, scales, bias, group)
        raise WeightFormatError("weights", fmt, "is not a packed draft weight format: use bf16, int8 or int4")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fmt in cpu_linear.BLOCK_FORMATS:
            rows = x.reshape(-1, x.shape[-1]).float().contiguous()
            y = cpu_linear.block_linear(rows, self.weight, self.scales, self.mins, self.bias)
            return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        h = x.to(torch.bfloat16)
        if self.fmt == "bf16":
            y = F.linear(h, self.weight)
        elif self.fmt == "int8":
            y = torch.ops.aten._weight_int8pack_mm(h, self.weight, self.scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(h, self.weight, self.group, self.scales)
            if y.shape[-1] != self.out_features:
                y = y[..., : self.out_features]
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    @property
    def nbytes(self) -> int:
        """What one product reads: the packed weight, its scales and the bias."""
        return sum(t.numel() * t.element_size() for t in (self.weight, self.scales, self.bias, self.mins)
                   if t is not None)


class DraftLM(CausalLM):
    """The target with its linear layers in draft formats (`weights` for the layers' projections,
    `head` for the lm_head). Everything else is the target's own object (embeddings, norms, rotary
    embedding, the Hugging Face modules), so a cache of the target is a cache of this model."""

    def __init__(self, target: CausalLM, weights: str, head: str, group: int, activations: str = "auto") -> None:
        self.__dict__.update(target.__dict__)  # the target's modules and fused weights, shared
        self.forward_calls = 0
        self.weights, self.head, self.group, self.activations = weights, head, group, activations
        self._packed: list[dict[str, PackedLinear]] = []
        if weights != "fp":
            if any(w is None for w in target._gate_up):
                raise WeightFormatError("weights", weights, "does not fit this model: its MLP is not a gated one "
                                        "without bias, which the draft weight formats need (the format that works "
                                        "here: fp)")
            for i, layer in enumerate(target.layers):
                w, b = target._qkv[i]
                o, down = layer.self_attn.o_proj, layer.mlp.down_proj
                self._packed.append({"qkv": self._pack(w, b, weights),
                                     "o": self._pack(o.weight, o.bias, weights),
                                     "gate_up": self._pack(target._gate_up[i], None, weights),
                                     "down": self._pack(down.weight, down.bias, weights)})
        self._head = None if head == "fp" else self._pack(target.lm_head.weight, target.lm_head.bias, head)

    def _pack(self, w: torch.Tensor, b: torch.Tensor | None, fmt: str) -> PackedLinear:
        blocks = block_format(fmt, self.group, w.device.type, w.dtype, w.shape[1], self.activations)
        return PackedLinear.pack_blocks(w, b, blocks) if blocks else PackedLinear.pack(w, b, fmt, self.group)

    def _linear(self, name: str, i: int, x: torch.Tensor) -> torch.Tensor:
        return self._packed[i][name](x) if self._packed else super()._linear(name, i, x)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return super()._logits(h) if self._head is None else self._head(h).float()


def linear_bytes(model: CausalLM, weights: str, head: str, group: int, activations: str = "auto") -> int:
    """What a forward of `model` reads of its linear layers' weights with the layers in `weights`
    and the lm_head in `head` (fp: the target's own), from their shapes alone."""
    return _linear_bytes(model, weights, head, group, activations, own=True)


def copy_bytes(model: CausalLM, weights: str, head: str | None, group: int, activations: str = "auto") -> int:
    """What the draft copy in these formats allocates beyond the target's own weights."""
    return _linear_bytes(model, weights, weights if head is None else head, group, activations, own=False)


def _linear_bytes(model: CausalLM, weights: str, head: str, group: int, activations: str, own: bool) -> int:
    def size(w: torch.Tensor, fmt: str, bias: torch.Tensor | None = None) -> int:
        out, k = w.shape
        extra = 0 if bias is None else out * 4
        if fmt == "fp":
            return w.numel() * w.element_size() + (0 if bias is None else bias.numel() * bias.element_size()) \
                if own else 0
        if fmt == "bf16":
            return out * k * 2 + extra
        blocks = block_format(fmt, group, w.device.type, w.dtype, k, activations)
        if blocks is not None:  # codes, then an fp16 scale (and for q4_1 an fp16 minimum) per 32 inputs
            return out * k // (2 if blocks == "q4_1" else 1) + out * (k // 32) * (4 if blocks == "q4_1" else 2) + extra
        if fmt == "int8":
            return out * k + out * 2 + extra
        n = out + (-out % INT4_ROWS)
        return n * k // 2 + (k // group) * n * 4 + extra

    total = 0
    for i, layer in enumerate(model.layers):
        w, b = model._qkv[i]
        total += size(w, weights, b) + size(layer.self_attn.o_proj.weight, weights, layer.self_attn.o_proj.bias)
        mlp = layer.mlp
        if model._gate_up[i] is not None:
            total += size(model._gate_up[i], weights) + size(mlp.down_proj.weight, weights, mlp.down_proj.bias)
    return total + size(model.lm_head.weight, head, model.lm_head.bias)


def check_format(target: CausalLM, weights: str, head: str, group: int, activations: str = "auto") -> None:
    """Raise WeightFormatError (the key, its value, the reason and what works here) unless the formats
    run on the target's device with this group size, these rows and the target's layer shapes."""
    device = target.device.type
    # the input sizes the packed layers take: the hidden size (q/k/v, lm_head) and the MLP's (down)
    inputs = {w.shape[1] for w, _ in target._qkv} | {target.lm_head.weight.shape[1]}
    inputs |= {layer.mlp.down_proj.weight.shape[1] for layer in target.layers}
    if activations == "fp32":
        for fmt in {weights, head} & {"int8", "int4"}:
            if any(block_format(fmt, group, device, target.dtype, k) is None for k in inputs):
                raise WeightFormatError(
                    "activations", activations, f"cannot run here: {fmt} products with float32 rows need the "
                    "project's CPU kernel, a float32 target on the CPU"
                    f"{' and groups of 32' if fmt == 'int4' else ''} and layers whose inputs are multiples of 32; "
                    "use activations=auto or activations=bf16")
    works = ", ".join(working_formats(device))
    for key, fmt in (("weights", weights), ("head_weights", head)):
        why = format_problem(fmt, device)
        if why is not None:
            raise WeightFormatError(key, fmt, f"{'is' if fmt not in WEIGHT_FORMATS else 'cannot run here:'} {why}; "
                                    f"the formats that work here ({device}): {works}")
    if "int4" not in (weights, head):
        return
    fits = [g for g in INT4_GROUPS if all(k % g == 0 for k in inputs) and format_problem("int4", device, g) is None]
    bad = sorted(k for k in inputs if k % group)
    why = (f"a layer has {bad[0]} inputs, not a multiple of {group}" if bad
           else format_problem("int4", device, group) if group in INT4_GROUPS
           else f"torch's int4 kernel takes groups of {', '.join(map(str, INT4_GROUPS))}")
    if bad or group not in INT4_GROUPS or format_problem("int4", device, group) is not None:
        works = ", ".join(map(str, fits)) or "none (use weights=int8 or bf16)"
        raise WeightFormatError("weights_group", group, f"does not work here: {why}; the int4 groups that work for "
                                f"this model here: {works}")


_COPIES: weakref.WeakKeyDictionary[CausalLM, dict[tuple[str, str, int, str], DraftLM]] = weakref.WeakKeyDictionary()


def draft_model(target: CausalLM, weights: str = "fp", head: str | None = None, group: int = 32,
                activations: str = "auto") -> CausalLM:
    """The model a draft pass runs: the target itself for fp weights, else its copy in these formats
    (head None: the lm_head in `weights` too; `activations`: the rows its low-bit products take), made
    on first use and kept while the target lives, so every method and every sequence drafting from
    this target in these formats shares one copy."""
    head = weights if head is None else head
    if weights == "fp" and head == "fp":
        return target
    copies = _COPIES.setdefault(target, {})
    key = (weights, head, group, activations)
    if key not in copies:
        check_format(target, weights, head, group, activations)
        copies[key] = DraftLM(target, weights, head, group, activations)
    return copies[key]
