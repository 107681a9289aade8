"""`python evaluate.py [key=value ...]`: compose the run's configs with Hydra, then run the harness.

Several methods in one run (`method=[ar,magicdec,sparsespec_l]`, Hydra's own list syntax) are
composed one by one: Hydra would merge the listed files into one node, and their parts' defaults
clash. A `method.KEY=` or `method/GROUP=` override goes to each listed method that has that key or
group (`method.drafter.policy.ratio=0.05` leaves ar alone), read off the method's composed config
rather than guessed by trying; one that no listed method has is an error naming it.

Hydra's own flags (`-m` multirun, `--cfg`, `--help`, ...) run through Hydra's app as usual, one
method per job. Bad input: one line naming the key, exit status 2, no result file.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from sparsespec.checks import ConfigError, close
from sparsespec.config import CONF_DIR, hydra_error_line, register_configs
from sparsespec.eval.auto import AUTO, choose

log = logging.getLogger("evaluate")
CONFIG = "evaluate"
_ABSENT = object()


@dataclass
class Run:
    """What one evaluate.py command runs: its settings, a composed node per method, the command."""

    cfg: DictConfig  # the settings (the first method's config; out_dir resolved), without Hydra's node
    methods: list[DictConfig]  # one composed method node per listed method, each with its overrides
    command: str  # as typed, kept in out_dir/command.txt
    hydra: DictConfig  # Hydra's own node (job logging)


def _parse(args: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides(args)
    except HydraException as e:
        raise ConfigError(hydra_error_line(e)) from None


def method_list(args: list[str]) -> list[str] | None:
    """The names a `method=` override lists (one name: a list of one); None without one."""
    names = None
    for o in _parse(args):
        if o.key_or_group == "method" and o.package is None and not o.is_delete() and not o.is_sweep_override():
            value = o.value()
            names = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    if names is not None and not names:
        raise ConfigError("method=[]: list at least one method")
    return names


def _compose(overrides: list[str]) -> DictConfig:
    """The config with Hydra's node (its runtime choices, and what `${hydra:...}` resolves against)."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return compose(CONFIG, overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(hydra_error_line(e)) from None
    except AssertionError:  # OmegaConf's, for a key below a part a method does not have
        raise ConfigError(f"{' '.join(o for o in overrides if o.lstrip('+~').startswith('method'))}: a key the "
                          "method does not have") from None


def _group_applies(o: Any, choices: DictConfig) -> bool:
    chosen = choices.get(o.key_or_group) is not None
    return not chosen if o.is_add() else chosen


def _value_applies(o: Any, method: DictConfig) -> bool:
    path = o.key_or_group[len("method."):]
    parent, _, _ = path.rpartition(".")
    if o.is_add() or o.is_force_add():  # +method.x / ++method.x: where the node that takes it exists
        node = OmegaConf.select(method, parent, default=None) if parent else method
        return OmegaConf.is_dict(node)
    return OmegaConf.select(method, path, default=_ABSENT) is not _ABSENT


def _lacking(o: Any, methods: list[DictConfig], names: list[str]) -> ConfigError:
    """The error for an override no listed method takes, with the keys that are there."""
    line = o.input_line
    if len(names) > 1:
        return ConfigError(f"{line}: no listed method ({', '.join(names)}) has this key")
    path = o.key_or_group.removeprefix("method.").removeprefix("method/")
    parent, _, leaf = path.rpartition(".")
    node = OmegaConf.select(methods[0], parent, default=None) if parent else methods[0]
    if "/" in o.key_or_group or not OmegaConf.is_dict(node):
        missing = parent.split(".")[0] if parent else path
        return ConfigError(f"{line}: {names[0]} has no such key (it has no method.{missing}; a part's settings sit "
                           "under method.drafter, method.drafter.policy and method.controller; ar has no parts)")
    keys = [str(k) for k in node if k != "_target_"]
    where = f"method.{parent}" if parent else "a method"
    return ConfigError(f"{line}: {names[0]} has no such key{close(leaf, keys)}; {where} has {', '.join(keys)}")


def _compose_methods(common: list[str], names: list[str] | None, typed: list[Any]) -> tuple[list, list]:
    """(each method's config with the overrides it takes, each method's config without them)."""
    groups = [o for o in typed if "/" in o.key_or_group]
    values = [o for o in typed if "/" not in o.key_or_group]
    out, bares, used = [], [], set()
    for name in names or [None]:
        base = [*common, f"method={name}"] if name is not None else common
        bare = _compose(base)
        mine = [o for o in groups if _group_applies(o, bare.hydra.runtime.choices)]
        shaped = _compose([*base, *(o.input_line for o in mine)]) if mine else bare
        mine += [o for o in values if _value_applies(o, shaped.method)]
        chosen = {id(o) for o in mine}
        used |= chosen
        # in the order typed: a later override of the same key wins, as on any command line
        out.append(_compose([*base, *(o.input_line for o in typed if id(o) in chosen)]) if mine else bare)
        bares.append(bare)
    names = names or [str(out[0].method.name)]
    for o in typed:
        if id(o) not in used:
            raise _lacking(o, [c.method for c in out], names)
    return out, bares


def compose_run(args: list[str]) -> Run:
    """The run a command line asks for. Raises ConfigError (one line naming the key)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    register_configs()
    overrides = _parse(args)
    names = method_list(args)
    is_method = [o.key_or_group.startswith(("method.", "method/")) for o in overrides]
    listing = [o.key_or_group == "method" and names is not None and not o.is_sweep_override() for o in overrides]
    common = [o.input_line for o, m, li in zip(overrides, is_method, listing, strict=True) if not m and not li]
    typed = [o for o, m in zip(overrides, is_method, strict=True) if m]  # the method overrides, in the order typed
    held = HydraConfig.instance().cfg
    inside_app = GlobalHydra.instance().is_initialized()  # compose in the app's context (its search path)
    with contextlib.nullcontext() if inside_app else initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        if names is not None and AUTO in names:  # the planner's pick under this run's settings
            chosen = choose(_compose([*common, "method=ar"]))
            names = list(dict.fromkeys(chosen if n == AUTO else n for n in names))
        out, bares = _compose_methods(common, names, typed)
        named = out[0] if len(out) == 1 else bares[0]  # a list's default out_dir: its first method's ...
        try:
            HydraConfig.instance().set_config(named)  # what ${hydra:job.override_dirname} resolves against
            out_dir = str(named.out_dir)
        except Exception as e:
            raise ConfigError(f"out_dir could not be resolved ({type(e).__name__}: {e}); pass out_dir=DIR") from None
        finally:
            HydraConfig.instance().cfg = held
    if len(out) > 1 and not any(o.key_or_group == "out_dir" for o in overrides):  # ... named by the list
        listed = ",".join([f"method=[{','.join(names)}]", *(o.input_line for o in typed)])
        out_dir = out_dir.replace(f"method={names[0]}", listed, 1)
    hydra = out[0].hydra
    for c in out:
        with open_dict(c):
            del c["hydra"]
    cfg = out[0].copy()
    cfg.out_dir = out_dir
    return Run(cfg, [c.method for c in out], " ".join(["python evaluate.py", *(shlex.quote(a) for a in args)]), hydra)


def run(run: Run) -> Path:
    """Evaluate, then log the finished out_dir to W&B with `logger=wandb`. Raises EvaluationError."""
    from sparsespec.eval.harness import run_evaluation

    out_dir = run_evaluation(run.cfg, run.methods, command=run.command)
    if (run.cfg.get("logger") or {}).get("wandb"):  # logger=wandb: out_dir's files to a W&B run (offline by default)
        from sparsespec.tracking import log_evaluation

        log_evaluation(run.cfg, out_dir)
    return out_dir


def _hydra_job(cfg: DictConfig) -> None:
    """One job of Hydra's app (`-m`, one method per job)."""
    from hydra.core.hydra_config import HydraConfig

    from sparsespec.eval.settings import EvaluationError

    args = list(HydraConfig.get().overrides.task)
    try:
        run(Run(cfg, [cfg.method], " ".join(["python evaluate.py", *(shlex.quote(a) for a in args)]), HydraConfig.get()))
    except EvaluationError as e:
        log.error("%s", e)
        sys.exit(2)


_HYDRA_FLAGS = ("multirun", "cfg", "help", "hydra_help", "info", "shell_completion", "config_path", "config_name",
                "config_dir", "experimental_rerun", "resolve", "package", "version")


def main(args: list[str]) -> int:
    """evaluate.py's command line -> its exit status (0, or 2 for bad input)."""
    from hydra._internal.utils import _run_hydra, get_args_parser

    from sparsespec.eval.settings import EvaluationError

    parser = get_args_parser()
    ns = parser.parse_args(args)
    if any(getattr(ns, flag, None) for flag in _HYDRA_FLAGS):
        try:
            if ns.multirun and method_list(ns.overrides) and len(method_list(ns.overrides)) > 1:
                raise ConfigError("method=[...] runs its methods in one process; with -m, sweep them as jobs "
                                  "(method=a,b,c) or drop -m")
        except ConfigError as e:
            _plain_log()
            log.error("%s", e)
            return 2
        register_configs()
        _run_hydra(args=ns, args_parser=parser, task_function=_hydra_job, config_path=str(CONF_DIR),
                   config_name=CONFIG)
        return 0
    try:
        plan = compose_run(ns.overrides)
    except ConfigError as e:
        _plain_log()
        log.error("%s", e)
        return 2
    from hydra.core.utils import configure_log

    configure_log(plan.hydra.job_logging, plan.hydra.verbose)
    try:
        run(plan)
    except EvaluationError as e:
        log.error("%s", e)
        return 2
    return 0


def _plain_log() -> None:
    """Hydra's job logging format, for an error found before the config that sets it is composed."""
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="[%(asctime)s][%(name)s][%(levelname)s] - "
                        "%(message)s")
