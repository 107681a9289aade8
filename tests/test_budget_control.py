"""The budget_control study (the far-copy control) on a tiny model: agreement per copy distance,
layer count and budget, resumed from finished windows; bad text options refused before anything loads."""

import json

import pytest
from helpers import books, make_tokenizer, save_model

from sparsespec.experiments import ExperimentError
from sparsespec.experiments.driver import run


def test_control_scores_far_copies_per_depth_and_budget_and_resumes(tmp_path):
    from sparsespec.data.far_copy import far_copy
    from sparsespec.experiments.budget_control import markdown
    from sparsespec.experiments.common.checkpoint import Checkpoint

    ids = list(range(100))
    copied = far_copy(ids, 30, 20)
    assert copied[:80] == ids[:80] and copied[80:] == ids[50:70]  # position p holds the token at p - 30
    assert far_copy(ids, 10, 20)[80:] == ids[70:80] * 2  # shorter than the span: the copy repeats
    with pytest.raises(Exception, match="distance 90"):
        far_copy(ids, 90, 20)  # the source would start before the window
    tok = make_tokenizer(chat=False)
    target = save_model(tmp_path / "target", tok, layers=3, seed=0)
    data = books(tmp_path, 3)
    args = ["--model", str(target), "--data", str(data), "--ctx", "300", "--distances", "60,200", "--layers", "1,3",
            "--budgets", "32,full", "--span", "40", "--warmup", "4", "--offsets", "0.02,0.3", "--books", "2",
            "--out", str(tmp_path / "c.json")]
    report = run("budget_control", args)
    assert len(report["windows"]) == 4 and not (tmp_path / "c.partial.jsonl").exists()
    for w in report["windows"]:
        for label in ("plain", "D=60", "D=200"):
            c = w["texts"][label]
            assert c["n"] == 40 - 4 - 1
            assert c["agree"]["3/full"] == c["n"]  # N = all layers, full cache: the target itself
            assert 0 <= c["agree"]["1/full"] <= c["n"] and 0 <= c["target_copies"] <= c["n"]
    # a 32-token streaming view of the target loses something somewhere
    assert sum(w["texts"][t]["agree"]["3/32"] for w in report["windows"] for t in ("plain", "D=60")) < 8 * 35
    text = markdown(report)
    assert "| 3 | full | 1.000 ± 0.000 (0.000)" in text and "D=200" in text
    # a stopped run resumes from its finished windows: a kept window is not scored again
    kept = {**report["windows"][0], "texts": {t: {**c, "target_copies": 0} for t, c in
                                             report["windows"][0]["texts"].items()}}
    settings = json.loads(json.dumps({"ctx": [300], "distances": [60, 200], "layers": [1, 3], "budgets": [32, None],
                                      "span": 40, "warmup": 4, "data": str(data), "model": str(target)}))
    Checkpoint.open(str(tmp_path / "c.json"), settings, resume=False).add([kept])
    again = run("budget_control", [*args, "--resume"])
    assert again["windows"][0] == kept and again["windows"][1:] == report["windows"][1:]


@pytest.mark.parametrize("bad,match", [(["--warmup", "39", "--span", "40"], "--warmup"),
                                       (["--offsets", "0.1,x"], "--offsets"), (["--distances", "9,y"], "--distances")])
def test_far_copy_studies_refuse_bad_text_options_before_loading_anything(tmp_path, bad, match):
    for name, first in (("budget_control", []), ("figure1", ["untrained"])):
        with pytest.raises(ExperimentError, match=match):
            run(name, [*first, *bad, "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "x.json")])
    assert not list(tmp_path.iterdir())  # no partial result file
