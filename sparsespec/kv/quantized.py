"""The K/V a draft step reads, in a draft KV format (`method.drafter.kv`): the view a drafter attends
to stored in fewer bytes, so a draft step reads less. The target's own cache is never changed; the
verification pass reads it as it is.

Formats:

- fp: the cache's own dtype (today's behaviour: a sparse view is a gathered copy in that dtype, a
  full view is the cache itself).
- bf16: keys and values rounded to bfloat16 (half of float32's bytes).
- int8: each key's and value's row (one token, one KV head) as symmetric int8 with its own float32
  scale, the row's largest magnitude over 127: a quarter of float32's bytes plus 4 bytes per row.

Where the view lives:

- a sparse view (`select` gives indices): the kept entries are gathered from the target's cache
  and rounded into a compact cache of this format, reused round after round;
- a full view (the policy keeps everything, as QuantSpec's draft does): a copy of the whole cache
  in this format, kept in step with it: each round rounds only the entries the target cache gained
  since the last one (accepted tokens never change), and the round's drafts are dropped from the
  copy afterwards, as they are from the target's cache without one.

The attention of a draft step takes the view as it is stored: bf16 keys and values as tensors,
int8 ones as `Int8Rows` (values and scales), which the CPU attention kernel reads directly
(sparsespec.kernels.cpu_attention) and any other path dequantizes first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from sparsespec.checks import SettingError
from sparsespec.kv.cache import KVCache, gather_rows

if TYPE_CHECKING:
    from sparsespec.kv.footprint import Part, Sizing

KV_FORMATS = ("fp", "bf16", "int8")
INT8_MAX = 127.0
SCALE_BYTES = 4  # one float32 scale per row (token, KV head) of int8 keys or values


@dataclass
class Int8Rows:
    """Keys or values of one layer in int8: data [H, T, D] int8, scale [H, T] float32; row (h, t)
    is data[h, t] * scale[h, t]."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The rows as `dtype` (products in float32: what the CPU kernel computes per element)."""
        return (self.data.float() * self.scale[..., None]).to(dtype)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (int8 [..., D], float32 scale [...]): symmetric per row, scale = max |x| / 127."""
    x = x.float()
    scale = (x.abs().amax(-1) / INT8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return (x / scale[..., None]).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def check_kv_format(fmt: str) -> None:
    """SettingError (`kv=value is ...; the formats that work`) unless `fmt` is a draft KV format."""
    if fmt not in KV_FORMATS:
        raise SettingError("kv", fmt, f"is not a draft KV format; the formats that work: {', '.join(KV_FORMATS)}")


def entry_bytes(fmt: str, n_layers: int, n_kv_heads: int, head_dim: int, own_dtype: torch.dtype) -> int:
    """Bytes of one token's keys and values over every layer in the view format `fmt` (fp: the
    cache's own dtype `own_dtype`), scales included."""
    if fmt == "fp":
        elem = torch.empty((), dtype=own_dtype).element_size()
        return 2 * n_layers * n_kv_heads * head_dim * elem
    if fmt == "bf16":
        return 2 * n_layers * n_kv_heads * head_dim * 2
    return 2 * n_layers * n_kv_heads * (head_dim + SCALE_BYTES)


def format_label(fmt: str, own_dtype: torch.dtype) -> str:
    """A view format as rows report it: fp32 / bf16 / fp16 (the cache's own), bf16, int8."""
    if fmt == "fp":
        return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(own_dtype, str(own_dtype))
    return fmt


class QuantizedKVCache(KVCache):
    """A KV cache whose entries are held in a draft KV format ("bf16" or "int8"), written from
    rows of any float dtype. Writes round; `write` returns what attention reads: bf16 tensors, or
    `Int8Rows` for int8."""

    def __init__(self, fmt: str, n_layers: int, n_kv_heads: int, head_dim: int,
                 device: str | torch.device = "cpu", capacity: int = 256) -> None:
        if fmt not in ("bf16", "int8"):
            raise SettingError("kv", fmt, "is not a quantized KV format: a quantized cache holds bf16 or int8")
        self.fmt = fmt
        super().__init__(n_layers, n_kv_heads, head_dim, torch.bfloat16 if fmt == "bf16" else torch.int8,
                         device, capacity)
        shape = (n_kv_heads, self.capacity)
        n = n_layers if fmt == "int8" else 0
        self.k_scale = [torch.empty(shape, dtype=torch.float32, device=self.device) for _ in range(n)]
        self.v_scale = [torch.empty(shape, dtype=torch.float32, device=self.device) for _ in range(n)]

    def reserve(self, n: int) -> None:
        old = self.capacity
        super().reserve(n)
        if self.capacity == old or self.fmt != "int8":
            return
        for store in (self.k_scale, self.v_scale):
            for i, s in enumerate(store):
                new = torch.empty((self.n_kv_heads, self.capacity), dtype=torch.float32, device=self.device)
                new[:, : self.length] = s[:, : self.length]
                store[i] = new

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Round k, v ([n_kv_heads, n, head_dim], any float dtype) into entries [start, start + n)."""
        end = start + k.shape[1]
        if self.fmt == "bf16":
            self.k[layer][:, start:end] = k
            self.v[layer][:, start:end] = v
            return
        for data, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, s = quantize_int8(x)
            data[layer][:, start:end] = q
            scales[layer][:, start:end] = s

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        n = k.shape[1]
        end = self.length + n
        if end > self.capacity:
            raise RuntimeError(f"KVCache.write past capacity {self.capacity}: call reserve({n}) first")
        self.store(layer, self.length, k, v)
        return self.rows(layer, end)

    def rows(self, layer: int, end: int):
        """Entries [0, end) of a layer as attention reads them: (keys, values)."""
        if self.fmt == "bf16":
            return self.k[layer][:, :end], self.v[layer][:, :end]
        return (Int8Rows(self.k[layer][:, :end], self.k_scale[layer][:, :end]),
                Int8Rows(self.v[layer][:, :end], self.v_scale[layer][:, :end]))

    def shift(self, start: int, end: int, drop: int) -> None:
        """Move entries [start + drop, end) to [start, end - drop) (a windowed cache's eviction)."""
        stores = [self.k, self.v] + ([self.k_scale, self.v_scale] if self.fmt == "int8" else [])
        for store in stores:
            for t in store:
                t[:, start : end - drop] = t[:, start + drop : end].clone()

    def gather(self, index: torch.Tensor, extra: int = 32, out: KVCache | None = None) -> KVCache:
        raise NotImplementedError("a quantized cache is a draft's view; gather from the cache it was made from")

    def nbytes(self) -> int:
        return super().nbytes() + sum(t.numel() * t.element_size() for t in self.k_scale + self.v_scale)


def new_cache(fmt: str, n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype,
              device: str | torch.device, capacity: int) -> KVCache:
    """A cache whose entries are held in the view format `fmt` (fp: a plain cache of `dtype`)."""
    if fmt == "fp":
        return KVCache(n_layers, n_kv_heads, head_dim, dtype, device, capacity)
    return QuantizedKVCache(fmt, n_layers, n_kv_heads, head_dim, device, capacity)


def view_bytes(view: KVCache) -> int:
    """What one pass over a view's `length` entries reads of its keys and values (scales included)."""
    per = 2 * view.n_layers * view.n_kv_heads * view.head_dim * view.k[0].element_size()
    if isinstance(view, QuantizedKVCache) and view.fmt == "int8":
        per += 2 * view.n_layers * view.n_kv_heads * SCALE_BYTES
    return per * view.length


class DraftView:
    """The K/V a drafter's rounds attend to, in the format `fmt`, built from a cache whose entries
    [0, length) are final (accepted tokens: the target's cache, or a drafter model's own). One per
    sequence; `gathered` and `full` each reuse their storage round after round."""

    def __init__(self, fmt: str = "fp") -> None:
        check_kv_format(fmt)
        self.fmt = fmt
        self.compact: KVCache | None = None  # a sparse view's gathered entries
        self.copy: QuantizedKVCache | None = None  # a full view's copy (quantized formats only)
        self.synced = 0  # entries of the source `copy` holds

    @staticmethod
    def memory(fmt: str, model: Any, policy: Any, at: Sizing, source_capacity: int, prefix: str = "") -> list[Part]:
        """What a drafter's view in the format `fmt` allocates over `model`'s cache (allocated with
        `source_capacity` entries) under `policy`: a sparse view's compact cache, gathered with
        room for a draft and 64 entries of slack; when the budget outgrows it, the next one is
        allocated while the old one still exists. A full view in a quantized format: a copy of
        the whole cache. `prefix` names a drafter model's own ("drafter ")."""
        from sparsespec.kv.footprint import Part, kv_bytes

        parts = []
        if not policy.covers(at.tokens):
            compact = kv_bytes(model, policy.budget_for(at.tokens) + at.kmax + 1 + 64, fmt)
            parts.append(Part(f"{prefix}compact KV cache", compact, "decode"))
            if at.new_tokens is None or policy.budget_for(at.tokens) - policy.budget_for(at.prompt + 1) > 64:
                parts.append(Part(f"{prefix}compact cache regrowth", compact, "decode", False,
                                  compact // (2 * model.n_layers)))
        if fmt != "fp" and policy.covers(at.prompt + 1):
            parts.append(Part("drafter KV copy" if prefix else "draft KV copy", kv_bytes(model, source_capacity, fmt),
                              "decode"))
        return parts

    def gathered(self, cache: KVCache, index: torch.Tensor, extra: int) -> KVCache:
        """The entries at `index` ([n_layers, n_kv_heads, budget]) with room for `extra` drafts."""
        if self.fmt == "fp":
            self.compact = cache.gather(index, extra=extra, out=self.compact)
            return self.compact
        n_layers, n_heads, budget = index.shape
        out = self.compact
        if out is None or out.capacity < budget + extra:
            # slack: a ratio budget grows with the context; reallocate every ~64 tokens of it
            out = self.compact = QuantizedKVCache(self.fmt, n_layers, n_heads, cache.head_dim, cache.device,
                                                  capacity=budget + extra + 64)
        per_head = cache.device.type != "cuda"
        rows = torch.empty((n_heads, budget, cache.head_dim), dtype=cache.dtype, device=cache.device)
        vals = torch.empty_like(rows)
        for layer in range(n_layers):
            gather_rows(cache.k[layer], index[layer], rows, per_head)
            gather_rows(cache.v[layer], index[layer], vals, per_head)
            out.store(layer, 0, rows, vals)
        out.length = budget
        return out

    def full(self, cache: KVCache, extra: int) -> KVCache:
        """Every entry of `cache` with room for `extra` drafts: the cache itself (fp), else its copy
        in this format, brought up to date by rounding only the entries it gained since."""
        if self.fmt == "fp":
            return cache
        length = cache.length
        if self.copy is None:
            self.copy = QuantizedKVCache(self.fmt, cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.device,
                                         capacity=max(cache.capacity, length + extra))
            self.synced = 0
        copy = self.copy
        start = min(self.synced, length)
        copy.length = start  # drop the last round's drafts (and anything the source has rolled back)
        copy.reserve(length - start + extra)
        for layer in range(cache.n_layers):
            copy.store(layer, start, cache.k[layer][:, start:length], cache.v[layer][:, start:length])
        copy.length = self.synced = length
        return copy
