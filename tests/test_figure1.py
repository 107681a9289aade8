"""The figure1 study on tiny models: each recipe's seeds per context, budget and text, the
cells' spread, the markdown and plot, resumed from finished windows."""

import json
import math
import statistics

import pytest
from helpers import books, make_tokenizer, save_model

from sparsespec.experiments.driver import run


def test_figure1_scores_each_recipes_seeds_per_context_budget_and_text(tmp_path):
    from sparsespec.experiments.common.checkpoint import Checkpoint
    from sparsespec.experiments.figure1 import cells, markdown, plot

    tok = make_tokenizer(chat=False)
    target = save_model(tmp_path / "target", tok, layers=3, seed=0)
    other = save_model(tmp_path / "a_s1" / "drafter", tok, layers=1, seed=5)
    (other.parent / "metrics.json").write_text(json.dumps({"global_step": 7, "seconds": 60.0, "final": {}}))
    lone = save_model(tmp_path / "b_s0" / "drafter", tok, layers=1, seed=6)
    data = books(tmp_path, 3)
    args = ["untrained", f"a={target},{other}", f"b={lone}", "--model", str(target), "--data", str(data),
            "--ctx", "300,400", "--distances", "60,200", "--budgets", "32,full", "--span", "40", "--warmup", "4",
            "--books", "2", "--n-layers", "1", "--out", str(tmp_path / "f.json")]
    report = run("figure1", args)
    assert [w["ctx"] for w in report["windows"]] == [300, 300, 400, 400]
    assert not (tmp_path / "f.partial.jsonl").exists()
    assert report["training"]["a"][1]["steps"] == 7 and "steps" not in report["training"]["a"][0]
    c = cells(report)
    for ctx in (300, 400):
        for text in ("plain", "D=60", "D=200"):
            w = [x["texts"][text] for x in report["windows"] if x["ctx"] == ctx]
            n = sum(x["n"] for x in w)
            assert sum(x["agree"]["a#0/full"] for x in w) == n  # the target as its own drafter
            p = sum(x["agree"]["a#1/full"] for x in w) / n
            cell = c[(ctx, "a", text, "full")]
            assert cell["acc"] == pytest.approx((1 + p) / 2) and cell["n"] == n and cell["seeds"] == 2
            assert cell["seed_std"] == pytest.approx(statistics.stdev([1.0, p]))
            assert cell["spread"] == pytest.approx(math.hypot(cell["seed_std"], cell["se"]))
            assert c[(ctx, "b", text, "full")]["seed_std"] == 0.0 and c[(ctx, "untrained", text, "32")]["seeds"] == 1
    text = markdown(report)
    assert "**300**" in text and "| a | full |" in text and "| untrained | 32 |" in text and "Training: 1 runs of 7–7 steps" in text
    plot(report, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
    # a stopped run resumes from its finished windows
    kept = {**report["windows"][0], "texts": {t: {**x, "target_copies": 0} for t, x in
                                             report["windows"][0]["texts"].items()}}
    settings = json.loads(json.dumps({"ctx": [300, 400], "groups": report["groups"], "budgets": [32, None],
                                      "distances": [60, 200], "span": 40, "warmup": 4, "offsets": [0.02],
                                      "data": str(data), "model": str(target)}))
    Checkpoint.open(str(tmp_path / "f.json"), settings, resume=False).add([kept])
    again = run("figure1", [*args, "--resume"])
    assert again["windows"][0] == kept and again["windows"][1:] == report["windows"][1:]
