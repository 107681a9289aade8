"""The types and checks of train.py's own settings. Their values, and what each one means, are in
conf/train.yaml: the one place a default is written.

The parts train.py instantiates (drafter, budget, loss, corpus) hold their settings and checks in
their own classes; the config groups for them are generated from those classes (config.py).
Each section here checks its fields in `__post_init__`; `sparsespec.config.validate_train_config`
runs them and the rules that span sections, before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from sparsespec.checks import DTYPES, choice, non_negative, number, positive, require
from sparsespec.models.device import check_device_form


@dataclass
class TrainModelConfig:
    path: str | None = MISSING
    device: str = MISSING
    dtype: str = MISSING

    def __post_init__(self) -> None:
        check_device_form("model.device", self.device)
        choice("model.dtype", self.dtype, DTYPES)


@dataclass
class TeacherConfig:
    dtype: str = MISSING
    topk: int = MISSING
    batch_size: int = MISSING
    cache_dir: str | None = MISSING
    on_policy_tokens: int = MISSING

    def __post_init__(self) -> None:
        choice("teacher.dtype", self.dtype, DTYPES)
        non_negative("teacher.topk", self.topk, int)
        positive("teacher.batch_size", self.batch_size, int)
        non_negative("teacher.on_policy_tokens", self.on_policy_tokens, int)


@dataclass
class OptimConfig:
    lr: float = MISSING
    weight_decay: float = MISSING
    warmup_ratio: float = MISSING
    min_lr_ratio: float = MISSING
    betas: list[float] = MISSING

    def __post_init__(self) -> None:
        positive("optim.lr", self.lr, float)
        non_negative("optim.weight_decay", self.weight_decay)
        for key in ("warmup_ratio", "min_lr_ratio"):
            value = getattr(self, key)
            require(0 <= number(f"optim.{key}", value) <= 1, f"optim.{key}", value, "[0, 1]")
        betas = list(self.betas)
        require(len(betas) == 2 and all(0 <= number("optim.betas", b) < 1 for b in betas), "optim.betas", betas,
                "two values in [0, 1)")


@dataclass
class TrainConfig:
    """conf/train.yaml after composition (callbacks, loggers and the trainer are Lightning's own)."""

    seed: int = MISSING
    out_dir: str = MISSING
    ckpt_path: str | None = MISSING
    threads: int | None = MISSING
    export: bool = MISSING
    update_latest: bool = MISSING
    eval_untrained: bool = MISSING
    loss_positions: int | None = MISSING
    model: TrainModelConfig = MISSING
    teacher: TeacherConfig = MISSING
    optim: OptimConfig = MISSING
    callbacks: dict[str, Any] | None = MISSING
    drafter: Any = MISSING
    budget: Any = MISSING
    loss: Any = MISSING
    corpus: Any = MISSING  # conf/corpus (training.data.DraftDataModule)
    trainer: Any = MISSING
    logger: Any = MISSING

    def __post_init__(self) -> None:
        if self.threads is not None:
            positive("threads", self.threads, int)
        if self.loss_positions is not None:
            positive("loss_positions", self.loss_positions, int)
