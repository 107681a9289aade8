"""`train(cfg)`: everything `python train.py` does, importable and testable without Hydra's runtime.

Builds (all via hydra.utils.instantiate from the composed config): target + tokenizer
(sparsespec.models.loading.load_model), the drafter, the data module with cached teacher targets,
the budget sampler, the loss, the LightningModule, callbacks, loggers and the Trainer; fits
(optionally resuming from `ckpt_path`), then exports the drafter and updates the latest pointer.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from sparsespec.config import ConfigError, validate_train_config
from sparsespec.training.export import export_drafter
from sparsespec.training.module import BudgetDraftModule
from sparsespec.training.teacher import Teacher, model_fingerprint

log = logging.getLogger(__name__)


def _loggers(cfg: DictConfig) -> list[Any] | bool:
    if not cfg.get("logger"):
        return False
    out = []
    for lcfg in cfg.logger.values():
        if lcfg is None:
            continue
        if "WandbLogger" in str(lcfg.get("_target_", "")) and lcfg.get("offline") is None:
            # offline unless the user configured W&B (an API key or an explicit WANDB_MODE)
            offline = not os.environ.get("WANDB_API_KEY") and os.environ.get("WANDB_MODE") in (None, "offline")
            if offline:
                os.environ.setdefault("WANDB_MODE", "offline")
            lcfg = OmegaConf.merge(lcfg, {"offline": offline})
        out.append(instantiate(lcfg))
    return out or False


def _trainer_cfg(cfg: DictConfig) -> DictConfig:
    """Lightning's FSDPStrategy refuses a CPU accelerator. With one CPU process there is nothing to
    shard anyway, so trainer=fsdp falls back to the single-device strategy there (logged), and the
    same config shards across GPUs when they exist."""
    tcfg = cfg.trainer
    strategy = tcfg.get("strategy")
    is_fsdp = "fsdp" in str(strategy.get("_target_", "") if isinstance(strategy, DictConfig) else strategy).lower()
    if is_fsdp and not torch.cuda.is_available():
        log.warning("trainer=fsdp: Lightning's FSDP needs CUDA; no GPU here, so running one CPU process "
                    "with strategy=auto (nothing to shard with one process)")
        tcfg = OmegaConf.merge(tcfg, {"strategy": "auto", "accelerator": "cpu"})
    return tcfg


def _metrics(trainer: L.Trainer) -> dict[str, float]:
    return {k: round(float(v), 5) for k, v in sorted(trainer.callback_metrics.items()) if k.startswith("val/")}


def check_drafter_tokenizer(cfg: DictConfig) -> None:
    """drafter.path=DIR must speak the target's token ids: compare the two tokenizers (cheap: no
    weights load). A directory without tokenizer files is left to the vocabulary-size check."""
    path = cfg.drafter.get("path")
    if not path:
        return
    from sparsespec.models.loading import ModelLoadError, check_same_tokenizer, load_tokenizer

    try:
        theirs = load_tokenizer(path)
    except ModelLoadError as e:
        log.warning("drafter.path=%s: %s; checking its vocabulary size only", path, e)
        return
    try:
        check_same_tokenizer(load_tokenizer(cfg.model.get("path")), theirs, what=f"drafter.path={path}")
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_training_length(tcfg: DictConfig) -> None:
    """trainer.max_steps / trainer.max_epochs must end training: the learning-rate schedule (warmup,
    cosine decay) spans that many optimizer steps (module.schedule_steps). max_steps=-1 means
    max_epochs alone (null: Lightning's 1000); fast_dev_run sets its own length. Types and
    max_steps' range are checked by validate_train_config; ConfigError before any model loads."""
    epochs = tcfg.get("max_epochs")
    if epochs is not None and epochs != -1 and epochs < 1:
        raise ConfigError(f"trainer.max_epochs={epochs} is out of range: allowed a positive number of epochs, "
                          "-1 (no epoch limit: training ends at trainer.max_steps) or null (Lightning's default)")
    if tcfg.get("max_steps", -1) == -1 and epochs == -1 and not tcfg.get("fast_dev_run"):
        raise ConfigError("trainer.max_steps=-1 with trainer.max_epochs=-1 sets no end to training, and the "
                          "learning-rate schedule needs its length: set trainer.max_steps=N (optimizer steps) "
                          "or trainer.max_epochs=N (passes over the training windows)")


def train(cfg: DictConfig, callbacks: list[Any] | None = None, command: str | None = None) -> dict[str, Any]:
    """Run one training job; returns trainer, module, datamodule, export dir and metrics.

    The config is validated first (sparsespec.config.validate_train_config: a ConfigError naming
    the key, before any model loads). `callbacks`: extra Lightning callbacks (tests record steps).
    `command` (the command line, as train.py passes it) is kept in metrics.json."""
    validate_train_config(cfg)
    from sparsespec.models.device import resolve_device

    resolve_device(cfg.model.device)  # a GPU this machine lacks: refused before out_dir is made
    check_training_length(cfg.trainer)
    check_drafter_tokenizer(cfg)
    t_start = time.perf_counter()
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    L.seed_everything(int(cfg.seed), workers=True)
    out_dir = Path(cfg.out_dir).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    from sparsespec.models.loading import load_model

    loaded = load_model(cfg.model.get("path"), dtype=cfg.model.dtype, device=cfg.model.device)
    target, tokenizer = loaded.model, loaded.tokenizer
    fingerprint = model_fingerprint(target)
    drafter = instantiate(cfg.drafter).build(target)  # copies what it needs before the teacher cast

    tcfg = cfg.teacher
    on_policy = int(tcfg.get("on_policy_tokens") or 0)
    teacher_factory = lambda: Teacher(target, tcfg.dtype, tcfg.topk, tcfg.batch_size, on_policy)  # noqa: E731
    datamodule = instantiate(cfg.corpus, tokenizer=tokenizer, teacher=teacher_factory, fingerprint=fingerprint,
                             teacher_dtype=tcfg.dtype, topk=tcfg.topk, cache_dir=tcfg.get("cache_dir"),
                             seed=int(cfg.seed), on_policy_tokens=on_policy)
    module = BudgetDraftModule(drafter, instantiate(cfg.budget), instantiate(cfg.loss),
                               optim=OmegaConf.to_container(cfg.optim, resolve=True), seed=int(cfg.seed))
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None] + list(callbacks or [])
    trainer: L.Trainer = instantiate(_trainer_cfg(cfg), callbacks=callbacks, logger=_loggers(cfg),
                                     default_root_dir=str(out_dir))

    untrained = None
    if cfg.get("eval_untrained") and not cfg.get("ckpt_path"):
        # the starting point, measured on the same held-out sequences (acceptance before training)
        trainer.validate(module, datamodule=datamodule, verbose=False)
        untrained = _metrics(trainer)
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    final = _metrics(trainer)

    export_dir = None
    summary = {"command": command, "untrained": untrained, "final": final, "global_step": trainer.global_step,
               "teacher_shards_computed": datamodule.computed_shards,
               "seconds": round(time.perf_counter() - t_start, 1), "fingerprint": fingerprint,
               "config": OmegaConf.to_container(cfg, resolve=True)}
    if trainer.is_global_zero:
        if cfg.get("export", True):
            export_dir = export_drafter(module.drafter, tokenizer, out_dir, info=summary,
                                        update_latest=cfg.get("update_latest", True))
            log.info("exported drafter to %s", export_dir)
            from sparsespec.tracking import log_drafter_artifact

            log_drafter_artifact(trainer.loggers, export_dir)
        (out_dir / "metrics.json").write_text(json.dumps(summary, indent=1, default=str))
        log.info("untrained %s\nfinal %s", untrained, final)
    return {"trainer": trainer, "module": module, "datamodule": datamodule, "export_dir": export_dir,
            "metrics": final, "untrained": untrained, "summary": summary}
