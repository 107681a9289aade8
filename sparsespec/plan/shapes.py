"""A causal LM's shape, as the cost model needs it: from a Hugging Face config.json (a path or a
dict) or a known name. Nothing here downloads anything: the known shapes are written out below."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# The few shapes the planner knows by name: the config.json fields the cost model reads, copied from
# each model's published config (no hub access at run time).
KNOWN: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, model_type="llama"),
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                         max_position_embeddings=131072, model_type="llama"),
    "qwen2.5-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
                       max_position_embeddings=131072, model_type="qwen2"),
    # the ends of the published claims' model ranges (docs/planning.md holds the claims against their ceilings)
    "llama-3.2-3b": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                         head_dim=128, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                         max_position_embeddings=131072, model_type="llama"),
    "qwen2.5-14b": dict(hidden_size=5120, num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
                        intermediate_size=13824, vocab_size=152064, tie_word_embeddings=False,
                        max_position_embeddings=131072, model_type="qwen2"),
    "llama-2-7b-128k": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                            intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False,
                            max_position_embeddings=131072, model_type="llama"),
}
# model types whose q/k/v projections carry a bias
QKV_BIAS = ("qwen2",)


class ShapeError(ValueError):
    """A model the cost model cannot read; the message names the argument and what to pass."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that set what a decoding step reads and computes."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    max_positions: int | None = None
    qkv_bias: bool = False

    @property
    def layer_matrices(self) -> list[tuple[int, int]]:
        """(out, in) of one layer's linear layers as the runner fuses them: q/k/v, o, gate/up, down."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(q + 2 * kv, self.hidden), (self.hidden, q), (2 * self.intermediate, self.hidden),
                (self.hidden, self.intermediate)]

    @property
    def linear_params(self) -> int:
        """Weights a step multiplies by: every layer's linear layers and the lm_head."""
        return self.layers * sum(o * i for o, i in self.layer_matrices) + self.vocab * self.hidden

    @property
    def norm_params(self) -> int:
        """Two RMSNorms a layer and the final one."""
        return (2 * self.layers + 1) * self.hidden

    def kv_elements_per_token(self) -> int:
        """K and V entries one token adds to the cache, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim

    def with_name(self, name: str) -> ModelShape:
        return replace(self, name=name)


def from_config(config: dict[str, Any], name: str = "model") -> ModelShape:
    """A shape from a Hugging Face config's fields (text_config is read where the model nests one)."""
    cfg = config.get("text_config") or config
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if cfg.get(k) is None]
    if missing:
        raise ShapeError(f"model={name}: its config has no {', '.join(missing)}; pass a causal LM's config.json "
                         f"(the fields {', '.join(need)}) or one of the known names: {', '.join(KNOWN)}")
    heads = int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or int(cfg["hidden_size"]) // heads
    return ModelShape(name=name, layers=int(cfg["num_hidden_layers"]), hidden=int(cfg["hidden_size"]), heads=heads,
                      kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=int(head_dim),
                      intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
                      tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                      max_positions=cfg.get("max_position_embeddings"),
                      qkv_bias=bool(cfg.get("attention_bias", False)) or cfg.get("model_type") in QKV_BIAS)


def load_shape(model: str | dict[str, Any] | ModelShape) -> ModelShape:
    """A shape from a known name (`llama-3.1-8b`), a config.json path, a model folder holding one, or a
    config dict. ShapeError (naming `model=`) for anything else."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, dict):
        return from_config(model)
    key = str(model).lower()
    if key in KNOWN:
        return from_config(KNOWN[key], key)
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ShapeError(f"model={model}: not a known model name ({', '.join(KNOWN)}) and no config.json there; "
                         "pass a Hugging Face config.json path or a model folder")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ShapeError(f"model={model}: {path} is not a readable JSON config ({e})") from None
    if not isinstance(config, dict):
        raise ShapeError(f"model={model}: {path} holds no JSON object; pass a Hugging Face config.json")
    return from_config(config, path.parent.name or str(path))
