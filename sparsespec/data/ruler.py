"""``dataset=ruler``: RULER-style synthetic tasks generated at any length, offline.

Tasks (templates and answer prefixes from RULER's constants.py):

* ``niah_single``: one needle "One of the special magic numbers for <key> is: <7 digits>." in real
  text; the answer is the number.
* ``niah_multikey``: ``num_keys`` (default 4) needles with different keys; one is asked for.
* ``variable_tracking``: a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... of ``num_hops`` (default
  4) hops hidden in the text; the answer is every variable in the chain.

Haystack (``haystack=``): ``pg19`` (default; the shipped books or ``haystack_path``) or
``essays`` (Paul Graham's essays, as in RULER). ``depth`` places the (asked) needle: a number in
[0, 1], a list, or by default ``num_samples`` depths evenly spaced from start to end. Every prompt
is exactly ``ctx`` tokens. Deterministic for a given ``seed``. Scored with RULER's
string_match_all.
"""

from __future__ import annotations

import random
import string
from typing import Any

from sparsespec.data import haystacks, synthetic
from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.metrics import string_match_all
from sparsespec.data.prompts import make_frame

TASKS = ("niah_single", "niah_multikey", "variable_tracking")
MAX_NEW_TOKENS = {"niah_single": 128, "niah_multikey": 128, "variable_tracking": 30}
DEFAULT_SAMPLES = 10

NIAH_HEAD = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards.\n"
)
NIAH_TAIL = "\nWhat are all the special magic numbers for {key} mentioned in the provided text?"
NIAH_PREFIX = " The special magic numbers for {key} mentioned in the provided text are"
NIAH_NEEDLE = " One of the special magic numbers for {key} is: {value}."
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_TAIL = "\nQuestion: Find all variables that are assigned the value {value} in the text above."
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {n} variables are assigned "
    "the value {value}, they are: "
)

# Keys are adjective-noun pairs, like RULER's word keys (it draws them from the wonderwords lists).
_ADJECTIVES = (
    "ancient", "bitter", "brave", "calm", "clever", "crimson", "curious", "damp", "eager", "faint", "fierce",
    "gentle", "glossy", "hollow", "humble", "icy", "jolly", "lively", "lonely", "mellow", "misty", "narrow",
    "noisy", "odd", "pale", "proud", "quiet", "rapid", "rusty", "shiny", "silent", "sleepy", "smooth", "sour",
    "steady", "sticky", "swift", "tame", "tender", "tidy", "upset", "vast", "wary", "wicked", "witty", "young",
)
_NOUNS = (
    "anchor", "badger", "barrel", "beacon", "blanket", "bucket", "candle", "canyon", "carpet", "castle", "cider",
    "comet", "cottage", "crayon", "desert", "falcon", "feather", "garden", "glacier", "hammer", "harbor",
    "helmet", "island", "jacket", "kettle", "ladder", "lantern", "meadow", "mirror", "needle", "orchard",
    "parrot", "pebble", "pillow", "pocket", "quarry", "rabbit", "saddle", "signal", "spider", "teapot",
    "thimble", "tunnel", "velvet", "walnut", "whistle", "window", "zephyr",
)  # fmt: skip


def _key(rng: random.Random, taken: set[str]) -> str:
    while True:
        key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        if key not in taken:
            taken.add(key)
            return key


def _var(rng: random.Random, taken: set[str]) -> str:
    while True:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in taken:
            taken.add(name)
            return name


def _int_option(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DatasetError(f"option {name}={value!r}: use an integer >= {low}")
    return value


def load(
    tokenizer: Any,
    ctx: int,
    *,
    path: str | None = None,
    task: str | None = None,
    limit: int | None = None,
    split: str = "test",
    seed: int = 0,
    use_chat_template: bool = True,
    haystack: str = "pg19",
    haystack_path: str | None = None,
    depth: Any = None,
    num_samples: int | None = None,
    num_keys: int = 4,
    num_hops: int = 4,
) -> list[Sample]:
    """``path`` is accepted as the PG-19 haystack data when ``haystack_path`` is not given."""
    task = task or "niah_single"
    if task not in TASKS:
        raise DatasetError(f"dataset.task={task!r} for ruler: use one of {', '.join(TASKS)}")
    n = _int_option("num_samples", num_samples, 1) if num_samples is not None else (limit or DEFAULT_SAMPLES)
    if limit is not None:
        n = min(n, limit)
    num_keys = _int_option("num_keys", num_keys, 1)
    num_hops = _int_option("num_hops", num_hops, 1)
    depths = synthetic.parse_depths(depth, n)
    text = haystacks.corpus(haystack, haystack_path or path)
    samples = []
    for i in range(n):
        rng = random.Random(f"ruler:{task}:{seed}:{i}")
        hay = synthetic.text_haystack(tokenizer, text, rng)
        taken: set[str] = set()
        if task == "variable_tracking":
            names = [_var(rng, taken) for _ in range(num_hops + 1)]
            value = str(rng.randint(10000, 99999))
            statements = [f" VAR {names[0]} = {value}."] + [f" VAR {names[j + 1]} = VAR {names[j]}." for j in range(num_hops)]
            # The chain is spread through the text in order; ``depth`` is where it starts.
            start = depths[i] * 0.5
            spots = sorted(rng.uniform(start, 1.0) for _ in statements[1:])
            needles = list(zip([start, *spots], statements, strict=True))
            frame = make_frame(tokenizer, use_chat_template, VT_PREFIX.format(n=num_hops + 1, value=value))
            built = synthetic.build(tokenizer, ctx, frame, VT_HEAD, VT_TAIL.format(value=value), hay, needles)
            answers = names
            meta = {"value": value, "chain": [s.strip() for s in statements]}
        else:
            count = num_keys if task == "niah_multikey" else 1
            keys = [_key(rng, taken) for _ in range(count)]
            values = [str(rng.randint(1_000_000, 9_999_999)) for _ in keys]
            spots = [depths[i]] + [rng.random() for _ in keys[1:]]
            needles = [(d, NIAH_NEEDLE.format(key=k, value=v)) for d, k, v in zip(spots, keys, values, strict=True)]
            frame = make_frame(tokenizer, use_chat_template, NIAH_PREFIX.format(key=keys[0]))
            built = synthetic.build(tokenizer, ctx, frame, NIAH_HEAD, NIAH_TAIL.format(key=keys[0]), hay, needles)
            answers = [values[0]]
            meta = {"key": keys[0], "needles": [s.strip() for _, s in needles]}
        meta.update(
            depth=round(built.depths[0], 4), requested_depth=depths[i], needle_positions=built.needle_positions,
            haystack=haystack, chat_template=frame.chat, truncated=False,
        )
        samples.append(Sample(f"ruler/{task}/{i:04d}", "ruler", task, built.ids, answers, MAX_NEW_TOKENS[task], meta))
    return samples


def score(sample: Sample, prediction: str) -> float | None:
    return string_match_all(prediction, sample.answers) if sample.answers else None
