"""results.jsonl: one JSON object a line per (sample, method), appended atomically.

A line is written with one write() and fsync'd, so a killed run leaves whole lines only (a torn
final line, should the OS cut one, is dropped on reading). A rerun with the same out_dir skips
the (sample_id, method) pairs already there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# The output contract other tools read (docs/architecture.md); extra keys may follow, these never change.
CONTRACT_FIELDS = (
    "sample_id", "dataset", "method", "ctx", "prompt_tokens", "new_tokens", "output_ids", "prefill_s",
    "wall_s", "tokens_per_s", "acceptance_rate", "mean_accepted_tokens", "draft_steps", "verify_steps",
    "speedup",
)


def read_rows(path: str | Path) -> list[dict]:
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    with open(p, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line from a killed run: that pair simply runs again
    return rows


class ResultsFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows = read_rows(self.path)
        if self.path.exists():
            self._rewrite_clean()

    def _rewrite_clean(self) -> None:
        """Drop a torn trailing line so new lines never glue onto it."""
        text = self.path.read_text(encoding="utf-8")
        clean = "".join(json.dumps(r) + "\n" for r in self.rows)
        if text != clean:
            write_atomic(self.path, clean)

    def done(self, sample_id: str, method: str) -> dict | None:
        for r in self.rows:
            if r["sample_id"] == sample_id and r["method"] == method:
                return r
        return None

    def append(self, row: dict) -> None:
        missing = [k for k in CONTRACT_FIELDS if k not in row]
        if missing:
            raise KeyError(f"result row lacks contract fields {missing}")
        line = json.dumps(row) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        self.rows.append(row)


def write_atomic(path: str | Path, text: str) -> None:
    """Write-then-rename: readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
