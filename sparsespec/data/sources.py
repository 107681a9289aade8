"""Where rows come from: a hub id or local files, both through the ``datasets`` library.

Local ``.jsonl`` / ``.json`` / ``.parquet`` files (or a directory of them) go through
``datasets.load_dataset("json" | "parquet", data_files=...)``, the same code path and Arrow types a
hub load gives, so a file fixture exercises what a user's hub load would. The schema is checked
before any row is used, and every failure names the file and the fix.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sparsespec.data.base import DatasetError

log = logging.getLogger(__name__)

_EXT_BUILDER = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Compressed JSON the datasets library reads as is (the shipped PG-19 books are .jsonl.xz).
COMPRESSIONS = (".xz", ".gz", ".bz2")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Source:
    """A resolved ``dataset.path``: local files, or a hub id."""

    files: list[Path]
    hub_id: str | None = None

    @property
    def label(self) -> str:
        if self.hub_id:
            return f"hub dataset {self.hub_id}"
        return ", ".join(str(f) for f in self.files) if len(self.files) <= 3 else f"{self.files[0].parent}/ ({len(self.files)} files)"


def file_type(path: Path) -> tuple[str, str]:
    """(stem, suffix) of a data file, a compression suffix included in neither: passkey.jsonl.xz ->
    ("passkey", ".jsonl"). Only JSON may be compressed."""
    name = path.name.lower()
    stem, suffix = path.stem, path.suffix.lower()
    if suffix in COMPRESSIONS and Path(name[: -len(suffix)]).suffix in (".jsonl", ".json"):
        inner = Path(path.name[: -len(suffix)])
        return inner.stem, inner.suffix.lower()
    return stem, suffix


def resolve(path: str | Path, suffixes: tuple[str, ...] = tuple(_EXT_BUILDER)) -> Source:
    """A local file or directory if ``path`` exists, a hub id if it looks like ``owner/name``."""
    p = Path(str(path)).expanduser()
    if p.is_file():
        if file_type(p)[1] not in suffixes:
            raise DatasetError(f"{p}: unsupported file type {p.suffix!r}; use one of {', '.join(suffixes)} "
                               f"(JSON may be compressed: {', '.join(COMPRESSIONS)})")
        return Source([p])
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and file_type(f)[1] in suffixes)
        if not files:
            raise DatasetError(f"{p}: the directory holds no {'/'.join(suffixes)} file")
        return Source(files)
    if _HUB_ID.match(str(path)) and not str(path).startswith((".", "~")):
        return Source([], hub_id=str(path))
    raise DatasetError(f"dataset path {str(path)!r} does not exist (neither a file, a directory nor a hub id like owner/name)")


def pick_task_files(source: Source, task: str) -> Source:
    """In a directory of per-task files (LongBench's data/, InfiniteBench's), the file for ``task``."""
    if source.hub_id or len(source.files) == 1 and file_type(source.files[0])[0] == task:
        return source
    chosen = [f for f in source.files if file_type(f)[0] == task]
    if chosen:
        return Source(chosen)
    if len(source.files) == 1:
        return source  # one file holding several tasks: the loader filters rows by task
    stems = sorted({file_type(f)[0] for f in source.files})
    raise DatasetError(
        f"{source.files[0].parent}: no file for task {task!r} (expected {task}.jsonl); files there: {', '.join(stems)}"
    )


def check_utf8(path: Path) -> None:
    """Raise a DatasetError naming the file and byte offset when a JSON file is not UTF-8.

    Needed because the Arrow JSON reader accepts some invalid bytes silently.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with _open_bytes(path) as fh:
        while chunk := fh.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                raise DatasetError(
                    f"{path}: not valid UTF-8 (byte {offset + e.start}: {e.reason}); re-save the file as UTF-8"
                ) from None
            offset += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise DatasetError(f"{path}: not valid UTF-8 (truncated sequence at the end); re-save it as UTF-8") from None


def _open_bytes(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed when its name says it is compressed."""
    import bz2
    import gzip
    import lzma

    opener = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix.lower(), open)
    return opener(path, "rb")


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Silence the datasets progress bars for our loads only (others may want theirs)."""
    import datasets

    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was:
            datasets.enable_progress_bars()


def _load_files(files: list[Path]) -> list[tuple[Path | None, Any]]:
    import datasets

    out: list[tuple[Path | None, Any]] = []
    by_builder: dict[str, list[Path]] = {}
    for f in files:
        by_builder.setdefault(_EXT_BUILDER[file_type(f)[1]], []).append(f)
    for builder, group in by_builder.items():
        if builder == "json":
            for f in group:
                check_utf8(f)
        # One load per file: a schema error then names its file, and files of different tasks may
        # carry different columns.
        for f in group:
            try:
                with _quiet_progress():
                    ds = datasets.load_dataset(builder, data_files=[str(f)], split="train")
            except Exception as e:
                cause = e.__cause__ or e
                raise DatasetError(
                    f"{f}: could not be read as {'JSON lines / a JSON array' if builder == 'json' else 'Parquet'} "
                    f"({type(cause).__name__}: {cause})"
                ) from e
            out.append((f, ds))
    return out


def load_hub(hub_id: str, name: str | None, split: str, **kwargs: Any) -> Any:
    import datasets

    try:
        with _quiet_progress():
            return datasets.load_dataset(hub_id, name, split=split, **kwargs)
    except Exception as e:
        raise DatasetError(
            f"could not load hub dataset {hub_id!r} (config {name!r}, split {split!r}): {type(e).__name__}: {e}. "
            "Offline, or for a hub dataset that still needs a loading script, download its files and pass "
            "dataset.path=FILE_OR_DIR"
        ) from e


def check_fields(ds: Any, required: tuple[str, ...], where: str, hint: str = "") -> None:
    cols = list(ds.column_names)
    missing = [c for c in required if c not in cols]
    if missing:
        raise DatasetError(
            f"{where}: missing field {missing[0]!r}"
            + (f" (also {', '.join(repr(m) for m in missing[1:])})" if len(missing) > 1 else "")
            + f"; found fields: {', '.join(cols) or 'none'}. {hint or 'Each row needs ' + ', '.join(required) + '.'}"
        )


def load_rows(
    source: Source,
    required: tuple[str, ...],
    *,
    hub_name: str | None = None,
    hub_split: str = "test",
    hint: str = "",
    hub_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """All rows of ``source`` as dicts, after checking every file has the ``required`` fields.

    Each row gets ``__file__`` (the file it came from, or the hub id) so later per-row errors can
    name it.
    """
    rows: list[dict[str, Any]] = []
    if source.hub_id:
        ds = load_hub(source.hub_id, hub_name, hub_split, **(hub_kwargs or {}))
        check_fields(ds, required, source.label, hint)
        for row in ds:
            row["__file__"] = source.hub_id
            rows.append(row)
        return rows
    for f, ds in _load_files(source.files):
        check_fields(ds, required, str(f), hint)
        for row in ds:
            row["__file__"] = str(f)
            rows.append(row)
    return rows


def row_error(row: dict[str, Any], index: int, message: str) -> DatasetError:
    rid = row.get("_id", row.get("id", index))
    return DatasetError(f"{row.get('__file__', '?')}: row {index} (id {rid}): {message}")
