"""The experiments driver (python -m sparsespec.experiments): studies found by name, the shared
options declared once, bad options refused before anything runs, a saved report rendered again, and
the two commands beside the studies (docs, report)."""

from __future__ import annotations

import argparse
import json

import pytest

from sparsespec import experiments
from sparsespec.experiments import ExperimentError, driver


def test_every_module_is_found_by_its_name_and_renders():
    names = experiments.names()
    assert {"bench", "budget_control", "entropy_controller", "figure1", "soak", "evaluate"} <= set(names)
    assert "driver" not in names and "common" not in names
    for name in names:
        module = experiments.study(name)
        renders = [a for a in dir(module) if a == "markdown" or a.endswith("_table")]
        assert renders, name
        if hasattr(module, "measure"):  # a study: markdown, options the driver knows, a command line
            assert hasattr(module, "markdown"), name
            assert set(getattr(module, "OPTIONS", {})) <= set(driver.SHARED), name
            assert isinstance(driver.parser(name, module), argparse.ArgumentParser)
    with pytest.raises(ExperimentError, match="no study 'nope'; known: .*bench"):
        experiments.study("nope")


def test_a_shared_option_is_declared_once_with_each_studys_default():
    bench = driver.parser("bench", experiments.study("bench")).parse_args([])
    control = driver.parser("budget_control", experiments.study("budget_control")).parse_args([])
    assert bench.ctx == "4k,8k,16k,32k" and control.ctx == "4k" and bench.model is None
    assert driver.contexts(["4k,16k"]) == driver.contexts(["4096", "16384"]) == [4096, 16384]
    with pytest.raises(ExperimentError, match="--ctx"):
        driver.contexts(["4q"])
    with pytest.raises(SystemExit):  # a count that is not positive: argparse's error, exit 2
        driver.parser("bench", experiments.study("bench")).parse_args(["--books", "0"])


def test_bad_options_are_refused_before_anything_loads(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert driver.main(["entropy_controller", "--ks", "1,x", "--model", str(tmp_path / "missing"),
                        "--out", str(out)]) == 2
    assert "--ks: comma-separated integers" in capsys.readouterr().err
    assert driver.main(["sensitivity", "--ctx", "16q", "--out", str(out)]) == 2
    assert "--ctx" in capsys.readouterr().err
    assert driver.main(["nope"]) == 2 and "no study 'nope'" in capsys.readouterr().err
    assert driver.main(["evaluate"]) == 2 and "nothing to run" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no partial result file
    assert driver.main([]) == 2 and "bench" in capsys.readouterr().out


def test_a_saved_report_renders_without_measuring(tmp_path, capsys):
    report = {"command": "x", "args": {"repeats": 1}, "rows": [
        {"ctx": 4096, "variant": "windowed", "step_ms": 2.0, "step_ms_runs": [2.0] * 8, "entries_after_prompt": 10,
         "peak_entries": 12, "cache_mb": 1.0, "prefill_s": 0.5}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    md = tmp_path / "r.md"
    assert driver.run("drafter_kv", ["--render", str(path), "--markdown", str(md)]) == report
    assert "| 4k | windowed | 2.0 ± 0.0 | 10 | 12 | 1 | 0.5 |" in capsys.readouterr().out
    assert "| 4k | windowed |" in md.read_text()


def test_the_docs_command_checks_the_committed_docs(capsys):
    assert driver.main(["docs", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_a_checkpoint_resumes_whole_parts_with_the_same_settings_only(tmp_path):
    from sparsespec.experiments.common.checkpoint import Checkpoint

    out = str(tmp_path / "r.json")
    first = Checkpoint.open(out, {"ctx": (4096,), "k": 2}, resume=False)
    first.add([{"ctx": 4096, "sample": "a", "method": "ar", "x": 1}, {"ctx": 4096, "sample": "a", "method": "m"}])
    first.add([{"ctx": 4096, "sample": "b", "method": "ar"}])  # b: m never finished
    partial = tmp_path / "r.partial.jsonl"
    partial.write_text(partial.read_text() + '[{"ctx": 4096, "sample": "c", "me')  # a write cut short
    again = Checkpoint.open(out, {"ctx": [4096], "k": 2}, resume=True)
    assert [r["method"] for r in again.rows(4096, "a", ["ar", "m"])] == ["ar", "m"]
    assert again.rows(4096, "b", ["ar", "m"]) == [] and again.rows(4096, "c", ["ar"]) == []
    again.add([{"ctx": 4096, "sample": "b", "method": "ar"}, {"ctx": 4096, "sample": "b", "method": "m"}])
    assert len(Checkpoint.open(out, {"ctx": [4096], "k": 2}, resume=True).rows(4096, "b", ["ar", "m"])) == 2
    with pytest.raises(ExperimentError, match="other settings"):
        Checkpoint.open(out, {"ctx": [4096], "k": 3}, resume=True)
    with pytest.raises(ExperimentError, match="--resume needs --out"):
        Checkpoint.open(None, {}, resume=True)
    Checkpoint.open(out, {"k": 3}, resume=False).close()  # without --resume: started afresh, then done
    assert not partial.exists()


def test_every_command_a_footer_shows_is_one_the_driver_takes_today():
    """Results files keep the command that made them, some from scripts the driver replaced; the docs
    show each as today's command, and that command parses (the study exists, every option is one
    it takes), so a reader can run what a table says made it."""
    import shlex
    from pathlib import Path

    from sparsespec.experiments.common.commands import ENTRY, current_command

    root = Path(__file__).resolve().parents[1]
    reports = [json.loads(p.read_text()) for p in root.glob("results/**/*.json")]
    recorded = [r.get("command") for r in reports if isinstance(r, dict)]
    shown = [current_command(c) for c in recorded if isinstance(c, str)]
    assert any(c.startswith(ENTRY) for c in shown)
    for command in shown:
        assert "scripts/" not in command, command
        if not command.startswith(ENTRY):
            continue
        name, *args = shlex.split(command)[len(shlex.split(ENTRY)):]
        if name in ("docs", "report"):
            continue
        driver.parser(name, experiments.study(name)).parse_args(args)  # SystemExit on an unknown option
    assert current_command("python scripts/microbench.py --skinny --json a.json") == \
        f"{ENTRY} skinny --out a.json"
    assert current_command("python evaluate.py method=ar") == "python evaluate.py method=ar"
