"""Finished samples of a long benchmark, kept as they finish so that a stopped run can resume."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from sparsespec.provenance import Provenance, provenance_line
from sparsespec.reports import ReportError


class Checkpoint:
    """Finished samples, one JSON line each, beside the report (REPORT.partial.jsonl): an hour-long
    64k run that stops (or is stopped) keeps what it finished, and a resumed run skips those
    samples, prefill included. The first line records the settings a resumed run must share."""

    def __init__(self, path: Path | None, done: list[dict]):
        self.path, self.done = path, done

    @classmethod
    def open(cls, report: str | None, settings: dict, resume: bool) -> Checkpoint:
        """The checkpoint beside `report` (none without one), started afresh or, with `resume`,
        holding the samples an earlier run with the same `settings` finished."""
        if not report:
            if resume:
                raise ReportError("--resume needs --json (the checkpoint is JSON.partial.jsonl)")
            return cls(None, [])
        path = Path(report).with_suffix(".partial.jsonl")
        done = []
        if resume and path.exists():
            head, *lines = path.read_text().splitlines()
            if json.loads(head) != settings:
                raise ReportError(f"--resume: {path} was written with other settings ({head}); rerun with "
                                  "those, or without --resume to start over")
            done = [row for line in lines for row in json.loads(line)]
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(settings) + "\n")
        return cls(path, done)

    def rows(self, ctx: int, sample_id: str, specs: list[str]) -> list[dict]:
        """This sample's rows if every method finished it, else [] (it runs again)."""
        rows = {r["method"]: r for r in self.done if r["ctx"] == ctx and r["sample"] == sample_id}
        return [rows[s] for s in specs if s in rows] if all(s in rows for s in specs) else []

    def add(self, sample_rows: list[dict]) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(sample_rows) + "\n")

    def save(self, report: dict, path: str | None) -> None:
        """Write the finished report to `path` (none: not kept), then close the checkpoint."""
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(report, indent=1))
        self.close()

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


def add_checkpoint_args(parser, unit: str) -> None:
    """--json (the report) and --resume (from its checkpoint), for a script that keeps `unit`s."""
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--resume", action="store_true", help=f"reuse the finished {unit} in JSON.partial.jsonl")


def checkpointed_report(script: str, args, argv: list[str] | None, settings: dict,
                        measure: Callable[[Checkpoint], dict], markdown: Callable[[dict], str]) -> dict:
    """A long script's run: the checkpoint beside args.json (resumed with args.resume when it was
    written with the same `settings`), `measure` into it, then the finished report (the arguments,
    what was measured, the command that made it and its provenance) saved, printed as markdown and
    returned."""
    prov = Provenance.begin()
    checkpoint = Checkpoint.open(args.json, settings, args.resume)
    report = {"args": vars(args), **measure(checkpoint),
              "command": f"python scripts/{script} " + " ".join(sys.argv[1:] if argv is None else argv)}
    report["provenance"] = checkpoint.provenance(prov)
    checkpoint.save(report, args.json)
    print(markdown(report) + "\n\n" + provenance_line(report))
    return report
