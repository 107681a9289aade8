"""What each part of a decoding round reads and computes, from a model's shape alone.

A round of speculative decoding is: k draft steps, one verification pass over the k + 1 new rows,
and, for a recall index, the index's update from the queries that were kept; `ar` is one step per
token. Each part is a list of `Op`s (bytes read, FLOPs, query rows); a `DeviceProfile` turns them
into seconds. The byte counts follow the engine: a step reads every linear layer's weights once for
all rows of the batch (the lm_head included, in its own format), the norms, and each sequence's K
and V over its cache (a draft: over its view). Draft weight formats are counted as
`sparsespec.models.quantized` packs them: bf16 two bytes a weight, int8 one byte and a bfloat16
scale per output row, int4 half a byte and a bfloat16 scale and zero point per group of inputs,
output rows padded to a multiple of 16; a bias stays float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparsespec.plan.shapes import ModelShape

# bytes an element takes in each dtype; labels as rows report them (fp32, bf16) are accepted too
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "int4": 0.5}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
WEIGHT_FORMATS = ("float32", "bfloat16", "float16", "int8", "int4")
KV_FORMATS = ("float32", "bfloat16", "float16")
DRAFT_KV_FORMATS = (*KV_FORMATS, "int8", "int4")  # int8: a float32 scale per (token, KV head) row (kv/quantized.py)
# int4 K/V (a float32 scale and zero point per row) is priced for comparison with 4-bit KV drafts
# such as QuantSpec's; the engine holds a draft's K/V in int8 at most
INT4_ROWS = 16  # torch's int4 packing pads output rows to a multiple of this (models/quantized.py)


def dtype_name(value: str, key: str = "dtype", allowed: tuple[str, ...] = WEIGHT_FORMATS) -> str:
    """`value` as a dtype name of `allowed` (ValueError naming `key` otherwise)."""
    name = ALIASES.get(str(value).lower(), str(value).lower())
    if name not in allowed:
        raise ValueError(f"{key}={value}: not one of {', '.join(allowed)}")
    return name


@dataclass(frozen=True)
class Dtypes:
    """The target's weight and KV dtypes, and what a draft step reads: `draft_weights` (None: the
    target's), `draft_head` (None: as draft_weights), `draft_kv` (None: the target's KV dtype)."""

    weights: str = "float32"
    kv: str = "float32"
    draft_weights: str | None = None
    draft_head: str | None = None
    draft_kv: str | None = None
    group: int = 32
    blocks: bool = False  # int8 / int4 drafts held as GGUF blocks (Q8_0 / Q4_1) for the CPU kernel

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", dtype_name(self.weights, "weights", KV_FORMATS))
        object.__setattr__(self, "kv", dtype_name(self.kv, "kv", KV_FORMATS))
        for key in ("draft_weights", "draft_head"):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, dtype_name(getattr(self, key), key))
        if self.draft_kv is not None:
            object.__setattr__(self, "draft_kv", dtype_name(self.draft_kv, "draft_kv", DRAFT_KV_FORMATS))

    def draft(self) -> tuple[str, str, str]:
        """(layers' format, lm_head's format, KV format) a draft step reads."""
        w = self.draft_weights or self.weights
        return w, self.draft_head or w, self.draft_kv or self.kv


@dataclass(frozen=True)
class Op:
    """One kind of work in a step. `rows`: query rows per product (a linear op: all the batch's rows
    at once; attention: one sequence's rows against its own cache). `count`: how many times it runs
    (attention: once per sequence of the batch). `bytes`/`flops`: of one run. `reads`: "weights",
    "kv" or "host" (what its bytes are)."""

    kind: str  # linear | attention | index | copy | lookup
    bytes: float
    flops: float
    rows: int
    count: int = 1
    reads: str = "kv"
    fmt: str | None = None  # a linear op's weight format, an attention op's K/V format (priced apart)


def matrix_bytes(out: int, inp: int, fmt: str, group: int = 32, bias: str | None = None, blocks: bool = False) -> float:
    """Bytes one product reads of an (out, in) weight held in `fmt`, with a bias in dtype `bias`.
    `blocks`: int8 and int4 (groups of 32) as the GGUF blocks the project's CPU kernel reads for a
    float32 target (Q8_0: a float16 scale per 32 weights; Q4_1: a float16 scale and minimum), where
    the inputs are a multiple of 32; else as torch's packed ops hold them."""
    fmt = dtype_name(fmt)
    extra = out * DTYPE_BYTES[dtype_name(bias)] if bias else 0
    if blocks and inp % 32 == 0 and (fmt == "int8" or (fmt == "int4" and group == 32)):
        return out * inp // (2 if fmt == "int4" else 1) + out * (inp // 32) * (4 if fmt == "int4" else 2) + extra
    if fmt == "int8":
        return out * inp + out * 2 + extra
    if fmt == "int4":
        n = out + (-out % INT4_ROWS)
        return n * inp // 2 + (inp // group) * n * 4 + extra
    return out * inp * DTYPE_BYTES[fmt] + extra


def weight_bytes(shape: ModelShape, fmt: str = "float32", head: str | None = None, group: int = 32,
                 norms: str | None = None, blocks: bool = False) -> float:
    """What one forward reads of the weights: every layer's linear layers in `fmt`, the lm_head in
    `head` (None: `fmt`) and the norms in `norms`, the model's own dtype (None: `fmt` where it is a
    float dtype, else float32). A bias is in the model's dtype where `fmt` is it, else float32 (a
    draft copy keeps its biases in float32). A tied lm_head is read like an untied one: the step
    multiplies by it either way."""
    head = fmt if head is None else head
    own = norms or (dtype_name(fmt) if dtype_name(fmt) in KV_FORMATS else "float32")
    bias = own if dtype_name(fmt) == own else "float32"
    total = 0.0
    for i, (out, inp) in enumerate(shape.layer_matrices):
        total += shape.layers * matrix_bytes(out, inp, fmt, group, bias if shape.qkv_bias and i == 0 else None, blocks)
    total += matrix_bytes(shape.vocab, shape.hidden, head, group, blocks=blocks)
    return total + shape.norm_params * DTYPE_BYTES[own]


def kv_bytes(shape: ModelShape, tokens: int, dtype: str = "float32") -> float:
    """K and V bytes of `tokens` cached tokens over all layers (int8 / int4: with each row's float32
    scale, and zero point for int4)."""
    dtype = dtype_name(dtype, "kv", DRAFT_KV_FORMATS)
    per_row = {"int8": 4, "int4": 8}.get(dtype, 0)
    scales = 2 * shape.layers * shape.kv_heads * per_row * tokens
    return shape.kv_elements_per_token() * tokens * DTYPE_BYTES[dtype] + scales


def linear_flops(shape: ModelShape, rows: int) -> float:
    return 2.0 * shape.linear_params * rows


def attention_flops(shape: ModelShape, rows: int, tokens: int) -> float:
    """Scores and the weighted sum of values: 4 * head_dim FLOPs per query head, key and layer."""
    return 4.0 * shape.layers * shape.heads * shape.head_dim * rows * tokens


def forward(shape: ModelShape, rows: int, tokens: int, batch: int, weights: str, head: str, kv: str,
            group: int = 32, norms: str | None = None, blocks: bool = False) -> list[Op]:
    """One forward of `rows` new tokens per sequence for `batch` sequences, each attending over
    `tokens` cached tokens in `kv`, with the weights in `weights` (lm_head in `head`)."""
    return [Op("linear", weight_bytes(shape, weights, head, group, norms, blocks), linear_flops(shape, rows * batch),
               rows * batch, 1, "weights", dtype_name(weights)),
            Op("attention", kv_bytes(shape, tokens, kv), attention_flops(shape, rows, tokens), rows, batch, "kv",
               dtype_name(kv, "kv", DRAFT_KV_FORMATS))]


def ar_step(shape: ModelShape, ctx: int, batch: int = 1, dtypes: Dtypes | None = None) -> list[Op]:
    """One autoregressive step: every weight once for the batch, every sequence's whole cache."""
    d = dtypes or Dtypes()
    return forward(shape, 1, ctx, batch, d.weights, d.weights, d.kv)


def verify_pass(shape: ModelShape, ctx: int, rows: int, batch: int = 1, dtypes: Dtypes | None = None) -> list[Op]:
    """The target over `rows` new tokens a sequence (k drafts + 1) against the whole cache."""
    d = dtypes or Dtypes()
    return forward(shape, rows, ctx, batch, d.weights, d.weights, d.kv)


def draft_step(shape: ModelShape, view_tokens: int, batch: int = 1, dtypes: Dtypes | None = None) -> list[Op]:
    """A self-draft step: the target's weights in the draft's formats, attention over the view."""
    d = dtypes or Dtypes()
    w, head, kv = d.draft()
    return forward(shape, 1, view_tokens, batch, w, head, kv, d.group, norms=d.weights, blocks=d.blocks)


def model_draft_step(drafter: ModelShape, tokens: int, batch: int = 1, dtypes: Dtypes | None = None) -> list[Op]:
    """A step of a separate drafter model over `tokens` of its own cache, in the draft's formats."""
    d = dtypes or Dtypes()
    w, head, kv = d.draft()
    return forward(drafter, 1, tokens, batch, w, head, kv, d.group, norms=d.weights, blocks=d.blocks)


def view_gather(shape: ModelShape, view_tokens: int, batch: int = 1, kv: str = "float32") -> list[Op]:
    """Copying a round's sparse view into the compact cache the draft steps read (read + write)."""
    return [Op("copy", 2 * kv_bytes(shape, view_tokens, kv), 0.0, 1, batch, "kv")]


def index_update(shape: ModelShape, ctx: int, rows: int, batch: int = 1, kv: str = "float32",
                 window: int = 16) -> list[Op]:
    """The recall index's refresh from the `rows` kept queries of a round: their attention mass over
    every cached key (one product over the keys: K's bytes, scores' FLOPs), written into the ring of
    the last `window` rows with its running sum (float32, per layer, KV head and key), then the
    selection of the view reads the sum once."""
    keys = kv_bytes(shape, ctx, kv) / 2
    score = 2.0 * shape.layers * shape.heads * shape.head_dim * rows * ctx
    ring = 4.0 * shape.layers * shape.kv_heads * ctx * (min(rows, window) * 2 + 3)
    return [Op("index", keys, score, rows, batch, "kv"), Op("copy", ring, 0.0, 1, batch, "kv")]


def prompt_lookup(ctx: int, batch: int = 1) -> list[Op]:
    """Prompt lookup reads the token ids on the host (no model, no KV): one scan of the context."""
    return [Op("lookup", 8.0 * ctx, 0.0, 1, batch, "host")]


def view_budget(ctx: int, ratio: float = 0.1, budget: int | None = None, k_sink: int = 16,
                k_recent: int | None = None) -> int:
    """Tokens a sparse view keeps per KV head at `ctx` (as kv.policies.KVPolicy.budget_for)."""
    if budget is not None:
        return min(budget, ctx)
    return min(ctx, max(k_sink + (k_recent or 0) + 1, math.ceil(ratio * ctx)))
