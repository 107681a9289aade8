"""The planner: the cost model's bytes on a hand-checkable shape and against the engine's own count,
regimes, device profiles, acceptance curves from rows, the CLI and its refusals, and the committed
calibration (no timing, no model loads beyond tiny random ones)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sparsespec.plan import cost
from sparsespec.plan.__main__ import main as cli
from sparsespec.plan.acceptance import Acceptance, AcceptanceError, Curve, curves_from_rows
from sparsespec.plan.cost import Dtypes
from sparsespec.plan.planner import METHODS, PlanError, plan, predict
from sparsespec.plan.profile import (
    DeviceProfile,
    ProfileError,
    _per_byte,
    from_dict,
    from_probe,
    load_profile,
)
from sparsespec.plan.shapes import ShapeError, from_config, load_shape

ROOT = Path(__file__).resolve().parents[1]
# 2 layers, hidden 64, 4 query heads and 2 KV heads of 16, MLP 128, vocabulary 100, tied embeddings
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=100, tie_word_embeddings=True, max_position_embeddings=512)


def test_weight_and_kv_bytes_of_a_tiny_shape_by_hand():
    s = from_config(TINY, "tiny")
    # per layer: q/k/v 128x64 + o 64x64 + gate/up 256x64 + down 64x128 = 36864 weights; x2 + lm_head
    # 100x64 = 80128 weights; norms (2*2 + 1) * 64 = 320
    assert s.linear_params == 80128 and s.norm_params == 320
    assert cost.weight_bytes(s, "float32") == (80128 + 320) * 4
    assert cost.weight_bytes(s, "bf16") == (80128 + 320) * 2
    # int8: a byte a weight + a bf16 scale per output row; norms stay float32
    assert cost.weight_bytes(s, "int8") == 2 * (8192 + 256 + 4096 + 128 + 16384 + 512 + 8192 + 128) + 6400 + 200 + 1280
    # int4 group 32: half a byte a weight + a (scale, zero) pair per group; rows padded to 16 (100 -> 112)
    layer = (128 * 32 + 2 * 128 * 4) + (64 * 32 + 2 * 64 * 4) + (256 * 32 + 2 * 256 * 4) + (64 * 64 + 4 * 64 * 4)
    assert cost.weight_bytes(s, "int4") == 2 * layer + 112 * 32 + 2 * 112 * 4 + 1280
    # the CPU kernel's GGUF blocks: Q8_0 a float16 scale per 32 weights, Q4_1 a scale and a minimum
    assert cost.matrix_bytes(64, 128, "int8", blocks=True) == 64 * 128 + 64 * 4 * 2
    assert cost.matrix_bytes(100, 64, "int4", blocks=True) == 100 * 32 + 100 * 2 * 4
    assert cost.kv_bytes(s, 10, "float32") == 2 * 2 * 2 * 16 * 10 * 4
    assert cost.kv_bytes(s, 10, "int8") == 2 * 2 * 2 * 16 * 10 + 2 * 2 * 2 * 4 * 10  # + a float32 scale a row


def test_known_shapes_match_the_committed_measurements():
    smol = load_shape("smollm2-135m")
    decode = json.loads((ROOT / "results" / "decode.json").read_text())
    batching = json.loads((ROOT / "results" / "batching.json").read_text())
    assert cost.weight_bytes(smol, "float32") == decode["weight_bytes"]
    assert cost.kv_bytes(smol, 1, "float32") == batching["kv_per_token"]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("fmt", ["fp", "bf16", "int8", "int4"])
def test_linear_bytes_agree_with_the_engine_count(family, fmt):
    from conftest import tiny_config, tiny_lm

    from sparsespec.models import quantized

    model = tiny_lm(family, vocab=100, intermediate_size=128)
    shape = from_config(tiny_config(family, vocab=100, intermediate_size=128).to_dict(), family)
    # on the CPU the engine may hold int8 / int4 as GGUF blocks for its own kernel
    layout = getattr(quantized, "block_format", None)
    blocks = layout is not None and layout(fmt, 32, "cpu", model.dtype, 64) is not None
    ours = cost.weight_bytes(shape, "float32" if fmt == "fp" else fmt, norms="float32", blocks=blocks) \
        - shape.norm_params * 4
    assert ours == quantized.linear_bytes(model, fmt, fmt, 32)


def test_regime_flips_from_weights_to_kv_with_context_and_batch():
    bf16 = Dtypes("bfloat16", "bfloat16")
    short = plan("llama-3.1-8b", 8192, 1, "h100", bf16, methods=["ar"])[0]
    long = plan("llama-3.1-8b", 131072, 32, "h100", bf16, methods=["ar"])[0]
    assert short.regime == "weights" and long.regime == "KV"
    # a few-row product on a 2-core CPU is slower than its bytes: compute-bound parts show up there
    cpu = plan("smollm2-135m", 16384, 8, "cpu", methods=["magicdec"])[0]
    assert cpu.parts_ms["verify"] > cpu.ar_step_ms


def test_a_bf16_self_draft_from_a_tenth_of_the_cache_costs_most_of_an_8b_step():
    """15-16 GB of weights and 4.3 GB of K/V at 32k: a draft step reads the weights and a tenth of
    the K/V, about 0.8 of an ar step, so no acceptance takes it past 1/γ."""
    p = plan("llama-3.1-8b", 32768, 1, "h100", Dtypes("bfloat16", "bfloat16"), methods=["magicdec"])[0]
    assert 0.78 < p.draft_cost < 0.83
    assert p.ceiling == pytest.approx(1 / p.draft_cost)
    assert p.speedup < p.ceiling


def test_a_round_priced_by_hand_on_a_roofline_profile():
    """Everything bandwidth-bound: speedup = (accepted + 1) * ar / (k draft + verify + gather)."""
    s = from_config(TINY, "tiny")
    prof = DeviceProfile("flat", "datasheet", bandwidth_gbs=1.0, compute_tflops={"float32": 1e6})
    k, ctx = 3, 400
    curve = Curve("magicdec", ctx, [1.0] * k)
    p = predict(METHODS["magicdec"], s, ctx, 1, prof, Dtypes(), k, curve)
    w, kv = cost.weight_bytes(s), cost.kv_bytes(s, ctx)
    view = cost.kv_bytes(s, cost.view_budget(ctx))  # 10%: 40 tokens
    ar, draft, gather = w + kv, w + view, 2 * view
    assert p.speedup == pytest.approx((k + 1) * ar / (k * draft + ar + gather))
    assert p.draft_cost == pytest.approx(draft / ar)
    assert p.tokens_per_round == pytest.approx(k + 1)


def test_recall_index_update_is_priced_and_lowers_the_prediction():
    s = load_shape("smollm2-135m")
    curve = Curve("sparsespec_l", 32768, [0.8] * 4)
    prof = load_profile("cpu")
    with_index = predict(METHODS["sparsespec_l"], s, 32768, 1, prof, Dtypes(), 4, curve)
    without = predict(METHODS["snapkv_self"], s, 32768, 1, prof, Dtypes(), 4, curve)
    assert with_index.parts_ms["index"] > 0 and "index" not in without.parts_ms
    assert with_index.speedup < without.speedup


def test_per_byte_table_interpolates_and_extends():
    table = {1: 10.0, 5: 5.0}  # GB/s
    assert _per_byte(table, 1) == pytest.approx(1e-10)
    assert _per_byte(table, 3) == pytest.approx((1e-10 + 2e-10) / 2)
    assert _per_byte(table, 9) == pytest.approx(2e-10 + (1e-10 / 4) * 4)


def test_acceptance_curve_from_rounds_counts_each_position():
    rows = [{"method": "m", "ctx": 4096, "dataset": "d", "temperature": 0.0,
             "drafted_per_round": [4, 4, 4, 0], "accepted_per_round": [4, 0, 2, 0]}] * 5
    (c,) = curves_from_rows(rows)
    assert c.p == pytest.approx([2 / 3, 1.0, 0.5, 1.0])
    assert c.n == [15, 10, 10, 5]
    assert c.accepted(4) == pytest.approx(2.0)  # the rows' mean accepted tokens a drafted round
    assert c.draft_share == pytest.approx(0.75)
    k = Curve.constant("m", 1, 2.0, 4)
    assert sum(k.p[0] ** i for i in range(1, 5)) == pytest.approx(2.0)


def test_acceptance_interpolates_between_contexts_and_names_the_fix_when_missing():
    acc = Acceptance([Curve("m", 4096, [0.9, 0.9]), Curve("m", 16384, [0.5, 0.5])])
    mid = acc.curve("m", 8192)
    assert mid.p == pytest.approx([0.7, 0.7]) and "interpolated" in mid.source
    assert acc.curve("m", 65536).p == [0.5, 0.5]
    with pytest.raises(AcceptanceError, match="sparsespec.plan.acceptance --runs"):
        acc.curve("other", 4096)


def test_committed_acceptance_has_every_measured_method():
    from sparsespec.plan.acceptance import load_acceptance

    acc = load_acceptance()
    assert {"magicdec", "sparsespec_l", "lookup"} <= set(acc.methods())
    assert all(0 <= p <= 1 for c in acc.curves for p in c.p)


def test_profile_from_a_probe_recovers_its_rates():
    """A synthetic probe of Llama-3.1-8B's shape in bf16 whose steps take exactly bytes / rate."""
    shape = load_shape("llama-3.1-8b")
    w = cost.weight_bytes(shape, "bfloat16")
    gemv, attn, overhead = 3000.0, 2000.0, 0.5  # GB/s, GB/s, ms

    def ms(ctx, rows_rate):
        return 1e3 * (w / (gemv * 1e9) + cost.kv_bytes(shape, ctx, "bfloat16") / (rows_rate * 1e9)) + overhead

    ctxs = [{"ctx": c, **{key: {"wall_ms": ms(c, attn), "device_ms": ms(c, attn)}
                          for key in ("ar_step", "verify_5", "verify_21")},
             "recall_update": {"wall_ms": 1.0, "device_ms": 1.0 + c / 1e5}} for c in (32768, 131072)]
    probe = {"ceilings": {"gemv_bf16": {"gb_s": gemv}}, "contexts": ctxs, "gpu": "NVIDIA H100 80GB HBM3",
             "dtype": "bfloat16", "shape": {k: v for k, v in load_shape_config("llama-3.1-8b").items()}}
    p = from_probe(probe)
    assert p.source == "probe" and p.bandwidth_gbs == gemv
    assert p.attention[1] == pytest.approx(attn)
    assert p.step_overhead_ms == pytest.approx(overhead)
    assert p.compute("bfloat16") == pytest.approx(989e12)  # the H100's datasheet figure
    again = from_dict(json.loads(p.to_json()), "saved")  # a saved probe profile loads back the same
    assert again.attention == pytest.approx(p.attention) and again.source == "probe"
    assert from_dict(probe, "probe.json").bandwidth_gbs == gemv  # a probe.json is read as one


def load_shape_config(name):
    from sparsespec.plan.shapes import KNOWN

    return KNOWN[name]


def test_profile_missing_a_figure_names_it(tmp_path):
    with pytest.raises(ProfileError, match="profile=x: no bandwidth_gbs"):
        from_dict({"name": "x", "source": "measured"}, "x")
    with pytest.raises(ProfileError, match="compute_tflops"):
        from_dict({"name": "x", "source": "measured", "bandwidth_gbs": 1.0}, "x")
    with pytest.raises(ProfileError, match="profile=.*nope.json: no such file"):
        load_profile(tmp_path / "nope.json")
    assert load_profile("h200").source in ("datasheet", "probe")


def test_cli_prints_every_method(capsys):
    assert cli(["model=smollm2-135m", "ctx=4k", "batch=1", "profile=cpu"]) == 0
    out = capsys.readouterr().out
    for name in METHODS:
        assert f"| {name} |" in out or name in out.split("Not priced")[-1], name
    assert "ceiling 1/γ" in out and "regime" in out


def test_cli_reads_a_config_json_and_writes_predictions(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    out = tmp_path / "plan.json"
    assert cli([f"model={tmp_path / 'config.json'}", "ctx=256", "batch=1,4", "profile=h100", f"json={out}"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["batch"] for r in rows} == {1, 4} and any(r["method"] == "ar" for r in rows)


@pytest.mark.parametrize("args, key", [
    (["profile=/no/such/profile.json"], "profile=/no/such/profile.json"),
    (["model=no-such-model"], "model=no-such-model"),
    (["ctx=lots"], "ctx="),
    (["batch=two"], "batch=two"),
    (["colour=red"], "colour"),
    (["model=smollm2-135m", "ctx=16k", "rope_scaling=none"], "ctx=16384"),
    (["dtype=int3"], "weights=int3"),
])
def test_cli_bad_input_is_one_line_naming_the_argument(args, key, capsys):
    assert cli(args) == 2
    err = capsys.readouterr()
    assert err.out == ""
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0]


def test_unknown_model_and_bad_config_raise_shape_errors(tmp_path):
    with pytest.raises(ShapeError, match="model=.*known model name"):
        load_shape("gpt-7")
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ShapeError, match="num_hidden_layers"):
        load_shape(bad)
    with pytest.raises(PlanError, match="batch=0"):
        plan("smollm2-135m", 4096, 0, "cpu")


def test_committed_calibration_is_what_the_code_gives_and_beats_the_identity():
    from sparsespec.plan.calibrate import report

    committed = json.loads((ROOT / "results" / "plan_calibration.json").read_text())
    fresh = report()
    assert fresh["rows"] == committed["rows"] and fresh["summary"] == committed["summary"]
    s = committed["summary"]
    assert s["all"]["median_abs_error"] < s["identity"]["median_abs_error"]
    assert math.isclose(s["all"]["rows"], len(committed["rows"]))


def test_planned_reads_an_evaluate_method_config():
    from sparsespec.plan.planner import MethodSpec, planned, spec_from_method

    config = {"name": "my_recall", "lookup": 0, "controller": {"_target_": "x.FixedK", "k": 4},
              "drafter": {"_target_": "sparsespec.decoding.drafters.SelfDrafter", "weights": "int8", "kv": "fp",
                          "policy": {"_target_": "sparsespec.kv.recall.RecallIndex", "ratio": 0.05, "window": 8}}}
    spec = spec_from_method(config)
    assert (spec.view, spec.ratio, spec.window, spec.draft_weights, spec.acceptance_from) == \
        ("recall", 0.05, 8, "int8", "sparsespec_l")
    assert spec_from_method({"name": "lookup", "drafter": None, "lookup": 2}).drafter == "lookup"
    p = planned(config, "smollm2-135m", 16384, k=4)
    assert p is not None and p.k == 4 and "stand-in for my_recall" in p.acceptance
    assert planned("ar", "smollm2-135m", 4096).speedup == 1.0
    assert planned(MethodSpec("unmeasured"), "smollm2-135m", 4096) is None  # no acceptance, no stand-in


def test_committed_acceptance_has_the_quantized_and_verification_guided_methods_own():
    from sparsespec.plan.acceptance import load_acceptance

    acc = load_acceptance()
    for method, ctxs in (("magicdec_q", (4096, 65536)), ("sparsespec_l_q", (4096, 65536)),
                         ("quantspec", (4096, 65536)), ("pillarattn", (4096,)), ("vegas", (4096,))):
        for ctx in ctxs:
            c = acc.curve(method, ctx, "pg19")
            assert c.method == method and c.ctx == ctx and "stand-in" not in c.source
    # the int8-layer variants of the quantized benchmark are other drafts: not merged into the int4 methods'
    q = json.loads((ROOT / "results" / "quantized_drafts.json").read_text())
    int4 = [r for r in q["rows"] if r["method"] == "magicdec_q" and r["ctx"] == 32768]
    assert acc.curve("magicdec_q", 32768).accepted(acc.curve("magicdec_q", 32768).max_k) == \
        pytest.approx(int4[0]["tau"] - 1, rel=1e-6)


def test_bench_curves_leave_out_variants_with_other_drafts():
    from sparsespec.plan.acceptance import curves_from_bench

    rows = [{"method": "m", "ctx": 4096, "acceptance": 0.5, "tau": 3.0},
            {"method": "m:attention=pytorch", "ctx": 4096, "acceptance": 0.5, "tau": 3.0},
            {"method": "m:weights=int8", "ctx": 4096, "acceptance": 0.1, "tau": 1.4}]
    (c,) = curves_from_bench({"rows": rows})
    assert c.rows == 2 and c.accepted(c.max_k) == pytest.approx(2.0, rel=1e-6)


def test_verification_guided_methods_are_priced_with_their_views():
    from sparsespec.config import load_method
    from sparsespec.plan.planner import METHODS, predict, spec_from_method

    vegas = spec_from_method(load_method("vegas").as_dict())
    assert (vegas.view, vegas.ratio, vegas.min_budget, vegas.window, vegas.k_sink) == ("recall", 0.05, 256, 2, 0)
    pillar = spec_from_method(load_method("pillarattn").as_dict())
    assert (pillar.view, pillar.ratio, pillar.window, pillar.k_recent) == ("recall", 0.05, 9, 9)
    shape = load_shape("llama-3.1-8b")
    prof = DeviceProfile("flat", "datasheet", bandwidth_gbs=1000.0, compute_tflops={"bfloat16": 1e6})
    curve = Curve("x", 4096, [0.8] * 4)
    # at 4k, 5% is 205 tokens: Vegas's floor of 256 makes its draft read more than PillarAttn's
    g_vegas = predict(METHODS["vegas"], shape, 4096, 8, prof, Dtypes("bfloat16", "bfloat16"), 4, curve).draft_cost
    g_pillar = predict(METHODS["pillarattn"], shape, 4096, 8, prof, Dtypes("bfloat16", "bfloat16"), 4, curve).draft_cost
    assert g_vegas > g_pillar


def test_committed_map_is_what_the_code_gives_and_the_claims_against_their_ceilings():
    from sparsespec.plan.maps import BATCHES, CONTEXTS, DEVICES, MODELS, build

    committed = json.loads((ROOT / "results" / "plan_map.json").read_text())
    fresh = build()
    for key in ("cells", "ceilings", "sizes", "claims", "profiles"):
        assert fresh[key] == committed[key], key
    assert len(committed["cells"]) == len(DEVICES) * len(MODELS) * len(CONTEXTS) * len(BATCHES)
    assert all(c["status"] == "predicted" for c in committed["cells"])
    claims = {c["paper"]: c for c in committed["claims"]}
    # a bf16 self-draft from a 10% view cannot reach 2.79x at <= 64k on any model of SparseSpec-L's range
    assert not claims["SparseSpec-L"]["holds_under_ceiling"] and claims["SparseSpec-L"]["ceiling"] < 2.79
    assert claims["SparseSpec-L"]["baseline_bandwidth_share_at_most"] < 1
    assert claims["QuantSpec"]["holds_under_ceiling"] and claims["TriForce"]["holds_under_ceiling"]


def test_a_weight_formats_measured_share_slows_its_products():
    """A block-quantized product that reads its bytes at half float32's rate takes twice its bytes' time."""
    from sparsespec.plan.cost import Op

    prof = DeviceProfile("cpu", "measured", bandwidth_gbs=10.0, device="cpu", linear={1: 10.0, 5: 10.0},
                         format_share={"int4": {1: 0.5, 5: 0.25}})
    plain = prof.op_seconds(Op("linear", 1e9, 0.0, 1, 1, "weights", "float32"))
    assert plain == pytest.approx(0.1)
    assert prof.op_seconds(Op("linear", 1e9, 0.0, 1, 1, "weights", "int4")) == pytest.approx(0.2)
    assert prof.op_seconds(Op("linear", 1e9, 0.0, 3, 1, "weights", "int4")) == pytest.approx(0.1 / 0.375)
    assert from_dict(json.loads(prof.to_json())).format_share == {"int4": {1: 0.5, 5: 0.25}}


def test_int8_kv_attention_is_priced_at_its_measured_rate_and_the_committed_profile_has_it():
    from sparsespec.plan.cost import Op

    prof = DeviceProfile("cpu", "measured", bandwidth_gbs=10.0, device="cpu", attention={1: 10.0},
                         kv_share={"int8": 0.25})
    fp = prof.op_seconds(Op("attention", 1e9, 0.0, 1, 1, "kv", "float32"))
    assert prof.op_seconds(Op("attention", 0.25e9, 0.0, 1, 1, "kv", "int8")) == pytest.approx(fp)
    cpu = load_profile("cpu")
    kv = json.loads((ROOT / "results" / "plan_kv_formats.json").read_text())
    assert 0 < cpu.kv_share["int8"] < 1 and cpu.kv_share["int8"] == pytest.approx(
        sorted(r["int8_share"] for r in kv["rows"])[len(kv["rows"]) // 2])
