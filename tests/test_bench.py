"""scripts/bench.py runs end to end on a tiny model in seconds: every method, HF's included, on
the same prompt, with identical greedy outputs and a markdown section that reruns replace."""

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import torch
from test_data import make_tokenizer
from test_harness import _doc
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench  # noqa: E402

from sparsespec.eval.summary import distinct_by_part  # noqa: E402
from sparsespec.kv.policies import FullKV, StreamingKV  # noqa: E402
from sparsespec.reports import bench_run  # noqa: E402
from sparsespec.reports.bench import markdown as bench_markdown  # noqa: E402
from sparsespec.reports.sections import write_section  # noqa: E402


def _save(d: Path, tok, layers: int, seed: int) -> Path:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      initializer_range=0.25, bos_token_id=0, eos_token_id=1)
    LlamaForCausalLM(cfg).eval().save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_bench_runs_every_method_side_by_side(tmp_path):
    tok = make_tokenizer(chat=False)
    target = _save(tmp_path / "target", tok, layers=2, seed=0)
    drafter = _save(tmp_path / "drafter", tok, layers=1, seed=1)
    data = _books(tmp_path, 3)
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\nintro stays\n")
    methods = "hf,hf_assisted,hf_lookup,ar,ar:attention=pytorch,sd,magicdec,sparsespec_l,sparsespec_l:controller=fixed:k=3"
    report = bench.main(["--ctx", "400,700", "--new-tokens", "12", "--repeats", "2", "--methods", methods,
                         "--model-path", str(target), "--drafter-path", str(drafter), "--data", str(data),
                         "--hf-full-max", "512", "--write", str(md), "--threads", "1", "--plot", str(tmp_path / "s.png")])
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
    text = md.read_text()
    assert "intro stays" in text and text.count("<!-- bench:decode -->") == 1 and "| 400 | sparsespec_l |" in text
    write_section(md, "decode", "new body")
    text = md.read_text()
    assert "new body" in text and "sparsespec_l" not in text and "intro stays" in text


def test_inversion_script_sweeps_k_and_plots(tmp_path):
    import inversion

    tok = make_tokenizer(chat=False)
    target = _save(tmp_path / "target", tok, layers=2, seed=0)
    data = _books(tmp_path, 2)
    report = inversion.main(["--ctx", "500", "--ks", "1,3", "--new-tokens", "10", "--repeats", "1",
                             "--model-path", str(target), "--data", str(data), "--out", str(tmp_path / "inv"),
                             "--ratio", "0.3", "--threads", "1"])
    fixed = [r for r in report["rows"] if r["fixed"]]
    assert len(fixed) == 2 and len(report["rows"]) == 3  # two fixed k and the entropy controller
    assert fixed[0]["k"] <= 1 < fixed[1]["k"] <= 3  # k_mean: the last draft is cut to what is left
    for r in report["rows"]:
        assert r["speedup"] > 0 and 0 <= r["alpha"] <= 1
        assert abs(r["predicted"] - (r["alpha"] * r["k"] + 1) / (r["k"] * r["gamma"] + 1)) < 1e-9
    assert (tmp_path / "inv" / "inversion.png").stat().st_size > 1000


def test_budgetdraft_results_groups_seeds_and_times_the_engine(tmp_path):
    import budgetdraft_results as fig1

    tok = make_tokenizer(chat=False)
    target = _save(tmp_path / "target", tok, layers=2, seed=0)
    for s in (1, 2):
        _save(tmp_path / f"d_s{s}", tok, layers=1, seed=s)
    data = _books(tmp_path, 3)
    md = tmp_path / "benchmarks.md"
    res = fig1.main(["untrained", f"self={target}", f"tiny={tmp_path}/d_s*", f"mixed={target},{tmp_path}/d_s1", "--model", str(target),
                     "--data", str(data), "--ctx", "300", "--budgets", "40", "80", "--positions", "48",
                     "--books", "2", "--ks", "2", "4", "--n-layers", "1", "--engine-ctx", "300",
                     "--engine-drafters", "tiny", "self", "--engine-budget", "80", "--engine-ks", "2", "3",
                     "--engine-repeats", "1", "--engine-books", "2", "--new-tokens", "8", "--threads", "1",
                     "--own-ctx", "200", "--own-tokens", "8", "--lookup-ngrams", "1",
                     "--write", str(md), "--plot", str(tmp_path / "fig1.png"), "--out", str(tmp_path / "r.json")])
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
    text = md.read_text()
    assert "On the target's own output" in text and "| lookup n=1 | - |" in text
    assert "<!-- bench:fig1 -->" in text and "| 0k | tiny |" not in text and "| tiny |" in text
    assert (tmp_path / "fig1.png").stat().st_size > 1000 and json.loads((tmp_path / "r.json").read_text())["rows"]


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


def _books(tmp_path: Path, n: int) -> Path:
    data = tmp_path / "pg19.jsonl"
    data.write_text("".join(json.dumps({"short_book_title": f"Book {i}", "publication_date": "1900",
                                        "url": f"u{i}", "text": _doc(i, 2000)}) + "\n" for i in range(n)))
    return data


def test_bench_resumes_from_its_finished_samples(tmp_path, monkeypatch):
    """A run stopped during its second sample keeps the first; --resume neither prefills nor decodes
    it again, and the finished report equals an uninterrupted run's outputs."""
    tok = make_tokenizer(chat=False)
    target = _save(tmp_path / "target", tok, layers=2, seed=0)
    out = tmp_path / "r.json"
    argv = ["--ctx", "400", "--new-tokens", "10", "--repeats", "1", "--warmup", "0", "--samples", "2",
            "--methods", "ar,sparsespec_l", "--model-path", str(target), "--data", str(_books(tmp_path, 2)),
            "--threads", "1", "--json", str(out)]
    partial = out.with_suffix(".partial.jsonl")
    real_prefill, prefilled = bench_run.prefill_once, []

    def stop_on_second(target, sample, n):
        if prefilled:
            raise KeyboardInterrupt
        prefilled.append(sample.sample_id)
        return real_prefill(target, sample, n)

    monkeypatch.setattr(bench_run, "prefill_once", stop_on_second)
    try:
        bench.main(argv)
    except KeyboardInterrupt:
        pass
    assert not out.exists() and len(partial.read_text().splitlines()) == 2  # settings + the first sample

    def count(target, sample, n):
        prefilled.append(sample.sample_id)
        return real_prefill(target, sample, n)

    monkeypatch.setattr(bench_run, "prefill_once", count)
    with pytest.raises(SystemExit, match="other settings"):
        bench.main([*argv, "--new-tokens", "11", "--resume"])
    resumed = bench.main([*argv, "--resume"])
    assert len(prefilled) == 2 and prefilled[0] != prefilled[1]  # only the unfinished sample ran again
    assert not partial.exists() and json.loads(out.read_text())["rows"] == json.loads(json.dumps(resumed["rows"]))
    fresh = bench.main([a for a in argv if a not in ("--json", str(out))])
    assert [r["output_ids"] for r in resumed["rows"]] == [r["output_ids"] for r in fresh["rows"]]
    assert all(r["identical_ar"] for r in resumed["rows"])
    # each report says where it came from, and that part of it was an earlier run's
    assert json.loads(out.read_text())["provenance"]["note"] == "resumed: 2 rows from an earlier run"
    assert "note" not in fresh["provenance"] and len(fresh["provenance"]["commit"]) == 40
    assert [r["sample"] for r in resumed["rows"]] == [r["sample"] for r in fresh["rows"]]
    md = tmp_path / "b.md"
    rerendered = bench.main(["--render", str(out), "--write", str(md), "--name", "r"])  # runs nothing
    assert rerendered["rows"] == json.loads(out.read_text())["rows"]
    assert bench_markdown(json.loads(out.read_text())) in md.read_text()
    with pytest.raises(SystemExit, match="--render"):
        bench.main(["--render", str(tmp_path / "missing.json")])


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


def test_control_scores_far_copies_per_depth_and_budget_and_resumes(tmp_path):
    import control

    from sparsespec.data.far_copy import far_copy
    from sparsespec.reports.checkpoint import Checkpoint
    from sparsespec.reports.control import markdown

    ids = list(range(100))
    copied = far_copy(ids, 30, 20)
    assert copied[:80] == ids[:80] and copied[80:] == ids[50:70]  # position p holds the token at p - 30
    assert far_copy(ids, 10, 20)[80:] == ids[70:80] * 2  # shorter than the span: the copy repeats
    with pytest.raises(Exception, match="distance 90"):
        far_copy(ids, 90, 20)  # the source would start before the window
    tok = make_tokenizer(chat=False)
    target = _save(tmp_path / "target", tok, layers=3, seed=0)
    data = _books(tmp_path, 3)
    args = ["--model", str(target), "--data", str(data), "--ctx", "300", "--distances", "60,200", "--layers", "1,3",
            "--budgets", "32,full", "--span", "40", "--warmup", "4", "--offsets", "0.02,0.3", "--books", "2",
            "--json", str(tmp_path / "c.json")]
    report = control.main(args)
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
    settings = json.loads(json.dumps({"ctx": 300, "distances": [60, 200], "layers": [1, 3], "budgets": [32, None],
                                      "span": 40, "warmup": 4, "data": str(data), "model": str(target)}))
    Checkpoint.open(str(tmp_path / "c.json"), settings, resume=False).add([kept])
    again = control.main([*args, "--resume"])
    assert again["windows"][0] == kept and again["windows"][1:] == report["windows"][1:]


@pytest.mark.parametrize("bad,match", [(["--warmup", "39", "--span", "40"], "--warmup"),
                                       (["--offsets", "0.1,x"], "--offsets"), (["--distances", "9,y"], "--distances")])
def test_far_copy_scripts_refuse_bad_text_options_before_loading_anything(tmp_path, bad, match):
    import control
    import figure1

    for main, first in ((control.main, []), (figure1.main, ["untrained"])):
        with pytest.raises(SystemExit, match=match):
            main([*first, *bad, "--model", str(tmp_path / "missing"), "--json", str(tmp_path / "x.json")])
    assert not list(tmp_path.iterdir())  # no partial result file


@pytest.mark.parametrize("view", [StreamingKV(budget=24, k_sink=4), StreamingKV(ratio=0.1, k_sink=4), FullKV()],
                         ids=["budget", "ratio", "full"])
def test_span_logits_read_only_what_reaches_the_spans_and_equal_the_whole_prefix(view):
    from conftest import random_prompt, tiny_lm

    from sparsespec.reports.agreement import reach, span_logits

    lm, ids = tiny_lm("qwen2", layers=2), random_prompt(1400, seed=3)
    prefix, spans = ids[:1300], [ids[1300:1340], ids[1340:1400]]
    got = span_logits(lm.hf, prefix, spans, view)
    for span, logits in zip(spans, got, strict=True):
        seq = prefix + span
        ref = lm.forward(seq, lm.new_cache(len(seq)), mask=view.mask(0, len(seq), len(seq)))[1300:]
        torch.testing.assert_close(logits, ref, atol=5e-5, rtol=1e-4)  # summation order only
    # two layers back: 1300 - 2 x 20 recent (budget); 1300 - 126, then 1174 - 114 (ratio); full reads all
    expect = 0 if isinstance(view, FullKV) else 1260 if view.budget else 1060
    assert reach(view, 2, 1300) == expect


def test_figure1_scores_each_recipes_seeds_per_context_budget_and_text(tmp_path):
    import figure1

    from sparsespec.reports.checkpoint import Checkpoint
    from sparsespec.reports.figure1 import cells, markdown, plot

    tok = make_tokenizer(chat=False)
    target = _save(tmp_path / "target", tok, layers=3, seed=0)
    other = _save(tmp_path / "a_s1" / "drafter", tok, layers=1, seed=5)
    (other.parent / "metrics.json").write_text(json.dumps({"global_step": 7, "seconds": 60.0, "final": {}}))
    lone = _save(tmp_path / "b_s0" / "drafter", tok, layers=1, seed=6)
    data = _books(tmp_path, 3)
    args = ["untrained", f"a={target},{other}", f"b={lone}", "--model", str(target), "--data", str(data),
            "--ctx", "300,400", "--distances", "60,200", "--budgets", "32,full", "--span", "40", "--warmup", "4",
            "--books", "2", "--n-layers", "1", "--json", str(tmp_path / "f.json")]
    report = figure1.main(args)
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
    again = figure1.main([*args, "--resume"])
    assert again["windows"][0] == kept and again["windows"][1:] == report["windows"][1:]


def test_controller_oracle_charges_each_round_its_accepted_drafts():
    from sparsespec.reports.controller import conditional, oracle, round_cost

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


def test_controller_script_compares_fixed_k_the_controller_and_the_oracle(tmp_path):
    import controller

    tok = make_tokenizer(chat=False)
    target = _save(tmp_path / "target", tok, layers=2, seed=0)
    data = _books(tmp_path, 3)
    report = controller.main(["--model", str(target), "--data", str(data), "--ctx", "300", "--ks", "1,2",
                              "--k-max", "4", "--small", "1,2,4", "--new-tokens", "12", "--books", "1",
                              "--threads", "1", "--json", str(tmp_path / "c.json")])
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
    text = controller.markdown(report)
    assert "| ctx | mode | k=1 | k=2 | k=4 | entropy | entropy, small k | oracle |" in text
    assert "| 300 | greedy | " in text and "| 300 | sampled | " in text and "Independence: in the k = 4 runs" in text


def test_sensitivity_script_sweeps_ratio_and_window_exactly_and_resumes(tmp_path):
    import sensitivity

    from sparsespec.reports.checkpoint import Checkpoint
    from sparsespec.reports.sensitivity import markdown, plot

    tok = make_tokenizer(chat=False)
    target = _save(tmp_path / "target", tok, layers=2, seed=0)
    data = _books(tmp_path, 3)
    args = ["--model", str(target), "--data", str(data), "--ctx", "300", "--ratios", "0.05,0.5", "--windows", "2,8",
            "--new-tokens", "12", "--books", "2", "--threads", "1", "--json", str(tmp_path / "s.json")]
    report = sensitivity.main(args)  # raises if any setting's output differs from ar's
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
    again = sensitivity.main([*args, "--resume"])["rows"]
    assert [r for r in again if r["sample"] == first] == kept and len(again) == 8
