"""Draft weight formats (method.drafter.weights) and draft KV formats (method.drafter.kv): the draft
pass reads a bf16 / int8 / int4 copy of the target's linear layers and attends to a bf16 / int8 view
of the K/V, the unmodified target verifies over its own cache, so the output is still the target's:
greedy token-identical to ar, sampling exact in distribution. Each check also shows the quantized
draft really differs from the target's own (rejections happen), so it would catch a verifier that
trusted the draft."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch
from conftest import random_prompt, tiny_lm
from helpers import BATCH, TV_BOUND, exact_marginals, tv

from sparsespec.config import ConfigError, load_method
from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import ModelDrafter, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.decoding.sampling import Sampling
from sparsespec.eval.memory import estimate_bytes
from sparsespec.eval.methods import MethodConfigError
from sparsespec.kernels import cpu_attention
from sparsespec.kv.policies import FullKV, KVPolicy, StreamingKV
from sparsespec.kv.quantized import DraftView, Int8Rows, QuantizedKVCache, quantize_int8, view_bytes
from sparsespec.kv.recall import RecallIndex
from sparsespec.models import quantized
from sparsespec.models.quantized import PackedLinear, draft_model

FORMATS = ["bf16", "int8", "int4"]
# as rows report them on the CPU in float32, where int8 and int4 run as blocks of 32 in the project's kernel
LABELS = {"bf16": "bf16", "int8": "int8-g32", "int4": "int4-g32"}


@dataclass
class KeyNorm(KVPolicy):
    """A user's own KV policy (the architecture guide's example): keys of low norm kept."""

    def score(self, state) -> torch.Tensor:
        cache = state.cache
        return -torch.stack([k[:, : cache.length].norm(dim=-1) for k in cache.k])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_packed_layer_computes_its_format_rounding_of_the_product(fmt):
    """Each format's product is the float32 one up to its own rounding, and no closer: the copy
    really holds other weights. 61 outputs: int4's packing takes multiples of 16, the rest is cut."""
    torch.manual_seed(0)
    w, b, x = torch.randn(61, 64), torch.randn(61), torch.randn(3, 64)
    exact = x @ w.T + b
    out = PackedLinear.pack(w, b, fmt, 32)(x)
    assert out.shape == (3, 61) and out.dtype == torch.float32
    err = (out - exact).abs().max().item()
    bound = {"bf16": 0.15, "int8": 0.5, "int4": 4.0}[fmt]  # |x @ w| ~ 8: bf16 rounding, 1/127 and 1/15 grids
    assert 1e-3 < err < bound


def _engine(target, policy: KVPolicy, fmt: str, controller=None) -> SpeculativeEngine:
    return SpeculativeEngine(target, SelfDrafter(policy, weights=fmt), controller or FixedK(3))


POLICIES = {
    "magicdec": lambda: StreamingKV(budget=40, k_sink=4),
    "sparsespec_l": lambda: RecallIndex(budget=40, k_sink=4, k_recent=8, window=4),
    "snapkv_self": lambda: RecallIndex(budget=40, k_sink=4, k_recent=8, window=4, refresh=False),
    "key_norm": lambda: KeyNorm(budget=40, k_sink=4),
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_output_is_ar_for_every_view_and_format(family, fmt):
    """Every self-drafting view (MagicDec's, SparseSpec-L's, SnapKV's, a user's) with the draft's
    weights in each format gives ar's tokens, with drafts both kept and rejected along the way."""
    target = tiny_lm(family)
    prompt = random_prompt(64, seed=3)
    ar = SpeculativeEngine(target).generate(prompt, 16).output_ids
    kept = 0
    for name, policy in POLICIES.items():
        res = _engine(target, policy(), fmt).generate(prompt, 16)
        assert res.output_ids == ar, (name, fmt)
        assert res.drafted > res.accepted, (name, fmt)
        assert res.extra["draft_weights"] == LABELS[fmt]
        kept += res.accepted
    assert kept > 0  # and some drafts were good enough to keep


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_full_view_drafts_differ_only_through_the_weights(fmt):
    """With the full cache the fp draft is the target itself (every draft accepted); the same view
    with the weights in another format has rejections: the draft pass really reads the copy."""
    target = tiny_lm("llama")
    prompt = random_prompt(80, seed=3)
    fp = _engine(target, FullKV(), "fp").generate(prompt, 48)
    q = _engine(target, FullKV(), fmt).generate(prompt, 48)
    assert fp.accepted == fp.drafted > 0
    assert q.output_ids == fp.output_ids and 0 < q.accepted < q.drafted


def test_one_copy_is_shared_by_every_sequence_of_a_batch():
    """The copy is made once per (target, formats) and a batch's drafts run through it together: each
    sequence's output is what it gives alone, and the copy's forwards are the batch's draft steps
    in lockstep, not one per sequence."""
    target = tiny_lm("qwen2")
    prompts = [random_prompt(n, seed=n) for n in (60, 90, 75)]
    alone = [_engine(target, StreamingKV(budget=16, k_sink=2), "int8").generate(p, 16).output_ids for p in prompts]
    copy = draft_model(target, "int8")
    assert draft_model(target, "int8") is copy and draft_model(target, "fp") is target
    copy.forward_calls = 0
    res = _engine(target, StreamingKV(budget=16, k_sink=2), "int8").generate_batch(prompts, 16)
    assert [r.output_ids for r in res] == alone
    assert copy.forward_calls < sum(r.draft_steps for r in res)  # packed across the sequences


def _assert_target_marginals(drafters) -> None:
    """For each (drafter factory, controller factory): speculative sampling from a tiny target gives
    the target's per-position marginals (exact, by enumeration), with drafts rejected on the way."""
    V, steps, n = 6, 3, 1500
    torch.set_num_threads(1)
    target = tiny_lm("llama", vocab=V, seed=1, layers=1)
    prompt = random_prompt(12, seed=5, vocab=V)
    sampling = Sampling(temperature=1.0)
    exact = exact_marginals(target, prompt, steps, sampling)
    for make, control in drafters:
        counts, drafted, accepted = torch.zeros(steps, V), 0, 0
        for seeds in torch.arange(n).split(BATCH):
            engine = SpeculativeEngine(target, make(), control())
            for res in engine.generate_batch([prompt] * len(seeds), steps, sampling, seed=seeds.tolist()):
                drafted, accepted = drafted + res.drafted, accepted + res.accepted
                for i, t in enumerate(res.output_ids):
                    counts[i, t] += 1
        assert drafted > accepted > 0
        for i in range(steps):
            assert tv(counts[i] / n, exact[i]) < TV_BOUND, f"position {i}"


def test_sampling_with_a_quantized_draft_gives_the_target_distribution():
    """Speculative sampling with int4 drafts (MagicDec's view, and a small model drafter, fixed k) and
    int8 drafts (SparseSpec-L's index under the entropy controller): the per-position marginals are
    the target's (exact, by enumeration), though the drafts are rejected often (q is the quantized
    draft's own)."""
    small = tiny_lm("llama", vocab=6, seed=2, layers=1)
    _assert_target_marginals([
        (lambda: SelfDrafter(StreamingKV(budget=6, k_sink=1), weights="int4"), lambda: FixedK(2)),
        (lambda: ModelDrafter(small, weights="int4"), lambda: FixedK(2)),
        (lambda: SelfDrafter(RecallIndex(budget=5, k_sink=1, k_recent=2, window=2), weights="int8"),
         lambda: EntropyController(candidates=(1, 2, 3)))])


def test_shipped_quantized_methods_are_exact_and_say_what_their_draft_read():
    target = tiny_lm("qwen3")
    prompt = random_prompt(150, seed=6)
    ar = SpeculativeEngine(target).generate(prompt, 20).output_ids
    for name in ("magicdec_q", "sparsespec_l_q"):
        res = load_method(name, ["method.drafter.policy.ratio=0.2"]).build(target).generate(prompt, 20)
        assert res.output_ids == ar
        assert res.extra["draft_weights"].startswith("int4-g32, lm_head int8") and res.extra["draft_kv"] == "fp32"
        # the layers in int4 (an eighth of float32's, plus scales), the lm_head in int8, and the K/V
        # of a view of some tokens
        weights = quantized.linear_bytes(target, "int4", "int8", 32)
        assert weights < quantized.linear_bytes(target, "fp", "fp", 32) / 6
        kv = res.extra["draft_step_bytes"] - weights
        per_token = 2 * target.n_layers * target.n_kv_heads * target.head_dim * 4
        assert 0 < kv < 150 * per_token  # a sparse view: fewer entries than the 150 prompt tokens


def test_the_memory_guard_counts_the_quantized_copy():
    target, small = tiny_lm("llama"), tiny_lm("llama", seed=7, layers=1)
    plain = estimate_bytes(target, 2048, [load_method("sparsespec_l", [])], None, 512)
    q = estimate_bytes(target, 2048, [load_method("sparsespec_l", ["method.drafter.weights=int8"])], None, 512)
    copy = quantized.copy_bytes(target, "int8", None, 32)
    assert q["draft weights copy"] == copy > 0
    assert q.peak - plain.peak == copy
    assert copy == sum(p.nbytes for layer in draft_model(target, "int8")._packed for p in layer.values()) \
        + draft_model(target, "int8")._head.nbytes
    # a model drafter's copy is of the drafter's weights, and an fp lm_head adds nothing
    sd = estimate_bytes(target, 2048, [load_method("sd", ["method.drafter.weights=int4",
                                                          "method.drafter.head_weights=fp"])], small, 512)
    assert sd["draft weights copy"] == quantized.copy_bytes(small, "int4", "fp", 32) \
        == quantized.copy_bytes(small, "int4", "int4", 32) - draft_model(small, "int4")._head.nbytes


def test_a_model_drafter_method_takes_the_format_from_its_config():
    target, small = tiny_lm("qwen2"), tiny_lm("qwen2", seed=7, layers=1)
    prompt = random_prompt(64, seed=3)
    ar = SpeculativeEngine(target).generate(prompt, 16).output_ids
    for name in ("sd", "sd_sparse"):
        method = load_method(name, ["method.drafter.weights=int8", "method.drafter.policy.budget=40"]
                             if name == "sd_sparse" else ["method.drafter.weights=int8"])
        res = method.build(target, small, prefill_chunk=32).generate_batch([prompt, prompt[:50]], 16)
        assert res[0].output_ids == ar and res[0].extra["draft_weights"] == LABELS["int8"]
        assert res[0].drafted > res[0].accepted


# -- bad input: one line naming the key, the reason and the formats that work here -------------


def test_an_unknown_format_is_refused_before_any_model_loads():
    with pytest.raises(ConfigError) as e:
        load_method("magicdec", ["method.drafter.weights=int3"])
    msg = str(e.value)
    assert "method.drafter.weights='int3'" in msg and "fp, bf16, int8, int4" in msg and "\n" not in msg


def test_a_group_the_layers_cannot_take_is_refused_with_the_groups_that_work():
    target = tiny_lm("llama")  # 64 and 96 inputs
    with pytest.raises(MethodConfigError) as e:
        load_method("magicdec", ["method.drafter.weights=int4", "method.drafter.weights_group=128"]).build(target)
    msg = str(e.value)
    assert msg.startswith("method magicdec: method.drafter.weights_group=128 does not work here: a layer has 64 "
                          "inputs")
    assert msg.endswith("the int4 groups that work for this model here: 32") and "\n" not in msg


def test_a_format_without_a_kernel_on_this_device_is_refused(monkeypatch):
    """int4 where torch's kernel does not run (a device or build without it): simulated by a probe
    that fails, as the real one does there."""
    quantized.format_problem.cache_clear()
    monkeypatch.setattr(quantized, "_probe", lambda fmt, device, group=32: "no kernel" if fmt == "int4" else None)
    try:
        target = tiny_lm("llama")
        with pytest.raises(MethodConfigError) as e:
            load_method("sparsespec_l_q", []).build(target)
        assert str(e.value) == ("method sparsespec_l_q: method.drafter.weights='int4' cannot run here: torch's int4 "
                                "kernel does not run on cpu: no kernel; the formats that work here (cpu): fp, bf16, "
                                "int8")
    finally:
        quantized.format_problem.cache_clear()


def test_evaluate_refuses_a_format_the_model_cannot_take_before_writing_anything(tmp_path):
    """Through the harness: the refusal comes after the model loads (it depends on its shapes) and
    before the out_dir exists."""
    from helpers import compose_cfg, tiny_target
    from helpers import text as _text
    from helpers import training_tokenizer as make_tokenizer

    from sparsespec.eval.harness import EvaluationError, run_evaluation

    tok = make_tokenizer()
    model_dir = tmp_path / "target"
    tiny_target(len(tok), layers=1).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    text = tmp_path / "doc.txt"
    text.write_text(_text(5, 400))
    out = tmp_path / "eval_out"
    cfg = compose_cfg("evaluate", [f"model.path={model_dir}", "method=magicdec", "method.drafter.weights=int4",
                                   "method.drafter.weights_group=128", "dataset=text", f"dataset.path={text}",
                                   "dataset.use_chat_template=false", "ctx=128", "gen.max_new_tokens=4",
                                   f"out_dir={out}", "runtime.warmup=false", "runtime.progress=false", "baseline=null"])
    with pytest.raises(EvaluationError) as e:
        run_evaluation(cfg)
    assert "method.drafter.weights_group=128" in str(e.value) and "groups that work" in str(e.value)
    assert not out.exists()


def test_the_summary_row_says_what_the_draft_read():
    from sparsespec.eval.summary import summarize, to_markdown

    base = {"dataset": "pg19", "task": None, "ctx": 16384, "sample_id": "a", "tokens_per_s": 1.0}
    rows = [{**base, "method": "ar"},
            {**base, "method": "sparsespec_l_q", "draft_weights": "int4-g32", "draft_kv": "fp32",
             "draft_step_bytes": 96e6}]
    table = to_markdown(summarize(rows))
    assert "draft step read" in table.splitlines()[0]
    assert table.splitlines()[3].endswith("| int4-g32 weights, fp32 K/V: 96 MB |")
    assert table.splitlines()[2].endswith("| — |")  # ar drafts nothing


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_model_drafter_reads_its_weights_in_the_format(family, fmt):
    """The target as its own model drafter: with fp weights every draft is kept; in another format
    some are rejected (the drafter's passes read the copy), and under each policy (full, streaming,
    recall) the output is ar's."""
    target = tiny_lm(family)
    prompt = random_prompt(64, seed=3)
    ar = SpeculativeEngine(target).generate(prompt, 32).output_ids
    fp = SpeculativeEngine(target, ModelDrafter(target, FullKV()), FixedK(3)).generate(prompt, 32)
    assert fp.output_ids == ar and fp.accepted == fp.drafted
    rejected = 0
    for policy in (FullKV(), StreamingKV(budget=40, k_sink=4), RecallIndex(budget=40, k_sink=4, k_recent=8, window=4)):
        res = SpeculativeEngine(target, ModelDrafter(target, policy, weights=fmt), FixedK(3)).generate(prompt, 32)
        assert res.output_ids == ar, type(policy).__name__
        assert res.extra["draft_weights"] == LABELS[fmt]
        rejected += res.drafted - res.accepted
    assert rejected > 0


# -- draft KV formats (method.drafter.kv): the view a draft step attends to ----------------------

KV_FORMATS = ["fp", "bf16", "int8"]


def test_an_int8_view_holds_each_row_to_its_scale():
    """Per token and KV head: the row's largest magnitude maps to 127, every element within half a
    step of the original; the stored bytes are a quarter of float32's plus one scale per row."""
    torch.manual_seed(0)
    x = torch.randn(2, 37, 64) * torch.rand(2, 37, 1) * 10
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (2, 37)
    assert (q.abs().amax(-1) == 127).all()
    back = Int8Rows(q, scale).dequantize()
    assert ((back - x).abs() <= scale[..., None] / 2 + 1e-6).all() and (back != x).any()
    cache = QuantizedKVCache("int8", 3, 2, 64, capacity=10)
    cache.length = 10
    assert view_bytes(cache) == 2 * 3 * 2 * (64 + 4) * 10 == cache.nbytes()


def test_a_full_view_copy_follows_the_cache_and_drops_each_rounds_drafts():
    """The full view's copy rounds only what the cache gained since the last round, forgets the last
    round's drafts, and equals a fresh rounding of the whole cache every time."""
    target = tiny_lm("llama")
    cache = target.new_cache(64)
    target.prefill(random_prompt(30, seed=1), cache)
    view = DraftView("int8")
    for extra_tokens in (0, 5, 1):
        if extra_tokens:
            target.forward(random_prompt(extra_tokens, seed=extra_tokens), cache, logits="none")
        copy = view.full(cache, 4)
        assert copy.length == cache.length
        target.forward([1, 2], copy, logits="none")  # a round's drafts, written into the copy
        for layer in range(cache.n_layers):
            q, s = quantize_int8(cache.k[layer][:, : cache.length])
            assert torch.equal(copy.k[layer][:, : cache.length], q)
            assert torch.equal(copy.k_scale[layer][:, : cache.length], s)


def test_the_view_is_read_in_its_format():
    """A draft step over the int8 / bf16 view gives other logits than over the cache itself (the
    view really holds rounded K/V), close to them; with the CPU kernel built, the int8 view is read
    by its int8 path."""
    target = tiny_lm("qwen2")
    cache = target.new_cache(128)
    target.prefill(random_prompt(90, seed=2), cache)
    exact = target.forward([5], cache, logits="last")
    cache.crop(90)
    calls = []
    real = cpu_attention.few_rows_attention_int8
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_attention, "few_rows_attention_int8", lambda *a, **k: calls.append(1) or real(*a, **k))
        for fmt in ("bf16", "int8"):
            view = DraftView(fmt).full(cache, 2)
            logits = target.forward([5], view, logits="last")
            err = (logits - exact).abs().max().item()
            assert 0 < err < 0.05 * exact.abs().max().item(), fmt  # rounded K/V: near, not equal
    assert len(calls) == (target.n_layers if cpu_attention.available() else 0)


QUANTIZED_METHODS = ["quantspec", "magicdec_q", "sparsespec_l_q"]


@functools.cache
def _ar_run(family: str) -> tuple:
    """A tiny target of the family, a prompt and ar's 16 tokens (shared by the methods' tests)."""
    target = tiny_lm(family)
    prompt = random_prompt(100, seed=6)
    return target, prompt, SpeculativeEngine(target).generate(prompt, 16).output_ids


@pytest.mark.parametrize("kv", KV_FORMATS)
@pytest.mark.parametrize("name", QUANTIZED_METHODS)
def test_quantized_methods_with_each_kv_format_are_ar(family, name, kv):
    """quantspec (int4 weights, the whole KV) and the sparse-view methods with int4 weights, each
    with its view in fp, bf16 and int8: ar's tokens, with rejections, and the row says what the
    draft read."""
    target, prompt, ar = _ar_run(family)
    # half the prompt in the view: a random tiny model's draft from a streaming window of a quarter
    # of it agrees with the target almost nowhere, whatever the weights' format
    # quantspec's full view leaves only the formats to disagree; with its lm_head exact in int8 a tiny
    # Llama's draft can agree on all 16 tokens, so the lm_head goes in int4 too (the test can fail)
    over = ["method.drafter.policy.ratio=0.5"] if name != "quantspec" else ["method.drafter.head_weights=int4"]
    res = load_method(name, [f"method.drafter.kv={kv}", *over]).build(target).generate(prompt, 16)
    assert res.output_ids == ar
    assert res.drafted > res.accepted  # the quantized draft disagrees somewhere
    assert res.extra["draft_weights"].startswith("int4-g32")  # the lm_head may have its own
    assert res.extra["draft_kv"] == {"fp": "fp32", "bf16": "bf16", "int8": "int8"}[kv]


def test_a_draft_step_counts_the_views_bytes_in_its_format():
    """draft_step_bytes = the weights' bytes + the view's: the same full view (quantspec's) read
    in fp32, bf16 and int8 costs 4, 2 and 1 bytes per element (+ 4 bytes of scale per row)."""
    target = tiny_lm("llama")
    prompt = random_prompt(100, seed=4)
    weights = quantized.linear_bytes(target, "int4", "int4", 32)
    per_row = {"fp": 4 * target.head_dim, "bf16": 2 * target.head_dim, "int8": target.head_dim + 4}
    for kv, row in per_row.items():
        drafter = SelfDrafter(FullKV(), weights="int4", kv=kv)
        res = SpeculativeEngine(target, drafter, FixedK(3)).generate(prompt, 12)
        entries = (res.extra["draft_step_bytes"] - weights) / (2 * target.n_layers * target.n_kv_heads * row)
        # every round reads the whole cache: between the prompt and the prompt and the output
        assert len(prompt) <= entries <= len(prompt) + 12, kv


def test_sampling_with_a_quantized_view_gives_the_target_distribution():
    """Speculative sampling with int8 views (quantspec's full view with int4 weights, and MagicDec's
    streaming view with int8 weights): the marginals are the target's, with drafts rejected."""
    _assert_target_marginals([
        (lambda: SelfDrafter(FullKV(), weights="int4", kv="int8"), lambda: FixedK(2)),
        (lambda: SelfDrafter(StreamingKV(budget=6, k_sink=1), weights="int8", kv="int8"), lambda: FixedK(2))])


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_a_model_drafters_cache_is_held_in_the_kv_format(kv):
    """A model drafter's windowed cache (sd_sparse) and a scored one's view (sd_recall) in the
    format: ar's output, the row says the format, and the windowed cache really holds it."""
    target, small = tiny_lm("qwen3"), tiny_lm("qwen3", seed=7, layers=1)
    prompt = random_prompt(200, seed=3)  # past the window by more than an eviction's worth
    ar = SpeculativeEngine(target).generate(prompt, 16).output_ids
    for name in ("sd_sparse", "sd_recall"):
        engine = load_method(name, [f"method.drafter.kv={kv}", "method.drafter.policy.budget=100"]).build(
            target, small, prefill_chunk=64)
        res = engine.generate(prompt, 16)
        assert res.output_ids == ar and res.drafted > res.accepted and res.extra["draft_kv"] == kv, name
        if name == "sd_sparse":
            assert isinstance(engine.drafter.cache, QuantizedKVCache) and engine.drafter.cache.fmt == kv


def test_the_memory_guard_counts_the_quantized_view():
    """quantspec's copy of the whole cache and a sparse view's compact cache are counted in their
    format (int8 with its scales), and equal what the run allocates."""
    target = tiny_lm("llama")
    tokens, new = 300, 8
    prompt = random_prompt(tokens - new, seed=9)
    per_entry = 2 * target.n_layers * target.n_kv_heads * (target.head_dim + 4)
    est = estimate_bytes(target, tokens, [load_method("quantspec", [])], None, 512, new_tokens=new)
    assert est["draft KV copy"] == per_entry * (tokens + 64)
    engine = load_method("quantspec", []).build(target)
    engine.generate(prompt, new)
    assert engine.drafter._view.copy.nbytes() == est["draft KV copy"]
    fp = estimate_bytes(target, tokens, [load_method("magicdec", [])], None, 512, new_tokens=new)
    q = estimate_bytes(target, tokens, [load_method("magicdec", ["method.drafter.kv=int8"])], None, 512,
                       new_tokens=new)
    budget = StreamingKV().budget_for(tokens) + FixedK().k + 1 + 64
    assert q["compact KV cache"] == per_entry * budget
    assert fp["compact KV cache"] == 2 * target.n_layers * target.n_kv_heads * target.head_dim * 4 * budget
    engine = load_method("magicdec", ["method.drafter.kv=int8"]).build(target)
    engine.generate(prompt, new)
    assert engine.drafter._view.compact.nbytes() <= q["compact KV cache"]


def test_an_unknown_kv_format_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        load_method("quantspec", ["method.drafter.kv=int4"])
    msg = str(e.value)
    assert msg == ("method quantspec: method.drafter.kv='int4' is not a draft KV format; the formats that work: "
                   "fp, bf16, int8")


def test_evaluate_exits_nonzero_on_an_unknown_kv_format_and_writes_nothing(tmp_path):
    from helpers import ROOT
    from helpers import run_python as _run

    out = tmp_path / "e"
    r = _run([str(ROOT / "evaluate.py"), "method=magicdec", "method.drafter.kv=fp8", f"out_dir={out}"], tmp_path)
    text = r.stderr + r.stdout
    assert r.returncode != 0 and "method.drafter.kv='fp8'" in text and "fp, bf16, int8" in text
    assert "Traceback" not in text and not out.exists()


@pytest.mark.slow  # a minute or more on 2 cores: two generations on the real model
@pytest.mark.embedded
def test_quantspec_is_exact_on_smollm2():
    """The embedded SmolLM2 with quantspec's int4 weights and int8 view of the whole cache, on a held-
    out book: ar's tokens. Its int4 layers hold the checkpoint's own 4-bit blocks exactly, so the
    lm_head is put in int4 too (lossy for its 8-bit weights), which makes the draft disagree
    somewhere: the test can fail."""
    from sparsespec.data.pg19 import load_books, select_split
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    loaded = load_model(None)
    lm = CausalLM(loaded.model)
    book = select_split(load_books(), "eval")[0]["text"]
    prompt = loaded.tokenizer(book[100_000:104_000])["input_ids"][:400]
    ar = SpeculativeEngine(lm).generate(prompt, 32).output_ids
    res = load_method("quantspec", ["method.drafter.head_weights=int4"]).build(lm).generate(prompt, 32)
    assert res.output_ids == ar
    assert res.drafted > res.accepted > 0
    assert res.extra["draft_weights"].startswith("int4-g32") and res.extra["draft_kv"] == "int8"
