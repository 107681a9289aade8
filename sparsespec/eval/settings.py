"""The types and checks of evaluate.py's own settings. Their values, and what each one means, are
in conf/evaluate.yaml (and conf/model, conf/dataset): the one place a default is written.

Each section checks its fields in `__post_init__`; `sparsespec.config.validate_evaluate_config`
runs them and the rules that span sections, before any model loads. `check_run` is the one place a
run's settings are checked: it runs those checks, builds each method once, resolves what the rest
of the run reads (ctx, sampling, out_dir, shard, device, dtypes) and returns them as `RunSettings`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING

from sparsespec.checks import DTYPES, ConfigError, SettingError, choice, number, positive, require
from sparsespec.eval.results import SHARD_FORM, Shard, parse_shard, resolve_shard, results_name
from sparsespec.models.device import check_device_form

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

    from sparsespec.decoding.sampling import Sampling
    from sparsespec.eval.methods import Method

log = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------------------------------
# a run's settings, checked once


class EvaluationError(ValueError):
    """Bad input: the message names the key or file and the fix."""


@dataclass(frozen=True)
class RunSettings:
    """A run's settings after `check_run`: what every later step reads instead of the raw config."""

    cfg: DictConfig  # the composed config (config.yaml and the fingerprint are written from it)
    methods: list[Method]  # each built once from its config; ar first when it takes part
    ctx: int
    max_new: int  # gen.max_new_tokens
    sampling: Sampling
    out_dir: Path
    shard: Shard | None
    device: torch.device
    dtype: torch.dtype
    drafter_dtype: torch.dtype

    @property
    def results_path(self) -> Path:
        """This process's results file (its shard's, or results.jsonl)."""
        return self.out_dir / results_name(self.shard)

    @property
    def chunk(self) -> int:
        return int(self.cfg.runtime.prefill_chunk)

    @property
    def seed(self) -> int:
        return int(self.cfg.gen.seed)


def check_run(cfg: DictConfig, method_cfgs: list[DictConfig] | None = None) -> RunSettings:
    """Every check that needs no model, once, before anything is loaded or written: the settings'
    types and ranges, each method (built here, and only here, from its config), ctx, out_dir, the
    shard and the device. Raises EvaluationError naming the key."""
    from sparsespec.config import parse_ctx, validate_evaluate_config
    from sparsespec.decoding.sampling import Sampling
    from sparsespec.models.device import resolve_device, resolve_dtype

    try:
        methods = validate_evaluate_config(cfg, method_cfgs)
    except ConfigError as e:
        raise EvaluationError(str(e)) from e
    methods = with_baseline(methods, cfg.baseline)
    try:
        out_dir = Path(str(cfg.out_dir))
    except Exception as e:  # the default names the run from Hydra's runtime, which compose() does not set
        raise EvaluationError(f"out_dir could not be resolved ({type(e).__name__}); pass out_dir=DIR") from e
    if out_dir.exists() and not out_dir.is_dir():
        raise EvaluationError(f"out_dir={out_dir} is a file; pass a directory")
    try:
        shard = resolve_shard(cfg.get("shard"))  # shard=null reads the launcher's environment
        device = resolve_device(cfg.model.device)
        dtype = resolve_dtype(cfg.model.dtype, device)
        drafter_dtype = resolve_dtype(cfg.drafter.dtype or cfg.model.dtype, device, key="drafter.dtype")
    except ValueError as e:
        raise EvaluationError(str(e)) from None
    if shard is not None:
        log.info("shard %s (%s): samples %d, %d, %d, ... of the list, into %s", shard, shard.source, shard.index,
                 shard.index + shard.count, shard.index + 2 * shard.count, out_dir / results_name(shard))
    # ctx, temperature and top_p were checked above (validate_evaluate_config, GenConfig)
    return RunSettings(cfg, methods, parse_ctx(cfg.ctx), int(cfg.gen.max_new_tokens),
                       Sampling(float(cfg.gen.temperature), float(cfg.gen.top_p)), out_dir, shard, device, dtype,
                       drafter_dtype)


def with_baseline(methods: list[Method], baseline: str | None) -> list[Method]:
    """The run's methods with `ar` added for baseline=ar, ar first: the paired speedup and the
    identity check of every other method's row need ar's row of the same sample."""
    from sparsespec.eval.methods import Method

    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise EvaluationError(f"method list {names} names a method twice; list each method once")
    if baseline == "ar" and "ar" not in names:
        methods = [Method(name="ar"), *methods]
    return sorted(methods, key=lambda m: m.name != "ar")
