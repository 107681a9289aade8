"""Where exported drafters are found: `<cache_root>/drafters/LATEST` is a text file with the absolute
path of the newest export (written by training, read by evaluation)."""

from __future__ import annotations

import os
from pathlib import Path

from sparsespec.models.embedded import cache_root

LATEST = "LATEST"


def drafters_root() -> Path:
    return cache_root() / "drafters"


def latest_drafter_path() -> Path | None:
    """The newest exported drafter directory, or None if nothing was exported (or it was deleted)."""
    pointer = drafters_root() / LATEST
    try:
        path = Path(pointer.read_text().strip())
    except OSError:
        return None
    return path if (path / "config.json").is_file() else None


def set_latest(path: Path) -> None:
    root = drafters_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{LATEST}.{os.getpid()}.tmp"
    tmp.write_text(str(Path(path).resolve()) + "\n")
    os.replace(tmp, root / LATEST)
