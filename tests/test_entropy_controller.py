"""The entropy_controller study (sparsespec.experiments.entropy_controller): the
oracle's per-round costs, the entropy controller's calibration bins, and the study's comparison of
fixed k, the controller and the oracle on a tiny model."""


import pytest
from helpers import books, make_tokenizer, save_model

from sparsespec.experiments.driver import run


def test_controller_oracle_charges_each_round_its_accepted_drafts():
    from sparsespec.experiments.entropy_controller import conditional, oracle, round_cost

    cost = round_cost({1: 1.2, 2: 1.4, 4: 2.0}, ar_step=1.0)
    assert [cost(k) for k in (0, 1, 2, 3, 4)] == pytest.approx([1.0, 1.2, 1.4, 1.7, 2.0])
    with pytest.raises(ValueError, match="k=5"):
        cost(5)
    rounds = [[4, 0], [4, 4], [4, 1], [4, 3], [2, 2]]  # (drafted, accepted); the last round cut short
    best = oracle(rounds, cost)
    assert best["wall_s"] == pytest.approx(1.0 + 2.0 + 1.2 + 1.7 + 1.4) and best["k_mean"] == 2.0
    # draft 1: 4 of 5 rounds; draft 2 given 1: 3 of 4; draft 3 given 2: of the 2 rounds that drafted
    # 3 and accepted 2, both; draft 4 given 3: 1 of 2
    assert conditional(rounds, 4) == [0.8, 0.75, 1.0, 0.5]


def test_entropy_calibration_bins_add_up_to_the_labelled_tokens():
    from sparsespec.decoding.controllers import EntropyController, RoundStats

    c = EntropyController(candidates=(2, 4))
    for hs, acc in [([0.1, 0.3, 2.5, 4.0], 1), ([0.2, 0.7], 2), ([1.5, 0.1, 0.1, 0.1], 4)]:
        c.max_draft()
        for i in range(len(hs)):
            c.keep_drafting(i + 1, hs[: i + 1])
        c.observe(RoundStats(drafted=len(hs), accepted=acc, entropies=hs, draft_s=0.01, verify_s=0.1))
    report = c.report()
    bins, overall = report["calibration_bins"], report["calibration"]
    assert sum(b["n"] for b in bins) == overall["n"] == 2 + 2 + 4  # up to and including the first rejection
    assert [b["n"] for b in bins] == [5, 1, 1, 1, 0, 0]  # 0.1 0.2 0.1 0.1 0.1 | 0.3 | 0.7 | 1.5 | - | -
    assert bins[1]["observed"] == 0.0 and bins[0]["observed"] == 1.0  # 0.3 was the first rejection
    assert sum(b["predicted"] * b["n"] for b in bins) / overall["n"] == pytest.approx(overall["predicted"])


def test_controller_study_compares_fixed_k_the_controller_and_the_oracle(tmp_path):
    tok = make_tokenizer(chat=False)
    target = save_model(tmp_path / "target", tok, layers=2, seed=0)
    data = books(tmp_path, 3)
    report = run("entropy_controller", ["--model", str(target), "--data", str(data), "--ctx", "300", "--ks", "1,2",
                              "--k-max", "4", "--small", "1,2,4", "--new-tokens", "12", "--books", "1",
                              "--threads", "1", "--out", str(tmp_path / "c.json")])
    rows = {(r["mode"], r["method"]): r for r in report["rows"]}
    methods = ["ar", "k=1", "k=2", "k=4", "entropy", "entropy, small k", "oracle"]
    assert set(rows) == {(m, x) for m in ("greedy", "sampled") for x in methods}
    assert all(rows[("greedy", m)]["identical_ar"] for m in methods[:-1])  # the first law
    for mode in ("greedy", "sampled"):
        o, k4 = rows[(mode, "oracle")], rows[(mode, "k=4")]
        assert o["speedup"] == pytest.approx(rows[(mode, "ar")]["wall_s"] / o["wall_s"])
        assert 0 <= o["k_mean"] <= 4 and set(o["round_s"]) == {"1", "2", "4"}
        assert len(k4["conditional"]) == 4 and all(v is None or 0 <= v <= 1 for v in k4["conditional"])
        assert sum(b["n"] for b in rows[(mode, "entropy")]["calibration_bins"]) == \
            rows[(mode, "entropy")]["calibration"]["n"]
    from sparsespec.experiments.entropy_controller import markdown

    text = markdown(report)
    assert "| ctx | mode | k=1 | k=2 | k=4 | entropy | entropy, small k | oracle |" in text
    assert "| 300 | greedy | " in text and "| 300 | sampled | " in text and "Independence: in the k = 4 runs" in text
