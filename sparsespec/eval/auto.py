"""`method=auto`: the method the planner predicts fastest for this run's model, context, batch and
device (sparsespec.plan), chosen before anything loads and said in one line.

The planner reads only the model's config.json, this device's profile and the committed acceptance
curves, and a method whose acceptance was never measured (it would be priced with another method's)
is not chosen. The CPU has a measured profile; on a GPU the datasheet profile of an H100, H200 or
A100 is used where the device's name says which, and anything else is refused (name a method)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from omegaconf import DictConfig

from sparsespec.checks import ConfigError

log = logging.getLogger(__name__)
AUTO = "auto"


def _model_config(path: str | None) -> dict:
    from sparsespec.models import embedded

    where = embedded.embedded_model_dir() if path is None else Path(path)
    file = where / "config.json" if where.is_dir() else None
    if file is None or not file.is_file():
        raise ConfigError(f"method=auto: needs the model's config.json (model.path={path}); name a method instead")
    return json.loads(file.read_text(encoding="utf-8"))


def _profile(device: str) -> str:
    from sparsespec.models.device import resolve_device

    where = resolve_device(device)
    if where.type == "cpu":
        return "cpu"
    name = torch.cuda.get_device_name(where).lower() if where.type == "cuda" else where.type
    for gpu in ("h200", "h100", "a100"):
        if gpu in name:
            return gpu
    raise ConfigError(f"method=auto: no device profile for {name}; name a method, or measure a profile "
                      "(docs/planning.md)")


def choose(cfg: DictConfig) -> str:
    """The method name `method=auto` stands for under the run's settings `cfg` (a composed config)."""
    from sparsespec.config import parse_ctx
    from sparsespec.plan import Dtypes, best

    profile = _profile(str(cfg.model.device))
    dtype = str(cfg.model.dtype)
    dtype = ("float32" if profile == "cpu" else "bfloat16") if dtype == "auto" else dtype
    ctx, batch = parse_ctx(cfg.ctx), int(cfg.gen.batch_size)
    try:
        pick = best(_model_config(cfg.model.path), ctx, batch, profile,
                    Dtypes(weights=dtype, kv=dtype, blocks=profile == "cpu" and dtype == "float32"), stand_ins=False)
    except ValueError as e:
        raise ConfigError(f"method=auto: {e}") from None
    log.info("method=auto: %s, predicted %.2fx ar at %s on %s (batch %d; python -m sparsespec.plan for the table)",
             pick.method, pick.speedup, cfg.ctx, profile, batch)
    return pick.method
