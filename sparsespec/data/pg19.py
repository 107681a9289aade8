"""``dataset=pg19``: continuation windows of PG-19 books.

Sources, in order: ``dataset.path`` (a jsonl/json/parquet file, a directory of them, or a hub id
such as ``emozilla/pg19``; ``deepmind/pg19`` still needs a loading script, which ``datasets`` >= 4
no longer runs), the environment variable ``SPARSESPEC_PG19``, then the six public-domain Project
Gutenberg books shipped inside the package (``sparsespec/data/pg19_books.jsonl.xz``, PG-19's schema).

Each book gives one window of exactly ``ctx`` tokens starting after the first 2% of the book's
characters by default (``offset``), which skips the Project Gutenberg header and front matter
(title page, contents) in every shipped book, so the window is running prose. A book shorter than
``ctx`` tokens is skipped with a logged reason.

Books are split for training vs. evaluation by ``pg19_split``; evaluation uses every book unless
``split`` asks for one half.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.continuation import check_offset
from sparsespec.data.sources import Source, load_rows, resolve, row_error
from sparsespec.data.text import continuation_samples, slug

DEFAULT_PATH = Path(__file__).resolve().parent / "pg19_books.jsonl.xz"
ENV_VAR = "SPARSESPEC_PG19"
REQUIRED = ("short_book_title", "text")  # publication_date and url are kept in meta when present
DEFAULT_OFFSET = 0.02
N_EVAL_BOOKS = 2
# Names for `split` that choose books from the loaded rows. Any other name is a hub split.
_ALL = ("test", "all")
_HUB_SPLITS = ("train", "validation", "test")


def default_path() -> str:
    env = os.environ.get(ENV_VAR)
    if env:
        return env
    return str(DEFAULT_PATH)


def _source(path: str | None) -> Source:
    chosen = path if path is not None else default_path()
    if path is None and not Path(chosen).exists():
        fix = f"unset {ENV_VAR} or point it at a PG-19-schema file" if os.environ.get(ENV_VAR) else (
            "the shipped books are missing from this install: reinstall the package (pip install -e .)")
        raise DatasetError(
            f"no PG-19 data: {chosen} does not exist; {fix}, or pass dataset.path=FILE_OR_DIR (or a hub id such as "
            "emozilla/pg19)"
        )
    return resolve(chosen)


def load_books(path: str | None = None, hub_split: str = "test") -> list[dict[str, Any]]:
    """The books' rows (short_book_title, text, and publication_date/url when present)."""
    rows = load_rows(
        _source(path), REQUIRED, hub_split=hub_split,
        hint="PG-19 rows need short_book_title and text (publication_date and url are optional).",
    )
    for i, row in enumerate(rows):
        if not isinstance(row["text"], str):
            raise row_error(row, i, f"field 'text' is {type(row['text']).__name__}, expected a string")
        if not row["text"].strip():
            raise row_error(row, i, f"book {row['short_book_title']!r} is empty (field 'text')")
    return rows


def pg19_books(path: str | None = None) -> list[str]:
    """The titles of the available books, in file order."""
    return [str(r["short_book_title"]) for r in load_books(path)]


def pg19_split(titles: list[str], n_eval: int = N_EVAL_BOOKS) -> tuple[list[str], list[str]]:
    """(train_titles, eval_titles): the ``n_eval`` books whose SHA-1 of the title sorts last are
    held out for evaluation, the rest are for training.

    Hashing the title (rather than taking file positions) keeps a book on the same side when
    books are added, removed or reordered. Both lists keep the input order.
    """
    if n_eval < 0:
        raise DatasetError(f"n_eval={n_eval}: the number of held-out books must be >= 0")
    if len(set(titles)) != len(titles):
        raise DatasetError("pg19_split: titles must be unique")
    ranked = sorted(titles, key=lambda t: (hashlib.sha1(t.encode("utf-8")).hexdigest(), t))
    held = set(ranked[len(ranked) - n_eval :]) if n_eval else set()
    return [t for t in titles if t not in held], [t for t in titles if t in held]


def select_split(rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    """``test``/``all``: every book; ``train``/``eval``: one side of ``pg19_split``."""
    if split in _ALL:
        return rows
    if split not in ("train", "eval"):
        raise DatasetError(f"split={split!r} for pg19: use test (every book), train or eval (pg19_split halves)")
    train, held = pg19_split([str(r["short_book_title"]) for r in rows])
    keep = set(train if split == "train" else held)
    return [r for r in rows if str(r["short_book_title"]) in keep]


def load(
    tokenizer: Any,
    ctx: int,
    *,
    path: str | None = None,
    limit: int | None = None,
    split: str = "test",
    offset: int | float = DEFAULT_OFFSET,
) -> list[Sample]:
    """``offset``: where each window starts (float: fraction of the book's characters, default
    0.02; int: tokens). ``split``: test/all (every book), train, eval (see pg19_split); with a hub
    id, train/validation/test also pick the hub split."""
    offset = check_offset(offset)
    hub_split = split if split in _HUB_SPLITS else "test"
    rows = load_books(path, hub_split=hub_split)
    is_hub = _source(path).hub_id is not None
    if not (is_hub and split in _HUB_SPLITS and split != "test"):
        rows = select_split(rows, split)
    docs = []
    for row in rows:
        meta = {"title": row["short_book_title"], "file": row["__file__"], "split": split}
        for key in ("publication_date", "url"):
            if row.get(key) is not None:
                meta[key] = row[key]
        docs.append((slug(str(row["short_book_title"])), row["text"], meta))
    return continuation_samples("pg19", docs, tokenizer, ctx, offset, limit)
