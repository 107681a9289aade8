"""The soak study (sparsespec.experiments.soak) smoke-run on a tiny model: acceptance per round,
memory over time, the compared methods on the same prefill (and the first law), its table and plot,
and a stopped run that resumes from its finished contexts."""

import json

import pytest
from helpers import make_env
from helpers import text as _text

from sparsespec.experiments.driver import run
from sparsespec.experiments.soak import markdown

pytestmark = pytest.mark.usefixtures("isolated")


def test_soak_smoke(tmp_path):
    env = make_env(tmp_path / "env")
    text = tmp_path / "book.txt"
    text.write_text(_text(9, 3000))
    out = tmp_path / "soak" / "soak.json"
    argv = ["--model", str(env["model_dir"]), "--ctx", "256", "--new-tokens", "24", "--text", str(text),
            "--out", str(out), "--interval", "0.05", "--set", "method.controller.candidates=[2,4]",
            "--plot", str(tmp_path / "soak" / "soak.png")]
    report = run("soak", argv)
    data = json.loads(out.read_text())
    assert (tmp_path / "soak" / "soak.png").stat().st_size > 0
    run_ = data["runs"][0]
    assert run_["ctx"] == 256 and run_["new_tokens"] == 24 and run_["prompt_tokens"] == 256
    assert run_["rounds"] and all(0 <= r["accepted"] <= r["drafted"] for r in run_["rounds"])
    assert sum(r["accepted"] + 1 for r in run_["rounds"]) <= 23  # tokens after the prefill's first one
    assert run_["rounds"][-1]["tokens"] <= 24
    assert run_["memory"] and all(m["rss_mib"] > 0 for m in run_["memory"])
    assert report["runs"][0]["acceptance_rate"] == run_["acceptance_rate"]
    # the comparison methods decode from the same shared prefill, and the first law holds
    assert [c["method"] for c in run_["compare"]] == ["ar", "magicdec"]
    assert all(c["same_output"] and c["new_tokens"] == 24 for c in run_["compare"])
    assert run_["speedup_vs_ar"] > 0
    # long-output evidence: acceptance by quarter, from the same rounds, and the loop check
    quarters = [q for q in run_["acceptance_by_quarter"] if q is not None]
    assert len(run_["acceptance_by_quarter"]) == 4 and quarters and all(0 <= q <= 1 for q in quarters)
    assert len(run_["output_ids"]) == 24 and len(run_["distinct_by_quarter"]) == 4
    # its table, as docs are rebuilt from the saved report: every method against ar, and the memory it held
    md = markdown(data)
    assert "| 256 | ar | " in md and "| 256 | sparsespec_l | " in md and md.count("| yes |") >= 3
    assert data["command"].startswith("python -m sparsespec.experiments soak --model")
    # a run stopped after its first context resumes there: the finished context is not decoded again
    partial = out.with_suffix(".partial.jsonl")
    settings = {k: data["args"][k] for k in ("method", "set", "compare", "new_tokens", "model", "dtype", "text",
                                             "temperature", "top_p", "seed", "prefill_chunk", "memory_guard")}
    kept = {**run_, "tokens_per_s": -1.0}
    partial.write_text(json.dumps(settings) + "\n" + json.dumps([kept]) + "\n")
    again = run("soak", [*argv, "--resume"])
    assert again["runs"] == [kept] and not partial.exists()
