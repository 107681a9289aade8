"""RULER's synthetic families (niah_multivalue, niah_multiquery, cwe, fwe, needle value types), offline.

The tokenizer is a small byte-level BPE like tests/test_data.py's, trained here on slices of the
PG-19 haystack and on list numbers so that words and numbers take a few tokens each, as with a
real tokenizer (the cwe list then fits at ctx 1024 with RULER's own counts).
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections import Counter
from pathlib import Path

import helpers
import pytest
from omegaconf import OmegaConf

from sparsespec.data import DatasetError, haystacks, load_samples, loader_options, ruler, score

NEEDLE = "One of the special magic {kind} for {key} is: {value}."


def make_tokenizer(chat: bool):
    """Byte-level BPE of 4000 tokens over forty slices of the PG-19 haystack and the numbers."""
    text = haystacks.corpus("pg19")
    step = len(text) // 40
    training = [text[i * step : i * step + 10_000] for i in range(40)] + [" ".join(f"{i}." for i in range(3000))]
    return helpers.make_tokenizer(chat, training, 4000)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(chat=False)


@pytest.fixture(scope="module")
def chat_tok():
    return make_tokenizer(chat=True)


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def between(text: str, start: str, end: str) -> str:
    """The text between the last ``start`` and the last ``end`` after it."""
    a = text.rindex(start) + len(start)
    return text[a : text.rindex(end)]


# ---------------------------------------------------------------------------------------------
# niah_multivalue, niah_multiquery, value types
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ctx", [1024, 2048])
def test_niah_multivalue_hides_every_value_of_one_key(chat_tok, ctx):
    samples = load_samples("ruler", chat_tok, ctx, task="niah_multivalue", limit=2, seed=3)
    assert len(samples) == 2
    for s in samples:
        assert len(s.prompt_ids) == ctx and s.max_new_tokens == 128
        out = decode(chat_tok, s.prompt_ids)
        key = s.meta["key"]
        assert len(s.answers) == 4 and len(set(s.answers)) == 4
        for value in s.answers:
            assert re.fullmatch(r"\d{7}", value)
            assert out.count(NEEDLE.format(kind="numbers", key=key, value=value)) == 1
        assert out.count("One of the special magic numbers for") == 4
        assert len(set(s.meta["needle_positions"])) == 4  # four needles at four places
        assert out.endswith(f" The special magic numbers for {key} mentioned in the provided text are")
        assert score(s, " ".join(s.answers)) == 1.0
        assert score(s, " ".join(s.answers[:3])) == 0.75
        assert score(s, "no idea") == 0.0
    few = load_samples("ruler", chat_tok, 1024, task="niah_multivalue", limit=1, num_values=2)[0]
    assert len(few.answers) == 2 and decode(chat_tok, few.prompt_ids).count("One of the special magic") == 2


@pytest.mark.parametrize("ctx", [1024, 2048])
def test_niah_multiquery_asks_for_every_key(chat_tok, ctx):
    samples = load_samples("ruler", chat_tok, ctx, task="niah_multiquery", limit=2, seed=3)
    for s in samples:
        assert len(s.prompt_ids) == ctx and s.max_new_tokens == 128
        out = decode(chat_tok, s.prompt_ids)
        keys = s.meta["keys"]
        assert len(keys) == 4 and len(set(keys)) == 4 and len(s.answers) == 4
        for key, value in zip(keys, s.answers, strict=True):
            assert out.count(NEEDLE.format(kind="numbers", key=key, value=value)) == 1
        assert out.count("One of the special magic numbers for") == 4
        query = f"{keys[0]}, {keys[1]}, {keys[2]}, and {keys[3]}"  # RULER's query wording
        assert f"What are all the special magic numbers for {query} mentioned in the provided text?" in out
        assert out.endswith(f" The special magic numbers for {query} mentioned in the provided text are")
        assert score(s, ", ".join(s.answers)) == 1.0
        assert score(s, s.answers[0]) == 0.25
    two = load_samples("ruler", chat_tok, 1024, task="niah_multiquery", limit=1, num_queries=2)[0]
    assert len(two.answers) == 2
    assert f"for {two.meta['keys'][0]}, and {two.meta['keys'][1]} mentioned" in decode(chat_tok, two.prompt_ids)


@pytest.mark.parametrize(
    ("value_type", "kind", "pattern"),
    [
        ("number", "numbers", r"\d{7}"),
        ("word", "words", r"[a-z]+-[a-z]+"),
        ("uuid", "uuids", r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"),
    ],
)
def test_needle_value_types(tok, value_type, kind, pattern):
    for task in ("niah_single", "niah_multikey", "niah_multivalue"):
        s = load_samples("ruler", tok, 1024, task=task, limit=1, value_type=value_type)[0]
        assert len(s.prompt_ids) == 1024 and s.meta["value_type"] == value_type
        out = decode(tok, s.prompt_ids)
        assert out.count(f"Some special magic {kind} are hidden") == 1
        assert out.count(f"I will quiz you about the {kind} afterwards.") == 1
        for value in s.answers:
            assert re.fullmatch(pattern, value) and value != s.meta["key"]
            assert NEEDLE.format(kind=kind, key=s.meta["key"], value=value) in out
        if value_type == "uuid":
            assert all(uuid.UUID(v).version == 4 for v in s.answers)
        assert out.endswith(f" The special magic {kind} for {s.meta['key']} mentioned in the provided text are")
        assert score(s, " ".join(s.answers)) == 1.0


# ---------------------------------------------------------------------------------------------
# cwe
# ---------------------------------------------------------------------------------------------


def cwe_list(out: str) -> list[str]:
    """The words of the asked list (after the solved example), checking its numbering."""
    listed = between(out, ruler.CWE_HEAD, "\nQuestion: What are the")
    entries = re.findall(r"(\d+)\. (\S+)", listed)
    assert [int(n) for n, _ in entries] == list(range(1, len(entries) + 1))
    return [w for _, w in entries]


@pytest.mark.parametrize(("ctx", "freq_cw", "freq_ucw"), [(1024, 6, 1), (2048, 6, 1), (4096, 30, 3)])
def test_cwe_common_words_are_the_most_frequent(chat_tok, ctx, freq_cw, freq_ucw):
    samples = load_samples("ruler", chat_tok, ctx, task="cwe", limit=2, seed=5)
    assert len(samples) == 2
    for s in samples:
        assert len(s.prompt_ids) == ctx and s.max_new_tokens == 120
        assert (s.meta["freq_cw"], s.meta["freq_ucw"]) == (freq_cw, freq_ucw)  # RULER's counts at this ctx
        out = decode(chat_tok, s.prompt_ids)
        assert out.count("Below is a numbered list of words.") == 2  # RULER's solved example, then the task
        assert out.count(ruler.CWE_PREFIX.format(n=10)) == 2
        assert out.endswith("\nQuestion: What are the 10 most common words in the above list?<|end|>\n<|assistant|>\n"
                            " Answer: The top 10 words that appear most often in the list are:")
        counts = Counter(cwe_list(out))
        assert len(s.answers) == 10 and len(set(s.answers)) == 10
        assert all(counts[w] == freq_cw for w in s.answers)
        others = [c for w, c in counts.items() if w not in s.answers]
        assert len(others) >= 10 and max(others) <= freq_ucw < freq_cw
        assert {w for w, _ in counts.most_common(10)} == set(s.answers)
        # The list is as long as ctx allows: the fill after RULER's list is a word or two.
        assert s.meta["num_words"] <= len(counts) <= s.meta["num_words"] + s.meta["fill_words"]
        assert s.meta["fill_words"] <= 2 * freq_ucw + 1
        example_words = set(re.findall(r"\d+\. (\S+)", out[: out.rindex(ruler.CWE_HEAD)]))
        assert not example_words & set(s.answers)
        answer = " ".join(f"{i + 1}. {w}" for i, w in enumerate(s.answers))
        assert score(s, answer) == 1.0
        assert score(s, " ".join(s.answers[:5])) == 0.5
        assert score(s, "12345") == 0.0


def test_cwe_options_and_words_beyond_the_haystack_vocabulary(tok, monkeypatch):
    s = load_samples("ruler", tok, 2048, task="cwe", limit=1, num_cw=5, freq_cw=8, freq_ucw=2)[0]
    assert len(s.prompt_ids) == 2048 and len(s.answers) == 5
    out = decode(tok, s.prompt_ids)
    assert out.endswith("What are the 5 most common words in the above list? Answer: The top 5 words that appear "
                        "most often in the list are:")
    counts = Counter(cwe_list(out))
    assert all(counts[w] == 8 for w in s.answers) and max(c for w, c in counts.items() if w not in s.answers) <= 2
    # A haystack of 100 distinct words: the list goes on with hyphenated pairs of them.
    syllables = ["ba", "ke", "lo", "mu", "ri", "sa", "to", "ve", "ni", "fo"]
    small = " ".join(a + b for a, b in itertools.product(syllables, syllables))
    monkeypatch.setattr(haystacks, "corpus", lambda name, path=None: small)
    s = load_samples("ruler", tok, 4096, task="cwe", limit=1)[0]
    assert len(s.prompt_ids) == 4096
    counts = Counter(cwe_list(decode(tok, s.prompt_ids)))
    assert {w for w, _ in counts.most_common(10)} == set(s.answers) and all(counts[w] == 30 for w in s.answers)
    assert any("-" in w for w in counts) and all("-" not in w for w in s.answers)
    monkeypatch.setattr(haystacks, "corpus", lambda name, path=None: "just a few words here")
    with pytest.raises(DatasetError, match="distinct words"):
        load_samples("ruler", tok, 4096, task="cwe", limit=1)


# ---------------------------------------------------------------------------------------------
# fwe
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ctx", [1024, 2048])
def test_fwe_answers_are_the_three_most_frequent_coded_words(chat_tok, ctx):
    samples = load_samples("ruler", chat_tok, ctx, task="fwe", limit=2, seed=7)
    for s in samples:
        assert len(s.prompt_ids) == ctx and s.max_new_tokens == 50
        out = decode(chat_tok, s.prompt_ids)
        assert out.startswith("<|user|>\n" + ruler.FWE_HEAD + " ")
        assert out.endswith(ruler.FWE_TAIL + "<|end|>\n<|assistant|>\n" + ruler.FWE_PREFIX)
        words = between(out, ruler.FWE_HEAD, "\nQuestion: Do not provide").split()
        coded = Counter(w for w in words if re.fullmatch(r"[a-z]{6}", w))
        assert len(s.answers) == 3 and all(re.fullmatch(r"[a-z]{6}", w) for w in s.answers)
        top = coded.most_common(4)
        assert [w for w, _ in top[:3]] == s.answers  # in rank order
        assert top[0][1] > top[1][1] > top[2][1] > top[3][1]
        assert sum(w == "..." for w in words) > top[0][1]  # the noise word ranks first, as in RULER
        assert len(coded) > 5 and s.meta["vocab_size"] == ctx // 50
        assert score(s, ", ".join(s.answers)) == 1.0
        assert score(s, s.answers[0]) == pytest.approx(1 / 3)
        assert score(s, top[3][0]) == 0.0


def test_fwe_alpha_sets_the_zipf_exponent(tok):
    steep = load_samples("ruler", tok, 2048, task="fwe", limit=1, alpha=3.0)[0].meta["counts"]
    flat = load_samples("ruler", tok, 2048, task="fwe", limit=1)[0].meta["counts"]

    def ratio(counts: dict[str, int]) -> float:
        c = [v for w, v in counts.items() if w != "..."]
        return c[0] / c[1]

    assert ratio(flat) == pytest.approx((3 / 2) ** 2, rel=0.1)
    assert ratio(steep) == pytest.approx((3 / 2) ** 3, rel=0.1)
    assert ruler.zeta(2.0) == pytest.approx(3.14159265358979**2 / 6, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# all new tasks: determinism, options
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["niah_multivalue", "niah_multiquery", "cwe", "fwe"])
def test_new_tasks_are_deterministic_by_seed(tok, task):
    a, b, c = (load_samples("ruler", tok, 1024, task=task, limit=2, seed=seed) for seed in (1, 1, 2))
    assert [s.prompt_ids for s in a] == [s.prompt_ids for s in b]
    assert [s.answers for s in a] == [s.answers for s in b]
    assert [s.prompt_ids for s in a] != [s.prompt_ids for s in c]
    assert a[0].answers != a[1].answers  # samples differ from each other too
    assert [s.sample_id for s in a] == [f"ruler/{task}/0000", f"ruler/{task}/0001"]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_values": 0}, "num_values=0"),
        ({"num_queries": "4"}, "num_queries='4'"),
        ({"value_type": "hex"}, "value_type='hex'.*number, word, uuid"),
        ({"num_cw": 0}, "num_cw=0"),
        ({"freq_cw": 1}, "freq_cw=1"),
        ({"freq_ucw": 0}, "freq_ucw=0"),
        ({"freq_cw": 3, "freq_ucw": 3}, "freq_cw=3, freq_ucw=3.*freq_ucw below freq_cw"),
        ({"alpha": 1.0}, "alpha=1.0.*> 1"),
        ({"alpha": True}, "alpha=True"),
    ],
)
def test_bad_options_name_the_option(tok, options, match):
    with pytest.raises(DatasetError, match=match):
        load_samples("ruler", tok, 1024, task="cwe", limit=1, **options)


def test_unknown_task_lists_every_task_and_small_ctx_is_an_error(tok):
    with pytest.raises(DatasetError) as e:
        load_samples("ruler", tok, 1024, task="qa_1", limit=1)
    for task in ruler.TASKS:
        assert task in str(e.value)
    for task in ("cwe", "fwe"):
        with pytest.raises(DatasetError, match="ctx=160 is too small"):
            load_samples("ruler", tok, 160, task=task, limit=1)


def test_yaml_lists_every_option_with_its_default():
    conf = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "dataset" / "ruler.yaml")
    assert set(conf.options) == set(loader_options("ruler"))
    text = (Path(__file__).resolve().parents[1] / "conf" / "dataset" / "ruler.yaml").read_text()
    for name in ("num_values", "num_queries", "value_type", "num_cw", "freq_cw", "freq_ucw", "alpha"):
        assert re.search(rf"^  {name}: .+# \S", text, re.M), f"{name} needs a value and a comment"
