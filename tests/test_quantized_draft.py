"""Draft weight formats (method.drafter.weights): the draft pass reads a bf16 / int8 / int4 copy of
the target's linear layers, the unmodified target verifies, so the output is still the target's:
greedy token-identical to ar, sampling exact in distribution. Each check also shows the quantized
draft really differs from the target's own (rejections happen), so it would catch a verifier that
trusted the draft."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from conftest import random_prompt, tiny_lm
from test_sampling import BATCH, TV_BOUND, exact_marginals, tv

from sparsespec.config import ConfigError, load_method
from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import ModelDrafter, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.decoding.sampling import Sampling
from sparsespec.eval.memory import estimate_bytes
from sparsespec.eval.methods import MethodConfigError
from sparsespec.kv.policies import FullKV, KVPolicy, StreamingKV
from sparsespec.kv.recall import RecallIndex
from sparsespec.models import quantized
from sparsespec.models.quantized import PackedLinear, draft_model

FORMATS = ["bf16", "int8", "int4"]


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
        assert res.extra["draft_weights"] == ("int4-g32" if fmt == "int4" else fmt)
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


def test_sampling_with_a_quantized_draft_gives_the_target_distribution():
    """Speculative sampling with int4 drafts (MagicDec's view, and a small model drafter, fixed k) and
    int8 drafts (SparseSpec-L's index under the entropy controller): the per-position marginals are
    the target's (exact, by enumeration), though the drafts are rejected often (q is the quantized
    draft's own)."""
    V, steps = 6, 3
    torch.set_num_threads(1)
    target = tiny_lm("llama", vocab=V, seed=1, layers=1)
    prompt = random_prompt(12, seed=5, vocab=V)
    sampling = Sampling(temperature=1.0)
    exact = exact_marginals(target, prompt, steps, sampling)
    small = tiny_lm("llama", vocab=V, seed=2, layers=1)
    for make, control in ((lambda: SelfDrafter(StreamingKV(budget=6, k_sink=1), weights="int4"), lambda: FixedK(2)),
                          (lambda: ModelDrafter(small, weights="int4"), lambda: FixedK(2)),
                          (lambda: SelfDrafter(RecallIndex(budget=5, k_sink=1, k_recent=2, window=2), weights="int8"),
                           lambda: EntropyController(candidates=(1, 2, 3)))):
        counts, drafted, accepted, n = torch.zeros(steps, V), 0, 0, 1500
        for seeds in torch.arange(n).split(BATCH):
            engine = SpeculativeEngine(target, make(), control())
            for res in engine.generate_batch([prompt] * len(seeds), steps, sampling, seed=seeds.tolist()):
                drafted, accepted = drafted + res.drafted, accepted + res.accepted
                for i, t in enumerate(res.output_ids):
                    counts[i, t] += 1
        assert drafted > accepted > 0
        for i in range(steps):
            assert tv(counts[i] / n, exact[i]) < TV_BOUND, f"position {i}"


def test_shipped_quantized_methods_are_exact_and_say_what_their_draft_read():
    target = tiny_lm("qwen3")
    prompt = random_prompt(150, seed=6)
    ar = SpeculativeEngine(target).generate(prompt, 20).output_ids
    for name in ("magicdec_q", "sparsespec_l_q"):
        res = load_method(name, ["method.drafter.policy.ratio=0.2"]).build(target).generate(prompt, 20)
        assert res.output_ids == ar
        assert res.extra["draft_weights"] == "int4-g32" and res.extra["draft_kv"] == "fp32"
        # the weights in int4 (an eighth of float32's, plus scales) and the K/V of a view of some tokens
        weights = quantized.linear_bytes(target, "int4", "int4", 32)
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
        assert res[0].output_ids == ar and res[0].extra["draft_weights"] == "int8"
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
    assert msg.startswith("method magicdec: method.drafter.weights_group=128: a layer has 64 inputs")
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
        assert str(e.value) == ("method sparsespec_l_q: method.drafter.weights=int4: torch's int4 kernel does not "
                                "run on cpu: no kernel; the formats that work here (cpu): fp, bf16, int8")
    finally:
        quantized.format_problem.cache_clear()


def test_evaluate_refuses_a_format_the_model_cannot_take_before_writing_anything(tmp_path):
    """Through the harness: the refusal comes after the model loads (it depends on its shapes) and
    before the out_dir exists."""
    from test_reliability import compose_cfg
    from test_training import _text, make_tokenizer, tiny_target

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
        assert res.extra["draft_weights"] == ("int4-g32" if fmt == "int4" else fmt)
        rejected += res.drafted - res.accepted
    assert rejected > 0
