"""Building synthetic prompts in token space, so they hit ``ctx`` exactly.

A synthetic prompt is ``frame.before + head + haystack-with-needles + tail + frame.after``. Each
piece is tokenized on its own and the haystack is cut to the exact number of tokens left, so the
prompt is exactly ``ctx`` tokens (pieces tokenized apart may join slightly differently from the
same text tokenized whole; the model sees ordinary tokens either way). Needles go in at a sentence
(or line) boundary near the requested depth, so they do not split a word.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparsespec.data.base import DatasetError
from sparsespec.data.prompts import Frame, align_to_boundary, encode, take_tokens

_SNAP_WINDOW = 64  # tokens searched on each side of the target depth for a boundary


@dataclass
class Built:
    ids: list[int]
    needle_positions: list[int]  # token index of each needle's first token in ``ids``
    depths: list[float]  # actual relative depth of each needle in the haystack


def parse_depths(depth: Any, n: int) -> list[float]:
    """``depth`` None: ``n`` depths evenly spaced over [0, 1]; a number: that depth for every
    sample; a list: cycled over the samples."""
    if depth is None:
        return [0.5] if n == 1 else [i / (n - 1) for i in range(n)]
    values = list(depth) if isinstance(depth, list | tuple) else [depth]
    if not values:
        raise DatasetError("option depth=[]: give a number in [0, 1] or a list of them")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= float(v) <= 1.0:
            raise DatasetError(f"option depth={depth!r}: each depth is a number in [0, 1] (0 = start, 1 = end)")
    return [float(values[i % len(values)]) for i in range(n)]


def _is_sentence_end(piece: str) -> bool:
    s = piece.rstrip(" \"'”’)")
    return s.endswith((".", "!", "?"))


def snap(tokenizer: Any, hay: list[int], target: int, prefer_lines: bool) -> int:
    """The insertion index nearest ``target`` that follows a sentence end (or a newline)."""
    target = max(0, min(target, len(hay)))
    if target == 0:
        return 0  # the very start is a boundary already
    # At the end too we look back for a boundary, so a needle never follows half a word.
    lo, hi = max(1, target - _SNAP_WINDOW), min(len(hay), target + _SNAP_WINDOW)
    pieces = {p: tokenizer.decode([hay[p - 1]]) for p in range(lo, hi + 1)}

    def best(pred: Callable[[str], bool]) -> int | None:
        hits = [p for p, s in pieces.items() if pred(s)]
        return min(hits, key=lambda p: (abs(p - target), p)) if hits else None

    tests = [lambda s: "\n" in s, _is_sentence_end] if prefer_lines else [_is_sentence_end, lambda s: "\n" in s]
    for test in tests:
        found = best(test)
        if found is not None:
            return found
    return target


def insert_needles(
    tokenizer: Any, hay: list[int], needles: list[tuple[float, list[int]]], prefer_lines: bool = False
) -> tuple[list[int], list[int], list[float]]:
    """Insert each (depth, ids) needle into ``hay``; returns (ids, start positions, real depths).

    Needles keep their given order even when two snap to the same spot.
    """
    spots = [snap(tokenizer, hay, round(d * len(hay)), prefer_lines) for d, _ in needles]
    order = sorted(range(len(needles)), key=lambda k: (spots[k], k))
    out: list[int] = []
    positions = [0] * len(needles)
    cursor = 0
    for k in order:
        out.extend(hay[cursor : spots[k]])
        cursor = spots[k]
        positions[k] = len(out)
        out.extend(needles[k][1])
    out.extend(hay[cursor:])
    depths = [spots[k] / max(len(hay), 1) for k in range(len(needles))]
    return out, positions, depths


def build(
    tokenizer: Any,
    ctx: int,
    frame: Frame,
    head: str,
    tail: str,
    haystack: Callable[[int], list[int]],
    needles: list[tuple[float, str]],
    prefer_lines: bool = False,
) -> Built:
    """A prompt of exactly ``ctx`` tokens: ``haystack(n)`` must return ``n`` ids."""
    head_ids, tail_ids = encode(tokenizer, head), encode(tokenizer, tail)
    needle_ids = [(d, encode(tokenizer, t)) for d, t in needles]
    room = frame.budget(ctx) - len(head_ids) - len(tail_ids) - sum(len(ids) for _, ids in needle_ids)
    if room < 1:
        raise DatasetError(
            f"ctx={ctx} is too small for this synthetic task: instructions, question and needles alone take "
            f"{ctx - room + 1} tokens; use a larger ctx"
        )
    hay = haystack(room)
    if len(hay) != room:
        raise DatasetError(f"the haystack gave {len(hay)} tokens, {room} were needed")
    body, pos, depths = insert_needles(tokenizer, hay, needle_ids, prefer_lines)
    offset = len(frame.before) + len(head_ids)
    ids = frame.wrap(head_ids + body + tail_ids)
    return Built(ids, [offset + p for p in pos], depths)


def repeat_ids(unit: list[int], n: int) -> list[int]:
    """``n`` ids of ``unit`` repeated (the last copy cut short)."""
    if not unit:
        raise DatasetError("the haystack unit text tokenizes to nothing")
    reps = n // len(unit) + 1
    return (unit * reps)[:n]


def noise_haystack(tokenizer: Any, sentence: str) -> Callable[[int], list[int]]:
    unit = encode(tokenizer, sentence)
    return lambda n: repeat_ids(unit, n)


def text_haystack(tokenizer: Any, corpus: str, rng: random.Random) -> Callable[[int], list[int]]:
    """Windows of real text from ``corpus`` starting at a random line, wrapping to its start when
    the corpus runs out (the join is a blank line)."""
    if not corpus.strip():
        raise DatasetError("the haystack corpus is empty")

    def take(n: int) -> list[int]:
        est = n * 5
        start = align_to_boundary(corpus, rng.randrange(0, max(1, len(corpus) - est)))
        ids = take_tokens(tokenizer, corpus, n, start)
        sep = encode(tokenizer, "\n\n")
        while len(ids) < n:
            ids += sep + take_tokens(tokenizer, corpus, n - len(ids) - len(sep), 0) if n - len(ids) > len(sep) else sep
        return ids[:n]

    return take
