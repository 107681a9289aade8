"""Finished parts of a long study, kept as they finish so that a stopped run resumes where it was.
The file is JSON lines read and written as evaluate.py's results files are (eval.results: a torn
last line is dropped, every write replaces the file whole)."""

from __future__ import annotations

import json
from pathlib import Path

from sparsespec.eval.results import read_rows, write_atomic
from sparsespec.experiments import ExperimentError
from sparsespec.provenance import Provenance


class Checkpoint:
    """Finished parts (a sample's rows, a window's counts), one JSON line each, beside the report
    (REPORT.partial.jsonl): an hour-long 64k run that stops (or is stopped) keeps what it finished,
    and a resumed run skips those parts, prefill included. The first line records the settings a
    resumed run must share."""

    def __init__(self, path: Path | None, done: list[dict], lines: list | None = None):
        self.path, self.done = path, done
        self._lines = lines or []

    @classmethod
    def open(cls, report: str | None, settings: dict, resume: bool) -> Checkpoint:
        """The checkpoint beside `report` (none without one), started afresh or, with `resume`,
        holding the parts an earlier run with the same `settings` finished."""
        if not report:
            if resume:
                raise ExperimentError("--resume needs --out (the checkpoint is OUT.partial.jsonl)")
            return cls(None, [])
        path = Path(report).with_suffix(".partial.jsonl")
        settings = json.loads(json.dumps(settings))  # as the file gives them back (tuples are lists)
        if resume and path.exists():
            head, *parts = read_rows(path)
            if head != settings:
                raise ExperimentError(f"--resume: {path} was written with other settings ({json.dumps(head)}); "
                                      "rerun with those, or without --resume to start over")
            return cls(path, [row for part in parts for row in part], [head, *parts])
        checkpoint = cls(path, [], [settings])
        checkpoint._write()
        return checkpoint

    def _write(self) -> None:
        write_atomic(self.path, "".join(json.dumps(line) + "\n" for line in self._lines))

    def rows(self, ctx: int, sample_id: str, specs: list[str]) -> list[dict]:
        """This sample's rows if every method finished it, else [] (it runs again)."""
        rows = {r["method"]: r for r in self.done if r["ctx"] == ctx and r["sample"] == sample_id}
        return [rows[s] for s in specs if s in rows] if all(s in rows for s in specs) else []

    def add(self, part: list[dict]) -> None:
        """Keep a finished part (its rows)."""
        if self.path is not None:
            self._lines.append(part)
            self._write()

    def provenance(self, prov: Provenance) -> dict:
        """The provenance of a report measured since `prov` began, saying whether rows came from an
        earlier run that this one resumed (their provenance is that run's, not kept)."""
        out = prov.end()
        if self.done:
            out["note"] = f"resumed: {len(self.done)} rows from an earlier run"
        return out

    def close(self) -> None:
        """The run finished and its report holds everything: the checkpoint has done its job."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
