"""Evaluate methods on a benchmark at a context length: `python evaluate.py method=sparsespec_l ctx=64k`.

Thin entry point: compose the config (several methods with `method=[ar,magicdec,sparsespec_l]`),
instantiate each method, hand over to sparsespec.eval.harness. Bad input exits non-zero with a
message naming the key or file, before any result file is written. With `logger=wandb` the finished
out_dir is logged to W&B by sparsespec.tracking.log_evaluation.
"""

from __future__ import annotations

import logging
import shlex
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from sparsespec.config import ConfigError, compose_checked, hydra_error_line, register_configs

register_configs()
log = logging.getLogger("evaluate")


# `method=[a,b,...]`: Hydra would merge the listed method files into one node (their nested
# defaults clash), so the list and the `method.` overrides are taken off the command line here and
# each method is composed on its own (method_configs); Hydra sees `method=a`.
METHOD_LIST: list[str] | None = None
METHOD_OVERRIDES: list[str] = []
ARGS: list[str] | None = None  # the command line as given


def take_method_list(argv: list[str]) -> list[str]:
    """argv with `method=[a,b,...]` replaced by `method=a` and without `method.`/`method/` overrides
    (kept in METHOD_LIST / METHOD_OVERRIDES)."""
    global METHOD_LIST, METHOD_OVERRIDES, ARGS
    ARGS = argv[1:]
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key == "method" and value.startswith("[") and value.endswith("]"):
            names = [n.strip() for n in value[1:-1].split(",") if n.strip()]
            if names:
                METHOD_LIST = names
                METHOD_OVERRIDES = [a for a in argv[1:] if a.lstrip("+~").startswith(("method.", "method/"))]
                rest = [a for a in argv if a is not arg and a not in METHOD_OVERRIDES]
                return [*rest, f"method={names[0]}"]
    return argv


def method_configs(cfg: DictConfig) -> list[DictConfig]:
    """One composed method config per listed method. A `method.key=` or `method/group=` override
    applies to each listed method that has that key (`method.drafter.policy.ratio=0.05` leaves ar
    alone); one that no listed method has is an error."""
    if not METHOD_LIST:
        return [cfg.method]
    hc = HydraConfig.get()
    searchpath = [o for o in hc.overrides.hydra if o.startswith("hydra.searchpath=")]  # a user's method folder
    common = [*searchpath, *(o for o in hc.overrides.task if o.split("=", 1)[0].lstrip("+~") != "method")]
    out, used = [], set()
    for name in METHOD_LIST:
        base = [*common, f"method={name}"]
        mine = [o for o in METHOD_OVERRIDES if _composes([*base, o])]
        used.update(mine)
        out.append(hydra.compose("evaluate", overrides=[*base, *mine]).method)
    for o in METHOD_OVERRIDES:
        if o not in used:  # compose it once more for the error that names the key
            try:
                compose_checked("evaluate", [*common, f"method={METHOD_LIST[0]}", o])
            except ConfigError as e:
                raise ConfigError(f"{o}: no listed method has this key" if "no such key" in str(e) else str(e)) from None
    return out


def refuse_parts_a_method_lacks(argv: list[str]) -> None:
    """One method and an override below a part it lacks (`method=ar method.drafter.policy.ratio=0.5`:
    ar has no drafter): OmegaConf would stop with an assertion's traceback; say it in one line."""
    ovr = [a for a in argv[1:] if a.lstrip("+~").startswith("method.") and "," not in a.partition("=")[2]]
    if METHOD_LIST or not ovr:
        return
    keep = [a for a in argv[1:] if a.startswith(("method=", "hydra.searchpath="))]
    name = next((a.partition("=")[2] for a in keep if a.startswith("method=")), "the default method")
    try:
        compose_checked("evaluate", [*keep, *ovr], method=name)
    except ConfigError as e:
        if "has no such key" in str(e):  # Hydra reports everything else itself, naming the key
            log.error("%s", e)
            sys.exit(2)


def _composes(overrides: list[str]) -> bool:
    try:
        hydra.compose("evaluate", overrides=overrides)
        return True
    except Exception:  # a key this method does not have
        return False


@hydra.main(config_path="conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from sparsespec.eval.harness import EvaluationError, run_evaluation

    args = ARGS if ARGS is not None else list(HydraConfig.get().overrides.task)
    if METHOD_LIST and not any(a.startswith("out_dir=") for a in args):  # name the default out_dir by the list
        listed = ",".join([f"method=[{','.join(METHOD_LIST)}]", *METHOD_OVERRIDES])
        cfg.out_dir = str(cfg.out_dir).replace(f"method={METHOD_LIST[0]}", listed, 1)
    command = " ".join(["python evaluate.py", *(shlex.quote(o) for o in args)])
    try:
        methods = method_configs(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        log.error("%s", hydra_error_line(e))
        sys.exit(2)
    except ConfigError as e:
        log.error("%s", e)
        sys.exit(2)
    try:
        out_dir = run_evaluation(cfg, methods, command=command)
    except EvaluationError as e:
        log.error("%s", e)
        sys.exit(2)
    if (cfg.get("logger") or {}).get("wandb"):  # logger=wandb: out_dir's files to a W&B run (offline by default)
        from sparsespec.tracking import log_evaluation

        log_evaluation(cfg, out_dir)


if __name__ == "__main__":
    sys.argv = take_method_list(sys.argv)
    refuse_parts_a_method_lacks(sys.argv)
    main()
