"""Train a BudgetDraft drafter: `python train.py budget=multi|single|full [key=value ...]`.

Thin entry point: Hydra composes conf/train.yaml, sparsespec.training.run.train does the work.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from sparsespec.training.run import train

    result = train(cfg)
    # returned for Hydra sweepers / Optuna: the checkpoint monitor
    return result["metrics"].get("val/acceptance")


if __name__ == "__main__":
    main()
