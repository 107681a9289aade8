"""Train a BudgetDraft drafter: `python train.py budget=multi|single|full [key=value ...]`.

Thin entry point: Hydra composes conf/train.yaml, sparsespec.training.run.train does the work.
"""

from __future__ import annotations

import logging
import shlex
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from sparsespec.config import register_configs

register_configs()  # the config groups generated from the parts (drafter, budget, loss, data bases)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from sparsespec.config import ConfigError
    from sparsespec.training.run import train

    try:
        command = " ".join(["python train.py", *(shlex.quote(o) for o in HydraConfig.get().overrides.task)])
        result = train(cfg, command=command)
    except ConfigError as e:  # a bad key or value: one clear line, no traceback, nothing written
        logging.getLogger("train").error("%s", e)
        sys.exit(2)
    # returned for Hydra sweepers / Optuna: the checkpoint monitor
    return result["metrics"].get("val/acceptance")


if __name__ == "__main__":
    main()
