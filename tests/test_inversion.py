"""The inversion study on a tiny model: fixed draft lengths and the entropy controller, the
predicted speedup from acceptance and cost, and its plot."""


from helpers import books, make_tokenizer, save_model

from sparsespec.experiments.driver import run


def test_inversion_study_sweeps_k_and_plots(tmp_path):
    tok = make_tokenizer(chat=False)
    target = save_model(tmp_path / "target", tok, layers=2, seed=0)
    data = books(tmp_path, 2)
    report = run("inversion", ["--ctx", "500", "--ks", "1,3", "--new-tokens", "10", "--repeats", "1",
                               "--model", str(target), "--data", str(data), "--plot", str(tmp_path / "inv.png"),
                               "--ratio", "0.3", "--threads", "1"])
    fixed = [r for r in report["rows"] if r["fixed"]]
    assert len(fixed) == 2 and len(report["rows"]) == 3  # two fixed k and the entropy controller
    assert fixed[0]["k"] <= 1 < fixed[1]["k"] <= 3  # k_mean: the last draft is cut to what is left
    for r in report["rows"]:
        assert r["speedup"] > 0 and 0 <= r["alpha"] <= 1
        assert abs(r["predicted"] - (r["alpha"] * r["k"] + 1) / (r["k"] * r["gamma"] + 1)) < 1e-9
    assert (tmp_path / "inv.png").stat().st_size > 1000
