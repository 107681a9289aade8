"""Typed config schemas, registered with Hydra's ConfigStore by the entry points.

A misspelt key, a wrong type or a value outside its range fails while the config is composed or
validated, before any model loads, with a message naming the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sparsespec.eval.methods import MethodConfig


@dataclass
class ModelConfig:
    path: str | None = None  # null: the embedded SmolLM2-135M-Instruct
    dtype: str = "float32"
    rope_scaling: Any = "auto"


@dataclass
class DatasetConfig:
    name: str = "pg19"
    path: str | None = None
    task: str | None = None
    split: str = "test"
    use_chat_template: bool = True
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_at_eos: bool = False  # off by default so every method decodes the same number of tokens


@dataclass
class DrafterConfig:
    path: str | None = None  # a model directory with the target's tokenizer (sd, sd_sparse, budgetdraft)
    dtype: str | None = None  # default: the target's dtype


@dataclass
class RuntimeConfig:
    threads: int | None = None  # default: every core
    prefill_chunk: int = 1024
    warmup: bool = True
    repeats: int = 1  # decode each (sample, method) this many times; wall_s is the mean
    progress: bool = True
    memory_guard: bool = True


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(group="method", name="base_method", node=MethodConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="dataset", name="base_dataset", node=DatasetConfig)


_CTX = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_ctx(value: Any) -> int:
    """'4k' -> 4096, '128k' -> 131072, 5000 -> 5000 (k means 1024 tokens, as in the papers' labels)."""
    m = _CTX.match(str(value))
    if not m:
        raise ValueError(f"ctx={value!r}: use a label like 4k / 64k or a number of tokens")
    n = float(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    if n <= 0 or n != int(n):
        raise ValueError(f"ctx={value!r} must be a positive whole number of tokens")
    return int(n)
