"""Drafter models for BudgetDraft: Llama-family causal LMs sharing the target's tokenizer.

* `truncated`: the target's embeddings, first `n_layers` decoder layers, final norm and head. It
  starts as a (weak) drafter already and shares the target's vocabulary and RoPE setup.
* `small`: a fresh, randomly initialised LlamaConfig of the given size (target's vocab size).
* `path=DIR`: any Hugging Face causal-LM directory (e.g. a previous export) to fine-tune.

Default N=2: the 49k-vocabulary head is a fixed cost of every drafter step, so the first layers
add little to a step's cost (gamma) while each adds to acceptance; docs/training.md has the choice.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from sparsespec.checks import ConfigError, choice, positive

log = logging.getLogger(__name__)


def truncated(target: PreTrainedModel, n_layers: int = 2) -> PreTrainedModel:
    """A deep copy of `target` keeping only its first `n_layers` layers (the target is untouched)."""
    total = target.config.num_hidden_layers
    if not 1 <= n_layers <= total:
        raise ValueError(f"drafter.n_layers={n_layers}: the target has {total} layers")
    # copy without the dropped layers: deep-copying all 30 layers first would double peak memory
    layers = target.model.layers
    target.model.layers = nn.ModuleList(layers[:n_layers])
    try:
        model = copy.deepcopy(target)
    finally:
        target.model.layers = layers
    model.config.num_hidden_layers = n_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:n_layers]
    return model


def small(target: PreTrainedModel, hidden_size: int = 256, n_layers: int = 2, n_heads: int = 4,
          n_kv_heads: int = 2, intermediate_size: int = 768, seed: int = 0) -> PreTrainedModel:
    """A fresh small Llama with the target's vocabulary size, max positions and RoPE base."""
    tc = target.config
    rope = dict(getattr(tc, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
        max_position_embeddings=tc.max_position_embeddings, rope_parameters=rope,
        tie_word_embeddings=True, bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id,
        pad_token_id=getattr(tc, "pad_token_id", None),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg)


@dataclass
class DrafterSpec:
    """conf/drafter/*.yaml: the drafter to train. `path` (if set) wins over `kind`.

    freeze_embeddings: with tied embeddings this also freezes the head. For `truncated` that keeps
    the target's vocabulary geometry and skips the 28M-parameter head weight gradient (the costliest
    matmul in the step); a fresh `small` model must learn them (set it false there).
    """

    kind: str = "truncated"  # truncated | small
    path: str | None = None  # a Hugging Face model directory to start from instead
    n_layers: int = 2
    freeze_embeddings: bool = True
    hidden_size: int = 256  # kind=small only, like the three below
    n_heads: int = 4
    n_kv_heads: int = 2
    intermediate_size: int = 768
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.path:
            choice("drafter.kind", self.kind, ("truncated", "small"))
        elif not Path(str(self.path)).expanduser().exists():
            raise ConfigError(f"drafter.path={self.path} does not exist: pass a Hugging Face model directory")
        for key in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "intermediate_size"):
            positive(f"drafter.{key}", getattr(self, key), int)

    def build(self, target: PreTrainedModel) -> PreTrainedModel:
        """The drafter, in float32 train mode."""
        if self.path:
            model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32)
        elif self.kind == "truncated":
            model = truncated(target, self.n_layers)
        else:
            model = small(target, self.hidden_size, self.n_layers, self.n_heads, self.n_kv_heads,
                          self.intermediate_size, self.seed)
        if model.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"drafter vocab {model.config.vocab_size} != target vocab {target.config.vocab_size}")
        model = model.float().train()
        model.requires_grad_(True)
        if self.freeze_embeddings:
            model.get_input_embeddings().requires_grad_(False)
            model.get_output_embeddings().requires_grad_(False)
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("drafter: %s, %d layers, %.1fM trainable parameters", self.path or self.kind,
                 model.config.num_hidden_layers, n_train / 1e6)
        return model


@torch.inference_mode()
def measure_gamma(target: PreTrainedModel, drafter: PreTrainedModel, ctx: int = 2048, steps: int = 20) -> float:
    """gamma = one drafter decode step / one target decode step, both through CausalLM at `ctx`."""
    from sparsespec.models.runner import CausalLM

    def step(hf) -> float:
        lm = CausalLM(hf)
        cache = lm.new_cache(ctx + steps + 8)
        lm.prefill(torch.randint(0, lm.vocab_size, (ctx,)), cache)
        tok = torch.tensor([1])
        for _ in range(3):
            lm.forward(tok, cache, logits="last")
        t0 = time.perf_counter()
        for _ in range(steps):
            lm.forward(tok, cache, logits="last")
        return (time.perf_counter() - t0) / steps

    return step(drafter.eval()) / step(target.eval())


def decoder_layer_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The drafter's decoder-layer classes, for FSDP's auto-wrap policy (one FSDP unit per layer, so
    only one layer's full weights exist at a time). Taken from the model itself, so any family
    works: the classes Hugging Face marks as not to be split (`_no_split_modules`), else the classes
    of `model.model.layers`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not found:
        layers = getattr(getattr(model, "model", None), "layers", None)
        found = {type(m) for m in layers} if layers is not None else set()
    if not found:
        raise ValueError(f"trainer=fsdp: no decoder layers found in the drafter ({type(model).__name__}: no "
                         "_no_split_modules and no model.layers); set trainer.strategy.auto_wrap_policy")
    return found
