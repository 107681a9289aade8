"""Weights & Biases for train.py and evaluate.py (the sweep files are checked by sparsespec.sweeps).

- `wandb_mode_default()`: offline unless the user configured W&B (WANDB_MODE, WANDB_API_KEY, or an
  api.wandb.ai entry in ~/.netrc), so no run ever stops at a login prompt; `wandb sync DIR` uploads
  offline runs later.
- `wandb_logger(...)` / `null_logger()`: the `_target_`s of conf/logger/wandb.yaml and none.yaml.
- `log_evaluation(cfg, out_dir)`: an evaluation's out_dir (rows, summary, plots, drafter) as one run.

Imports of wandb, lightning and hydra stay inside functions: importing this module is cheap.
"""

from __future__ import annotations

import json
import math
import netrc
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from lightning.pytorch.loggers import Logger, WandbLogger

WANDB_HOST = "api.wandb.ai"
# result fields logged per sample (numbers, plus the identifying columns)
ROW_KEYS = ("sample_id", "dataset", "method", "ctx", "prompt_tokens", "new_tokens", "prefill_s", "wall_s",
            "tokens_per_s", "acceptance_rate", "mean_accepted_tokens", "draft_steps", "verify_steps",
            "speedup", "gamma", "k_mean", "predicted_speedup", "exact_match_ar", "score", "batch_size",
            "aggregate_tokens_per_s", "aggregate_speedup")
SUMMARY_METRICS = ("speedup", "tokens_per_s", "acceptance_rate", "mean_accepted_tokens", "gamma", "k_mean",
                   "predicted_speedup", "exact_match_ar", "score", "wall_s", "prefill_s", "aggregate_tokens_per_s",
                   "aggregate_speedup")


# --- mode: offline unless configured, never a prompt ---


def _netrc_has_wandb(path: str | os.PathLike | None = None) -> bool:
    path = Path(path) if path else Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    if not path.is_file():
        return False
    try:
        hosts = netrc.netrc(str(path)).hosts
    except (netrc.NetrcParseError, OSError):
        return False
    base = os.environ.get("WANDB_BASE_URL", "")
    host = base.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0] if base else WANDB_HOST
    return host in hosts


def wandb_mode_default(env: Mapping[str, str] | None = None, netrc_path: str | os.PathLike | None = None) -> str:
    """The W&B mode to use when the config does not say: WANDB_MODE if set; "online" when the user
    configured W&B (WANDB_API_KEY, or a ~/.netrc entry from `wandb login`); else "offline"."""
    env = os.environ if env is None else env
    if env.get("WANDB_MODE"):
        return str(env["WANDB_MODE"])
    if env.get("WANDB_API_KEY") or _netrc_has_wandb(netrc_path):
        return "online"
    return "offline"


def resolve_offline(offline: Any) -> bool:
    """conf `offline: auto|true|false` -> bool (auto: wandb_mode_default())."""
    if offline is None or str(offline).lower() == "auto":
        return wandb_mode_default() in ("offline", "dryrun")
    return bool(offline)


def _init_env(offline: bool) -> None:
    # offline: no network, no login prompt; WANDB_MODE wins over any leftover settings file
    if offline:
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_SILENT", "true")


# --- training: Lightning loggers ---


def wandb_logger(offline: Any = "auto", save_dir: str = ".", id: str | None = None,
                 hydra_config: str | None = None, **kwargs: Any) -> WandbLogger:
    """conf/logger/wandb.yaml: a Lightning WandbLogger whose run files live in `save_dir/wandb/`.

    offline=auto decides by wandb_mode_default(); `id` defaults to WANDB_RUN_ID (a W&B agent sets it,
    and the sweep configs put it in out_dir); `hydra_config` (the run's .hydra/config.yaml) is logged
    as the run config when it exists, merged with any config a sweep agent hands over."""
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    off = resolve_offline(offline)
    _init_env(off)
    if wandb.run is not None:  # an earlier job in this process (Hydra multirun, Optuna trials): close it,
        wandb.finish()         # or Lightning would log this job into that run
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    config = dict(kwargs.pop("config", None) or {})
    if hydra_config and Path(hydra_config).is_file():
        config = {**_load_config(hydra_config), **config}
    return WandbLogger(offline=off, save_dir=str(save_dir), id=id or os.environ.get("WANDB_RUN_ID") or None,
                       config=config or None, **kwargs)


_NULL_LOGGER: type | None = None


def null_logger() -> Logger:
    """conf/logger/none.yaml: a Lightning logger that records nothing. Lightning's own DummyLogger
    does not survive hydra.utils.instantiate's kwargs merge, and callbacks such as the
    LearningRateMonitor refuse a Trainer without any logger."""
    global _NULL_LOGGER
    if _NULL_LOGGER is None:
        from lightning.pytorch.loggers.logger import Logger

        class NullLogger(Logger):
            name = "none"
            version = ""

            def log_metrics(self, metrics, step=None) -> None:
                pass

            def log_hyperparams(self, params, *args, **kwargs) -> None:
                pass

        _NULL_LOGGER = NullLogger
    return _NULL_LOGGER()


def _load_config(path: str | os.PathLike) -> dict:
    """A saved Hydra config (.hydra/config.yaml keeps interpolations), resolved where possible."""
    cfg = OmegaConf.load(path)
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation that only resolves inside the Hydra job (e.g. ${hydra:...})
        return OmegaConf.to_container(cfg, resolve=False)


# --- evaluation: files in out_dir -> one W&B run ---


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def _flatten_summary(entry: dict) -> dict:
    flat = {k: entry[k] for k in ("method", "dataset", "ctx", "n") if k in entry}
    for m in SUMMARY_METRICS:
        s = entry.get(m)
        flat[f"{m}_mean"] = s["mean"] if isinstance(s, dict) else None
        flat[f"{m}_std"] = s["std"] if isinstance(s, dict) else None
    return flat


def summary_scalars(summary: list[dict]) -> dict[str, float]:
    """Run-summary scalars from summary.json: `<method>/<metric>` (mean over samples) for every method,
    and the bare `<metric>` of the primary method (the first one that is not `ar`), which is what a
    sweep's `metric.name` refers to (e.g. `speedup`)."""
    def means(e: dict) -> dict[str, float]:
        return {m: float(s["mean"]) for m in SUMMARY_METRICS
                if isinstance((s := e.get(m)), dict) and s.get("mean") is not None}

    out: dict[str, float] = {}
    multi_ctx = len({e.get("ctx") for e in summary}) > 1
    for e in summary:
        prefix = e["method"] + (f"/ctx{e['ctx']}" if multi_ctx else "")
        out |= {f"{prefix}/{m}": v for m, v in means(e).items()}
    primary = next((e for e in summary if e["method"] != "ar"), summary[0] if summary else None)
    return out | (means(primary) if primary else {})


def drafter_dirs(cfg: DictConfig, rows: Iterable[dict]) -> list[Path]:
    """The drafter directory (an exported HF model dir) the evaluation decoded with, if any: drafter.path
    when a method with a drafter model ran, or the latest export that a trained-drafter method
    (budgetdraft) falls back to."""
    from sparsespec.eval.methods import Method

    configs = {r["method"]: r["method_config"] for r in rows if r.get("method_config")}  # one per method
    methods = [Method.from_config(c) for c in configs.values()]
    if not any(m.needs_drafter_model for m in methods):
        return []
    path = OmegaConf.select(cfg, "drafter.path", default=None)
    if not path and any(m.needs_trained_drafter for m in methods):
        try:
            from sparsespec.models.exports import latest_drafter_path

            path = latest_drafter_path()
        except Exception:  # no export yet: nothing to log
            path = None
    return [Path(path)] if path and Path(path).is_dir() else []


def log_evaluation(cfg: DictConfig, out_dir: str | os.PathLike) -> str | None:
    """Log an evaluation's out_dir to W&B (cfg.logger.wandb: project, name, group, tags, offline, id).
    Returns the run id; None when cfg.logger has no wandb block or out_dir holds no results file.
    A sharded out_dir is logged as it stands: the rows of every shard's file written so far."""
    wcfg = OmegaConf.select(cfg, "logger.wandb", default=None)
    if wcfg is None:
        return None
    import wandb

    out_dir = Path(out_dir)
    off = resolve_offline(wcfg.get("offline", "auto"))
    _init_env(off)
    # every results file of out_dir (each shard writes its own; see sparsespec.eval.results), read as
    # the report command and the summary read them, so this run logs what summary.json summarises
    from sparsespec.eval.results import results_files
    from sparsespec.eval.summary import load_results

    files = results_files(out_dir)
    if not files:  # a shard with no sample wrote nothing
        return None
    rows = load_results([out_dir])
    summary = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").is_file() else []
    config = OmegaConf.to_container(cfg, resolve=True)
    init_kw = {k: wcfg.get(k) for k in ("project", "entity", "name", "group", "tags", "notes") if wcfg.get(k)}
    run = wandb.init(dir=str(out_dir), mode="offline" if off else None, job_type="evaluate", config=config,
                     id=wcfg.get("id") or os.environ.get("WANDB_RUN_ID") or None, reinit="finish_previous",
                     **init_kw)
    try:
        # per sample: one history step per result row, keyed by method; and the full table
        cols = [k for k in ROW_KEYS if any(k in r for r in rows)]
        table = wandb.Table(columns=cols, data=[[_jsonable(r.get(k)) for k in cols] for r in rows])
        run.log({"results": table})
        for i, r in enumerate(rows):
            run.log({f"sample/{r['method']}/{k}": float(v) for k in ROW_KEYS
                     if isinstance((v := r.get(k)), (int, float)) and not isinstance(v, bool)
                     and not (isinstance(v, float) and math.isnan(v))} | {"sample/index": i})
        if summary:
            flat = [_flatten_summary(e) for e in summary]
            scols = list(flat[0])
            run.log({"summary": wandb.Table(columns=scols, data=[[_jsonable(f.get(c)) for c in scols] for f in flat])})
        for k, v in summary_scalars(summary).items():
            run.summary[k] = v
        if (out_dir / "summary.md").is_file():
            run.summary["summary_md"] = (out_dir / "summary.md").read_text()
        images = {f"plots/{p.stem}": wandb.Image(str(p)) for p in sorted(out_dir.glob("*.png"))}
        if images:
            run.log(images)
        for d in drafter_dirs(cfg, rows):
            log_artifact_dir(run, d, name=f"drafter-{d.resolve().parent.name or d.name}", type="model")
        art = wandb.Artifact(f"evaluation-{run.id}", type="evaluation")
        for f in [*files, *(out_dir / name for name in ("summary.json", "summary.md", "config.yaml"))]:
            if f.is_file():
                art.add_file(str(f))
        run.log_artifact(art)
        return run.id
    finally:
        run.finish()


def log_artifact_dir(run: Any, path: str | os.PathLike, name: str, type: str = "model") -> None:
    """Log a directory (an exported drafter: config, safetensors, tokenizer) as a W&B artifact.
    `run` is a wandb Run, or a Lightning WandbLogger (its .experiment is used)."""
    import re

    import wandb

    run = getattr(run, "experiment", run)
    art = wandb.Artifact(re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:128], type=type,
                         metadata={"path": str(Path(path).resolve())})
    art.add_dir(str(path))
    run.log_artifact(art)


def log_drafter_artifact(loggers: Iterable[Any], export_dir: str | os.PathLike | None) -> bool:
    """After export in training: log the drafter dir to every WandbLogger among `loggers`."""
    if not export_dir:
        return False
    done = False
    for lg in loggers or []:
        if type(lg).__name__ == "WandbLogger":
            log_artifact_dir(lg, export_dir, name=f"drafter-{lg.experiment.id}", type="model")
            done = True
    return done
