"""The one module that knows a model's internals: a forward pass over our KVCache.

It reuses the Hugging Face modules (embeddings, norms, projections, MLP, rotary embedding with
whatever rope scaling the config asks for) and replaces only the attention-and-cache step, so any
Llama-shaped family works: Llama, Qwen2 (q/k/v bias), Mistral, Qwen3 (q/k norms). The test suite
checks its logits against transformers' own forward for several families.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sparsespec.kernels import cpu_linear
from sparsespec.kv.cache import KVCache
from sparsespec.kv.capture import Capture
from sparsespec.models.attention import attend
from sparsespec.models.device import to_device_ids
from sparsespec.precision import matmul_fp32


class UnsupportedModelError(ValueError):
    pass


# Families whose transformers modeling never applies `config.sliding_window`, even when a config.json
# carries the key (some Llama derivatives do).
_NO_WINDOW_FAMILIES = {"llama"}


def applied_sliding_window(config) -> int | None:
    """The sliding attention window, in tokens, that transformers (5.x) applies to `config`'s model,
    or None where it attends to the whole sequence, as we always do.

    A query at index i then sees keys i-W+1..i, so while no sequence exceeds W tokens the window cuts
    nothing and our full attention is exact. How each family decides:

    * mistral: every layer whenever `sliding_window` is not None; there is no `use_sliding_window`
      flag (Mistral-7B-v0.1 ships 4096, v0.2+ null) and Mistral ignores `layer_types`.
    * qwen2, qwen3 and other families with per-layer `layer_types`: the layers typed
      "sliding_attention". Their configs set `sliding_window=None` unless `use_sliding_window`, and
      derive layer_types from it and `max_window_layers` (layers i >= max_window_layers slide, so a
      model with no more layers than that never applies its window).
    * llama: never.
    * any other family that sets `sliding_window` without `layer_types`: taken as applied.
    """
    window = getattr(config, "sliding_window", None)
    model_type = getattr(config, "model_type", None)
    if window is None or model_type in _NO_WINDOW_FAMILIES:
        return None
    layer_types = getattr(config, "layer_types", None)
    if model_type != "mistral" and layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def sliding_window_message(window: int, tokens: int) -> str:
    """The one refusal for a sequence longer than the model's sliding window (load_model and CausalLM)."""
    return (f"sliding_window={window}: this model's attention sees only its last {window} tokens, ours the "
            f"whole cache, so at a context of {tokens} tokens (prompt + generation) the outputs would differ "
            f"from the model's. Run at a context of at most {window} tokens, or use a model without a "
            "sliding window")


@dataclass
class Block:
    """One sequence's part of a forward pass: its new tokens and the cache they are appended to
    (see `CausalLM.forward` for the other fields)."""

    ids: torch.Tensor | list[int]
    cache: KVCache
    positions: torch.Tensor | list[int] | None = None
    mask: torch.Tensor | None = None
    capture: Capture | None = None
    logits: str = "all"  # "all", "last" or "none"


class CausalLM:
    """A decoder-only LM run one block of tokens at a time against an explicit KVCache."""

    def __init__(self, hf_model: nn.Module) -> None:
        self.hf = hf_model
        inner = getattr(hf_model, "model", None)
        cfg = hf_model.config
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, a) for a in needed) or not hasattr(hf_model, "lm_head"):
            raise UnsupportedModelError(
                f"{type(hf_model).__name__} is not a Llama-shaped causal LM (model.embed_tokens/layers/norm/"
                "rotary_emb and lm_head); supported families: llama, qwen2, qwen3, mistral"
            )
        self.config = cfg
        # full attention equals the model's windowed one only while the cache fits the window:
        # forward and prefill refuse to go past it
        self.sliding_window = applied_sliding_window(cfg)
        self.embed, self.layers, self.norm = inner.embed_tokens, inner.layers, inner.norm
        self.rotary, self.lm_head = inner.rotary_emb, hf_model.lm_head
        attn0 = self.layers[0].self_attn
        self.n_layers = len(self.layers)
        self.head_dim = attn0.head_dim
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.scale = attn0.scaling
        self.vocab_size = self.lm_head.out_features
        self.dtype = self.lm_head.weight.dtype
        self.device = self.lm_head.weight.device
        self.forward_calls = 0  # counted so tests can prove that e.g. index refreshes add no forward
        self._fuse()

    def _fuse(self) -> None:
        """Concatenate q/k/v and gate/up weights per layer: one matmul each instead of three and two.

        A decode step is a few thousand small ops around bandwidth-bound matmuls; fewer, larger ops
        is most of what keeps it near the bandwidth floor (docs/performance.md). The weights are held
        once: each projection's parameter becomes a view into the fused tensor, so the Hugging Face
        modules (and an optimizer holding them) read and write the same memory.
        """
        self._qkv, self._gate_up = [], []
        for layer in self.layers:
            a, mlp = layer.self_attn, layer.mlp
            projs = (a.q_proj, a.k_proj, a.v_proj)
            w = _fuse_weights(projs)
            biases = [m.bias for m in projs]
            b = torch.cat([bb if bb is not None else torch.zeros(m.out_features, dtype=w.dtype, device=w.device)
                           for bb, m in zip(biases, projs, strict=True)]).detach() \
                if any(bb is not None for bb in biases) else None
            self._qkv.append((w, b))
            gated = all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))
            no_bias = gated and mlp.gate_proj.bias is None and mlp.up_proj.bias is None
            self._gate_up.append(_fuse_weights((mlp.gate_proj, mlp.up_proj)) if no_bias else None)

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.n_layers, self.n_kv_heads, self.head_dim, self.dtype, self.device, capacity)

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor | list[int],
        cache: KVCache,
        positions: torch.Tensor | list[int] | None = None,
        mask: torch.Tensor | None = None,
        capture: Capture | None = None,
        logits: str = "all",
    ) -> torch.Tensor | None:
        """Run ids ([n] token ids, a list or a tensor; moved to the model's device) appended to `cache`
        and return float32 logits.

        positions: RoPE positions of the new tokens (default: cache.length + arange(n)); a gathered
        compact cache passes the tokens' true positions. mask: [n, cache.length + n] bool visibility
        (default causal). logits: "all" ([n, V]), "last" ([1, V]) or "none" (prefill chunks).
        Raises UnsupportedModelError if the cache would then hold more tokens than the model's
        sliding window (`applied_sliding_window`): past it our full attention is not the model's.
        """
        return self.forward_many([Block(ids, cache, positions, mask, capture, logits)])[0]

    @torch.inference_mode()
    def forward_many(self, blocks: list[Block]) -> list[torch.Tensor | None]:
        """`forward` for several sequences at once, each block appended to its own cache.

        The rows of every block are packed into one [rows, hidden] tensor, so each weight matrix is
        read once for the whole batch (the point of batching: a decode step is bound by reading the
        weights); attention runs per block over its own cache, with its own length, mask and capture.
        Returns each block's logits as `forward` would.
        """
        ids = [to_device_ids(b.ids, self.device) for b in blocks]
        ns = [t.shape[0] for t in ids]
        positions = []
        for b, n in zip(blocks, ns, strict=True):
            if self.sliding_window is not None and b.cache.length + n > self.sliding_window:
                raise UnsupportedModelError(sliding_window_message(self.sliding_window, b.cache.length + n))
            b.cache.reserve(n)
            positions.append(torch.arange(b.cache.length, b.cache.length + n, device=self.device)
                             if b.positions is None else to_device_ids(b.positions, self.device))
        self.forward_calls += 1
        one = len(blocks) == 1
        x = self.embed(ids[0] if one else torch.cat(ids))  # [rows, hidden]
        cos, sin = self.rotary(x[None], (positions[0] if one else torch.cat(positions))[None])
        cos, sin = cos[0], sin[0]  # [rows, D]
        for i, layer in enumerate(self.layers):
            x = x + self._attention(layer, i, _norm(layer.input_layernorm, x), cos, sin, blocks, ns)
            x = x + self._mlp(layer, i, _norm(layer.post_attention_layernorm, x))
        for b, n in zip(blocks, ns, strict=True):
            b.cache.advance(n)
        return self._block_logits(x, blocks, ns)

    def _block_logits(self, x: torch.Tensor, blocks: list[Block], ns: list[int]) -> list[torch.Tensor | None]:
        """The rows each block asks logits for, through one lm_head product for all of them."""
        rows, ends, end = [], [], 0
        for b, n in zip(blocks, ns, strict=True):
            end += n
            if b.logits not in ("all", "last", "none"):
                raise ValueError(f"logits={b.logits!r}: expected all, last or none")
            rows.append(None if b.logits == "none" else (end - n, end) if b.logits == "all" else (end - 1, end))
            ends.append(end)
        wanted = [r for r in rows if r is not None]
        if not wanted:
            return [None] * len(blocks)
        if len(wanted) == 1:
            out = [self._logits(self.norm(x[wanted[0][0] : wanted[0][1]]))]
        else:
            idx = torch.cat([torch.arange(a, b, device=x.device) for a, b in wanted])
            out = self._logits(self.norm(x.index_select(0, idx))).split([b - a for a, b in wanted])
        it = iter(out)
        return [None if r is None else next(it) for r in rows]

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """float32 logits [n, V] from the final hidden states. In bf16/fp16 the product is taken in
        float32 rather than rounded to the model's dtype: near-ties between the top tokens decide
        greedy output, and the verifier's and sampler's probabilities come from these."""
        w, b = self.lm_head.weight, self.lm_head.bias
        if h.dtype == torch.float32:
            return linear(h, w, b)
        # CUDA: accumulated and returned in fp32 by cuBLAS, no fp32 copy of the weight; where that
        # kernel is missing the weight is upcast each step, which is said once
        out = matmul_fp32(h, w.t(), "the lm_head's float32 logits")
        return out if b is None else out + b.float()

    def _linear(self, name: str, i: int, x: torch.Tensor) -> torch.Tensor:
        """x through layer i's projection `name` ("qkv", "o", "gate_up" or "down"). The one place a
        projection's weights are read, so a draft copy with its weights in another format
        (models/quantized.py) overrides only this."""
        if name == "qkv":
            return linear(x, *self._qkv[i])
        if name == "gate_up":
            return linear(x, self._gate_up[i])
        m = self.layers[i].self_attn.o_proj if name == "o" else self.layers[i].mlp.down_proj
        return linear(x, m.weight, m.bias)

    def _mlp(self, layer, i, h):
        if self._gate_up[i] is None:
            return layer.mlp(h)
        gate, up = self._linear("gate_up", i, h).chunk(2, dim=-1)
        return self._linear("down", i, layer.mlp.act_fn(gate) * up)

    def _attention(self, layer, i, h, cos, sin, blocks, ns):
        attn = layer.self_attn
        rows, hq, hkv = h.shape[0], self.n_heads, self.n_kv_heads
        qkv = self._linear("qkv", i, h).view(rows, -1, self.head_dim).transpose(0, 1)  # [Hq + 2 Hkv, rows, D]
        if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms before RoPE
            q = attn.q_norm(qkv[:hq].transpose(0, 1)).transpose(0, 1)
            k = attn.k_norm(qkv[hq : hq + hkv].transpose(0, 1)).transpose(0, 1)
            qk = torch.cat([q, k])
        else:
            qk = qkv[: hq + hkv]
        qk = qk * cos + _rotate_half(qk) * sin  # q and k share one RoPE pass
        q, k, v = qk[:hq], qk[hq:], qkv[hq + hkv :]
        outs, start = [], 0
        for blk, n in zip(blocks, ns, strict=True):  # each sequence over its own cache
            part = slice(start, start + n)
            start += n
            keys, values = blk.cache.write(i, k[:, part], v[:, part])
            capture = blk.capture
            out, lse = attend(q[:, part], keys, values, self.scale, blk.mask, lse_rows=capture.last if capture else 0)
            if capture is not None:
                capture.observe(i, q[:, part][:, n - lse.shape[1] :], lse)
            outs.append(out)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, 1)  # [Hq, rows, D]
        return self._linear("o", i, out.transpose(0, 1).reshape(rows, -1))

    def prefill(
        self,
        ids: torch.Tensor | list[int],
        cache: KVCache,
        chunk: int = 1024,
        capture: Capture | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """Feed a long prompt in chunks (peak activation memory ~ chunk * context) and return the
        last position's logits [1, V], attending causally over the whole cache; capture applies to the
        final chunk only (the last prompt queries)."""
        ids = torch.as_tensor(ids, device=self.device)
        n = ids.shape[0]
        if self.sliding_window is not None and cache.length + n > self.sliding_window:  # before any chunk
            raise UnsupportedModelError(sliding_window_message(self.sliding_window, cache.length + n))
        cache.reserve(n)
        bounds = list(range(0, n, chunk)) + [n]
        if capture is not None and len(bounds) > 2 and n - bounds[-2] < capture.last:
            # the captured queries must all lie in the final chunk
            bounds[-2] = max(bounds[-3], n - capture.last)
            bounds = sorted(set(bounds))
        out = None
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            block = ids[start:end]
            last = end == n
            out = self.forward(block, cache, capture=capture if last else None,
                               logits="last" if last else "none")
            if progress:
                progress(block.shape[0])
        return out


# Up to this many rows (a batch's decode step, a verification block) a CPU float32 product x W^T is
# taken as (W x^T)^T: MKL's kernel for a few rows against a wide weight streams it faster that way
# (docs/performance.md, "A few rows against the weights").
SKINNY_ROWS = 64


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, b) ([rows, in] x [out, in] -> [rows, out]), by the faster product for a few
    rows on the CPU in float32: the project's few-rows kernel where it is built (the same
    arithmetic for every row whatever the row count, so a verification block's logits equal one-token
    steps' bit for bit), else MKL's."""
    if cpu_linear.applies(x, w):
        return cpu_linear.linear(x, w, b)
    rows = x.shape[0]
    if not (1 < rows <= SKINNY_ROWS and x.dim() == 2 and x.device.type == "cpu" and x.dtype == torch.float32):
        return F.linear(x, w, b)
    out = torch.mm(w, x.t()).t().contiguous()
    return out if b is None else out.add_(b)


def _norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm module in one fused op where that is exact (float32), else the module itself."""
    eps = getattr(module, "variance_epsilon", None)
    if eps is None or x.dtype != torch.float32 or type(module).__name__ not in _RMS_NORMS:
        return module(x)
    return F.rms_norm(x, module.weight.shape, module.weight, eps)


# HF RMSNorm classes that compute weight * x * rsqrt(mean(x^2) + eps) in float32 (checked in tests)
_RMS_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"}


# The projections fused per layer (module, its linears in order): the loader reads them into one
# tensor each where it can (models/loading.py), so fusing them costs no copy.
FUSED_PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def adjacent(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """The one tensor the weights already are, stacked by rows (each a contiguous view following
    the previous one in the same storage), else None."""
    first = weights[0]
    at = first.storage_offset()
    for w in weights:
        if (w.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or not w.is_contiguous()
                or w.dtype != first.dtype or w.shape[1:] != first.shape[1:] or w.storage_offset() != at):
            return None
        at += w.numel()
    rows = sum(w.shape[0] for w in weights)
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(
        first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]))


def _fuse_weights(linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """One [sum of out_features, in] tensor holding the linears' weights; each linear's weight is
    replaced by a view into it (the originals are freed). Weights loaded side by side already are
    that tensor: no copy."""
    ready = adjacent([m.weight.detach() for m in linears])
    if ready is not None:
        return ready
    fused = torch.cat([m.weight.detach() for m in linears])
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(fused[start : start + n], requires_grad=m.weight.requires_grad)
        start += n
    return fused


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
