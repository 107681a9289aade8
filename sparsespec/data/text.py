"""``dataset=text``: your own documents as continuation prompts.

``dataset.path`` is a ``.txt`` file (one document), a ``.jsonl``/``.json``/``.parquet`` file whose
rows have a ``text`` field (PG-19's schema works; JSON may be ``.xz``/``.gz``/``.bz2``-compressed), or a
directory of such files. Without ``dataset.path`` the PG-19 books shipped in the package are used. Each document
gives one window of exactly ``ctx`` tokens (see continuation.py); documents shorter than that are
skipped with a logged reason, since a continuation prompt is defined by its length.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.continuation import check_offset, window
from sparsespec.data.sources import Source, file_type, load_rows, resolve, row_error

log = logging.getLogger(__name__)

_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")


def read_text_file(path: Path) -> str:
    """A UTF-8 text file's content; invalid bytes are an error (not silently replaced), since a
    mis-decoded document would change every token the benchmark measures."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{path}: not valid UTF-8 (byte {e.start}: {e.reason}); convert it, e.g. `iconv -f latin1 -t utf-8`"
        ) from None
    return text.removeprefix("\ufeff")  # a BOM is not part of the document


def slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")[:60] or "doc"


def documents(path: str | None) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, text, meta) for every document under ``path``."""
    if path is None:
        from sparsespec.data.pg19 import default_path

        path = default_path()
        log.info("dataset=text: no dataset.path, reading the shipped PG-19 books (%s); pass dataset.path=FILE "
                 "for your own text", path)
    source = resolve(path, _SUFFIXES)
    if source.hub_id:
        raise DatasetError(f"dataset=text reads local files only; {path!r} does not exist (for a hub corpus use dataset=pg19 dataset.path={path})")
    docs: list[tuple[str, str, dict[str, Any]]] = []
    txt = [f for f in source.files if file_type(f)[1] == ".txt"]
    tables = [f for f in source.files if file_type(f)[1] != ".txt"]
    for f in txt:
        text = read_text_file(f)
        if not text.strip():
            raise DatasetError(f"{f}: the document is empty")
        docs.append((slug(f.stem), text, {"file": str(f)}))
    if tables:
        rows = load_rows(Source(tables), ("text",), hint="dataset=text reads the 'text' field of each row (PG-19's schema works).")
        for i, row in enumerate(rows):
            text = row["text"]
            if not isinstance(text, str):
                raise row_error(row, i, f"field 'text' is {type(text).__name__}, expected a string")
            if not text.strip():
                raise row_error(row, i, "the document is empty (field 'text')")
            stem = file_type(Path(row["__file__"]))[0]
            name = row.get("short_book_title") or row.get("title") or f"{stem}_{i}"
            meta = {"file": row["__file__"], "row": i}
            for key in ("short_book_title", "publication_date", "url", "title"):
                if row.get(key) is not None:
                    meta[key] = row[key]
            docs.append((slug(str(name)), text, meta))
    return docs


def continuation_samples(
    dataset: str, docs: list[tuple[str, str, dict[str, Any]]], tokenizer: Any, ctx: int, offset: int | float, limit: int | None
) -> list[Sample]:
    """One ctx-token window per document; short documents are skipped (logged), and when none is
    left the error says the longest length available."""
    samples: list[Sample] = []
    longest = 0
    seen: dict[str, int] = {}
    for name, text, meta in docs:
        if limit is not None and len(samples) >= limit:
            break
        w = window(tokenizer, text, ctx, offset)
        if w.ids is None:
            longest = max(longest, w.total_tokens or 0)
            log.warning("%s: skipping %s: %d tokens, shorter than ctx=%d", dataset, name, w.total_tokens, ctx)
            continue
        seen[name] = seen.get(name, 0) + 1
        sid = f"{dataset}/{name}" if seen[name] == 1 else f"{dataset}/{name}_{seen[name]}"
        samples.append(Sample(sid, dataset, None, w.ids, None, None, {**meta, **w.meta}))
    if not samples:
        raise DatasetError(
            f"dataset={dataset}: every document is shorter than ctx={ctx} tokens; the longest has {longest} tokens "
            f"with this tokenizer: use ctx<={longest} or longer documents"
        )
    return samples


def load(
    tokenizer: Any,
    ctx: int,
    *,
    path: str | None = None,
    limit: int | None = None,
    offset: int | float = 0,
) -> list[Sample]:
    """``offset``: where each window starts (int: tokens, float: fraction of the document)."""
    return continuation_samples("text", documents(path), tokenizer, ctx, check_offset(offset), limit)
