"""out_dir as one run's home: the lock on this process's results file, the fingerprint a resume is
checked against, the files every shard shares (config.yaml, run.json, command.txt, provenance.json)
and the summary over every results file there.

Several processes may share one out_dir (`shard=i/n`, a launcher's RANK/WORLD_SIZE or SLURM array):
each locks its own results file for the whole run, before the model loads, so a second process on the
same file stops at once (`RunLock`); the shared files are written under a short second lock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sparsespec.eval.methods import Method
from sparsespec.eval.results import (
    LockedError,
    ResultsFile,
    RunLock,
    read_rows,
    results_files,
    results_name,
    split_of,
    write_atomic,
)
from sparsespec.eval.settings import EvaluationError, RunSettings
from sparsespec.eval.summary import load_results, write_reports

RUN_FILE = "run.json"  # what every row of out_dir/results.jsonl was produced under (checked on resume)
SHARED_LOCK = ".shared.lock"  # held briefly while writing the files all shards of an out_dir share
COMMAND_FILE = "command.txt"  # the command line(s) that wrote out_dir, one per distinct invocation
PROVENANCE_FILE = "provenance.json"  # where each process that wrote rows ran (sparsespec.provenance): a list


class RunDir:
    """One process's view of its out_dir. Used as a context manager: however the run ends, the
    locks it took go, and so does an out_dir the run created and left empty."""

    def __init__(self, path: Path, results_path: Path | None = None) -> None:
        self.path = Path(path)
        self.results_path = results_path or self.path / results_name(None)
        self._locks: list[RunLock] = []

    @classmethod
    def of(cls, run: RunSettings) -> RunDir:
        return cls(run.out_dir, run.results_path)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        for lock in reversed(self._locks):
            lock.release()
        self._locks.clear()

    def lock(self) -> None:
        """This process's exclusive hold on its results file for the whole run (results.RunLock);
        taken before the model loads, so a second process on the same file stops at once."""
        lock = RunLock(self.results_path.with_name(self.results_path.name + ".lock"))
        try:
            self._locks.append(lock.acquire())
        except LockedError as e:
            by = f" ({e.holder})" if e.holder else ""
            raise EvaluationError(
                f"out_dir={self.path} is in use: another evaluate.py{by} is writing {self.results_path.name} there; "
                "wait for it to finish, pass another out_dir, or split the samples with shard=i/n") from None
        except OSError as e:
            raise EvaluationError(f"out_dir={self.path}: cannot create {lock.path} ({e.strerror or e}); pass a "
                                  "writable out_dir") from e

    def check_resume(self, fingerprint: dict, methods: list[Method]) -> None:
        """Refuse to mix results of different settings in one out_dir (before anything is written).
        The rows of every results file there count (shards of one run share its settings), and a
        split other than theirs is refused too: its shards would run samples the files there hold."""
        out_dir, mine = self.path, split_of(self.results_path)
        others = [f for f in results_files(out_dir) if split_of(f)[1] != mine[1]]
        if others:
            old = split_of(others[0])
            raise EvaluationError(
                f"out_dir={out_dir} holds {others[0].name} ({_split_label(old)}{' and others' if len(others) > 1 else ''}) "
                f"and this run is {_split_label(mine)}: their samples would overlap and run twice; split this run as "
                f"before ({'shard=i/' + str(old[1]) if old[1] > 1 else 'shard=null'}), or use a new out_dir")
        rows = [r for f in results_files(out_dir) for r in read_rows(f)]
        if not rows:
            return
        fix = (f"use a new out_dir, or delete {out_dir / 'results.jsonl'} to start over" if mine[1] == 1 else
               f"use a new out_dir, or delete {out_dir}'s results*.jsonl files to start over")
        run_file = out_dir / RUN_FILE
        if run_file.exists():
            try:
                old = json.loads(run_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                old = None
            if old is not None and old != fingerprint:
                raise EvaluationError(
                    f"out_dir={out_dir} holds results of a different run ({'; '.join(_diff(old, fingerprint)[:4])}): "
                    f"resuming would mix them; {fix}")
        for m in methods:
            conf = m.as_dict()
            old = next((r.get("method_config") for r in rows if r.get("method") == m.name and r.get("method_config")),
                       None)
            if old is not None and old != conf:
                raise EvaluationError(
                    f"out_dir={out_dir} holds {m.name} results with other method settings "
                    f"({'; '.join(_diff(old, conf, 'method.')[:4])}); {fix}")

    def start(self, config_yaml: str, fingerprint: dict, command: str | None) -> ResultsFile:
        """Create out_dir and write the files every shard shares (command.txt keeps each distinct
        command once); the results file to append to."""
        self.path.mkdir(parents=True, exist_ok=True)
        with RunLock(self.path / SHARED_LOCK):  # shards share these files: command.txt is read, then rewritten
            write_atomic(self.path / "config.yaml", config_yaml)
            write_atomic(self.path / RUN_FILE, json.dumps(fingerprint, indent=2))
            if command:
                file = self.path / COMMAND_FILE
                known = file.read_text(encoding="utf-8").splitlines() if file.exists() else []
                if command not in known:
                    write_atomic(file, "".join(line + "\n" for line in [*known, command]))
        return ResultsFile(self.results_path)

    def add_provenance(self, prov: dict) -> None:
        """Append one process's provenance to out_dir's list (under the shared lock: shards append too)."""
        add_provenance(self.path, prov)

    def write_summary(self, results: ResultsFile) -> tuple[list[dict], list[Path], dict]:
        """summary.json/.md and the plots over every results file of out_dir, not this process's
        alone: shards that finish one after another each rewrite the same summary.json, and under
        the lock the last one reads every row of the others (appended before they took it)."""
        with RunLock(self.path / SHARED_LOCK):
            files = results_files(self.path)
            rows = load_results([self.path]) if len(files) > 1 else results.rows
            return rows, files, write_reports(rows, self.path)


def add_provenance(out_dir: Path, prov: dict) -> None:
    """Append one process's provenance to out_dir's list (under the shared lock: shards append too)."""
    path = out_dir / PROVENANCE_FILE
    with RunLock(out_dir / SHARED_LOCK):
        known = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
        write_atomic(path, json.dumps([*known, prov], indent=1) + "\n")


def run_fingerprint(cfg: DictConfig, ctx: int, device: torch.device, dtype: torch.dtype) -> dict:
    """The settings every row of one out_dir must share (methods and limit may change on resume);
    `auto` device and dtype as they resolved, so a resume on another machine is told. The shard is
    left out, so every shard of one run passes `check_resume`."""
    model = {**OmegaConf.to_container(cfg.model, resolve=True), "device": device.type, "dtype": str(dtype)[6:]}
    return {
        "model": model,
        "dataset": _dataset_fingerprint(cfg.dataset),
        "ctx": ctx,
        "gen": OmegaConf.to_container(cfg.gen, resolve=True),
        "drafter": OmegaConf.to_container(cfg.drafter, resolve=True),
    }


def config_yaml(cfg: DictConfig, out_dir: Path) -> str:
    """The composed config, resolved where it can be (out_dir as used), to rerun or audit the run."""
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation only Hydra's runtime can resolve: keep it as written
        return OmegaConf.to_yaml(cfg)
    plain["out_dir"] = str(out_dir)
    return OmegaConf.to_yaml(plain)


def _dataset_fingerprint(dataset: DictConfig) -> dict:
    """The dataset's settings; a package dataset's own loader is implied by its name, so out_dirs
    written before datasets named their loader keep resuming."""
    d = OmegaConf.to_container(dataset, resolve=True)
    if d.get("_target_") == f"sparsespec.data.{d.get('name')}.load":
        del d["_target_"]
    return d


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}={old!r} before, {new!r} now"]


def _split_label(split: tuple[int, int] | None) -> str:
    return "unsharded" if split is None or split[1] == 1 else f"shard={split[0]}/{split[1]}"
