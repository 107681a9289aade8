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
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from sparsespec.config import register_configs

register_configs()
log = logging.getLogger("evaluate")


def method_configs(cfg: DictConfig) -> list[DictConfig]:
    """One composed method config per name in `method=[a,b,...]` (each gets the method.* overrides)."""
    overrides = list(HydraConfig.get().overrides.task)
    names = None
    for ov in OverridesParser.create().parse_overrides(overrides):
        if ov.key_or_group == "method" and not ov.is_delete():
            value = ov.value()
            names = [str(v) for v in value] if isinstance(value, list) else None
    if not names:
        return [cfg.method]
    rest = [o for o in overrides if not o.split("=", 1)[0].lstrip("+~") == "method"]
    return [hydra.compose("evaluate", overrides=[*rest, f"method={n}"]).method for n in names]


@hydra.main(config_path="conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from sparsespec.eval.harness import EvaluationError, run_evaluation

    command = " ".join(["python evaluate.py", *(shlex.quote(o) for o in HydraConfig.get().overrides.task)])
    try:
        out_dir = run_evaluation(cfg, method_configs(cfg), command=command)
    except EvaluationError as e:
        log.error("%s", e)
        sys.exit(2)
    if (cfg.get("logger") or {}).get("wandb"):  # logger=wandb: out_dir's files to a W&B run (offline by default)
        from sparsespec.tracking import log_evaluation

        log_evaluation(cfg, out_dir)


if __name__ == "__main__":
    main()
