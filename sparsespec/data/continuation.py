"""Continuation windows: exactly ``ctx`` tokens of a document (PG-19 books, plain text).

No chat template: the model continues the document, which is what perplexity-style long-context
speculative decoding is measured on. The window starts with the tokenizer's own leading special
tokens (BOS for Llama-style tokenizers), because such models are trained to see it first and behave
badly without it; the rest is ``ctx - len(BOS)`` tokens of the text, so the window is exactly
``ctx`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparsespec.data.base import DatasetError
from sparsespec.data.prompts import align_to_boundary, encode, special_prefix, take_tokens


@dataclass
class Window:
    ids: list[int] | None  # None: the document is shorter than the window
    total_tokens: int | None  # the document's token count, when it had to be counted
    meta: dict[str, Any] = field(default_factory=dict)


def check_offset(offset: Any) -> int | float:
    """An int is a token offset, a float in [0, 1) a fraction of the document's characters."""
    if isinstance(offset, bool) or not isinstance(offset, int | float):
        raise DatasetError(f"option offset={offset!r}: use an int (tokens) or a float in [0, 1) (fraction of the text)")
    if isinstance(offset, float) and not 0.0 <= offset < 1.0:
        raise DatasetError(f"option offset={offset}: a float offset is a fraction of the text, in [0, 1)")
    if isinstance(offset, int) and offset < 0:
        raise DatasetError(f"option offset={offset}: a token offset must be >= 0")
    return offset


def window(tokenizer: Any, text: str, ctx: int, offset: int | float) -> Window:
    """The ``ctx``-token window of ``text`` starting at ``offset``.

    When the text after ``offset`` is shorter than the window but the whole text is long enough,
    the window is moved back to end at the text's end (meta ``window_at_end``), so a long enough
    document always gives a full window.
    """
    prefix = special_prefix(tokenizer)
    n = int(ctx) - len(prefix)
    if n <= 0:
        raise DatasetError(f"ctx={ctx} leaves no room for text after the {len(prefix)} BOS token(s); use a larger ctx")
    meta: dict[str, Any] = {"document_chars": len(text), "truncated": True}
    if isinstance(offset, float):
        start = align_to_boundary(text, int(offset * len(text)))
        ids = take_tokens(tokenizer, text, n, start)
        meta["start_char"] = start
        if len(ids) == n:
            return Window(prefix + ids, None, meta)
        whole = encode(tokenizer, text)
    else:
        ids = take_tokens(tokenizer, text, offset + n, 0)
        meta["start_token"] = offset
        if len(ids) == offset + n:
            return Window(prefix + ids[offset:], None, meta)
        whole = ids  # take_tokens stopped at the end of the text: this is all of it
    total = len(whole) + len(prefix)
    if len(whole) < n:
        return Window(None, total, meta)
    meta.pop("start_char", None)
    meta.pop("start_token", None)
    meta["window_at_end"] = True
    meta["truncated"] = len(whole) > n
    return Window(prefix + whole[-n:], total, meta)
