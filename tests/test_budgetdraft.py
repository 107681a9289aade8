"""The budgetdraft study (sparsespec.experiments.budgetdraft) on tiny models: drafter groups over
seeds, acceptance per budget, the engine timed against ar, and acceptance on the target's own output."""

import json

from helpers import books, make_tokenizer, save_model

from sparsespec.experiments.budgetdraft import markdown
from sparsespec.experiments.driver import run


def test_budgetdraft_groups_seeds_and_times_the_engine(tmp_path):

    tok = make_tokenizer(chat=False)
    target = save_model(tmp_path / "target", tok, layers=2, seed=0)
    for s in (1, 2):
        save_model(tmp_path / f"d_s{s}", tok, layers=1, seed=s)
    data = books(tmp_path, 3)
    res = run("budgetdraft", ["untrained", f"self={target}", f"tiny={tmp_path}/d_s*", f"mixed={target},{tmp_path}/d_s1", "--model", str(target),
                     "--data", str(data), "--ctx", "300", "--budgets", "40", "80", "--positions", "48",
                     "--books", "2", "--ks", "2", "4", "--n-layers", "1", "--engine-ctx", "300",
                     "--engine-drafters", "tiny", "self", "--engine-budget", "80", "--engine-ks", "2", "3",
                     "--engine-repeats", "1", "--engine-books", "2", "--new-tokens", "8", "--threads", "1",
                     "--own-ctx", "200", "--own-tokens", "8", "--lookup-ngrams", "1",
                     "--plot", str(tmp_path / "fig1.png"), "--out", str(tmp_path / "r.json")])
    assert res["groups"]["tiny"] == [str(tmp_path / "d_s1"), str(tmp_path / "d_s2")]
    cell = {(r["drafter"], r["budget"]): r for r in res["rows"]}
    assert len(cell) == 4 * 3 and all(r["n_books"] == 2 for r in res["rows"])
    # the target drafting for itself with its full cache agrees everywhere: the windows, the
    # drafter's inference path and the scored positions line up with the target's greedy tokens
    assert cell[("self", "full")]["acc"] == 1.0 and cell[("self", "full")]["tau4"] == 4.0
    assert cell[("self", "40")]["acc"] < 1.0  # a 40-token streaming view loses something
    # a group's cell is the mean +- std over its seeds (here: the target itself and a random drafter)
    mixed = cell[("mixed", "full")]
    assert mixed["n_seeds"] == 2 and cell[("tiny", "full")]["n_seeds"] == 2
    other = 2 * mixed["acc"] - 1.0  # the random drafter's acceptance; the target's own is 1
    assert other < 1.0 and abs(mixed["acc_std"] - (1.0 - other) / 2**0.5) < 1e-9  # sample std over seeds
    assert cell[("untrained", "full")]["acc_std"] == 0.0
    for r in res["rows"]:
        assert 0 <= r["tau2"] <= 2 and 0 <= r["tau4"] <= 4
    eng = [r for r in res["engine"] if r["drafter"] != "ar"]
    assert {(r["drafter"], r["k"]) for r in eng} == {("tiny", 2), ("tiny", 3), ("self", 2), ("self", 3)}
    assert all(r["same_as_ar"] and r["speedup"] > 0 and r["n_prompts"] == 2 for r in eng)
    assert 0 < res["engine"][0]["ar_distinct"] <= 1
    # on the target's own output, the target itself predicts every token; a random drafter does not
    own = {(r["drafter"], r["view"]): r for r in res["own"]}
    assert own[("self", "full")]["acc"] == 1.0 and own[("self", "full")]["quarters"] == [1.0] * 4
    assert own[("tiny", "full")]["acc"] < 1.0 and own[("tiny", "full")]["n_seeds"] == 2
    assert 0 <= own[("lookup n=1", "-")]["acc"] <= 1 and len(own[("lookup n=1", "-")]["ar_distinct_quarters"]) == 4
    text = markdown(json.loads((tmp_path / "r.json").read_text()))
    assert "On the target's own output" in text and "| lookup n=1 | - |" in text
    assert "| 0k | tiny |" not in text and "| tiny |" in text
    assert (tmp_path / "fig1.png").stat().st_size > 1000 and json.loads((tmp_path / "r.json").read_text())["rows"]
