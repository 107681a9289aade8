"""The types and checks of evaluate.py's own settings. Their values, and what each one means, are
in conf/evaluate.yaml (and conf/model, conf/dataset): the one place a default is written.

Each section checks its fields in `__post_init__`; `sparsespec.config.validate_evaluate_config`
runs them and the rules that span sections, before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from sparsespec.checks import DTYPES, ConfigError, SettingError, choice, number, positive, require
from sparsespec.eval.results import SHARD_FORM, parse_shard
from sparsespec.models.device import check_device_form

ROPE_SCALING = ("auto", "none", "yarn", "dynamic", "linear")


@dataclass
class ModelConfig:
    path: str | None = MISSING
    device: str = MISSING
    dtype: str = MISSING
    rope_scaling: Any = MISSING

    def __post_init__(self) -> None:
        check_device_form("model.device", self.device)
        choice("model.dtype", self.dtype, DTYPES)
        if self.rope_scaling is not None and not hasattr(self.rope_scaling, "keys"):
            choice("model.rope_scaling", str(self.rope_scaling).lower(), ROPE_SCALING)


@dataclass
class DatasetConfig:
    # the base of every conf/dataset/*.yaml (a user's too), which sets _target_, name, path, task and options
    _target_: str = MISSING  # the loader: a function load(tokenizer, ctx, *, path, task, limit, ...) (data/loading.py)
    name: str = MISSING  # the dataset's label in messages and the default out_dir
    path: str | None = None
    task: str | None = None
    split: str = "test"
    use_chat_template: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # the loader's own settings (dataset.options.offset=0.1)


@dataclass
class GenConfig:
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    top_p: float = MISSING
    seed: int = MISSING
    stop_at_eos: bool = MISSING
    use_task_length: bool = MISSING
    batch_size: int = MISSING

    def __post_init__(self) -> None:
        positive("gen.max_new_tokens", self.max_new_tokens, int)
        positive("gen.batch_size", self.batch_size, int)
        require(number("gen.temperature", self.temperature) >= 0, "gen.temperature", self.temperature,
                ">= 0 (0 = greedy, > 0 = sampling)")
        require(0 < number("gen.top_p", self.top_p) <= 1, "gen.top_p", self.top_p, "(0, 1]")


@dataclass
class DrafterConfig:
    path: str | None = MISSING
    dtype: str | None = MISSING

    def __post_init__(self) -> None:
        if self.dtype is not None:
            choice("drafter.dtype", self.dtype, DTYPES)
        if self.path is not None:  # checked here, before the target loads, so the error names drafter.path
            from sparsespec.models.loading import _looks_local

            spec = str(self.path).strip()
            if _looks_local(spec) and not Path(spec).expanduser().exists():
                raise SettingError("drafter.path", spec, "does not exist: pass the drafter's model directory "
                                   "(a train.py export, or any model with the target's tokenizer) or a hub id")


@dataclass
class RuntimeConfig:
    threads: int | None = MISSING
    prefill_chunk: int = MISSING
    warmup: bool = MISSING
    repeats: int = MISSING
    progress: bool = MISSING
    memory_guard: bool = MISSING
    share_prefill: bool = MISSING

    def __post_init__(self) -> None:
        if self.threads is not None:
            positive("runtime.threads", self.threads, int)
        positive("runtime.prefill_chunk", self.prefill_chunk, int)
        positive("runtime.repeats", self.repeats, int)


@dataclass
class EvaluateConfig:
    """conf/evaluate.yaml (the method node is checked by `Method.from_config`)."""

    model: ModelConfig = MISSING
    method: Any = MISSING
    dataset: DatasetConfig = MISSING
    ctx: Any = MISSING
    limit: int | None = MISSING
    shard: Any = MISSING  # "i/n" or null; read as text here, so `shard=1` is told the form rather than a type
    baseline: str | None = MISSING
    out_dir: str = MISSING
    gen: GenConfig = MISSING
    drafter: DrafterConfig = MISSING
    runtime: RuntimeConfig = MISSING
    logger: Any = MISSING

    def __post_init__(self) -> None:
        if self.limit is not None:
            positive("limit", self.limit, int)
        choice("baseline", self.baseline, ("ar", None))
        if self.shard is not None:
            try:
                parse_shard(self.shard)
            except ValueError as e:
                raise ConfigError(f"shard={self.shard!r} {e}: expected {SHARD_FORM}") from None
