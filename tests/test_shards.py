"""Several processes on one out_dir: `shard=i/n` (or a launcher's split) and the lock on a results file.

Two real evaluate.py processes, one per shard, at once into one out_dir give exactly the unsharded run's
rows and a report over all of them; two processes with the same command into one out_dir: one runs, the
other stops at once with the lock message and writes nothing; bad `shard` values and launcher
environments; the split resolved from RANK/WORLD_SIZE and SLURM_ARRAY_TASK_ID/COUNT. The tiny model is
conftest.py's `harness_env`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, evaluate_cmd, pairs, run_evaluate, run_inproc, sub_env

from sparsespec.eval.harness import EvaluationError
from sparsespec.eval.results import (
    LockedError,
    RunLock,
    Shard,
    read_rows,
    resolve_shard,
    results_files,
    split_of,
)

EXTRA = ("method=magicdec", "limit=3")  # 3 samples x (ar, magicdec); shard 0 of 2 gets 2 samples, shard 1 one
LAUNCHER = ("RANK", "WORLD_SIZE", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
            "SLURM_ARRAY_TASK_STEP")


pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture
def env(harness_env):
    return harness_env


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    # a test run inside a SLURM job or under torchrun must not shard these runs (sub_env copies os.environ)
    for key in LAUNCHER:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def no_model_load(monkeypatch):
    import sparsespec.models.loading as loading

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the shard or the lock was checked")

    monkeypatch.setattr(loading, "load_model", boom)


def _rows(out: Path) -> list[dict]:
    return [r for f in results_files(out) for r in read_rows(f)]


# ---------------------------------------------------------------------------------------------
# two shards at once
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_shard_processes_at_once_give_the_unsharded_rows_and_one_report(env, tmp_path):
    out = tmp_path / "sharded"
    procs = [subprocess.Popen(evaluate_cmd(env, out, *EXTRA, f"shard={i}/2"), cwd=ROOT, env=sub_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(text[-2000:] for text in logs)
    assert "shard 1/2 (shard=1/2)" in logs[1]  # the one line saying which split this process runs

    files = results_files(out)
    assert [f.name for f in files] == ["results.shard-0-of-2.jsonl", "results.shard-1-of-2.jsonl"]
    assert not (out / "results.jsonl").exists()
    assert {r["sample_id"] for r in read_rows(files[0])} == {"text/doc0", "text/doc2"}  # samples 0, 2, ...
    assert {r["sample_id"] for r in read_rows(files[1])} == {"text/doc1"}
    assert not list(out.glob("*.lock")) and not list(out.glob(".*.lock"))  # each lock went with its run

    whole = run_inproc(env, tmp_path / "whole", *EXTRA)
    merged = _rows(out)
    assert len(set(pairs(merged))) == len(merged)  # no pair twice
    assert sorted(pairs(merged)) == sorted(pairs(whole))
    by = {(r["sample_id"], r["method"]): r for r in merged}
    assert all(by[(r["sample_id"], r["method"])]["output_ids"] == r["output_ids"] for r in whole)
    # each sample's ar ran in the same shard as its magicdec: every speedup is filled
    assert all(r["speedup"] is not None and r["exact_match_ar"] for r in merged if r["method"] != "ar")
    # out_dir's own summary: the shard that finished last wrote it under the lock, over both files
    assert {e["method"]: e["n"] for e in json.loads((out / "summary.json").read_text())} == {"ar": 3, "magicdec": 3}
    assert sum(cmd.count("shard=") for cmd in (out / "command.txt").read_text().splitlines()) == 2

    report = subprocess.run([sys.executable, "-m", "sparsespec.experiments", "report", str(out), "--out", str(tmp_path / "rep")],
                            cwd=ROOT, env=sub_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert {e["method"]: e["n"] for e in summary} == {"ar": 3, "magicdec": 3}
    assert (tmp_path / "rep" / "summary.md").is_file()

    # resume works per shard: shard 0 again has nothing to do and leaves its file as it was
    before = files[0].read_bytes()
    run_inproc(env, out, *EXTRA, "shard=0/2")
    assert files[0].read_bytes() == before
    # another split into the same out_dir would run samples twice: refused, nothing written
    for other in ((), ("shard=0/3",)):
        with pytest.raises(EvaluationError, match=r"holds results.shard-0-of-2.jsonl .*shard=i/2"):
            run_inproc(env, out, *EXTRA, *other)
    assert [f.name for f in results_files(out)] == [f.name for f in files]
    # shards of one run share its settings; a shard of other settings is refused like any resume
    with pytest.raises(EvaluationError, match="gen.max_new_tokens=10 before, 12 now"):
        run_inproc(env, out, *EXTRA, "shard=1/2", "gen.max_new_tokens=12")


def test_the_split_comes_from_a_slurm_array_when_shard_is_null(env, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    out = tmp_path / "array"
    with caplog.at_level(logging.INFO, logger="sparsespec.eval.settings"):
        run_inproc(env, out, *EXTRA)
    assert [f.name for f in results_files(out)] == ["results.shard-1-of-2.jsonl"]
    assert sorted(pairs(_rows(out))) == [("text/doc1", "ar"), ("text/doc1", "magicdec")]
    assert "shard 1/2 (SLURM_ARRAY_TASK_ID=1 of SLURM_ARRAY_TASK_COUNT=2)" in caplog.text


def test_a_shard_without_samples_writes_nothing(env, tmp_path):
    out = tmp_path / "empty_shard"
    run_inproc(env, out, "limit=2", "shard=3/4")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# the lock: the same command twice into one out_dir
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_same_command_twice_at_once_runs_once_and_the_second_stops(env, tmp_path):
    out = tmp_path / "twice"
    cmd = evaluate_cmd(env, out, *EXTRA)
    lock = out / "results.jsonl.lock"
    with open(tmp_path / "first.log", "w") as log_file:
        first = subprocess.Popen(cmd, cwd=ROOT, env=sub_env(tmp_path), stdout=log_file, stderr=subprocess.STDOUT)
    try:
        # The first holds the lock from before its model loads to its end; it is paused while it holds
        # it, so the second surely starts while the first is running, whatever the machine's speed.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and first.poll() is None:
            if lock.is_file() and lock.read_text().startswith(f"{first.pid} "):
                break
            time.sleep(0.005)
        assert first.poll() is None, "the first process ended before the second could start"
        os.kill(first.pid, signal.SIGSTOP)
        try:
            second = subprocess.run(cmd, cwd=ROOT, env=sub_env(tmp_path), capture_output=True, text=True, timeout=300)
        finally:
            os.kill(first.pid, signal.SIGCONT)
    finally:
        first.wait(timeout=300)
    text = second.stdout + second.stderr
    assert second.returncode == 2 and "Traceback" not in text
    [line] = [x for x in text.splitlines() if "is in use" in x]
    assert f"out_dir={out} is in use: another evaluate.py (pid {first.pid} on " in line
    assert line.endswith("wait for it to finish, pass another out_dir, or split the samples with shard=i/n")
    assert first.returncode == 0, (tmp_path / "first.log").read_text()[-2000:]

    lines = (out / "results.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]  # every line parses
    expected = [(f"text/doc{i}", m) for i in range(3) for m in ("ar", "magicdec")]
    assert sorted(pairs(rows)) == sorted(expected) and len(rows) == len(expected)
    assert not lock.exists()


def test_a_held_results_file_stops_the_run_before_the_model_loads(env, tmp_path, no_model_load):
    out = tmp_path / "held"
    holder = RunLock(out / "results.jsonl.lock").acquire()
    try:
        with pytest.raises(EvaluationError, match=rf"is in use: another evaluate.py \(pid {os.getpid()} on "):
            run_inproc(env, out, *EXTRA)
        assert os.listdir(out) == ["results.jsonl.lock"]  # the holder's lock alone: the refused run wrote nothing
        # another shard of the same out_dir has a file of its own, hence a lock of its own
        with pytest.raises(AssertionError, match="a model was loaded"):
            run_inproc(env, out, *EXTRA, "shard=1/2")
        assert os.listdir(out) == ["results.jsonl.lock"]
    finally:
        holder.release()
    assert not out.exists()  # the directory the holder created, empty again, went with its lock


def test_run_lock_is_exclusive_records_its_holder_and_cleans_up(tmp_path):
    path = tmp_path / "a" / "b" / "results.jsonl.lock"
    lock = RunLock(path).acquire()
    assert path.read_text() == f"{os.getpid()} {os.uname().nodename}\n"
    with pytest.raises(LockedError) as e:
        RunLock(path).acquire()  # a second open file description: refused as another process would be
    assert e.value.holder == f"pid {os.getpid()} on {os.uname().nodename}"
    lock.release()
    assert not (tmp_path / "a").exists()  # the lock file, and the directories only it needed, are gone
    with RunLock(path), pytest.raises(LockedError):
        RunLock(path).acquire()
    again = RunLock(path).acquire()  # free again once released
    again.release()


# ---------------------------------------------------------------------------------------------
# bad shard values: one line naming `shard`, before any model loads, nothing written
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "0/0", "2/2", "1", "-1/2", "1/2/3"])
def test_bad_shard_values_are_refused_before_the_model_loads(env, tmp_path, no_model_load, value):
    out = tmp_path / "bad"
    with pytest.raises(EvaluationError) as e:
        run_inproc(env, out, *EXTRA, f"shard={value}")
    assert str(e.value).startswith("shard=") and "expected i/n with 0 <= i < n" in str(e.value), str(e.value)
    assert not out.exists()


@pytest.mark.slow
def test_bad_shard_on_the_command_line_exits_nonzero_with_one_line(env, tmp_path):
    out = tmp_path / "bad_cli"
    proc = run_evaluate(env, out, *EXTRA, "shard=2/2")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text
    [line] = [x for x in text.splitlines() if "shard=" in x]
    assert "shard='2/2' is out of range: expected i/n with 0 <= i < n" in line
    assert not out.exists()


@pytest.mark.parametrize("environ,match", [
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 with WORLD_SIZE=4"),
    ({"RANK": "x", "WORLD_SIZE": "4"}, "RANK='x' is not an integer"),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_STEP": "2"}, "SLURM_ARRAY_TASK_ID=4"),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4"}, "an --array list with gaps"),
    ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2"}, "pass shard=i/n"),
])
def test_launcher_environments_that_name_no_shard_are_refused(environ, match):
    with pytest.raises(ValueError, match=match):
        resolve_shard(None, environ)


# ---------------------------------------------------------------------------------------------
# resolving the split
# ---------------------------------------------------------------------------------------------


def _split(value, environ) -> tuple[int, int] | None:
    s = resolve_shard(value, environ)
    return None if s is None else (s.index, s.count)


def test_the_split_resolves_from_the_key_or_the_launcher():
    assert _split(None, {}) is None
    assert _split("1/4", {}) == (1, 4)
    assert _split(" 0 / 2 ", {}) == (0, 2)
    assert _split("0/1", {}) is None  # one shard is the whole run: its rows stay in results.jsonl
    # torchrun and the like
    assert _split(None, {"RANK": "2", "WORLD_SIZE": "4"}) == (2, 4)
    assert _split(None, {"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert _split(None, {"RANK": "3"}) is None  # RANK without WORLD_SIZE says nothing about a split
    # SLURM job arrays: --array=0-3, --array=1-8 (counted from the first task), --array=0-15:4
    assert _split(None, {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"}) == (3, 4)
    one_to_eight = {"SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "8"}
    assert _split(None, {**one_to_eight, "SLURM_ARRAY_TASK_ID": "1"}) == (0, 8)
    assert _split(None, {**one_to_eight, "SLURM_ARRAY_TASK_ID": "8"}) == (7, 8)
    assert _split(None, {"SLURM_ARRAY_TASK_ID": "8", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0",
                         "SLURM_ARRAY_TASK_STEP": "4"}) == (2, 4)
    assert _split(None, {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1"}) is None
    # the key wins over the environment
    assert _split("0/1", {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}) is None  # every sample
    assert _split("0/2", {"RANK": "1", "WORLD_SIZE": "4", "SLURM_ARRAY_TASK_ID": "5"}) == (0, 2)
    assert "SLURM_ARRAY_TASK_ID=1" in resolve_shard(None, {**one_to_eight, "SLURM_ARRAY_TASK_ID": "1"}).source
    with pytest.raises(ValueError, match=r"shard='2/2' is out of range: expected i/n with 0 <= i < n"):
        resolve_shard("2/2", {})


def test_shards_are_disjoint_and_cover_every_sample():
    items = list(range(11))
    for n in (1, 2, 3, 4, 11, 12):
        parts = [Shard(i, n).select(items) for i in range(n)]
        assert sorted(x for p in parts for x in p) == items
    assert Shard(1, 3).select(items) == [1, 4, 7, 10]
    assert Shard(1, 3).file_name == "results.shard-1-of-3.jsonl"


def test_results_files_lists_results_and_shard_files_only(tmp_path):
    for name in ("results.shard-1-of-2.jsonl", "results.jsonl", "results.shard-0-of-2.jsonl",
                 "results.jsonl.lock", "results_old.jsonl", "results.shard-x-of-2.jsonl", "summary.json"):
        (tmp_path / name).write_text("")
    assert [f.name for f in results_files(tmp_path)] == ["results.jsonl", "results.shard-0-of-2.jsonl",
                                                         "results.shard-1-of-2.jsonl"]
    assert split_of("results.jsonl") == (0, 1) and split_of("x/results.shard-3-of-8.jsonl") == (3, 8)
    assert results_files(tmp_path / "missing") == []
