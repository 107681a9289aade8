"""Weights & Biases, shared by train.py and evaluate.py; W&B sweep specs and what an agent runs.

- `wandb_mode_default()`: offline unless the user configured W&B (WANDB_MODE, WANDB_API_KEY, or an
  api.wandb.ai entry in ~/.netrc). Offline runs never prompt for a login; `wandb sync DIR` uploads
  them later.
- `wandb_logger(...)`: the `_target_` of conf/logger/wandb.yaml (Lightning's WandbLogger with that
  default, the agent's run id, and the composed Hydra config logged as the run config).
- `log_evaluation(cfg, out_dir)`: after `run_evaluation` returns, log its files to a W&B run: the
  config, one row per (sample, method) as a table and as per-sample metrics, the summary as a table
  and as run-summary scalars, the plots as images, and the drafter directory as an artifact.
- `load_sweep`, `expand_sweep`, `agent_command`, `check_sweep_keys`: parse conf/sweep/*.yaml, draw
  points from its parameter space, build the exact argv a `wandb agent` builds for a point, and
  check that every swept key exists in the composed base config.
- `read_offline_run(run_dir)`: read back an offline run's config, history, summary and artifacts
  from its `run-<id>.wandb` file (tests; checking a run before `wandb sync`).

Imports of wandb and lightning stay inside functions: importing this module is cheap.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import netrc
import os
import random
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

WANDB_HOST = "api.wandb.ai"
SWEEP_COMMAND = ["${env}", "${interpreter}", "${program}", "${args_no_hyphens}"]
# result fields logged per sample (numbers, plus the identifying columns)
ROW_KEYS = ("sample_id", "dataset", "method", "ctx", "prompt_tokens", "new_tokens", "prefill_s", "wall_s",
            "tokens_per_s", "acceptance_rate", "mean_accepted_tokens", "draft_steps", "verify_steps",
            "speedup", "gamma", "k_mean", "predicted_speedup", "exact_match_ar", "score")
DRAFTER_METHODS = {"budgetdraft", "sd", "sd_sparse"}
SUMMARY_METRICS = ("speedup", "tokens_per_s", "acceptance_rate", "mean_accepted_tokens", "gamma", "k_mean",
                   "predicted_speedup", "exact_match_ar", "score", "wall_s", "prefill_s")


# ---------------------------------------------------------------------------------------------
# mode: offline unless configured, never a prompt
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# training: Lightning's WandbLogger
# ---------------------------------------------------------------------------------------------


def wandb_logger(offline: Any = "auto", save_dir: str = ".", id: str | None = None,
                 hydra_config: str | None = None, **kwargs: Any):
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


def null_logger():
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


# ---------------------------------------------------------------------------------------------
# evaluation: files in out_dir -> one W&B run
# ---------------------------------------------------------------------------------------------


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
    out: dict[str, float] = {}
    multi_ctx = len({e.get("ctx") for e in summary}) > 1
    for e in summary:
        prefix = e["method"] + (f"/ctx{e['ctx']}" if multi_ctx else "")
        for m in SUMMARY_METRICS:
            s = e.get(m)
            if isinstance(s, dict) and s.get("mean") is not None:
                out[f"{prefix}/{m}"] = float(s["mean"])
    primary = next((e for e in summary if e["method"] != "ar"), summary[0] if summary else None)
    for m in SUMMARY_METRICS:
        s = (primary or {}).get(m)
        if isinstance(s, dict) and s.get("mean") is not None:
            out[m] = float(s["mean"])
    return out


def drafter_dirs(cfg: DictConfig, rows: Iterable[dict]) -> list[Path]:
    """The drafter directory (an exported HF model dir) the evaluation decoded with, if any: drafter.path
    when a small-model method ran (budgetdraft, sd, sd_sparse, or any method with drafter: model), or
    the latest export that budgetdraft falls back to."""
    methods = {r.get("method") for r in rows}
    uses_model = bool(methods & DRAFTER_METHODS) or OmegaConf.select(cfg, "method.drafter", default=None) == "model"
    if not uses_model:
        return []
    path = OmegaConf.select(cfg, "drafter.path", default=None)
    if not path and "budgetdraft" in methods:
        try:
            from sparsespec.training.export import latest_drafter_path

            path = latest_drafter_path()
        except Exception:  # no export yet: nothing to log
            path = None
    return [Path(path)] if path and Path(path).is_dir() else []


def log_evaluation(cfg: DictConfig, out_dir: str | os.PathLike) -> str | None:
    """Log an evaluation's out_dir to W&B (cfg.logger.wandb: project, name, group, tags, offline, id).
    Returns the run id; None when cfg.logger has no wandb block."""
    wcfg = OmegaConf.select(cfg, "logger.wandb", default=None)
    if wcfg is None:
        return None
    import wandb

    out_dir = Path(out_dir)
    off = resolve_offline(wcfg.get("offline", "auto"))
    _init_env(off)
    rows = [json.loads(line) for line in (out_dir / "results.jsonl").read_text().splitlines() if line.strip()]
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
        for name in ("results.jsonl", "summary.json", "summary.md", "config.yaml"):
            if (out_dir / name).is_file():
                art.add_file(str(out_dir / name))
        run.log_artifact(art)
        return run.id
    finally:
        run.finish()


def log_artifact_dir(run, path: str | os.PathLike, name: str, type: str = "model") -> None:
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


# ---------------------------------------------------------------------------------------------
# sweeps: parse, expand, the agent's argv, key check
# ---------------------------------------------------------------------------------------------


def load_sweep(path: str | os.PathLike) -> dict:
    spec = yaml.safe_load(Path(path).read_text())
    for key in ("program", "method", "metric", "parameters", "command"):
        if key not in spec:
            raise ValueError(f"{path}: sweep config needs `{key}`")
    if spec["method"] not in ("grid", "random", "bayes"):
        raise ValueError(f"{path}: method={spec['method']!r}: use grid, random or bayes")
    if spec["command"] != SWEEP_COMMAND:
        raise ValueError(f"{path}: command must be {SWEEP_COMMAND} so key=value args reach Hydra unchanged")
    return spec


def _sample(p: dict, rng: random.Random) -> Any:
    if "value" in p:
        return p["value"]
    if "values" in p:
        return rng.choice(p["values"])
    dist = p.get("distribution") or ("int_uniform" if isinstance(p.get("min"), int)
                                      and isinstance(p.get("max"), int) else "uniform")
    lo, hi = p["min"], p["max"]
    if dist == "int_uniform":
        return rng.randint(int(lo), int(hi))
    if dist == "uniform":
        return rng.uniform(float(lo), float(hi))
    if dist == "log_uniform_values":
        return math.exp(rng.uniform(math.log(float(lo)), math.log(float(hi))))
    if dist == "q_log_uniform_values":
        q = float(p.get("q", 1))
        return round(math.exp(rng.uniform(math.log(float(lo)), math.log(float(hi)))) / q) * q
    if dist == "q_uniform":
        q = float(p.get("q", 1))
        return round(rng.uniform(float(lo), float(hi)) / q) * q
    raise ValueError(f"unsupported distribution {dist!r}")


def expand_sweep(spec: dict, n: int | None = None, seed: int = 0) -> list[dict]:
    """Points of the sweep's space: the full grid product (method grid; the first n if given), or n
    random draws (random; and bayes, whose first proposals are random draws too)."""
    params = spec["parameters"]
    if spec["method"] == "grid":
        for k, p in params.items():
            if not ("value" in p or "values" in p):
                raise ValueError(f"grid sweep: parameter {k} needs value or values, not a distribution")
        keys = list(params)
        choices = [[params[k]["value"]] if "value" in params[k] else list(params[k]["values"]) for k in keys]
        pts = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*choices)]
        return pts if n is None else pts[:n]
    rng = random.Random(seed)
    return [{k: _sample(p, rng) for k, p in params.items()} for _ in range(n or 1)]


def grid_size(spec: dict) -> int:
    return math.prod(1 if "value" in p else len(p["values"]) for p in spec["parameters"].values())


def agent_command(spec: dict, point: Mapping[str, Any], interpreter: str = "python") -> list[str]:
    """The argv `wandb agent` runs for this point: the sweep's `command` with ${env}, ${interpreter},
    ${program} and ${args_no_hyphens} filled in exactly as wandb/wandb_agent.py does (it formats each
    argument as f"{key}={value}"), using wandb's own create_sweep_command_args."""
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


def config_name(spec: dict) -> str:
    return Path(spec["program"]).stem  # train.py -> train, evaluate.py -> evaluate


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


def check_sweep_file(path: str | os.PathLike, config_dir: str | os.PathLike, n: int = 4) -> list[str]:
    """Problems with a sweep file: missing keys, and points whose overrides Hydra refuses."""
    spec = load_sweep(path)
    compose = hydra_compose(config_dir, config_name(spec))
    problems = [f"{k}: not a key of the {config_name(spec)} config"
                for k in check_sweep_keys(spec["parameters"], compose)]
    if problems:
        return problems
    for pt in expand_sweep(spec, n=n):
        args = agent_command(spec, pt)[3:]
        try:
            compose(args)
        except Exception as e:  # Hydra's override / composition errors
            problems.append(f"{' '.join(args)}: {type(e).__name__}: {e}")
    return problems


# ---------------------------------------------------------------------------------------------
# reading an offline run back (the .wandb file is a LevelDB-style log of protobuf records)
# ---------------------------------------------------------------------------------------------


def _records(path: Path) -> Iterable[bytes]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log")
    block, i, buf = 32768, 7, b""
    while i + 7 <= len(data):
        left = block - i % block
        if left < 7:
            i += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[i : i + 7])
        if kind == 0 and length == 0:  # zero padding to the block end
            i += left
            continue
        chunk = data[i + 7 : i + 7 + length]
        i += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk
            buf = b""


def find_offline_runs(root: str | os.PathLike) -> list[Path]:
    """Every `offline-run-*` (or `run-*`) directory under root, oldest first."""
    return sorted({p.parent for p in Path(root).rglob("run-*.wandb")}, key=lambda p: p.name)


def read_offline_run(run_dir: str | os.PathLike) -> dict:
    """{"id", "project", "config", "summary", "history", "artifacts"} of a run directory."""
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = Path(run_dir)
    files = sorted(run_dir.glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"{run_dir}: no run-*.wandb file")
    out: dict[str, Any] = {"id": None, "project": None, "config": {}, "summary": {}, "history": [], "artifacts": []}

    def key(item) -> str:
        return item.key or "/".join(item.nested_key)

    def val(item) -> Any:
        try:
            return json.loads(item.value_json)
        except ValueError:
            return item.value_json

    for raw in _records(files[-1]):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["id"], out["project"] = rec.run.run_id, rec.run.project
            out["config"].update({key(i): val(i) for i in rec.run.config.update})
        elif kind == "config":
            out["config"].update({key(i): val(i) for i in rec.config.update})
        elif kind == "history":
            out["history"].append({key(i): val(i) for i in rec.history.item})
        elif kind == "summary":
            out["summary"].update({key(i): val(i) for i in rec.summary.update})
        elif kind == "artifact":
            out["artifacts"].append({"name": rec.artifact.name, "type": rec.artifact.type,
                                     "files": [m.path for m in rec.artifact.manifest.contents]})
    return out


# ---------------------------------------------------------------------------------------------
# CLI: python -m sparsespec.tracking check conf/sweep/*.yaml | mode | command SWEEP.yaml
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sparsespec.tracking", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check sweep files: keys exist, sampled points compose")
    c.add_argument("files", nargs="+")
    c.add_argument("--conf", default=str(Path(__file__).resolve().parents[1] / "conf"))
    c.add_argument("-n", type=int, default=4, help="points per file to compose")
    sub.add_parser("mode", help="print the W&B mode a run would use (offline unless configured)")
    s = sub.add_parser("command", help="print the argv an agent would run for sampled points")
    s.add_argument("file")
    s.add_argument("-n", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "mode":
        print(wandb_mode_default())
        return 0
    if args.cmd == "command":
        import shlex

        spec = load_sweep(args.file)
        for pt in expand_sweep(spec, n=args.n, seed=args.seed):
            print(shlex.join(agent_command(spec, pt)))
        return 0
    bad = 0
    for f in args.files:
        try:
            problems = check_sweep_file(f, args.conf, n=args.n)
        except (ValueError, OSError, yaml.YAMLError) as e:
            problems = [str(e)]
        print(f"{f}: {'ok' if not problems else 'FAILED'}")
        for p in problems:
            print(f"  {p}")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
