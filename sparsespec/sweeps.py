"""W&B sweep files (conf/sweep/*.yaml): validate one, build the argv `wandb agent` runs for a point,
and compose every swept key with Hydra before a sweep starts.

    python -m sparsespec.sweeps check conf/sweep/*.yaml    # what scripts/sweep.sh runs first
    python -m sparsespec.sweeps mode                       # the W&B mode a run would use
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

# ${args_no_hyphens}: the agent passes `key=value`, which is Hydra's override syntax unchanged
SWEEP_COMMAND = ["${env}", "${interpreter}", "${program}", "${args_no_hyphens}"]


def load_sweep(path: str | os.PathLike) -> dict:
    """A conf/sweep/*.yaml spec, refused early when an agent could not run it as a Hydra override list."""
    spec = yaml.safe_load(Path(path).read_text())
    for key in ("program", "method", "metric", "parameters", "command"):
        if key not in spec:
            raise ValueError(f"{path}: sweep config needs `{key}`")
    if spec["method"] not in ("grid", "random", "bayes"):
        raise ValueError(f"{path}: method={spec['method']!r}: use grid, random or bayes")
    if spec["command"] != SWEEP_COMMAND:
        raise ValueError(f"{path}: command must be {SWEEP_COMMAND} so key=value args reach Hydra unchanged")
    return spec


def agent_command(spec: dict, point: Mapping[str, Any], interpreter: str = "python") -> list[str]:
    """The argv `wandb agent` runs for this point: the sweep's `command` with ${env}, ${interpreter},
    ${program} and ${args_no_hyphens} filled in by wandb's own create_sweep_command_args, so a value
    (a list, a bool) is formatted exactly as the agent will format it."""
    from wandb.sdk.launch.sweeps import utils as sweep_utils

    sweep_vars = sweep_utils.create_sweep_command_args({"args": {k: {"value": v} for k, v in point.items()}})
    sweep_vars["interpreter"] = [interpreter]
    sweep_vars["program"] = [spec["program"]]
    sweep_vars["env"] = ["/usr/bin/env"]
    argv: list[str] = []
    for c in sweep_utils.create_sweep_command(list(spec.get("command") or SWEEP_COMMAND)):
        c = str(c)
        if c.startswith("${") and c.endswith("}"):
            argv += sweep_vars.get(c[2:-1]) or []
        else:
            argv.append(c)
    return argv


def check_points(spec: dict) -> list[dict]:
    """A few points that between them use every listed value and both ends of every range: enough to
    catch a value Hydra refuses (a wrong type, a bad list) without sampling the space. Ranges end as
    the agent sends them: ints for int bounds, floats otherwise, exp() of log-space bounds."""
    ends: dict[str, list[Any]] = {}
    for k, p in spec["parameters"].items():
        if "value" in p:
            ends[k] = [p["value"]]
        elif "values" in p:
            ends[k] = list(p["values"])
        elif "min" in p and "max" in p:
            dist = p.get("distribution", "")
            lo, hi = p["min"], p["max"]
            if dist in ("log_uniform", "q_log_uniform"):  # min/max are natural logs
                lo, hi = math.exp(lo), math.exp(hi)
            elif not (dist in ("", "int_uniform") and isinstance(lo, int) and isinstance(hi, int)):
                lo, hi = float(lo), float(hi)
            ends[k] = [lo, hi]
        else:
            raise ValueError(f"parameter {k}: use value, values, or min/max")
    n = max((len(v) for v in ends.values()), default=1)
    return [{k: v[i % len(v)] for k, v in ends.items()} for i in range(n)]


def check_sweep_keys(keys: Iterable[str], compose: Callable[[list[str]], DictConfig]) -> list[str]:
    """Swept keys that do not exist in the composed base config (a config group such as `budget`
    counts as existing when the config has a node of that name). `compose(overrides)` composes the
    base config (hydra.compose with the sweep program's config name)."""
    tree = OmegaConf.to_container(compose([]), resolve=False)  # interpolations stay unresolved

    def exists(key: str) -> bool:
        node: Any = tree
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    return [k for k in keys if not exists(k)]


def hydra_compose(config_dir: str | os.PathLike, name: str) -> Callable[[list[str]], DictConfig]:
    """compose(overrides) for `name` (train / evaluate) in config_dir, with Hydra initialised per call."""
    from hydra import compose, initialize_config_dir

    from sparsespec.config import register_configs

    register_configs()  # the schemas evaluate.py registers (base_method, base_dataset, ...)

    def _compose(overrides: list[str]) -> DictConfig:
        with initialize_config_dir(str(Path(config_dir).resolve()), version_base="1.3"):
            return compose(name, overrides=list(overrides))

    return _compose


def check_sweep_file(path: str | os.PathLike, config_dir: str | os.PathLike) -> list[str]:
    """Problems with a sweep file: swept keys missing from the base config, and check_points() whose
    agent argv Hydra refuses. Empty when every run the agent starts will at least compose."""
    spec = load_sweep(path)
    name = Path(spec["program"]).stem  # train.py -> the train config
    compose = hydra_compose(config_dir, name)
    problems = [f"{k}: not a key of the {name} config"
                for k in check_sweep_keys(spec["parameters"], compose)]
    if problems:
        return problems
    for pt in check_points(spec):
        args = agent_command(spec, pt)[3:]
        try:
            compose(args)
        except Exception as e:  # Hydra's override / composition errors
            problems.append(f"{' '.join(args)}: {type(e).__name__}: {e}")
    return problems


# --- CLI, used by scripts/sweep.sh ---


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sparsespec.sweeps", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check sweep files: keys exist, every listed value composes")
    c.add_argument("files", nargs="+")
    c.add_argument("--conf", default=str(Path(__file__).resolve().parents[1] / "conf"))
    sub.add_parser("mode", help="print the W&B mode a run would use (offline unless configured)")
    args = ap.parse_args(argv)
    if args.cmd == "mode":
        from sparsespec.tracking import wandb_mode_default

        print(wandb_mode_default())
        return 0
    bad = 0
    for f in args.files:
        try:
            problems = check_sweep_file(f, args.conf)
        except (ValueError, OSError, yaml.YAMLError) as e:
            problems = [str(e)]
        print(f"{f}: {'ok' if not problems else 'FAILED'}")
        for p in problems:
            print(f"  {p}")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
