"""``dataset=ruler``: RULER's synthetic tasks generated at any length, offline.

Tasks (templates and answer prefixes from RULER's constants.py, constructions from its generation
scripts; ``MAX_NEW_TOKENS`` as RULER sets them: niah 128, vt 30, cwe 120, fwe 50):

* ``niah_single``: one needle "One of the special magic numbers for <key> is: <7 digits>." in real
  text; the answer is the number.
* ``niah_multikey``: ``num_keys`` (default 4) needles with different keys; one is asked for.
* ``niah_multivalue``: ``num_values`` (default 4) needles with the same key and different values, each
  at its own depth; the answer is every value.
* ``niah_multiquery``: ``num_queries`` (default 4) needles with different keys, all asked at once
  ("for <k1>, <k2>, <k3>, and <k4>"); the answer is every value.
* ``variable_tracking``: a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... of ``num_hops`` (default
  4) hops hidden in the text; the answer is every variable in the chain.
* ``cwe`` (common words extraction): after one solved example, a numbered list "1. word 2. word ..."
  in which ``num_cw`` (default 10) common words appear ``freq_cw`` times each and every other word
  ``freq_ucw`` times, shuffled; the answer is the common words. RULER's counts are the defaults:
  30 and 3 (example: 40 words, 10 and 3), or 6 and 1 below ctx 4096 (example: 20 words, 3 and 1).
  The words are the haystack text's own lowercase words of 4-12 letters (no word list is
  downloaded); past its vocabulary, hyphenated pairs of them.
* ``fwe`` (frequent words extraction): random 6-letter coded words over a vocabulary of ctx // 50
  words, the word of rank k appearing N * k^-alpha / zeta(alpha) times (``alpha`` default 2.0) and
  the top-ranked one being the noise word "..."; the answer is the three next most frequent.

Needle values (``value_type``, the niah tasks) are 7-digit numbers (default), adjective-noun words or
UUIDs, RULER's three needle value types; the prompt says "numbers", "words" or "uuids" as RULER's does.

Haystack (``haystack=``): ``pg19`` (default; the shipped books or ``haystack_path``) or
``essays`` (Paul Graham's essays, as in RULER). ``depth`` places the (first asked) needle: a number
in [0, 1], a list, or by default ``num_samples`` depths evenly spaced from start to end; other
needles go at random depths. Every prompt is exactly ``ctx`` tokens: the niah and vt haystacks are
cut to the exact token count (``synthetic.build``); the cwe and fwe lists grow to the largest RULER
list that fits (in distinct words for cwe, in words for fwe) and the few tokens left are filled,
for cwe with words used once each (the last one possibly cut short), for fwe with more noise words
"...". Deterministic for a given ``seed``. Scored with RULER's string_match_all.

Left out: RULER's QA tasks (qa_1, qa_2) need SQuAD and HotpotQA from the hub. Also left out, to keep
one real-text haystack and today's prompts unchanged: RULER's "noise" haystack (the repeated "The
grass is green..." of niah_single_1 and vt) and "needle" haystack (distractor needles, niah_multikey_2
and _3); UUID keys (niah_multikey_3; keys are always adjective-noun words); the singular wording
RULER uses when a single value is asked ("A special magic number ... What is"); vt's several chains
(``num_chains``, 1 in RULER's configs); fwe's optional solved example (off in RULER's configs) and
its ``coded_wordlen``/``vocab_size`` settings, fixed at RULER's defaults (6 letters, ctx // 50).
"""

from __future__ import annotations

import bisect
import functools
import math
import random
import re
import string
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sparsespec.data import haystacks, synthetic
from sparsespec.data.base import DatasetError, Sample
from sparsespec.data.metrics import string_match_all
from sparsespec.data.prompts import Frame, make_frame

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "variable_tracking", "cwe", "fwe")
MAX_NEW_TOKENS = {
    "niah_single": 128, "niah_multikey": 128, "niah_multivalue": 128, "niah_multiquery": 128,
    "variable_tracking": 30, "cwe": 120, "fwe": 50,
}  # fmt: skip
DEFAULT_SAMPLES = 10
VALUE_TYPES = {"number": "numbers", "word": "words", "uuid": "uuids"}  # value_type -> RULER's type_needle_v

NIAH_HEAD = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards.\n"
)
NIAH_TAIL = "\nWhat are all the special magic {kind} for {key} mentioned in the provided text?"
NIAH_PREFIX = " The special magic {kind} for {key} mentioned in the provided text are"
NIAH_NEEDLE = " One of the special magic {kind} for {key} is: {value}."
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_TAIL = "\nQuestion: Find all variables that are assigned the value {value} in the text above."
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {n} variables are assigned "
    "the value {value}, they are: "
)
CWE_HEAD = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
CWE_TAIL = "\nQuestion: What are the {n} most common words in the above list?"
CWE_PREFIX = " Answer: The top {n} words that appear most often in the list are:"
FWE_HEAD = (
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words."
)
FWE_TAIL = (
    "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
FWE_NOISE = "..."  # RULER's top-ranked coded word, which the question says to ignore
FWE_WORD_LEN = 6  # RULER's coded_wordlen
CWE_SHORT_CTX = 4096  # below it RULER uses fewer repeats and a smaller example

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
_WORD = re.compile(r"(?<![\w'’-])[a-z]{4,12}(?![\w'’-])")


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


def _value(rng: random.Random, value_type: str, taken: set[str]) -> str:
    if value_type == "word":
        return _key(rng, taken)
    if value_type == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return str(rng.randint(1_000_000, 9_999_999))


def _int_option(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DatasetError(f"option {name}={value!r}: use an integer >= {low}")
    return value


def _encode_many(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """``encode`` of each text, in one batched call."""
    if not texts:
        return []
    out = tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False, verbose=False)
    return [list(ids) for ids in out["input_ids"]]


# ---------------------------------------------------------------------------------------------
# niah and variable tracking: needles in real text
# ---------------------------------------------------------------------------------------------


def _niah(
    tokenizer: Any, ctx: int, task: str, rng: random.Random, hay: Callable[[int], list[int]], depth: float,
    use_chat_template: bool, num_keys: int, num_values: int, num_queries: int, value_type: str,
) -> tuple[synthetic.Built, Frame, list[str], dict[str, Any]]:
    kind = VALUE_TYPES[value_type]
    taken: set[str] = set()
    count = {"niah_multikey": num_keys, "niah_multiquery": num_queries}.get(task, 1)
    per_key = num_values if task == "niah_multivalue" else 1
    keys = [_key(rng, taken) for _ in range(count)]
    pairs = [(k, _value(rng, value_type, taken)) for k in keys for _ in range(per_key)]
    # The first needle (of the first asked key) goes at ``depth``, the others at random depths.
    spots = [depth] + [rng.random() for _ in pairs[1:]]
    needles = [(d, NIAH_NEEDLE.format(kind=kind, key=k, value=v)) for d, (k, v) in zip(spots, pairs, strict=True)]
    asked = keys if task == "niah_multiquery" else keys[:1]
    # RULER's query: "a" or "a, b, c, and d".
    query = ", ".join(asked[:-1]) + ", and " + asked[-1] if len(asked) > 1 else asked[0]
    frame = make_frame(tokenizer, use_chat_template, NIAH_PREFIX.format(kind=kind, key=query))
    head, tail = NIAH_HEAD.format(kind=kind), NIAH_TAIL.format(kind=kind, key=query)
    built = synthetic.build(tokenizer, ctx, frame, head, tail, hay, needles)
    answers = [v for k, v in pairs if k in asked]
    meta: dict[str, Any] = {"key": keys[0], "needles": [s.strip() for _, s in needles]}
    if task in ("niah_multivalue", "niah_multiquery"):
        meta["keys"] = asked
    meta["value_type"] = value_type
    return built, frame, answers, meta


def _variable_tracking(
    tokenizer: Any, ctx: int, rng: random.Random, hay: Callable[[int], list[int]], depth: float,
    use_chat_template: bool, num_hops: int,
) -> tuple[synthetic.Built, Frame, list[str], dict[str, Any]]:
    taken: set[str] = set()
    names = [_var(rng, taken) for _ in range(num_hops + 1)]
    value = str(rng.randint(10000, 99999))
    statements = [f" VAR {names[0]} = {value}."] + [f" VAR {names[j + 1]} = VAR {names[j]}." for j in range(num_hops)]
    # The chain is spread through the text in order; ``depth`` is where it starts.
    start = depth * 0.5
    spots = sorted(rng.uniform(start, 1.0) for _ in statements[1:])
    needles = list(zip([start, *spots], statements, strict=True))
    frame = make_frame(tokenizer, use_chat_template, VT_PREFIX.format(n=num_hops + 1, value=value))
    built = synthetic.build(tokenizer, ctx, frame, VT_HEAD, VT_TAIL.format(value=value), hay, needles)
    return built, frame, names, {"value": value, "chain": [s.strip() for s in statements]}


# ---------------------------------------------------------------------------------------------
# cwe: a numbered list of words, a few of them common
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def corpus_words(text: str) -> tuple[str, ...]:
    """The distinct lowercase words (4-12 letters) of a haystack text, sorted: cwe's vocabulary."""
    return tuple(sorted(set(_WORD.findall(text))))


class _Pieces:
    """Token ids of " <word>" for cwe's words, encoded once per load."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[str, list[int]] = {}

    def get(self, words: Sequence[str]) -> list[list[int]]:
        missing = list(dict.fromkeys(w for w in words if w not in self.cache))
        self.cache.update(zip(missing, _encode_many(self.tokenizer, [f" {w}" for w in missing]), strict=True))
        return [self.cache[w] for w in words]


class _Numbers:
    """Token ids of the list numbers: "1." for the first entry, " <i>." after, encoded once per load."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[list[int]] = [[]]  # ids[i] for entry i (1-based)
        self.total = [0]  # total[i]: tokens of entries 1..i's numbers

    def ensure(self, n: int) -> None:
        if n < len(self.ids):
            return
        n = max(n, 2 * len(self.ids))
        start = len(self.ids)
        new = _encode_many(self.tokenizer, [f"{i}." if i == 1 else f" {i}." for i in range(start, n + 1)])
        for ids in new:
            self.ids.append(ids)
            self.total.append(self.total[-1] + len(ids))


def _word_list(words: Sequence[Any], counts: Sequence[int], rng: random.Random) -> list[Any]:
    seq = [w for w, c in zip(words, counts, strict=True) for _ in range(c)]
    rng.shuffle(seq)
    return seq


def _cwe_example(words: Sequence[str], num_cw: int, freq_cw: int, freq_ucw: int, rng: random.Random) -> str:
    """RULER's solved example: the task on a short list, its answer prefix and the answer."""
    seq = _word_list(words, [freq_cw if j < num_cw else freq_ucw for j in range(len(words))], rng)
    listed = " ".join(f"{i + 1}. {w}" for i, w in enumerate(seq))
    answer = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words[:num_cw]))
    return CWE_HEAD + listed + CWE_TAIL.format(n=num_cw) + CWE_PREFIX.format(n=num_cw) + " " + answer + "\n"


def _compounds(rng: random.Random, pool: Sequence[str], taken: set[str], n: int) -> list[str]:
    """``n`` new hyphenated pairs of ``pool`` words, for lists longer than the haystack's vocabulary."""
    out: list[str] = []
    while len(out) < n:
        word = f"{rng.choice(pool)}-{rng.choice(pool)}"
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def _cwe(
    tokenizer: Any, ctx: int, rng: random.Random, vocab: Sequence[str], numbers: _Numbers, pieces: _Pieces,
    use_chat_template: bool, num_cw: int, freq_cw: int, freq_ucw: int,
) -> tuple[synthetic.Built, Frame, list[str], dict[str, Any]]:
    order = list(vocab)
    rng.shuffle(order)
    short = ctx < CWE_SHORT_CTX
    ex_size, ex_cw, ex_ucw = (20, 3, 1) if short else (40, 10, 3)
    ex_size = max(ex_size, 2 * num_cw)
    if len(order) < ex_size + num_cw + 1:
        raise DatasetError(
            f"the haystack text has {len(order)} distinct words, cwe needs more than {ex_size + num_cw}; "
            "use haystack=pg19 or a smaller num_cw"
        )
    example, words = order[:ex_size], order[ex_size:]
    head = _cwe_example(example, num_cw, ex_cw, ex_ucw, rng) + CWE_HEAD
    frame = make_frame(tokenizer, use_chat_template, CWE_PREFIX.format(n=num_cw))
    info: dict[str, Any] = {}

    def make_list(room: int) -> list[int]:
        # An entry costs its number's tokens plus its word's, so a list's length is known without
        # building it: the largest list that fits is found on prefix sums of the word lengths.
        word_ids: list[list[int]] = []
        prefix = [0]
        plain, taken = words[num_cw:], set(order)
        most = len(words) + len(plain) ** 2  # distinct words there can be

        def too_few() -> DatasetError:
            return DatasetError(
                f"the haystack text has too few distinct words ({len(order)}) for cwe at ctx={ctx}; "
                "use haystack=pg19, a larger freq_ucw or a smaller ctx"
            )

        def grow(k: int) -> None:  # word_ids for words[:k]
            if k <= len(word_ids):
                return
            while len(words) < k:  # past the haystack's vocabulary: hyphenated pairs of its words
                free = len(plain) ** 2 - (len(taken) - len(order))  # pairs not made yet
                if k - len(words) > free:
                    raise too_few()
                words.extend(_compounds(rng, plain, taken, min(free, max(k - len(words), len(words) // 4))))
            for ids in pieces.get(words[len(word_ids) : max(k, min(2 * len(word_ids), len(words)))]):
                word_ids.append(ids)
                prefix.append(prefix[-1] + len(ids))

        def entries(n: int) -> int:
            return num_cw * freq_cw + (n - num_cw) * freq_ucw

        def cost(n: int) -> int:  # tokens of the list of n distinct words
            grow(n)
            numbers.ensure(entries(n))
            return numbers.total[entries(n)] + freq_cw * prefix[num_cw] + freq_ucw * (prefix[n] - prefix[num_cw])

        if cost(num_cw) > room:
            raise DatasetError(
                f"ctx={ctx} is too small for cwe: the example and {num_cw} common words x {freq_cw} leave no "
                "room; use a larger ctx or smaller num_cw/freq_cw"
            )
        # cost() grows with n: double past the largest n that fits, then bisect.
        lo, hi = num_cw, num_cw + 1
        while cost(hi) <= room:
            if hi >= most:
                raise too_few()
            lo, hi = hi, min(most, num_cw + 2 * (hi - num_cw))
        n = lo + bisect.bisect_right(range(lo, hi), room, key=cost) - 1
        # Fill what is left with new words used once each (no more often than any listed word),
        # the last one cut to the exact count.
        left, fill = room - cost(n), 0
        while left > 0:
            grow(n + fill + 1)
            numbers.ensure(entries(n) + fill + 1)
            entry = len(numbers.ids[entries(n) + fill + 1]) + len(word_ids[n + fill])
            if entry > left:
                break
            left -= entry
            fill += 1
        counts = [freq_cw] * num_cw + [freq_ucw] * (n - num_cw) + [1] * fill
        index = _word_list(range(n + fill), counts, rng)
        ids: list[int] = []
        for i, j in enumerate(index, 1):
            ids += numbers.ids[i]
            ids += word_ids[j]
        if left > 0:
            ids += (numbers.ids[len(index) + 1] + word_ids[n + fill])[:left]
        info.update(num_words=n, list_entries=len(index), fill_words=fill + (left > 0))
        return ids

    built = synthetic.build(tokenizer, ctx, frame, head, CWE_TAIL.format(n=num_cw), make_list, [])
    answers = list(words[:num_cw])
    meta = {"freq_cw": freq_cw, "freq_ucw": freq_ucw, "example_words": ex_size, **info}
    return built, frame, answers, meta


# ---------------------------------------------------------------------------------------------
# fwe: Zipf-distributed coded words
# ---------------------------------------------------------------------------------------------


def zeta(alpha: float) -> float:
    """Riemann zeta(alpha) for alpha > 1 (scipy.special.zeta in RULER): a partial sum plus its
    Euler-Maclaurin tail."""
    k = 1000
    head = math.fsum(j**-alpha for j in range(1, k))
    return head + k ** (1 - alpha) / (alpha - 1) + k**-alpha / 2 + alpha * k ** (-alpha - 1) / 12


def zipf_counts(num_words: int, vocab_size: int, alpha: float) -> list[int]:
    """RULER's counts: the word of rank k appears int(num_words * k^-alpha / zeta(alpha)) times."""
    z = zeta(alpha)
    return [int(num_words * k**-alpha / z) for k in range(1, vocab_size + 1)]


def _coded_vocab(rng: random.Random, size: int) -> list[str]:
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        w = "".join(rng.choices(string.ascii_lowercase, k=FWE_WORD_LEN))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _fwe(
    tokenizer: Any, ctx: int, rng: random.Random, use_chat_template: bool, alpha: float
) -> tuple[synthetic.Built, Frame, list[str], dict[str, Any]]:
    size = max(ctx // 50, 5)  # RULER's vocab_size: its max length // 50
    vocab = [FWE_NOISE] + _coded_vocab(rng, size - 1)  # rank 1 is the noise word, as in RULER
    frame = make_frame(tokenizer, use_chat_template, FWE_PREFIX)
    info: dict[str, Any] = {}

    def make_text(room: int) -> list[int]:
        pieces = _encode_many(tokenizer, [f" {w}" for w in vocab])
        lens = [len(ids) for ids in pieces]

        def cost(num_words: int) -> int:
            return sum(c * n for c, n in zip(zipf_counts(num_words, size, alpha), lens, strict=True))

        # RULER grows num_words until the text reaches its length; here the largest that fits.
        hi = 1
        while cost(hi) <= room:
            hi *= 2
        num_words = bisect.bisect_right(range(hi), room, key=cost) - 1
        counts = zipf_counts(num_words, size, alpha)
        if not counts[1] > counts[2] > counts[3] > max(counts[4:], default=0):
            raise DatasetError(
                f"ctx={ctx} is too small for fwe: the three answer words would not be the most frequent; "
                "use a larger ctx"
            )
        # The tokens left are more noise words, shuffled in, the last one cut to the exact count.
        left = room - cost(num_words)
        extra, rest = divmod(left, lens[0])
        counts[0] += extra
        seq = _word_list(range(size), counts, rng)
        ids = [t for j in seq for t in pieces[j]] + pieces[0][:rest]
        info.update(num_words=num_words, vocab_size=size, counts=dict(zip(vocab[:4], counts[:4], strict=True)))
        return ids

    built = synthetic.build(tokenizer, ctx, frame, FWE_HEAD, FWE_TAIL, make_text, [])
    return built, frame, vocab[1:4], {"alpha": alpha, **info}


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------


def load(
    tokenizer: Any,
    ctx: int,
    *,
    path: str | None = None,
    task: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    use_chat_template: bool = True,
    haystack: str = "pg19",
    haystack_path: str | None = None,
    depth: Any = None,
    num_samples: int | None = None,
    num_keys: int = 4,
    num_values: int = 4,
    num_queries: int = 4,
    value_type: str = "number",
    num_hops: int = 4,
    num_cw: int = 10,
    freq_cw: int | None = None,
    freq_ucw: int | None = None,
    alpha: float = 2.0,
) -> list[Sample]:
    """``path`` is accepted as the PG-19 haystack data when ``haystack_path`` is not given."""
    task = task or "niah_single"
    if task not in TASKS:
        raise DatasetError(f"dataset.task={task!r} for ruler: use one of {', '.join(TASKS)}")
    n = _int_option("num_samples", num_samples, 1) if num_samples is not None else (limit or DEFAULT_SAMPLES)
    if limit is not None:
        n = min(n, limit)
    num_keys = _int_option("num_keys", num_keys, 1)
    num_values = _int_option("num_values", num_values, 1)
    num_queries = _int_option("num_queries", num_queries, 1)
    num_hops = _int_option("num_hops", num_hops, 1)
    if value_type not in VALUE_TYPES:
        raise DatasetError(f"option value_type={value_type!r}: use one of {', '.join(VALUE_TYPES)}")
    num_cw = _int_option("num_cw", num_cw, 1)
    short = ctx < CWE_SHORT_CTX
    freq_cw = _int_option("freq_cw", freq_cw, 2) if freq_cw is not None else (6 if short else 30)
    freq_ucw = _int_option("freq_ucw", freq_ucw, 1) if freq_ucw is not None else (1 if short else 3)
    if freq_ucw >= freq_cw:
        raise DatasetError(
            f"options freq_cw={freq_cw}, freq_ucw={freq_ucw}: the common words must repeat more often; "
            "set freq_ucw below freq_cw"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 1:
        raise DatasetError(f"option alpha={alpha!r}: use a number > 1 (the zeta distribution's exponent)")
    alpha = float(alpha)
    depths = synthetic.parse_depths(depth, n)
    # fwe needs no text; cwe takes its words from the haystack text.
    text = haystacks.corpus(haystack, haystack_path or path) if task != "fwe" else ""
    vocab = corpus_words(text) if task == "cwe" else ()
    numbers, pieces = _Numbers(tokenizer), _Pieces(tokenizer)
    samples = []
    for i in range(n):
        rng = random.Random(f"ruler:{task}:{seed}:{i}")
        if task == "cwe":
            built, frame, answers, meta = _cwe(
                tokenizer, ctx, rng, vocab, numbers, pieces, use_chat_template, num_cw, freq_cw, freq_ucw
            )
        elif task == "fwe":
            built, frame, answers, meta = _fwe(tokenizer, ctx, rng, use_chat_template, alpha)
        else:
            hay = synthetic.text_haystack(tokenizer, text, rng)
            if task == "variable_tracking":
                built, frame, answers, meta = _variable_tracking(
                    tokenizer, ctx, rng, hay, depths[i], use_chat_template, num_hops
                )
            else:
                built, frame, answers, meta = _niah(
                    tokenizer, ctx, task, rng, hay, depths[i], use_chat_template, num_keys, num_values,
                    num_queries, value_type,
                )
            meta.update(
                depth=round(built.depths[0], 4), requested_depth=depths[i], needle_positions=built.needle_positions
            )
        meta.update(haystack=None if task == "fwe" else haystack, chat_template=frame.chat, truncated=False)
        samples.append(Sample(f"ruler/{task}/{i:04d}", "ruler", task, built.ids, answers, MAX_NEW_TOKENS[task], meta))
    return samples


def score(sample: Sample, prediction: str) -> float | None:
    return string_match_all(prediction, sample.answers) if sample.answers else None
