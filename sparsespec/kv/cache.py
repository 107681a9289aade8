"""A preallocated per-layer KV cache (batch size 1).

HF's DynamicCache concatenates a new tensor every step; decoding at 64k context then spends its time
copying. Here every layer owns one buffer of shape [n_kv_heads, capacity, head_dim] that grows by
doubling, and rollback after a partial acceptance is a change of `length`, not a copy.

Keys are stored after RoPE, so gathering a subset of positions (a sparse view) keeps each key's
original position: a compact cache built by `gather` is a valid cache for drafting.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of every layer, `length` entries valid, `capacity` entries allocated."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        capacity: int = 256,
    ) -> None:
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.capacity = max(int(capacity), 1)
        shape = (n_kv_heads, self.capacity, head_dim)
        # torch.empty: nothing at or past `length` is ever read
        self.k = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]
        self.length = 0

    def reserve(self, n: int) -> None:
        """Make room for `n` more entries (capacity doubles, so growth costs amortised O(1))."""
        need = self.length + n
        if need <= self.capacity:
            return
        new_cap = max(need, 2 * self.capacity)
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                new = torch.empty(
                    (self.n_kv_heads, new_cap, self.head_dim), dtype=self.dtype, device=self.device
                )
                new[:, : self.length] = old[:, : self.length]
                store[i] = new
        self.capacity = new_cap

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v ([n_kv_heads, n, head_dim]) at [length, length + n) and return the valid prefix
        including them. `length` itself advances in `advance`, once all layers are written."""
        n = k.shape[1]
        end = self.length + n
        if end > self.capacity:  # a size-1 block would silently broadcast into an empty slice
            raise RuntimeError(f"KVCache.write past capacity {self.capacity}: call reserve({n}) first")
        self.k[layer][:, self.length : end] = k
        self.v[layer][:, self.length : end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def crop(self, length: int) -> None:
        """Roll back to the first `length` entries (rejected draft tokens are forgotten)."""
        if length < 0 or length > self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def gather(self, index: torch.Tensor, extra: int = 32, out: KVCache | None = None) -> KVCache:
        """A compact cache holding, per layer and KV head, the entries at `index`.

        index: [n_layers, n_kv_heads, budget] positions < length. The result has room for `extra`
        appended (draft) entries, so drafting never reallocates. `out`: a compact cache from an
        earlier round, reused when it is large enough (a draft round then allocates nothing).
        """
        n_layers, n_heads, budget = index.shape
        if out is None or out.capacity < budget + extra:
            # slack: a ratio budget grows with the context; reallocate every ~64 tokens of it, not every round
            out = KVCache(n_layers, n_heads, self.head_dim, self.dtype, self.device, capacity=budget + extra + 64)
        per_head = self.device.type != "cuda"
        for layer in range(n_layers):
            gather_rows(self.k[layer], index[layer], out.k[layer][:, :budget], per_head)
            gather_rows(self.v[layer], index[layer], out.v[layer][:, :budget], per_head)
        out.length = budget
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def gather_rows(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor, per_head: bool) -> None:
    """out[h] = src[h, index[h]] for every head (src [H, T, D], index [H, b], out [H, b, D]).
    per_head (the CPU): index_select of whole rows per head, 4x faster there than torch.gather with
    the index expanded over head_dim, which moves one element at a time (docs/performance.md); on a
    GPU one gather kernel for all heads, instead of a launch per head."""
    if per_head:
        for h in range(src.shape[0]):
            torch.index_select(src[h], 0, index[h], out=out[h])
    else:
        torch.gather(src, 1, index[..., None].expand(-1, -1, src.shape[-1]), out=out)
