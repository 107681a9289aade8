"""The evaluation harness end to end: evaluate.py on a tiny random Llama saved with its tokenizer.

The output contract (docs/architecture.md), several methods in one run (token-identical to ar), bad input
(non-zero exit, a message naming the key, no results file), resume (skips finished pairs, repairs a
torn line, survives a real SIGKILL), the ctx forms, and the report rebuilt by
`python -m sparsespec.experiments report`.
evaluate.py runs in a subprocess only where the entry point itself is under test; everything else
composes the same config with Hydra and calls run_evaluation in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    CONF,
    CTX,
    NEW,
    ROOT,
    base_overrides,
    evaluate_cmd,
    pairs,
    run_evaluate,
    run_inproc,
    sub_env,
)
from hydra import compose, initialize_config_dir

from sparsespec.config import parse_ctx, register_configs
from sparsespec.eval.harness import EvaluationError, with_baseline
from sparsespec.eval.methods import Method
from sparsespec.eval.results import CONTRACT_FIELDS, read_rows
from sparsespec.eval.summary import PLOTS, build_report, summarize

PNG = b"\x89PNG\r\n\x1a\n"

register_configs()


@pytest.fixture
def env(harness_env):
    """The tiny target, a drafter with another tokenizer and six documents (conftest.harness_env)."""
    return harness_env


@pytest.fixture(autouse=True)
def _isolated(isolated):
    """Every test's caches in its own tmp_path (conftest.isolated)."""
    return isolated


# ---------------------------------------------------------------------------------------------
# the entry point: a method list, the output contract, the report
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow  # starts evaluate.py (or a script) in its own process
def test_evaluate_method_list_output_contract(env, tmp_path):
    out = tmp_path / "run"
    proc = run_evaluate(env, out, "method=[ar,magicdec,sparsespec_l]", "limit=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_rows(out / "results.jsonl")
    samples = ["text/doc0", "text/doc1"]
    assert pairs(rows) == [(s, m) for s in samples for m in ("ar", "magicdec", "sparsespec_l")]
    for r in rows:
        assert set(CONTRACT_FIELDS) <= set(r), set(CONTRACT_FIELDS) - set(r)
        assert r["dataset"] == "text" and r["ctx"] == CTX and r["prompt_tokens"] == CTX
        assert r["new_tokens"] == NEW == len(r["output_ids"]) and all(isinstance(t, int) for t in r["output_ids"])
        assert r["prefill_s"] > 0 and r["wall_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["wall_s"])
        assert r["verify_steps"] > 0
    by = {(r["sample_id"], r["method"]): r for r in rows}
    for s in samples:
        ar = by[(s, "ar")]
        assert ar["acceptance_rate"] is None and ar["mean_accepted_tokens"] is None and ar["speedup"] is None
        assert ar["draft_steps"] == 0 and ar["verify_steps"] == NEW - 1  # the first token comes from prefill
        for m in ("magicdec", "sparsespec_l"):
            r = by[(s, m)]
            assert r["output_ids"] == ar["output_ids"], f"{m} on {s} differs from ar"
            assert 0.0 <= r["acceptance_rate"] <= 1.0 and r["mean_accepted_tokens"] >= 1.0 and r["draft_steps"] > 0
            assert r["speedup"] == pytest.approx(ar["wall_s"] / r["wall_s"])
            assert r["exact_match_ar"] is True
            assert 0 < r["budget_tokens"] < CTX  # a sparse view, recorded for acceptance-vs-budget
    summary = json.loads((out / "summary.json").read_text())
    assert [(e["method"], e["n"], e["ctx"]) for e in summary] == [(m, 2, CTX) for m in ("ar", "magicdec", "sparsespec_l")]
    assert summary[1]["exact_match_ar"]["mean"] == 1.0 and summary[1]["speedup"]["n"] == 2
    md = (out / "summary.md").read_text()
    for word in ("tokens/s", "speedup", "α", "τ", "magicdec", "sparsespec_l", "± "):
        assert word in md
    assert "| sparsespec_l | text | 192 | 2 |" in md
    assert "magicdec" in proc.stdout and "results.jsonl" in proc.stdout  # the table is printed
    # sentences made from the numbers, printed and in summary.md; the controller's calibration too
    for method in ("magicdec", "sparsespec_l"):
        sentence = next(line for line in md.splitlines() if line.startswith(f"On text at 192 context (2 samples), {method}"))
        assert "ms verifying with the full cache" in sentence and "token-identical to ar's on every sample" in sentence
        assert sentence in proc.stdout
    assert "ms updating its recall index" in md and "predicted α | observed α" in md
    assert "| sparsespec_l | text | 192 |" in md.split("predicted α")[1]
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == PNG, name
    assert (out / "config.yaml").is_file() and (out / "run.json").is_file()
    # where the rows were made: the code, the machine and its load, once per process that wrote rows
    [prov] = json.loads((out / "provenance.json").read_text())
    assert prov["rows"] == 6 and len(prov["commit"]) == 40 and prov["cores"] >= 1 and prov["wall_s"] > 0
    assert f"<sub>Provenance: commit {prov['commit'][:7]}" in md
    # the command that made the results, kept beside them (tables built from them cite it)
    command = (out / "command.txt").read_text().splitlines()
    assert command == ["python evaluate.py " + " ".join(base_overrides(env, out, "'method=[ar,magicdec,sparsespec_l]'",
                                                                         "limit=2"))]


def _headline_row(method: str, sample: str, wall: float, out: list[int], **extra) -> dict:
    return {"sample_id": sample, "dataset": "pg19", "task": None, "ctx": 4096, "method": method, "new_tokens": 100,
            "wall_s": wall, "prompt_tokens": 4096, "output_ids": out, **extra}


def test_headline_sentences_follow_the_numbers():
    from sparsespec.eval.summary import calibration_table, headline

    spec = {"k_mean": 4.0, "acceptance_rate": 0.75, "mean_accepted_tokens": 4.0, "draft_s": 2.0, "verify_s": 1.0,
            "overhead_s": 0.5, "engine_index_update_s": 0.5, "verify_steps": 25, "budget_tokens": 410}
    rows = [_headline_row("ar", "a", 10.0, [1, 2]), _headline_row("fast", "a", 5.0, [1, 2], speedup=2.0, exact_match_ar=True, **spec),
            _headline_row("slow", "a", 20.0, [1, 3], speedup=0.5, exact_match_ar=False, **spec)]
    fast, slow = headline(rows)
    assert fast.startswith("On pg19 at 4k context (1 sample), fast decoded 20.0 tokens/s against ar's 10.0")
    assert "2.00× ar, faster than ar" in fast and "sparse view of 410 of 4096 cached tokens" in fast
    # per round: 2 s / 25 rounds drafting, 1 s verifying, 0.5 s index (the whole overhead)
    assert "80 ms drafting, 40 ms verifying with the full cache and 20 ms updating its recall index" in fast
    assert "a token cost 50 ms against ar's 100 ms" in fast and "token-identical to ar's." in fast
    assert "0.50× ar, slower than ar" in slow and "differed from ar's on 1 of 1 samples" in slow
    assert headline([_headline_row("ar", "a", 10.0, [1])]) == []
    # a verdict only as strong as the samples allow: one sample at 1.03x, two whose spread spans 1
    [close] = headline([_headline_row("ar", "a", 10.0, [1]), _headline_row("m", "a", 9.7, [1], speedup=1.03)])
    assert "1.03× ar, within 5% of ar, which one sample cannot tell from noise." in close
    [spread] = headline([_headline_row("ar", s, 10.0, [1]) for s in "ab"]
                        + [_headline_row("m", s, 9.0, [1], speedup=v) for s, v in (("a", 1.2), ("b", 0.9))])
    assert "1.05× ar, as fast as ar within the spread over samples (± 0.21)." in spread
    assert calibration_table(rows) == ""
    rows[1]["engine_calibration"] = {"predicted": 0.8, "observed": 0.6, "n": 10}
    rows[1]["engine_prefix_acceptance"] = {"1": {"observed": 0.7, "predicted": 0.9, "n": 5}}
    assert "| fast | pg19 | 4k | 10 | 0.80 | 0.60 | 0.70 vs 0.90 / — / — / — |" in calibration_table(rows)


def test_ar_runs_first_so_every_row_gets_its_speedup():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        mcfgs = [compose("evaluate", overrides=[f"method={m}"]).method for m in ("magicdec", "sparsespec_l")]
        ar_cfg = compose("evaluate", overrides=["method=ar"]).method
    methods, ar = [Method.from_config(c) for c in mcfgs], Method.from_config(ar_cfg)
    assert [m.name for m in with_baseline(methods, "ar")] == ["ar", "magicdec", "sparsespec_l"]
    assert [m.name for m in with_baseline([*methods, ar], None)] == ["ar", "magicdec", "sparsespec_l"]
    assert [m.name for m in with_baseline(methods, None)] == ["magicdec", "sparsespec_l"]
    # the implicit baseline and an explicit `method=ar` are the same method settings (resume relies on it)
    assert with_baseline(methods, "ar")[0].as_dict() == with_baseline([ar], None)[0].as_dict()
    with pytest.raises(EvaluationError, match="twice"):
        with_baseline([methods[0], methods[0]], None)


# ---------------------------------------------------------------------------------------------
# bad input: non-zero exit, a message naming the key and the fix, no results file
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow  # starts evaluate.py (or a script) in its own process
def test_unknown_method_and_missing_model_exit_nonzero_without_results(env, tmp_path):
    out = tmp_path / "unknown"
    proc = run_evaluate(env, out, "method=nosuch")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "method/nosuch" in text and "magicdec" in text  # Hydra names the group and lists the options
    assert not (out / "results.jsonl").exists()

    out = tmp_path / "unknown_in_list"
    proc = run_evaluate(env, out, "method=[ar,nosuch]")
    assert proc.returncode != 0 and "method/nosuch" in proc.stdout + proc.stderr
    assert not (out / "results.jsonl").exists()

    out = tmp_path / "missing_model"
    missing = tmp_path / "no_such_model"
    proc = run_evaluate(env, out, f"model.path={missing}")
    assert proc.returncode == 2  # evaluate.py's exit code for bad input
    assert f"model.path={missing} does not exist" in proc.stdout + proc.stderr
    assert not (out / "results.jsonl").exists() and not out.exists()


@pytest.mark.slow  # starts evaluate.py in its own process
def test_a_missing_drafter_path_is_named_as_drafter_path(env, tmp_path):
    """The key in the message is the one the user set: a drafter's path is drafter.path, never the
    model.path of the loader underneath; checked before the target loads where the path is local."""
    missing = tmp_path / "no_drafter"
    out = tmp_path / "missing_drafter"
    proc = run_evaluate(env, out, "method=sd", f"drafter.path={missing}")
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "drafter.path" in ln]
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert errors[0].endswith(f"drafter.path='{missing}' does not exist: pass the drafter's model directory "
                              "(a train.py export, or any model with the target's tokenizer) or a hub id")
    assert not out.exists()
    # a name without a folder is taken as a hub id (offline here): still drafter.path, not model.path
    proc = run_evaluate(env, out, "method=sd", "drafter.path=no_such_drafter")
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "drafter.path" in ln]
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "drafter.path=no_such_drafter was taken as a Hugging Face hub id" in errors[0]
    assert "model.path" not in errors[0] and not out.exists()


def _bad_inputs(env, tmp: Path) -> dict[str, tuple[list[str], str]]:
    binary = tmp / "latin1.txt"
    binary.write_bytes("caf\xe9 au lait ".encode("latin-1") * 50)
    empty_dir = tmp / "empty_dir"
    empty_dir.mkdir()
    return {
        "missing dataset.path": ([f"dataset.path={tmp / 'nope.txt'}"], "does not exist"),
        "undecodable dataset.path": ([f"dataset.path={binary}"], "not valid UTF-8"),
        "dataset.path without documents": ([f"dataset.path={empty_dir}"], "holds no"),
        "ctx longer than the documents": (["ctx=1900"], "shorter than ctx=1900"),
        "ctx not a length": (["ctx=lots"], "ctx='lots'"),
        "method.drafter.policy.budget=0": (["method=magicdec", "method.drafter.policy.budget=0"], "method.drafter.policy.budget=0"),
        "method.controller.k=0": (["method=magicdec", "method.controller.k=0"], "method.controller.k=0"),
        "a zero candidate draft length": (["method=sparsespec_l", "method.controller.candidates=[0]"],
                                             "method.controller.candidates=[0]"),
        "a _target_ that cannot be imported": (["method=magicdec", "method.drafter._target_=nosuch.Drafter"],
                                               "method.drafter._target_='nosuch.Drafter' cannot be imported"),
        "drafter with another tokenizer": (["method=sd", f"drafter.path={env['other']}"],
                                           "tokenizer differs from the target's"),
        "small-model method without drafter": (["method=sd_sparse"], "drafter.path=DIR"),
        "missing drafter.path": (["method=sd", f"drafter.path={tmp / 'no_drafter'}"],
                                 f"drafter.path='{tmp / 'no_drafter'}' does not exist"),
        "drafter.path without a model": (["method=sd", f"drafter.path={empty_dir}"],
                                         f"drafter.path={empty_dir} is a directory without config.json"),
        "baseline other than ar": (["baseline=magicdec"], "baseline='magicdec' is not allowed"),
        "gen.max_new_tokens=0": (["gen.max_new_tokens=0"], "gen.max_new_tokens=0"),
        "gen.batch_size=0": (["gen.batch_size=0"], "gen.batch_size=0"),
        "gen.batch_size not an integer": (["gen.batch_size=two"], "gen.batch_size"),
    }


def test_bad_input_raises_naming_the_key_and_writes_nothing(env, tmp_path):
    for name, (extra, message) in _bad_inputs(env, tmp_path).items():
        out = tmp_path / name.replace(" ", "_").replace("=", "_")
        with pytest.raises(EvaluationError) as e:
            run_inproc(env, out, *extra)
        assert message in str(e.value), f"{name}: {e.value}"
        assert not (out / "results.jsonl").exists(), name
        assert not out.exists(), f"{name}: out_dir was created before the input was checked"


# ---------------------------------------------------------------------------------------------
# resume
# ---------------------------------------------------------------------------------------------


def test_resume_skips_finished_pairs_and_repairs_a_torn_line(env, tmp_path):
    out = tmp_path / "run"
    first = run_inproc(env, out, "limit=2", "method=magicdec")
    assert pairs(first) == [(f"text/doc{i}", m) for i in range(2) for m in ("ar", "magicdec")]

    # the same run again: nothing to do, nothing duplicated, nothing rewritten
    assert run_inproc(env, out, "limit=2", "method=magicdec") == first
    # more samples: only the new pairs run; the finished lines are kept byte for byte
    before = (out / "results.jsonl").read_bytes()
    more = run_inproc(env, out, "limit=3", "method=magicdec")
    assert (out / "results.jsonl").read_bytes().startswith(before)
    assert more[:4] == first and pairs(more[4:]) == [("text/doc2", "ar"), ("text/doc2", "magicdec")]
    # a new method in the list: only its pairs run
    again = run_inproc(env, out, "limit=3", methods=("ar", "magicdec", "sparsespec_l"))
    assert again[:6] == more and sorted(pairs(again[6:])) == [(f"text/doc{i}", "sparsespec_l") for i in range(3)]
    assert all(r["speedup"] is not None for r in again if r["method"] != "ar")

    # a kill mid-write leaves half a line: the rerun keeps whole lines only and redoes that pair
    data = (out / "results.jsonl").read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    (out / "results.jsonl").write_bytes(data[: last_start + (len(data) - last_start) // 2])
    repaired = run_inproc(env, out, "limit=3", methods=("ar", "magicdec", "sparsespec_l"))
    lines = (out / "results.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines) and len(lines) == len(repaired) == 9
    assert sorted(pairs(repaired)) == sorted(pairs(again))
    assert repaired[:8] == again[:8]
    assert repaired[8]["output_ids"] == again[8]["output_ids"]

    # other settings into the same out_dir would mix results: refused before anything is written
    data = (out / "results.jsonl").read_bytes()
    with pytest.raises(EvaluationError, match="gen.max_new_tokens=10 before, 12 now"):
        run_inproc(env, out, "limit=3", "gen.max_new_tokens=12")
    with pytest.raises(EvaluationError, match="method.controller.k=4 before, 6 now"):
        run_inproc(env, out, "limit=3", "method=magicdec", "method.controller.k=6")
    assert (out / "results.jsonl").read_bytes() == data


@pytest.mark.slow  # starts evaluate.py (or a script) in its own process
def test_rerun_after_sigkill_has_no_duplicate_and_no_missing_row(env, tmp_path):
    out = tmp_path / "killed"
    # 5 samples x 2 methods: the first line lands well before the end
    extra = ("method=magicdec", "method.controller.k=1", "limit=5", "gen.max_new_tokens=12")
    proc = subprocess.Popen(evaluate_cmd(env, out, *extra), cwd=ROOT, env=sub_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    results = out / "results.jsonl"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if results.exists() and results.read_bytes().count(b"\n") >= 1:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "evaluate.py ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed = read_rows(results)
    assert 1 <= len(killed) < 10

    rerun = run_evaluate(env, out, *extra)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    rows = read_rows(results)
    expected = [(f"text/doc{i}", m) for i in range(5) for m in ("ar", "magicdec")]
    assert sorted(pairs(rows)) == sorted(expected) and len(rows) == len(expected)
    assert rows[: len(killed)] == killed  # finished pairs were not run again
    by = {(r["sample_id"], r["method"]): r for r in rows}
    assert all(by[(s, "magicdec")]["output_ids"] == by[(s, "ar")]["output_ids"] for s, _ in expected)
    assert all(by[(s, "magicdec")]["speedup"] is not None for s, _ in expected)
    assert len(results.read_text().splitlines()) == 10


# ---------------------------------------------------------------------------------------------
# ctx: a label or a number of tokens, in the same key
# ---------------------------------------------------------------------------------------------


def test_ctx_label_and_integer_both_compose_and_run(env, tmp_path):
    # ctx stays a plain key: with a config group named ctx, Hydra rejects `ctx=5000` ("Config group
    # override must be a string or a list. Got int"), which the output contract and sweeps need.
    assert not (CONF / "ctx").exists()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        assert [parse_ctx(compose("evaluate", overrides=[f"ctx={v}"]).ctx) for v in ("64k", "5000", "1k", "128k")] == \
            [65536, 5000, 1024, 131072]
    rows = run_inproc(env, tmp_path / "label", "ctx=1k", "limit=1", "baseline=null", "method=magicdec")
    assert [(r["ctx"], r["prompt_tokens"]) for r in rows] == [(1024, 1024)]
    rows = run_inproc(env, tmp_path / "int", "ctx=300", "limit=1", "baseline=null", "method=ar")
    assert [(r["ctx"], r["prompt_tokens"]) for r in rows] == [(300, 300)]


def test_default_out_dir_differs_per_multirun_job():
    # `${now:}` resolves once per process, so a timestamp alone would put every job of
    # `evaluate.py -m ctx=4k,8k` in one out_dir, where the second would "resume" the first.
    from hydra.core.hydra_config import HydraConfig

    dirs = []
    try:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            for ovr in (["ctx=4k"], ["ctx=8k"], ["ctx=8k", "method=magicdec", "model.path=/m/x", "dataset.path=/d/y"]):
                cfg = compose("evaluate", overrides=ovr, return_hydra_config=True)
                HydraConfig.instance().set_config(cfg)
                dirs.append(Path(cfg.out_dir))
    finally:
        HydraConfig.instance().cfg = None  # as outside a Hydra app, for the other tests
    assert dirs[0].name == "ctx=4k" and dirs[1].name == "ctx=8k"
    assert dirs[2].name == "ctx=8k,method=magicdec"  # paths stay out of the name
    assert dirs[0].parts[:2] == ("outputs", "evaluate")


# ---------------------------------------------------------------------------------------------
# task scores and the report
# ---------------------------------------------------------------------------------------------


def test_task_scores_match_ar_when_outputs_do(env, tmp_path):
    out = tmp_path / "passkey"
    rows = run_inproc(env, out, "dataset=infinitebench", "dataset.task=passkey", "dataset.path=null", "ctx=256",
                      "limit=2", "method=magicdec", "gen.use_task_length=true")
    assert pairs(rows) == [(f"infinitebench/passkey/{i:04d}", m) for i in range(2) for m in ("ar", "magicdec")]
    assert {r["new_tokens"] for r in rows} == {6}  # InfiniteBench's passkey length, under gen.max_new_tokens=10
    for ar, md in zip(rows[::2], rows[1::2], strict=True):
        assert ar["score"] in (0.0, 1.0) and md["score"] == ar["score"] and md["output_ids"] == ar["output_ids"]
    summary = json.loads((out / "summary.json").read_text())
    assert [(e["dataset"], e["task"], e["score"]["n"]) for e in summary] == [("infinitebench", "passkey", 2)] * 2
    assert summary[0]["score"]["mean"] == summary[1]["score"]["mean"]
    assert "infinitebench/passkey" in (out / "summary.md").read_text()


def test_the_scored_answer_ends_at_the_first_eos(env):
    from sparsespec.data import Sample, score
    from sparsespec.eval.harness import answer_text

    tok = env["tok"]
    ids = tok("the ferryman", add_special_tokens=False)["input_ids"]
    tail = tok(" crossed the river back again", add_special_tokens=False)["input_ids"]
    sample = Sample("longbench/narrativeqa/1", "longbench", "narrativeqa", [0], ["the ferryman"], 128)
    text, after = answer_text(tok, ids + [tok.eos_token_id] + tail, {tok.eos_token_id})
    assert text == "the ferryman" and after == " crossed the river back again"
    assert score(sample, text) == 1.0 > score(sample, text + after)  # what scoring the whole output would give
    assert answer_text(tok, ids, {tok.eos_token_id}) == ("the ferryman", None)


def _row(sample: str, method: str, ctx: int, wall: float, alpha=None, budget=None, conf=None, accepted=None) -> dict:
    r = {"sample_id": sample, "dataset": "pg19", "task": None, "method": method, "ctx": ctx, "prompt_tokens": ctx,
         "new_tokens": 8, "output_ids": list(range(8)), "prefill_s": 0.5, "wall_s": wall, "tokens_per_s": 8 / wall,
         "acceptance_rate": alpha, "mean_accepted_tokens": None if alpha is None else 1 + 4 * alpha,
         "draft_steps": 0 if alpha is None else 12, "verify_steps": 7 if alpha is None else 3, "speedup": None,
         "budget_tokens": budget, "method_config": conf or {"name": method}, "temperature": 0.0, "seed": 0,
         "exact_match_ar": True, "score": None}
    if accepted is not None:
        r["accepted_per_round"] = accepted
    return r


@pytest.mark.slow  # starts evaluate.py (or the report command) in its own process
def test_report_command_rebuilds_summary_and_plots_from_several_runs(tmp_path):
    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    rows1, rows2 = [], []
    for ctx, rows in ((1024, rows1), (2048, rows2)):
        for s, ar_wall in (("a", 2.0), ("b", 4.0)):
            rows.append(_row(s, "ar", ctx, ar_wall))
            for budget, wall, alpha in ((64, 1.0, 0.5), (128, 0.5, 0.75)):
                r = _row(s, "magicdec", ctx, wall * ar_wall / 2, alpha, budget,
                         {"name": "magicdec", "k": 4, "budget": budget}, accepted=[0, 4, 2])
                r["speedup"] = ar_wall / r["wall_s"]
                rows.append(r)
    for d, rows in ((run1, rows1), (run2, rows2)):
        d.mkdir()
        (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"sample_id": "torn')
    out = tmp_path / "report"
    # run1 twice (a file and its directory): its rows count once
    proc = subprocess.run([sys.executable, "-m", "sparsespec.experiments", "report", str(run1 / "results.jsonl"),
                           str(run2 / "results.jsonl"), str(run1), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    got = {(e["ctx"], e["method"], e["variant"]): e for e in summary}
    assert sorted(got) == [(c, m, v) for c in (1024, 2048) for m, v in
                           (("ar", ""), ("magicdec", "budget=128"), ("magicdec", "budget=64"))]
    e = got[(1024, "magicdec", "budget=64")]
    assert e["n"] == 2 and e["speedup"]["mean"] == pytest.approx(2.0) and e["speedup"]["std"] == 0.0
    assert e["acceptance_rate"]["mean"] == 0.5 and e["budget_tokens"]["mean"] == 64
    assert e["tokens_per_s"]["mean"] == pytest.approx((8 / 1.0 + 8 / 2.0) / 2)  # walls 1.0 and 2.0
    assert e["tokens_per_s"]["std"] == pytest.approx(8 ** 0.5)  # sample std of (8, 4)
    assert got[(2048, "magicdec", "budget=128")]["speedup"]["mean"] == pytest.approx(4.0)
    assert got[(1024, "ar", "")]["n"] == 2 and got[(1024, "ar", "")]["speedup"] is None
    md = (out / "summary.md").read_text()
    assert "| magicdec (budget=64) | pg19 | 1k | 2 | 6.00 ± 2.83 | 2.00 ± 0.00 | 0.50 ± 0.00 |" in md
    assert "magicdec (budget=128)" in proc.stdout
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == PNG, name

    bad = subprocess.run([sys.executable, "-m", "sparsespec.experiments", "report", str(tmp_path / "none.jsonl"),
                          "--out", str(tmp_path / "r2")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no such results file" in bad.stderr


def test_build_report_in_process_matches_summarize(tmp_path):
    rows = [_row("a", "ar", 4096, 2.0), _row("a", "magicdec", 4096, 1.0, 0.5, 400, accepted=[1, 1])]
    rows[1]["speedup"] = 2.0
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_report([tmp_path], tmp_path / "out")
    assert report["summary"] == summarize(rows)
    assert [Path(p).name for p in report["plots"]] == list(PLOTS)
    assert "| magicdec | pg19 | 4k | 1 |" in (tmp_path / "out" / "summary.md").read_text()


def test_batched_evaluation_writes_the_rows_of_batch_size_one(env, tmp_path):
    """gen.batch_size=4: four samples decoded together per method, each row's greedy output equal
    to the unbatched run's; rows and summary report the batch and its aggregate throughput against
    batched ar; a batch larger than the samples shrinks to them."""
    methods = ("ar", "sparsespec_l", "magicdec")
    alone = run_inproc(env, tmp_path / "b1", "limit=4", methods=methods)
    out = tmp_path / "b4"
    batched = run_inproc(env, out, "limit=4", "gen.batch_size=4", methods=methods)
    assert pairs(batched) == [(f"text/doc{i}", m) for m in methods for i in range(4)]  # a batch per method
    by = {(r["sample_id"], r["method"]): r for r in alone}
    for r in batched:
        assert r["output_ids"] == by[(r["sample_id"], r["method"])]["output_ids"], (r["sample_id"], r["method"])
        assert r["batch_size"] == 4 and r["aggregate_tokens_per_s"] > 0 and r["exact_match_ar"] is True
        assert (r["aggregate_speedup"] is None) == (r["method"] == "ar")
    assert all(r["batch_size"] == 1 and r["aggregate_tokens_per_s"] == pytest.approx(r["tokens_per_s"]) for r in alone)
    md = (out / "summary.md").read_text()
    assert "| B | aggregate tokens/s | aggregate vs ar |" in md and "| sparsespec_l | text | 192 | 4 |" in md
    assert "in batches of 4" in md and "batched ar's" in md
    shrunk = run_inproc(env, tmp_path / "b8", "limit=2", "gen.batch_size=8", methods=("ar",))
    assert [r["batch_size"] for r in shrunk] == [2, 2]


def test_shared_prefill_runs_the_prompt_once_and_changes_nothing(env, tmp_path, monkeypatch):
    """runtime.share_prefill: one long prefill per sample for all methods, the same rows as without."""
    from sparsespec.models.runner import CausalLM

    lengths = []
    real = CausalLM.prefill

    def counting(self, ids, *a, **kw):
        lengths.append(len(ids))
        return real(self, ids, *a, **kw)

    monkeypatch.setattr(CausalLM, "prefill", counting)
    methods = ("ar", "magicdec", "sparsespec_l")
    shared = run_inproc(env, tmp_path / "shared", "limit=2", methods=methods)
    long_runs = [n for n in lengths if n > 64]
    lengths.clear()
    alone = run_inproc(env, tmp_path / "alone", "limit=2", "runtime.share_prefill=false", methods=methods)
    assert len(long_runs) == 2 and len([n for n in lengths if n > 64]) == 6  # one per sample vs one per run
    key = lambda r: (r["sample_id"], r["method"])  # noqa: E731
    for a, b in zip(sorted(shared, key=key), sorted(alone, key=key), strict=True):
        assert key(a) == key(b) and a["output_ids"] == b["output_ids"]
        assert a["acceptance_rate"] == b["acceptance_rate"] and a["prefill_s"] > 0


def test_low_precision_speculative_run_warns_about_token_identity(env, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="sparsespec.eval.harness"):
        run_inproc(env, tmp_path / "bf16", "model.dtype=bfloat16", "gen.max_new_tokens=4", methods=("magicdec",))
    assert any("model.dtype=bfloat16" in r.getMessage() and "float32" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparsespec.eval.harness"):
        run_inproc(env, tmp_path / "fp32", "gen.max_new_tokens=4", methods=("magicdec",))
    assert not any("near-tied" in r.getMessage() for r in caplog.records)


def test_a_method_list_is_composed_per_method_not_merged_by_hydra(monkeypatch):
    """`method=[a,b]` would make Hydra merge both method files (their nested controller defaults
    clash); the command line is composed once per listed method, each override going to the methods
    that have its key or group, read off their composed configs. sys.argv is left as it is."""
    from sparsespec.config import ConfigError
    from sparsespec.eval.cli import compose_run

    argv = ["evaluate.py", "ctx=4k", "method=[ar,magicdec,sparsespec_l]", "method.drafter.policy.ratio=0.2",
            "method/controller=fixed", "limit=1"]
    monkeypatch.setattr(sys, "argv", list(argv))
    run = compose_run(argv[1:])
    assert sys.argv == argv
    ar, md, sl = run.methods
    assert [m.name for m in run.methods] == ["ar", "magicdec", "sparsespec_l"]
    assert ar.drafter is None and ar.controller is None  # ar has neither key: left alone
    assert md.drafter.policy.ratio == sl.drafter.policy.ratio == 0.2
    assert sl.controller._target_.endswith("FixedK") and "candidates" not in sl.controller  # its group, switched
    assert sl.drafter.policy._target_.endswith("RecallIndex") and md.drafter.policy._target_.endswith("StreamingKV")
    assert run.cfg.ctx == "4k" and run.cfg.limit == 1 and "hydra" not in run.cfg
    assert run.cfg.out_dir.endswith("/ctx=4k,limit=1,method=[ar,magicdec,sparsespec_l],"
                                    "method.drafter.policy.ratio=0.2,method/controller=fixed")
    assert run.command == ("python evaluate.py ctx=4k 'method=[ar,magicdec,sparsespec_l]' "
                           "method.drafter.policy.ratio=0.2 method/controller=fixed limit=1")
    # one method: the same path, its overrides applied
    [one] = compose_run(["method=magicdec", "method.controller.k=6", "out_dir=x"]).methods
    assert one.controller.k == 6
    # an override no listed method takes: one line naming it, with the keys that are there
    with pytest.raises(ConfigError, match=r"^method.drafter.policy.ratoi=0.5: no listed method \(ar, magicdec\)"):
        compose_run(["method=[ar,magicdec]", "method.drafter.policy.ratoi=0.5"])
    with pytest.raises(ConfigError, match=r"ratoi=0.5: magicdec has no such key \(did you mean ratio\?\)"):
        compose_run(["method=magicdec", "method.drafter.policy.ratoi=0.5"])
    with pytest.raises(ConfigError, match=r"^method/controller=fixed: ar has no such key"):
        compose_run(["method=ar", "method/controller=fixed"])


def test_the_entry_point_in_process(env, tmp_path):
    """evaluate.py's own steps without a process: a method list composed and run, its command kept;
    bad input is exit status 2 with nothing written."""
    from sparsespec.eval import cli

    out = tmp_path / "list"
    run = cli.compose_run(base_overrides(env, out, "method=[ar,magicdec]", "limit=1", "gen.max_new_tokens=4",
                                         "method.controller.k=2"))
    assert cli.run(run) == out
    rows = read_rows(out / "results.jsonl")
    assert pairs(rows) == [("text/doc0", "ar"), ("text/doc0", "magicdec")] and rows[1]["exact_match_ar"]
    assert rows[1]["method_config"]["controller"]["k"] == 2
    assert (out / "command.txt").read_text().startswith("python evaluate.py model.path=")
    bad = tmp_path / "bad"
    assert cli.main(["method=ar", "method.controller.k=3", f"out_dir={bad}"]) == 2 and not bad.exists()
    assert cli.main([*base_overrides(env, bad, "method=sd", f"drafter.path={tmp_path / 'none'}")]) == 2
    assert not bad.exists()


def test_a_device_this_machine_lacks_is_refused_before_anything_is_written(env, tmp_path):
    # cuda:99: no CUDA here, or fewer GPUs than that where there is
    with pytest.raises(EvaluationError, match=r"model.device=cuda:99: (CUDA is not available|this machine has)"):
        run_inproc(env, tmp_path / "gpu", "model.device=cuda:99", "gen.max_new_tokens=4", methods=("magicdec",))
    assert not (tmp_path / "gpu").exists()
    rows = run_inproc(env, tmp_path / "cpu", "model.device=cpu", "model.dtype=auto", "gen.max_new_tokens=4",
                      methods=("magicdec",))
    assert rows and all(r["exact_match_ar"] for r in rows if r["method"] != "ar")
    # the fingerprint records what auto resolved to, so a resume elsewhere is told
    from sparsespec.eval.harness import RUN_FILE

    model = json.loads((tmp_path / "cpu" / RUN_FILE).read_text())["model"]
    assert (model["device"], model["dtype"]) == ("cpu", "float32")
