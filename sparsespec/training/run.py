"""`train(cfg)`: everything `python train.py` does, importable and testable without Hydra's runtime.

Builds (all via hydra.utils.instantiate from the composed config): target + tokenizer
(sparsespec.models.loading.load_model), the drafter, the data module with cached teacher targets,
the budget sampler, the loss, the LightningModule, callbacks, loggers and the Trainer; fits
(optionally resuming from `ckpt_path`), then exports the drafter and updates the latest pointer.

With several processes (trainer=ddp|fsdp with trainer.devices > 1, torchrun, srun) every rank runs
this function: each loads the target onto its own GPU, the teacher pass is divided among the ranks
(DraftDataModule.setup), the target is freed once the teacher targets are loaded (or right after
the drafter is built when they are all cached), and the export gathers the full drafter weights
onto rank 0, which alone writes the export and metrics.json (docs/training.md, "On GPUs").
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
from sparsespec.models.device import resolve_device
from sparsespec.training.distributed import world
from sparsespec.training.export import export_drafter, full_state_dict
from sparsespec.training.module import BudgetDraftModule
from sparsespec.training.teacher import TargetTeacher, model_fingerprint

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


def _is_fsdp(strategy: Any) -> bool:
    return "fsdp" in str(strategy.get("_target_", "") if isinstance(strategy, DictConfig) else strategy).lower()


def _bf16_possible(accelerator: str) -> tuple[bool, str]:
    """Whether bf16 autocast can run on the accelerator the Trainer will pick, and if not, why."""
    on_cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if on_cuda and torch.cuda.is_available():
        try:
            ok = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # older torch: no emulation to exclude
            ok = torch.cuda.is_bf16_supported()
        return ok, f"{torch.cuda.get_device_name()} has no native bfloat16"
    return torch.amp.is_autocast_available("cpu"), "this torch has no CPU autocast"


def _trainer_cfg(cfg: DictConfig) -> DictConfig:
    """The trainer config this machine can run.

    Lightning's FSDPStrategy refuses a CPU accelerator. With one CPU process there is nothing to
    shard anyway, so trainer=fsdp falls back to the single-device strategy there (logged), and the
    same config shards across GPUs when they exist. bf16 precision where bf16 cannot run (a GPU
    older than Ampere) falls back to 32-true (logged) rather than failing or emulating slowly."""
    tcfg = cfg.trainer
    if _is_fsdp(tcfg.get("strategy")) and not torch.cuda.is_available():
        log.warning("trainer=fsdp: Lightning's FSDP needs CUDA; no GPU here, so running one CPU process "
                    "with strategy=auto (nothing to shard with one process)")
        tcfg = OmegaConf.merge(tcfg, {"strategy": "auto", "accelerator": "cpu"})
    precision = str(tcfg.get("precision"))
    if precision.startswith("bf16"):
        ok, why = _bf16_possible(str(tcfg.get("accelerator", "auto")))
        if not ok:
            log.warning("trainer.precision=%s: %s; using trainer.precision=32-true", precision, why)
            tcfg = OmegaConf.merge(tcfg, {"precision": "32-true"})
    return tcfg


def _strategy(tcfg: DictConfig, drafter: torch.nn.Module) -> Any:
    """trainer.strategy, with FSDP's auto-wrap policy filled in from the drafter: one FSDP unit per
    decoder layer (the layer classes are the drafter's own, so they cannot be written in YAML
    ahead of knowing the model). Anything else is passed through to the Trainer as configured."""
    strategy = tcfg.get("strategy")
    if not (isinstance(strategy, DictConfig) and _is_fsdp(strategy)):
        return strategy
    if strategy.get("auto_wrap_policy") is not None:
        return instantiate(strategy)
    from sparsespec.training.drafters import decoder_layer_classes

    layers = decoder_layer_classes(drafter)
    log.info("trainer=fsdp: wrapping each %s in its own FSDP unit", ", ".join(sorted(c.__name__ for c in layers)))
    return instantiate(strategy, auto_wrap_policy=layers)


def rank_device(spec: str) -> torch.device:
    """Where this process loads the target. model.device=auto|cuda on a GPU machine means this
    rank's GPU (cuda:LOCAL_RANK, as torchrun, srun and Lightning's launcher number them), so eight
    ranks never load eight targets onto GPU 0; an explicit cuda:N or cpu is kept."""
    device = resolve_device(spec)
    if device.type == "cuda" and device.index is None:
        local = int(os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID") or 0)
        device = torch.device("cuda", local % max(torch.cuda.device_count(), 1))
    return device


def _teacher_device(spec: str, loaded: torch.device, trainer: L.Trainer) -> torch.device | None:
    """Where this rank's teacher pass runs: the Trainer's device for this rank when it is a GPU and
    model.device left the choice open (auto/cuda); None keeps the target where it was loaded."""
    root = trainer.strategy.root_device
    if root.type == "cuda" and loaded.type == "cuda" and spec in ("auto", "cuda"):
        return root
    if loaded.type == "cuda" and trainer.world_size > 1 and spec not in ("auto", "cuda"):
        log.warning("model.device=%s: every rank's teacher pass runs on that one GPU; model.device=auto puts each "
                    "on its own", spec)
    return None


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

    device = rank_device(cfg.model.device)
    # ctx: windows longer than the target's trained positions get the RoPE scaling (YaRN) that
    # evaluation applies at that length, and the drafter, built from the target, inherits it
    ctx = int(cfg.corpus.get("seq_len", 2048))
    reload = lambda: load_model(cfg.model.get("path"), dtype=cfg.model.dtype, device=device, ctx=ctx).model  # noqa: E731
    loaded = load_model(cfg.model.get("path"), dtype=cfg.model.dtype, device=device, ctx=ctx)
    tokenizer = loaded.tokenizer
    fingerprint = model_fingerprint(loaded.model)
    drafter = instantiate(cfg.drafter).build(loaded.model)  # copies what it needs before the teacher cast

    tcfg = cfg.teacher
    on_policy = int(tcfg.get("on_policy_tokens") or 0)
    # the factory holds the one reference to the target from here on, so releasing it frees it
    teacher = TargetTeacher(loaded.model, tcfg.dtype, tcfg.topk, tcfg.batch_size, on_policy, load=reload)
    del loaded
    datamodule = instantiate(cfg.corpus, tokenizer=tokenizer, teacher=teacher, fingerprint=fingerprint,
                             teacher_dtype=tcfg.dtype, topk=tcfg.topk, cache_dir=tcfg.get("cache_dir"),
                             seed=int(cfg.seed), on_policy_tokens=on_policy)
    if datamodule.teacher_cached():
        # every teacher shard is on disk: the drafter is built, nothing else needs the target
        log.info("teacher cache complete: releasing the target (only the drafter stays in memory)")
        teacher.release()
    module = BudgetDraftModule(drafter, instantiate(cfg.budget), instantiate(cfg.loss),
                               optim=OmegaConf.to_container(cfg.optim, resolve=True), seed=int(cfg.seed),
                               loss_positions=cfg.get("loss_positions"))
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None] + list(callbacks or [])
    trainer_cfg = _trainer_cfg(cfg)
    trainer: L.Trainer = instantiate(trainer_cfg, strategy=_strategy(trainer_cfg, drafter), callbacks=callbacks,
                                     logger=_loggers(cfg), default_root_dir=str(out_dir))
    teacher.device = _teacher_device(str(cfg.model.device), device, trainer)

    untrained = None
    if cfg.get("eval_untrained") and not cfg.get("ckpt_path"):
        # the starting point, measured on the same held-out sequences (acceptance before training)
        trainer.validate(module, datamodule=datamodule, verbose=False)
        untrained = _metrics(trainer)
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    final = _metrics(trainer)

    # collectives, so every rank takes part: the teacher shards all ranks computed, and the full
    # drafter weights gathered onto rank 0 (under FSDP no rank holds them whole)
    w = world(trainer)
    shards = w.sum(datamodule.computed_shards)
    state = full_state_dict(trainer.strategy.model, prefix="drafter.") if cfg.get("export", True) else None
    export_dir = None
    summary = {"command": command, "untrained": untrained, "final": final, "global_step": trainer.global_step,
               "teacher_shards_computed": shards, "world_size": w.size,
               "seconds": round(time.perf_counter() - t_start, 1), "fingerprint": fingerprint,
               "config": OmegaConf.to_container(cfg, resolve=True)}
    if trainer.is_global_zero:
        if state is not None:
            export_dir = export_drafter(module.drafter, tokenizer, out_dir, info=summary,
                                        update_latest=cfg.get("update_latest", True), state_dict=state)
            log.info("exported drafter to %s", export_dir)
            from sparsespec.tracking import log_drafter_artifact

            log_drafter_artifact(trainer.loggers, export_dir)
        (out_dir / "metrics.json").write_text(json.dumps(summary, indent=1, default=str))
        log.info("untrained %s\nfinal %s", untrained, final)
    w.barrier("export")  # no rank returns (and ends the job) before rank 0 has written the export
    return {"trainer": trainer, "module": module, "datamodule": datamodule, "export_dir": export_dir,
            "metrics": final, "untrained": untrained, "summary": summary}
