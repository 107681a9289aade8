"""Tiny random models of several families, built in the tests (no downloads)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from sparsespec.models.runner import CausalLM

VOCAB = 61


def tiny_config(family: str = "llama", vocab: int = VOCAB, layers: int = 2, **over):
    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
              initializer_range=0.25)  # a wide init gives peaked, diverse next-token distributions
    kw.update(over)
    if family == "llama":
        return LlamaConfig(**kw)
    if family == "qwen2":
        return Qwen2Config(**kw)
    if family == "qwen3":
        return Qwen3Config(head_dim=16, **kw)
    raise ValueError(family)


def tiny_hf(family: str = "llama", seed: int = 0, **over):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(family, **over)).eval()


def tiny_lm(family: str = "llama", seed: int = 0, **over) -> CausalLM:
    return CausalLM(tiny_hf(family, seed, **over))


FAMILIES = ["llama", "qwen2", "qwen3"]


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


def random_prompt(n: int, seed: int = 0, vocab: int = VOCAB) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()
