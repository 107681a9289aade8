"""Typed config schemas and the validation both entry points run before any model loads.

A misspelt key, a wrong type or a value outside its range fails while the config is composed
(the method schema, via ConfigStore) or validated (`validate_evaluate_config`,
`validate_train_config`), before any model loads, with a `ConfigError` naming the key and the
values it accepts. docs/reliability.md lists the rules.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
ROPE_SCALING = ("auto", "none", "yarn", "dynamic", "linear")


class ConfigError(ValueError):
    """A config key that cannot work: the message names the key and what it accepts."""


# ---------------------------------------------------------------------------------------------
# evaluate.py


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
    use_task_length: bool = False  # decode min(max_new_tokens, the benchmark's own answer length)


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
    share_prefill: bool = True  # prefill each sample once for every method (see harness.SharedPrefill)


@dataclass
class EvaluateConfig:
    """conf/evaluate.yaml (the method node is checked by `Method.from_config`)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    method: Any = None
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    ctx: Any = "4k"
    limit: int | None = 1
    baseline: str | None = "ar"
    out_dir: str = "outputs/evaluate"
    gen: GenConfig = field(default_factory=GenConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    logger: Any = None  # conf/logger/*.yaml (sparsespec.tracking checks its own keys)


# ---------------------------------------------------------------------------------------------
# train.py


@dataclass
class TrainModelConfig:
    path: str | None = None
    dtype: str = "float32"


@dataclass
class TeacherConfig:
    dtype: str = "bfloat16"
    topk: int = 8
    batch_size: int = 1
    cache_dir: str | None = None
    on_policy_tokens: int = 0


@dataclass
class OptimConfig:
    lr: float = 5.0e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])


@dataclass
class TrainDrafterConfig:
    _target_: str = "sparsespec.training.drafters.build_drafter"
    kind: str = "truncated"
    path: str | None = None
    n_layers: int = 2
    freeze_embeddings: bool = True
    hidden_size: int = 256  # drafter=small only
    n_heads: int = 4
    n_kv_heads: int = 2
    intermediate_size: int = 768
    seed: int = 0


@dataclass
class BudgetConfig:
    _target_: str = "sparsespec.training.budgets.BudgetSampler"
    mode: str = "multi"
    values: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    ratios: list[float] | None = None
    probs: list[float] | None = None
    n_views: int = 1
    k_sink: int = 16
    eval_values: list[int] = field(default_factory=lambda: [256, 512, 1024])


@dataclass
class LossConfig:
    _target_: str = "sparsespec.training.losses.BudgetDraftLoss"
    ce: float = 1.0
    acc: float = 1.0
    sparse_ce: float = 1.0
    sparse_acc: float = 0.0
    kl: float = 1.0
    depth: int = 4


@dataclass
class DataConfig:
    _target_: str = "sparsespec.training.data.DraftDataModule"
    path: str | None = None
    seq_len: int = 2048
    n_train: int = 96
    n_val: int = 4
    offset: float = 0.02
    batch_size: int = 1
    num_workers: int = 0
    shard_size: int = 16


@dataclass
class TrainerConfig:
    """The trainer keys conf/trainer/*.yaml sets, typed. Any other Lightning Trainer argument is
    accepted as is (checked against Trainer's signature)."""

    _target_: str = "lightning.pytorch.Trainer"
    accelerator: Any = "auto"
    devices: Any = 1
    num_nodes: int = 1
    strategy: Any = "auto"
    precision: Any = "bf16-mixed"
    max_steps: int = 120
    max_epochs: int | None = -1
    gradient_clip_val: float | None = 1.0
    accumulate_grad_batches: int = 1
    val_check_interval: Any = 40
    check_val_every_n_epoch: int | None = None
    log_every_n_steps: int = 10
    num_sanity_val_steps: int = 0
    fast_dev_run: Any = False
    enable_progress_bar: bool = True
    deterministic: Any = False
    limit_val_batches: Any = 1.0
    limit_train_batches: Any = 1.0


@dataclass
class TrainConfig:
    """conf/train.yaml after composition (callbacks and loggers are Lightning's own configs)."""

    seed: int = 0
    out_dir: str = "outputs/train"
    ckpt_path: str | None = None
    threads: int | None = None
    export: bool = True
    update_latest: bool = True
    eval_untrained: bool = True
    model: TrainModelConfig = field(default_factory=TrainModelConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    callbacks: dict[str, Any] | None = field(default_factory=dict)
    drafter: TrainDrafterConfig = field(default_factory=TrainDrafterConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: Any = None  # TrainerConfig + any Trainer argument: see _check_trainer
    logger: Any = None


def part_node(cls: type) -> dict:
    """A `_target_` node of a dataclass part holding its init fields' defaults: the dataclass is the
    one source of a part's defaults, and every field can be set from the command line."""
    import dataclasses

    node = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue  # required: the method file (or a user's override) gives it
        node[f.name] = list(value) if isinstance(value, tuple) else value
    return node


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    from sparsespec.decoding.controllers import EntropyController, FixedK
    from sparsespec.eval.methods import Method

    cs = ConfigStore.instance()
    # every method has these keys (so `method.lookup=2` works on any of them); its file adds the rest
    cs.store(group="method", name="base_method",
             node={k: v for k, v in part_node(Method).items() if k not in ("_target_", "name", "controller", "knobs")})
    for name, cls in (("fixed", FixedK), ("entropy", EntropyController)):
        cs.store(group="method/controller", name=name, node=part_node(cls))
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="dataset", name="base_dataset", node=DatasetConfig)
    cs.store(name="base_evaluate", node=EvaluateConfig)
    cs.store(name="base_train", node=TrainConfig)


# ---------------------------------------------------------------------------------------------
# validation


def _close(word: str, allowed: list[str]) -> str:
    near = difflib.get_close_matches(str(word), [str(a) for a in allowed], n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def check_schema(cfg: Any, schema: type, prefix: str = "") -> None:
    """Raise ConfigError unless `cfg` fits the dataclass `schema`: every key known, every value of
    the declared type. Interpolations are left unresolved (checked when used)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    base = OmegaConf.structured(schema)
    try:
        OmegaConf.merge(base, cfg)
    except ConfigKeyError as e:
        key = str(e.full_key or e.key)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node = OmegaConf.select(base, parent) if parent else base
        allowed = [str(k) for k in node.keys()] if node is not None and hasattr(node, "keys") else []
        leaf = key.rsplit(".", 1)[-1]
        raise ConfigError(f"{prefix}{key} is not a config key{_close(leaf, allowed)}; "
                          f"the keys of {prefix}{parent or 'the config'} are: {', '.join(allowed)}") from None
    except OmegaConfBaseException as e:
        key = str(e.full_key or e.key)
        what = str(e.msg).splitlines()[0] if e.msg else str(e).splitlines()[0]
        raise ConfigError(f"{prefix}{key}={e.value!r} has the wrong type: {what}") from None


def _num(key: str, value: Any, kind: type = float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise ConfigError(f"{key}={value!r} has the wrong type: expected {'an integer' if kind is int else 'a number'}")
    if isinstance(value, float) and math.isnan(value):
        raise ConfigError(f"{key}=nan is not a number")
    return value


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is out of range: allowed {allowed}")


def _positive(key: str, value: Any, kind: type = int) -> None:
    _require(_num(key, value, kind) > 0, key, value, "values > 0")


def _non_negative(key: str, value: Any, kind: type = float) -> None:
    _require(_num(key, value, kind) >= 0, key, value, "values >= 0")


def _choice(key: str, value: Any, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed{_close(str(value), list(allowed))}: "
                          f"use one of {', '.join(map(str, allowed))}")


def _plain(cfg: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, DictConfig | ListConfig):
        return OmegaConf.to_container(cfg, resolve=False)
    return cfg


CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose(name: str = "evaluate", overrides: list[str] | tuple[str, ...] = (), config_dir: str | Path | None = None
            ) -> Any:
    """conf/<name>.yaml composed with Hydra overrides, outside a Hydra app (scripts, the Python API)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    if GlobalHydra.instance().is_initialized():  # inside a Hydra app: compose in its context
        return hydra_compose(name, overrides=list(overrides))
    with initialize_config_dir(str(config_dir or CONF_DIR), version_base="1.3"):
        return hydra_compose(name, overrides=list(overrides))


def load_method(name: str, overrides: list[str] | tuple[str, ...] = (), search_path: str | Path | None = None
                ) -> Any:
    """conf/method/<name>.yaml with `method...` overrides -> a checked Method. `search_path`: a user's
    config folder (its method/ files) searched besides the package's own. Raises ConfigError."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    extra = [f"hydra.searchpath=[file://{Path(search_path).resolve()}]"] if search_path is not None else []
    try:
        cfg = compose("evaluate", [*extra, f"method={name}", *overrides])
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    return check_method(cfg.method)


def check_method(mc: Any) -> Any:
    """A composed method node -> the validated `Method` (no model is touched)."""
    from sparsespec.eval.methods import Method, MethodConfigError

    try:
        return Method.from_config(mc)
    except MethodConfigError as e:
        raise ConfigError(str(e)) from None


def validate_evaluate_config(cfg: Any, method_cfgs: list[Any] | None = None) -> None:
    """Everything evaluate.py can check without a model. Raises ConfigError."""
    check_schema(cfg, EvaluateConfig)
    for mc in method_cfgs if method_cfgs is not None else [cfg.method]:
        check_method(mc)
    _choice("model.dtype", cfg.model.dtype, DTYPES)
    rs = cfg.model.get("rope_scaling")
    if rs is not None and not hasattr(rs, "keys"):
        _choice("model.rope_scaling", str(rs).lower(), ROPE_SCALING)
    if cfg.drafter.dtype is not None:
        _choice("drafter.dtype", cfg.drafter.dtype, DTYPES)
    from sparsespec.data.registry import LOADERS

    _choice("dataset.name", cfg.dataset.name, tuple(LOADERS))
    from sparsespec.data.registry import loader_options

    known = loader_options(cfg.dataset.name)
    for key in cfg.dataset.get("options") or {}:
        if key not in known:
            raise ConfigError(f"dataset.options.{key} is not an option of dataset={cfg.dataset.name}"
                              f"{_close(str(key), known)}; its options are: {', '.join(known) or 'none'}")
    g = cfg.gen
    _positive("gen.max_new_tokens", g.max_new_tokens, int)
    _require(_num("gen.temperature", g.temperature) >= 0, "gen.temperature", g.temperature,
             ">= 0 (0 = greedy, > 0 = sampling)")
    _require(0 < _num("gen.top_p", g.top_p) <= 1, "gen.top_p", g.top_p, "(0, 1]")
    try:
        parse_ctx(cfg.ctx)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.limit is not None:
        _positive("limit", cfg.limit, int)
    _choice("baseline", cfg.baseline, ("ar", None))
    r = cfg.runtime
    if r.threads is not None:
        _positive("runtime.threads", r.threads, int)
    _positive("runtime.prefill_chunk", r.prefill_chunk, int)
    _positive("runtime.repeats", r.repeats, int)


def _check_trainer(tc: Any) -> None:
    import inspect

    import lightning as L

    known = {f for f in TrainerConfig.__dataclass_fields__}
    allowed = [p for p in inspect.signature(L.Trainer.__init__).parameters if p not in ("self",)]
    plain = _plain(tc) or {}
    for key in plain:
        if key not in known and key not in allowed:
            raise ConfigError(f"trainer.{key} is not a Lightning Trainer argument{_close(key, allowed)}; "
                              f"allowed: {', '.join(allowed)}")
    check_schema({k: v for k, v in plain.items() if k in known}, TrainerConfig, "trainer.")
    steps = plain.get("max_steps", -1)
    _require(_num("trainer.max_steps", steps, int) == -1 or steps > 0, "trainer.max_steps", steps,
             "a positive number of optimizer steps, or -1 (use max_epochs)")
    if "accumulate_grad_batches" in plain:
        _positive("trainer.accumulate_grad_batches", plain["accumulate_grad_batches"], int)
    if "log_every_n_steps" in plain:
        _positive("trainer.log_every_n_steps", plain["log_every_n_steps"], int)
    if plain.get("gradient_clip_val") is not None:
        _non_negative("trainer.gradient_clip_val", plain["gradient_clip_val"])
    vci = plain.get("val_check_interval")
    if vci is not None:
        _require(_num("trainer.val_check_interval", vci) > 0, "trainer.val_check_interval", vci,
                 "a positive number of steps (int) or a share of an epoch (float in (0, 1])")
    if "precision" in plain:
        from typing import get_args

        from lightning.fabric.plugins.precision.precision import (
            _PRECISION_INPUT_INT,
            _PRECISION_INPUT_STR,
            _PRECISION_INPUT_STR_ALIAS,
        )

        options = [*get_args(_PRECISION_INPUT_STR), *get_args(_PRECISION_INPUT_STR_ALIAS), *get_args(_PRECISION_INPUT_INT)]
        p = plain["precision"]
        _choice("trainer.precision", p if isinstance(p, int) and not isinstance(p, bool) else str(p), options)


def validate_train_config(cfg: Any) -> None:
    """Everything train.py can check without a model. Raises ConfigError."""
    check_schema(cfg, TrainConfig)
    if cfg.get("threads") is not None:
        _positive("threads", cfg.threads, int)
    _choice("model.dtype", cfg.model.dtype, DTYPES)
    t = cfg.teacher
    _choice("teacher.dtype", t.dtype, DTYPES)
    _non_negative("teacher.topk", t.topk, int)
    _positive("teacher.batch_size", t.batch_size, int)
    o = cfg.optim
    _positive("optim.lr", o.lr, float)
    _non_negative("optim.weight_decay", o.weight_decay)
    _require(0 <= _num("optim.warmup_ratio", o.warmup_ratio) <= 1, "optim.warmup_ratio", o.warmup_ratio, "[0, 1]")
    _require(0 <= _num("optim.min_lr_ratio", o.min_lr_ratio) <= 1, "optim.min_lr_ratio", o.min_lr_ratio, "[0, 1]")
    betas = list(o.betas)
    _require(len(betas) == 2 and all(0 <= _num("optim.betas", b) < 1 for b in betas), "optim.betas", betas,
             "two values in [0, 1)")

    d = cfg.drafter
    if not d.get("path"):
        _choice("drafter.kind", d.get("kind", "truncated"), ("truncated", "small"))
    elif not Path(str(d.path)).expanduser().exists():
        raise ConfigError(f"drafter.path={d.path} does not exist: pass a Hugging Face model directory")
    for key in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "intermediate_size"):
        if d.get(key) is not None:
            _positive(f"drafter.{key}", d[key], int)

    data = cfg.data
    for key in ("seq_len", "n_train", "n_val", "batch_size", "shard_size"):
        _positive(f"data.{key}", data[key], int)
    _non_negative("data.num_workers", data.num_workers, int)
    _non_negative("teacher.on_policy_tokens", t.on_policy_tokens, int)
    _require(t.on_policy_tokens < data.seq_len, "teacher.on_policy_tokens", t.on_policy_tokens,
             f"fewer than data.seq_len={data.seq_len}: each window keeps seq_len - on_policy_tokens prompt tokens")
    _require(0 <= _num("data.offset", data.offset) < 1, "data.offset", data.offset,
             "[0, 1): the share of each document's characters to skip")
    if data.path is not None and not Path(str(data.path)).expanduser().exists():
        raise ConfigError(f"data.path={data.path} does not exist: pass a .txt/.jsonl/.json/.parquet file or a "
                          "directory of them (null: the shipped PG-19 books)")

    from sparsespec.training.budgets import BudgetSampler
    from sparsespec.training.losses import BudgetDraftLoss

    for key, cls in (("budget", BudgetSampler), ("loss", BudgetDraftLoss)):
        kw = {k: v for k, v in _plain(cfg[key]).items() if k != "_target_"}
        try:
            cls(**kw)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if cfg.budget.mode != "full" and cfg.budget.k_sink + 1 >= data.seq_len:
        raise ConfigError(f"budget.k_sink={cfg.budget.k_sink} leaves no sparse view of a data.seq_len="
                          f"{data.seq_len} sequence: allowed k_sink < seq_len - 1")

    _check_trainer(cfg.trainer)
    ckpt = cfg.get("ckpt_path")
    if ckpt is not None and not Path(str(ckpt)).expanduser().is_file():
        raise ConfigError(f"ckpt_path={ckpt} is not a file: pass out_dir/checkpoints/last.ckpt of an earlier run "
                          "(or ckpt_path=null to start fresh)")


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
