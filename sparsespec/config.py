"""Composing configs, and the checks that run before any model loads.

Defaults live once: a part's in its class (its config group is generated from it here), an entry
point's own settings in its YAML (conf/evaluate.yaml, conf/train.yaml), typed and checked by the
dataclasses in `eval/settings.py` and `training/settings.py`. This module composes and validates:
a misspelt key, a wrong type or a value out of range fails with a `ConfigError` naming the key and
what it accepts; the rules that span sections are here. docs/reliability.md lists them.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

from sparsespec.checks import ConfigError, choice, close, positive, require

__all__ = ["ConfigError", "compose", "load_method", "parse_ctx", "register_configs", "validate_evaluate_config",
           "validate_train_config"]

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


# ---------------------------------------------------------------------------------------------
# config groups generated from the parts


def _settings(target: Any, exclude: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(name, annotation, default) of a part's settings: a dataclass's init fields, or a callable's
    keyword parameters. Left out: required ones, running state (private, or repr=False) and
    `exclude` (what the caller passes in)."""
    out = []
    if dataclasses.is_dataclass(target):
        for f in dataclasses.fields(target):
            if not f.init or not f.repr or f.name.startswith("_") or f.name in exclude:
                continue
            if f.default is not dataclasses.MISSING:
                out.append((f.name, f.type, f.default))
            elif f.default_factory is not dataclasses.MISSING:
                out.append((f.name, f.type, f.default_factory()))
        return out
    for p in inspect.signature(target).parameters.values():
        if p.default is not p.empty and p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in exclude:
            out.append((p.name, p.annotation, p.default))
    return out


def part_node(target: Any, exclude: tuple[str, ...] = ()) -> dict:
    """An untyped `_target_` node of a part's settings with their defaults (the part checks its own
    values when built). Parts of the part (a drafter's policy) are their own group."""
    node = {"_target_": f"{target.__module__}.{target.__qualname__}"}
    for name, _, value in _settings(target, exclude):
        value = list(value) if isinstance(value, tuple) else value
        if value is None or isinstance(value, int | float | str | list | dict):
            node[name] = value
    return node


def part_schema(target: Any, exclude: tuple[str, ...] = ()) -> type:
    """A typed structured config of a part's settings (a dataclass with `_target_`), so Hydra rejects
    a value of the wrong type while composing. Annotations OmegaConf cannot type become Any."""
    from omegaconf import OmegaConf

    module = vars(sys.modules[target.__module__])
    specs = [("_target_", str, dataclasses.field(default=f"{target.__module__}.{target.__qualname__}"))]
    for name, hint, value in _settings(target, exclude):
        mutable = isinstance(value, list | dict | tuple)
        default = dataclasses.field(default_factory=lambda v=value: list(v) if isinstance(v, tuple) else v.copy()) \
            if mutable else dataclasses.field(default=value)
        try:
            hint = eval(hint, module) if isinstance(hint, str) else hint  # noqa: S307 (the part's own annotation)
            OmegaConf.structured(dataclasses.make_dataclass("Probe", [(name, hint, default)]))
        except Exception:
            hint = Any
        specs.append((name, hint, default))
    return dataclasses.make_dataclass(f"{target.__name__}Settings", specs)


def shipped_parts() -> dict[str, dict[str, Any]]:
    """The package's parts by config group and option name (a user's part brings its own YAML)."""
    from sparsespec.decoding.controllers import EntropyController, FixedK
    from sparsespec.decoding.drafters import ModelDrafter, SelfDrafter
    from sparsespec.kv.policies import FullKV, StreamingKV
    from sparsespec.kv.recall import RecallIndex

    return {"method/drafter": {"self": SelfDrafter, "model": ModelDrafter},
            "method/drafter/policy": {"full": FullKV, "streaming": StreamingKV, "recall": RecallIndex},
            "method/controller": {"fixed": FixedK, "entropy": EntropyController}}


# the train.py groups' bases: conf/<group>/*.yaml start from these and set what differs
TRAIN_PART_BASES = {
    "drafter": ("sparsespec.training.drafters.DrafterSpec", ()),
    "budget": ("sparsespec.training.budgets.BudgetSampler", ()),
    "loss": ("sparsespec.training.losses.BudgetDraftLoss", ()),
    # the data module also takes what train.py passes from other sections (teacher.*, seed)
    "corpus": ("sparsespec.training.data.DraftDataModule", ("tokenizer", "teacher", "fingerprint", "teacher_dtype",
                                                          "topk", "cache_dir", "seed", "on_policy_tokens")),
}


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore
    from hydra.utils import get_class

    from sparsespec.eval.methods import Method
    from sparsespec.eval.settings import DatasetConfig, ModelConfig

    cs = ConfigStore.instance()
    cs.store(group="method", name="base_method", node=Method)
    for group, options in shipped_parts().items():
        for name, cls in options.items():
            cs.store(group=group, name=name, node=part_node(cls))
    for group, (path, exclude) in TRAIN_PART_BASES.items():
        cs.store(group=group, name=f"base_{group}", node=part_schema(get_class(path), exclude))
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="dataset", name="base_dataset", node=DatasetConfig)


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


def hydra_error_line(e: BaseException) -> str:
    """Hydra's or OmegaConf's composition error as one line (what failed and why, without the hints
    meant for a traceback)."""
    noise = ("To append", "full_key:", "object_type", "reference_type", "Set the environment", "Key '_target_'")

    def keep(err: BaseException) -> list[str]:
        return [ln.strip() for ln in str(err).strip().splitlines() if ln.strip() and not ln.strip().startswith(noise)]

    own = keep(e)
    if any(ln.endswith(":") for ln in own):  # a list follows (Hydra's available options)
        return " ".join(own[: next((i for i, ln in enumerate(own) if ln.startswith("Config search path")), None)])
    lines = own[:1] + (keep(e.__cause__)[:1] if e.__cause__ is not None else own[1:2])
    if "not in 'Method'" in " ".join(lines):
        lines.append("(a part's settings sit under its node: method.drafter.policy.ratio, method.controller.k)")
    return " ".join(lines)


def load_method(name: str, overrides: list[str] | tuple[str, ...] = (), search_path: str | Path | None = None
                ) -> Any:
    """conf/method/<name>.yaml with `method...` overrides -> a checked Method. `search_path`: a user's
    config folder (its method/ files) searched besides the package's own. Raises ConfigError."""
    extra = [f"hydra.searchpath=[file://{Path(search_path).resolve()}]"] if search_path is not None else []
    cfg = compose_checked("evaluate", [*extra, f"method={name}", *overrides], method=name)
    return check_method(cfg.method)


def compose_checked(name: str, overrides: list[str] | tuple[str, ...], method: str | None = None) -> Any:
    """compose(), with every composition error as one ConfigError line naming the key."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return compose(name, overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(hydra_error_line(e)) from None
    except AssertionError:  # OmegaConf's, for a key below a null part (ar has no drafter)
        keys = " ".join(o for o in overrides if o.lstrip("+~").startswith("method."))
        raise ConfigError(f"{keys}: {method or 'the method'} has no such key (a part's settings sit under "
                          "method.drafter, method.drafter.policy and method.controller; ar has no parts)") from None


def check_method(mc: Any) -> Any:
    """A composed method node -> the validated `Method` (no model is touched)."""
    from sparsespec.eval.methods import Method, MethodConfigError

    try:
        return Method.from_config(mc)
    except MethodConfigError as e:
        raise ConfigError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# validation


def check_settings(cfg: Any, schema: type) -> None:
    """Raise ConfigError unless `cfg` fits the settings dataclass `schema`: every key known, every
    value of the declared type, and each section's own checks (`__post_init__`). Interpolations
    are left unresolved (checked when used)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    base = OmegaConf.structured(schema)
    try:
        merged = OmegaConf.merge(base, cfg)
    except ConfigKeyError as e:
        key = str(e.full_key or e.key)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node = schema
        for part in parent.split(".") if parent else []:
            node = typing.get_type_hints(node).get(part) if dataclasses.is_dataclass(node) else None
        allowed = [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []
        raise ConfigError(f"{key} is not a config key{close(key.rsplit('.', 1)[-1], allowed)}; "
                          f"the keys of {parent or 'the config'} are: {', '.join(allowed)}") from None
    except OmegaConfBaseException as e:
        what = str(e.msg).splitlines()[0] if e.msg else str(e).splitlines()[0]
        raise ConfigError(f"{e.full_key or e.key}={e.value!r} has the wrong type: {what}") from None
    own, hints = {}, typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints[f.name]):
            OmegaConf.to_object(merged[f.name])  # runs the section's __post_init__
        elif not OmegaConf.is_interpolation(merged, f.name) and not OmegaConf.is_config(merged[f.name]):
            own[f.name] = merged[f.name]
    schema(**own)


def _part(key: str, node: Any, **extra: Any) -> Any:
    """Build a part from its node (cheap parts only), its own checks as a ConfigError."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, **extra)
    except InstantiationException as e:
        cause = e.__cause__ or e
        raise ConfigError(str(cause) if str(cause).startswith(f"{key}.") else f"{key}: {cause}") from None


def validate_evaluate_config(cfg: Any, method_cfgs: list[Any] | None = None) -> list[Any]:
    """Everything evaluate.py can check without a model -> the checked methods (one `Method` per
    method config, `cfg.method` without a list). Raises ConfigError."""
    from sparsespec.data import DatasetError, loader_options
    from sparsespec.eval.settings import EvaluateConfig

    check_settings(cfg, EvaluateConfig)
    methods = [check_method(mc) for mc in (method_cfgs if method_cfgs is not None else [cfg.method])]
    name = cfg.dataset.name
    try:  # the loader imports, and its options are known, before any model loads
        known = loader_options(cfg.dataset._target_)
    except DatasetError as e:
        raise ConfigError(str(e)) from None
    package, _, module = str(cfg.dataset._target_).removesuffix(".load").rpartition(".")
    if package == "sparsespec.data":  # rows and messages name a package dataset by its loader's module
        choice("dataset.name", name, (module,))
    for key in cfg.dataset.get("options") or {}:
        if key not in known:
            raise ConfigError(f"dataset.options.{key} is not an option of dataset={name}{close(str(key), known)}; "
                              f"its options are: {', '.join(known) or 'none'}")
    try:
        parse_ctx(cfg.ctx)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return methods


def _check_trainer(tc: Any) -> None:
    """Lightning's own Trainer arguments (conf/trainer): known names, and the ranges a typo would
    otherwise only reveal after the model loads."""
    from typing import get_args

    import lightning as L
    from lightning.fabric.plugins.precision.precision import (
        _PRECISION_INPUT_INT,
        _PRECISION_INPUT_STR,
        _PRECISION_INPUT_STR_ALIAS,
    )
    from omegaconf import OmegaConf

    from sparsespec.checks import non_negative, number

    allowed = [p for p in inspect.signature(L.Trainer.__init__).parameters if p != "self"]
    plain = OmegaConf.to_container(tc, resolve=False) if OmegaConf.is_config(tc) else dict(tc or {})
    for key in plain:
        if key not in allowed and key != "_target_":
            raise ConfigError(f"trainer.{key} is not a Lightning Trainer argument{close(key, allowed)}; "
                              f"allowed: {', '.join(allowed)}")
    steps = plain.get("max_steps", -1)
    require(number("trainer.max_steps", steps, int) == -1 or steps > 0, "trainer.max_steps", steps,
            "a positive number of optimizer steps, or -1 (use max_epochs)")
    for key in ("accumulate_grad_batches", "log_every_n_steps"):
        if key in plain:
            positive(f"trainer.{key}", plain[key], int)
    if plain.get("gradient_clip_val") is not None:
        non_negative("trainer.gradient_clip_val", plain["gradient_clip_val"])
    vci = plain.get("val_check_interval")
    if vci is not None:
        require(number("trainer.val_check_interval", vci) > 0, "trainer.val_check_interval", vci,
                "a positive number of steps (int) or a share of an epoch (float in (0, 1])")
    if "precision" in plain:
        options = [*get_args(_PRECISION_INPUT_STR), *get_args(_PRECISION_INPUT_STR_ALIAS), *get_args(_PRECISION_INPUT_INT)]
        p = plain["precision"]
        choice("trainer.precision", p if isinstance(p, int) and not isinstance(p, bool) else str(p), options)


def validate_train_config(cfg: Any) -> None:
    """Everything train.py can check without a model. Raises ConfigError."""
    from sparsespec.training.settings import TrainConfig
    check_settings(cfg, TrainConfig)
    for key in ("drafter", "budget", "loss"):
        _part(key, cfg[key])
    t = cfg.teacher
    _part("corpus", cfg.corpus, teacher_dtype=t.dtype, topk=t.topk, on_policy_tokens=t.on_policy_tokens)
    if cfg.budget.mode != "full" and cfg.budget.k_sink + 1 >= cfg.corpus.seq_len:
        raise ConfigError(f"budget.k_sink={cfg.budget.k_sink} leaves no sparse view of a corpus.seq_len="
                          f"{cfg.corpus.seq_len} sequence: allowed k_sink < seq_len - 1")
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
