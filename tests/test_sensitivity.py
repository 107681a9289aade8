"""The sensitivity study on a tiny model: SparseSpec-L's ratio and window swept, every setting's
output ar's, the predicted speedup, the markdown and plot, resumed from finished windows."""


import pytest
from helpers import books, make_tokenizer, save_model

from sparsespec.experiments.driver import run


def test_sensitivity_study_sweeps_ratio_and_window_exactly_and_resumes(tmp_path):
    from sparsespec.experiments.common.checkpoint import Checkpoint
    from sparsespec.experiments.sensitivity import markdown, plot

    tok = make_tokenizer(chat=False)
    target = save_model(tmp_path / "target", tok, layers=2, seed=0)
    data = books(tmp_path, 3)
    args = ["--model", str(target), "--data", str(data), "--ctx", "300", "--ratios", "0.05,0.5", "--windows", "2,8",
            "--new-tokens", "12", "--books", "2", "--threads", "1", "--out", str(tmp_path / "s.json")]
    report = run("sensitivity", args)  # raises if any setting's output differs from ar's
    rows = report["rows"]
    assert {(r["ratio"], r["window"]) for r in rows} == {(0.05, 2), (0.05, 8), (0.5, 2), (0.5, 8)}
    assert len(rows) == 8 and len({r["sample"] for r in rows}) == 2
    for r in rows:
        assert 0 <= r["alpha"] <= 1 and r["gamma"] > 0
        assert r["predicted"] == pytest.approx((r["alpha"] * r["k"] + 1) / (r["k"] * r["gamma"] + 1))
    text = markdown(report)
    assert "| 0.05 | 2 | " in text and "| 0.5 | 8 | " in text
    plot(report, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 0
    assert not (tmp_path / "s.partial.jsonl").exists()  # a finished run leaves no checkpoint
    # a stopped run resumes from its finished windows: a kept window is not measured again
    first = rows[0]["sample"]
    kept = [{**r, "speedup": 9.0} for r in rows if r["sample"] == first]
    settings = {"ctx": [300], "ratios": [0.05, 0.5], "windows": [2, 8], "new_tokens": 12, "repeats": 1,
                "data": str(data), "model": str(target)}
    Checkpoint.open(str(tmp_path / "s.json"), settings, resume=False).add(kept)
    again = run("sensitivity", [*args, "--resume"])["rows"]
    assert [r for r in again if r["sample"] == first] == kept and len(again) == 8
