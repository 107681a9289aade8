"""A user's own dataset, outside the package: the worked example of docs/evaluation.md, written to
a temporary folder exactly as the doc shows it, runs through evaluate.py with its own metric."""

import json
import subprocess
import sys
from pathlib import Path

import helpers
import pytest
from helpers import ROOT, base_overrides, doc, sub_env

from sparsespec.data import DatasetError, load_samples, loader_options

DOC = ROOT / "docs" / "evaluation.md"


def write_doc_examples(folder: Path) -> dict[str, Path]:
    """Every ```block``` the doc marks with `<!-- example: PATH -->`, written to folder/PATH."""
    return helpers.write_doc_examples(DOC, folder, {"my_data/my_qa.py", "my_conf/dataset/my_qa.yaml"})


def write_questions(path: Path, n: int = 3) -> Path:
    """Documents in the tiny tokenizer's words; each answer is a word of its document."""
    rows = [{"id": i, "document": doc(10 + i, 300), "question": "what crossed the river?", "answer": "ferryman"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.slow  # starts evaluate.py (or a script) in its own process
def test_a_users_dataset_runs_from_the_command_line_with_its_metric(harness_env, tmp_path):
    write_doc_examples(tmp_path)
    data = write_questions(tmp_path / "questions.jsonl")
    out = tmp_path / "run"
    # base_overrides picks dataset=text; the later dataset=my_qa wins, as on any command line
    cmd = [sys.executable, str(ROOT / "evaluate.py"), *base_overrides(harness_env, out, "limit=2"),
           f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "dataset=my_qa", f"dataset.path={data}",
           "method=[ar,sparsespec_l]", "gen.use_task_length=true", "ctx=256"]
    proc = subprocess.run(cmd, cwd=ROOT, env={**sub_env(tmp_path), "PYTHONPATH": str(tmp_path / "my_data")},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["sample_id"], r["method"]) for r in rows] == [(f"my_qa/{i}", m) for i in range(2)
                                                             for m in ("ar", "sparsespec_l")]
    for r in rows:
        assert r["dataset"] == "my_qa" and r["score"] in (0.0, 1.0)  # the example's own metric scored it
        assert r["new_tokens"] == 10 and 0 < r["prompt_tokens"] <= 256  # min(gen.max_new_tokens, the loader's 16)
    assert all(r["exact_match_ar"] for r in rows)
    saved = (out / "config.yaml").read_text()
    assert "_target_: my_qa.load" in saved and "instruction: Answer the question from the document." in saved


def test_a_users_dataset_through_the_python_api(harness_env, tmp_path, monkeypatch):
    write_doc_examples(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "my_data"))
    sys.modules.pop("my_qa", None)
    data = write_questions(tmp_path / "questions.jsonl")
    assert loader_options("my_qa.load") == ["instruction"]
    samples = load_samples("my_qa.load", harness_env["tok"], 128, path=str(data), limit=2, instruction="Answer:")
    assert [s.sample_id for s in samples] == ["my_qa/0", "my_qa/1"]
    assert all(len(s.prompt_ids) == 128 and s.meta["truncated"] for s in samples)  # cut to ctx in the middle
    with pytest.raises(DatasetError, match="dataset=my_qa needs dataset.path=FILE"):
        load_samples("my_qa.load", harness_env["tok"], 128)
    with pytest.raises(DatasetError, match="no option 'instructions'.*instruction"):
        load_samples("my_qa.load", harness_env["tok"], 128, path=str(data), instructions="x")
    with pytest.raises(DatasetError, match="dataset.task=qa: dataset=my_qa.load takes no task"):
        load_samples("my_qa.load", harness_env["tok"], 128, path=str(data), task="qa")
    sys.modules.pop("my_qa", None)


def test_a_dataset_target_that_cannot_be_imported_is_named_before_the_model_loads(harness_env, tmp_path):
    from sparsespec.config import ConfigError, compose, validate_evaluate_config

    write_doc_examples(tmp_path)
    sys.modules.pop("my_qa", None)  # and its folder is not on the path
    cfg = compose("evaluate", [f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "dataset=my_qa", "method=ar"])
    assert cfg.dataset._target_ == "my_qa.load" and cfg.dataset.options.instruction.startswith("Answer")
    with pytest.raises(ConfigError, match="dataset._target_='my_qa.load' cannot be imported.*PYTHONPATH"):
        validate_evaluate_config(cfg)
    with pytest.raises(ConfigError, match="dataset.options.instructions is not an option of dataset=ruler"):
        validate_evaluate_config(compose("evaluate", ["dataset=ruler", "+dataset.options.instructions=x"]))
