"""The bench study (sparsespec.experiments.bench) runs end to end on a tiny model in seconds: every
method, HF's included, on the same prompt, with identical greedy outputs and its plot; it resumes
from its finished samples; a saved report renders again without a run; its tables report the spread
over samples and acceptance by quarter."""

import json

import pytest
from helpers import books, make_tokenizer, save_model

from sparsespec.eval.summary import distinct_by_part
from sparsespec.experiments import ExperimentError
from sparsespec.experiments.bench import markdown as bench_markdown
from sparsespec.experiments.common import runner
from sparsespec.experiments.driver import run


def bench(argv: list[str]) -> dict:
    return run("bench", argv)


def test_bench_runs_every_method_side_by_side(tmp_path):
    tok = make_tokenizer(chat=False)
    target = save_model(tmp_path / "target", tok, layers=2, seed=0)
    drafter = save_model(tmp_path / "drafter", tok, layers=1, seed=1)
    data = books(tmp_path, 3)
    methods = "hf,hf_assisted,hf_lookup,ar,ar:attention=pytorch,sd,magicdec,sparsespec_l,sparsespec_l:controller=fixed:k=3"
    report = bench(["--ctx", "400,700", "--new-tokens", "12", "--repeats", "2", "--methods", methods,
                    "--model", str(target), "--drafter", str(drafter), "--data", str(data),
                    "--hf-full-max", "512", "--threads", "1", "--plot", str(tmp_path / "s.png")])
    rows = report["rows"]
    got = {(r["ctx"], r["method"]) for r in rows}
    assert {(400, m) for m in methods.split(",")} <= got
    assert (700, "hf_lookup") not in got and (700, "sparsespec_l") in got  # HF re-prefilling only <= 512
    for r in rows:  # the first law, against our AR and HF's own generate()
        assert r["identical_ar"] and r["identical_hf"], (r["ctx"], r["method"])
        assert len(r["output_ids"]) == 12 and r["tok_s"] > 0 and r["floor_tok_s"] > 0
        if r["method"].split(":")[0] not in ("hf", "hf_assisted", "hf_lookup", "ar"):
            assert 0 <= r["acceptance"] <= 1 and r["gamma"] > 0
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert "| 400 | sparsespec_l |" in bench_markdown(report)
    assert report["command"].startswith("python -m sparsespec.experiments bench --ctx 400,700")


def test_bench_markdown_reports_the_spread_over_samples():
    def row(sample, method, tok_s, vs_ar, acc):
        return {"ctx": 4096, "sample": sample, "method": method, "tok_s": tok_s, "tok_s_std": 0.0, "vs_hf": None,
                "vs_ar": vs_ar, "floor_tok_s": 40.0, "acceptance": acc, "tau": None if acc is None else 1 + 3 * acc,
                "gamma": None, "k_mean": None, "index_share": None, "identical_ar": True, "identical_hf": None,
                "prefill_s": 1.0, "hf_prefill_s": None, "peak_rss_gb": 1.0,
                **({"draft_ms": 10.0 * sample, "verify_ms": 5.0, "index_ms": 1.0, "other_ms": 0.1} if acc else {})}
    rows = [row(s, "ar", 20.0, 1.0, None) for s in (1, 2)] + [row(1, "magicdec", 24.0, 1.2, 0.8),
                                                            row(2, "magicdec", 16.0, 0.8, 0.6)]
    text = bench_markdown({"command": "x", "bandwidth_gbs": 30.0, "weight_bytes": 5e8, "rows": rows})
    assert "| 4k | magicdec | 2 | 1.00 ± 0.28 | 0.70 ± 0.14 | 3.10 ± 0.42 |" in text  # sample std, not repeats'
    assert "| 4k | magicdec | 15.0 | 5.0 | 1.0 | 0.1 |" in text and "| 4k | magicdec | 10.0 |" not in text  # one row, not one per sample
    # one timed run per sample: its tokens/s carry no "± 0.00"; the ratio's spread is over the samples
    assert "| 4k | magicdec | 20.00 | — | 1.00 ± 0.28 | 0.70 ± 0.14 |" in text and "± 0.00" not in text.split("Spread")[0]
    repeated = bench_markdown({"command": "x", "bandwidth_gbs": 30.0, "weight_bytes": 5e8, "rows": rows,
                               "args": {"repeats": 3}})
    assert "| 4k | magicdec | 20.00 ± 0.00 |" in repeated and "timed runs each" in repeated


def test_bench_resumes_from_its_finished_samples(tmp_path, monkeypatch, capsys):
    """A run stopped during its second sample keeps the first; --resume neither prefills nor decodes
    it again, and the finished report equals an uninterrupted run's outputs."""
    tok = make_tokenizer(chat=False)
    target = save_model(tmp_path / "target", tok, layers=2, seed=0)
    out = tmp_path / "r.json"
    argv = ["--ctx", "400", "--new-tokens", "10", "--repeats", "1", "--warmup", "0", "--books", "2",
            "--methods", "ar,sparsespec_l", "--model", str(target), "--data", str(books(tmp_path, 2)),
            "--threads", "1", "--out", str(out)]
    partial = out.with_suffix(".partial.jsonl")
    real_prefill, prefilled = runner.prefill_once, []

    def stop_on_second(target, sample, n):
        if prefilled:
            raise KeyboardInterrupt
        prefilled.append(sample.sample_id)
        return real_prefill(target, sample, n)

    monkeypatch.setattr(runner, "prefill_once", stop_on_second)
    try:
        bench(argv)
    except KeyboardInterrupt:
        pass
    assert not out.exists() and len(partial.read_text().splitlines()) == 2  # settings + the first sample

    def count(target, sample, n):
        prefilled.append(sample.sample_id)
        return real_prefill(target, sample, n)

    monkeypatch.setattr(runner, "prefill_once", count)
    with pytest.raises(ExperimentError, match="other settings"):
        bench([*argv, "--new-tokens", "11", "--resume"])
    resumed = bench([*argv, "--resume"])
    assert len(prefilled) == 2 and prefilled[0] != prefilled[1]  # only the unfinished sample ran again
    assert not partial.exists() and json.loads(out.read_text())["rows"] == json.loads(json.dumps(resumed["rows"]))
    fresh = bench([a for a in argv if a not in ("--out", str(out))])
    assert [r["output_ids"] for r in resumed["rows"]] == [r["output_ids"] for r in fresh["rows"]]
    assert all(r["identical_ar"] for r in resumed["rows"])
    # each report says where it came from, and that part of it was an earlier run's
    assert json.loads(out.read_text())["provenance"]["note"] == "resumed: 2 rows from an earlier run"
    assert "note" not in fresh["provenance"] and len(fresh["provenance"]["commit"]) == 40
    assert [r["sample"] for r in resumed["rows"]] == [r["sample"] for r in fresh["rows"]]
    capsys.readouterr()
    rerendered = bench(["--render", str(out), "--plot", str(tmp_path / "r.png")])  # runs nothing
    assert rerendered["rows"] == json.loads(out.read_text())["rows"]
    assert bench_markdown(json.loads(out.read_text())) in capsys.readouterr().out
    assert (tmp_path / "r.png").stat().st_size > 1000
    with pytest.raises(ExperimentError, match="--render"):
        bench(["--render", str(tmp_path / "missing.json")])


def test_acceptance_by_part_counts_each_round_where_it_starts():
    from sparsespec.decoding.engine import GenerationResult

    # 16 tokens: the prefill's, then rounds emitting 4 (3 of 4 accepted), 4 (3/4), 1 (0/4), 6 (5/5)
    res = GenerationResult(output_ids=list(range(16)), prompt_tokens=8, prefill_s=0.0, wall_s=1.0,
                           rounds=[(4, 3), (4, 3), (4, 0), (5, 5)])
    # the rounds start at tokens 1, 5, 9, 10 of 16: quarters 0, 1, 2, 2; none starts in the last
    assert res.acceptance_by_part(4) == [0.75, 0.75, 5 / 9, None]
    assert res.acceptance_by_part(1) == [11 / 17]
    ar = GenerationResult(output_ids=list(range(16)), prompt_tokens=8, prefill_s=0.0, wall_s=1.0)
    assert ar.acceptance_by_part(4) is None and ar.acceptance_rate is None  # nothing drafted


def test_bench_markdown_reports_acceptance_by_quarter():
    rows = [{"ctx": 65536, "sample": s, "method": "sparsespec_l", "tok_s": 4.0, "tok_s_std": 0.0, "vs_hf": None,
             "vs_ar": 1.0, "floor_tok_s": 9.0, "acceptance": 0.7, "tau": 3.0, "gamma": 0.2, "k_mean": 4.0,
             "index_share": 0.2, "identical_ar": True, "identical_hf": None, "prefill_s": 1.0, "hf_prefill_s": None,
             "peak_rss_gb": 5.0, "acceptance_quarters": q} for s, q in ((1, [0.6, 0.7, 0.8, 0.9]), (2, [0.8, 0.7, None, 0.9]))]
    # AR's outputs: 8 tokens, the first sample's second half a loop of one token
    rows += [{**rows[0], "sample": s, "method": "ar", "acceptance": None, "tau": None, "gamma": None,
              "acceptance_quarters": None, "output_ids": ids} for s, ids in ((1, [1, 2, 3, 4, 5, 5, 5, 5]),
                                                                           (2, [1, 2, 3, 3, 4, 5, 6, 7]))]
    text = bench_markdown({"command": "x", "bandwidth_gbs": 30.0, "weight_bytes": 5e8, "rows": rows})
    assert "| 64k | sparsespec_l | 0.70 ± 0.14 | 0.70 ± 0.00 | 0.80 | 0.90 ± 0.00 |" in text  # one value: no ±
    assert "| 64k | ar (distinct-token share) | 1.00 ± 0.00 | 0.75 ± 0.35 | 0.75 ± 0.35 | 0.75 ± 0.35 |" in text
    assert distinct_by_part([1, 2, 3, 4, 5, 5, 5, 5, 5], 4) == [1.0, 1.0, 0.5, 1 / 3]  # the rest joins the last
