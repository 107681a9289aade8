"""The GPU check (scripts/gpu_check.sh) runs only now and then on a GPU machine; its --cpu mode runs the
same steps here on tiny models, so a change that breaks the check fails this file first. No speed is
asserted: only that every file and every row is written, and what the rows must hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparsespec.experiments import gpu_speed

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _check_speed_report(out: Path) -> dict:
    report = json.loads((out / "speed.json").read_text())
    rows = {(r["model"], r["ctx"], r["method"]): r for r in report["rows"]}
    assert sorted(rows) == sorted(gpu_speed.expected_rows(gpu_speed.CPU_PLAN))
    for key, r in rows.items():
        assert r["status"] == "ok", (key, r.get("reason"))
        assert r["identical_ar"] is not None, key
        if r["dtype"] == "float32" and r["method"] in gpu_speed.OURS:
            assert r["identical_ar"], key  # float32: our methods decode ar's tokens
        if r["method"] in ("magicdec", "sparsespec_l"):
            assert r["acceptance"] is not None and r["gamma"] is not None and r["gamma"] > 0, key
    assert report["ok"]
    table = (out / "speed.md").read_text()
    assert table.count("\n| ") == len(rows) + 1  # the header and one line per row
    assert "n/a (random)" in table and "All rows passed." in table
    return report


@pytest.mark.slow
def test_cpu_check_writes_the_test_log_the_speed_json_and_table(tmp_path):
    out = tmp_path / "check"
    proc = _run("--cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "tests.log").read_text()
    assert " passed" in log and " failed" not in log and "PASSED" in log
    assert (out / "tests.xml").read_text().startswith("<?xml")
    assert "test_syncs.py" in log  # the sync count is part of the selection
    report = _check_speed_report(out)
    assert report["use_hydra"]
    _check_probe(out)
    assert "done: probe exit 0, tests exit 0, speed exit 0" in (out / "gpu_check.log").read_text()
    assert len([p for p in out.iterdir() if p.is_file()]) <= 8  # what a borrowed machine returns


def _check_probe(out: Path) -> None:
    probe = json.loads((out / "probe.json").read_text())
    assert probe["errors"] == [] and probe["plan"] == "cpu"
    assert probe["ceilings"]["copy"]["gb_s"] > 0 and probe["ceilings"]["gemv_bf16"]["gb_s"] > 0
    assert [c["ctx"] for c in probe["contexts"]] == [256, 512]
    for c in probe["contexts"]:
        for part in ("ar_step", "verify_5", "verify_21", "draft_step_10pct", "view_select", "view_gather",
                     "recall_update"):
            assert {"wall_ms", "device_ms", "enqueue_ms"} <= c[part].keys(), part
        assert c["ar_kernels"] > 0 and 0 < c["view_tokens"] < c["ctx"]
    assert set(probe["attend_vs_fp32"]) == {"1", "5", "21", "1024"}
    assert max(probe["attend_vs_fp32"].values()) < 1e-4  # float32 on the CPU
    assert probe["flash_causal_alignment"] in ("bottom-right", "top-left")
    assert probe["event_reads"]["reads"] > 0


def test_bad_flag_fails_clearly():
    proc = _run("--bogus")
    assert proc.returncode == 2
    assert "unknown option '--bogus'" in proc.stderr and "--help" in proc.stderr
    proc = _run("--out")
    assert proc.returncode == 2 and "--out needs a folder" in proc.stderr
    proc = _run("--cpu", "--new-tokens", "many")
    assert proc.returncode == 2 and "--new-tokens needs a whole number, got 'many'" in proc.stderr
    proc = _run("--models")
    assert proc.returncode == 2 and "--models needs a value" in proc.stderr
    proc = _run("--models", "llama")
    assert proc.returncode == 2 and "--models needs a comma-separated list of embedded, llama8b_shape" in proc.stderr


def test_models_and_new_tokens_pick_the_plan():
    plan = gpu_speed.select(gpu_speed.GPU_PLAN, "llama8b_shape", 32)
    assert [m.key for m in plan.models] == ["llama8b_shape"] and plan.new_tokens == 32
    with pytest.raises(ValueError, match=r"--models=llama: expected a comma-separated list of embedded, llama8b_shape"):
        gpu_speed.select(gpu_speed.GPU_PLAN, "llama")
    with pytest.raises(ValueError, match="--new-tokens=1: at least 2"):
        gpu_speed.select(gpu_speed.GPU_PLAN, None, 1)


@pytest.mark.slow
def test_without_hydra_the_speed_table_is_the_same(tmp_path):
    """What a GPU machine without Hydra/OmegaConf runs (imports of them blocked), row for row."""
    proc = subprocess.run([sys.executable, "-m", "sparsespec.experiments", "gpu_speed", "--cpu", "--no-hydra",
                           "--out", str(tmp_path / "speed.json"), "--markdown", str(tmp_path / "speed.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not _check_speed_report(tmp_path)["use_hydra"]


def test_methods_built_without_hydra_are_the_shipped_configs():
    shipped, plain = gpu_speed.method_builders(True), gpu_speed.method_builders(False)
    assert set(shipped) == set(plain) == set(gpu_speed.OURS)
    for name in gpu_speed.OURS:
        a, b = shipped[name](None), plain[name](None)
        assert (repr(a.drafter), repr(a.controller), a.prompt_lookup, a.prefill_chunk) == \
            (repr(b.drafter), repr(b.controller), b.prompt_lookup, b.prefill_chunk), name


EMBEDDED_PLAN = gpu_speed.Plan("embedded-cpu", "cpu", (gpu_speed.ModelSpec("embedded", "SmolLM2", (256,), "float32"),),
                               new_tokens=4, warmup_tokens=2)


def test_rows_of_an_absent_embedded_model_are_skipped_with_the_reason(tmp_path, monkeypatch):
    """A GPU machine without the built model (and no way to build it offline) still gets every row."""
    monkeypatch.setenv("SPARSESPEC_CACHE", str(tmp_path))
    monkeypatch.delenv("SPARSESPEC_GGUF", raising=False)
    report = gpu_speed.measure_plan(EMBEDDED_PLAN, use_hydra=True)
    assert [r["status"] for r in report["rows"]] == ["skipped"] * len(gpu_speed.METHODS)
    assert "not built" in report["rows"][0]["reason"] and report["ok"]
    assert "skipped: embedded model not built" in gpu_speed.markdown(report)


@pytest.fixture
def one_thread():
    """As the gpu_speed study's --cpu runs: a small model on a busy machine is slowest with spinning threads."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.embedded
def test_embedded_model_rows_on_a_book_prompt(one_thread):
    """The GPU plan's embedded rows (the CPU plan uses random stand-ins), at a short context."""
    from sparsespec.models import embedded

    if not embedded.is_built(embedded.embedded_model_dir()):
        pytest.skip("the embedded model is not built (make model)")
    report = gpu_speed.measure_plan(EMBEDDED_PLAN, use_hydra=True)
    rows = {r["method"]: r for r in report["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    assert all(rows[m]["identical_ar"] for m in gpu_speed.OURS) and report["ok"]
    assert rows["sparsespec_l"]["acceptance"] is not None


@pytest.mark.embedded
def test_book_prompt_without_datasets_is_the_loaders(monkeypatch):
    """A bare GPU image has no `datasets`: the prompt then comes from the shipped file directly, and
    must be the very window the PG-19 loader gives."""
    from transformers import AutoTokenizer

    import sparsespec.data
    from sparsespec.models import embedded

    if not embedded.is_built(embedded.embedded_model_dir()):
        pytest.skip("the embedded model is not built (make model)")
    tok = AutoTokenizer.from_pretrained(str(embedded.embedded_model_dir()))
    with_loader = gpu_speed.embedded_prompt(tok, 300)

    def no_datasets(*args, **kwargs):
        raise ImportError("No module named 'datasets'")

    monkeypatch.setattr(sparsespec.data, "load_samples", no_datasets)
    assert gpu_speed.embedded_prompt(tok, 300) == with_loader and len(with_loader) == 300
