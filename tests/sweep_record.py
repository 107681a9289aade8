"""Run a program (train.py, evaluate.py) as `python PROGRAM ARGS...` would, recording what it hands to
W&B: the run's id, project and config, every run.log() call, the run summary, and each logged artifact
with its files. The record goes to the JSON file named by $SWEEP_RECORD after every call, so it is
complete however the process ends.

    SWEEP_RECORD=rec.json python tests/sweep_record.py train.py optim.lr=0.001 ...

W&B still writes its own (offline) run as usual: the recorder wraps the public `wandb.Run` methods and
calls through. Tests read the record instead of W&B's run files, whose format is not public.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import wandb

RECORD = Path(os.environ["SWEEP_RECORD"])
state: dict[str, Any] = {"id": None, "project": None, "config": {}, "summary": {}, "history": [], "artifacts": []}


def _plain(o: Any) -> Any:
    # a wandb media object (Table, Image, ...) is recorded by its type, e.g. {"_type": "Table"}
    return {"_type": type(o).__name__}


def _write() -> None:
    RECORD.write_text(json.dumps(state, default=_plain))


def _read(run: wandb.Run) -> None:
    state.update(id=run.id, project=run.project, config=run.config.as_dict(),
                 summary={k: run.summary.get(k) for k in run.summary.keys()})
    _write()


def _wrap(name: str, record: Any) -> None:
    orig = getattr(wandb.Run, name)

    def wrapper(self: wandb.Run, *args: Any, **kwargs: Any) -> Any:
        if name == "finish":  # read the summary while the run is still open
            _read(self)
            return orig(self, *args, **kwargs)
        out = orig(self, *args, **kwargs)
        record(*args, **kwargs)
        _read(self)
        return out

    setattr(wandb.Run, name, wrapper)


def _log(data: dict, *args: Any, **kwargs: Any) -> None:
    state["history"].append(json.loads(json.dumps(data, default=_plain)))


def _log_artifact(artifact: wandb.Artifact, *args: Any, **kwargs: Any) -> None:
    state["artifacts"].append({"name": artifact.name, "type": artifact.type,
                               "files": sorted(artifact.manifest.entries)})


_wrap("log", _log)
_wrap("log_artifact", _log_artifact)
_wrap("finish", None)
atexit.register(_write)  # W&B closes an unfinished run at exit itself: keep what was read last

if __name__ == "__main__":
    program = os.path.abspath(sys.argv[1])
    sys.argv = [program, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(program)  # as `python PROGRAM` sets it, not this file's directory
    runpy.run_path(program, run_name="__main__")
