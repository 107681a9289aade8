"""The first law: every method's greedy output is the target's own (token-identical to AR),
on several model families, prompts, budgets and draft lengths."""

from pathlib import Path

import pytest
import torch
from conftest import random_prompt, tiny_lm
from helpers import drafters, engine

from sparsespec.config import load_method
from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import DecodeState, ModelDrafter, PromptLookup, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kernels import cpu_attention
from sparsespec.kv.policies import FullKV, StreamingKV
from sparsespec.kv.recall import RecallIndex

FAMILY_PROMPTS = [("llama", 120, 0), ("qwen2", 333, 1), ("qwen3", 200, 2)]


@pytest.mark.parametrize("family,prompt_len,seed", FAMILY_PROMPTS)
def test_greedy_identical_to_ar(family, prompt_len, seed):
    target = tiny_lm(family)
    prompt = random_prompt(prompt_len, seed=seed)
    ar = SpeculativeEngine(target).generate(prompt, 40)
    assert ar.new_tokens == 40
    for name, make in drafters(family).items():
        for k in (1, 5):
            res = engine(target, make(), FixedK(k)).generate(prompt, 40)
            assert res.output_ids == ar.output_ids, f"{family} {name} k={k}"
            assert res.drafted >= res.accepted and res.verify_steps < 40
            if name.startswith("lookup"):  # the lookup path really drafted (the test has power)
                assert res.extra["lookup_rounds"] > 0, f"{family} {name}"
        res = engine(target, make(), EntropyController(candidates=(2, 4, 8))).generate(prompt, 40)
        assert res.output_ids == ar.output_ids, f"{family} {name} entropy controller"


def test_lookup_drafts_are_accepted_and_exact():
    """The accept path of lookup drafting, not only its reject path: a tiny random model's output
    reuses tokens of its prompt often enough that unigram lookup drafts get accepted."""
    accepted = {}
    for family, prompt_len, seed in FAMILY_PROMPTS:
        target, prompt = tiny_lm(family), random_prompt(prompt_len, seed=seed)
        ar = SpeculativeEngine(target).generate(prompt, 40)
        res = SpeculativeEngine(target, None, FixedK(5), prompt_lookup=PromptLookup(1)).generate(prompt, 40)
        assert res.output_ids == ar.output_ids, family
        assert res.draft_steps == 0 and res.gamma == 0.0  # a copy runs no model: no draft cost ratio
        accepted[family] = res.accepted
    assert sum(a > 0 for a in accepted.values()) >= 2, accepted


def test_lookup_rounds_do_not_train_the_controller():
    """The entropy controller learns acceptance-vs-entropy and the draft cost of the drafter it
    sizes; a copied draft has neither, so only the fallback's rounds reach it."""
    target, prompt = tiny_lm("llama"), random_prompt(120, seed=0)
    controller = EntropyController(candidates=(2, 4))
    drafter = SelfDrafter(StreamingKV(budget=24, k_sink=4))
    res = SpeculativeEngine(target, drafter, controller, prompt_lookup=PromptLookup(1)).generate(prompt, 40)
    assert res.extra["lookup_rounds"] > 0 and res.extra["fallback_rounds"] > 0
    assert len(controller.chosen) == res.extra["fallback_rounds"] < len(res.rounds)
    # a copy is capped at the lookup's own k, not at the controller's largest candidate
    capped = SpeculativeEngine(target, None, EntropyController(candidates=(2, 8)), prompt_lookup=PromptLookup(1, k=3)
                               ).generate(prompt, 40)
    assert capped.output_ids == res.output_ids and max(d for d, _ in capped.rounds) == 3


def test_lookup_drafts_what_followed_the_latest_earlier_ngram():
    two, one = PromptLookup(2), PromptLookup(1)
    assert two.lookup([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert two.lookup([1, 2, 9, 1, 2, 8, 1, 2], 2) == [8, 1]  # the latest occurrence wins
    assert two.lookup([5, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]  # a copy past the end repeats itself
    assert one.lookup([7, 7, 7], 3) == [7, 7, 7]
    assert two.lookup([1, 2, 3], 3) == [] and two.lookup([1, 2], 3) == []  # no earlier occurrence


def test_self_drafter_with_full_view_is_always_accepted():
    """Drafting from the exact cache reproduces the target: acceptance must be 1 (this would
    drop if drafting corrupted the cache or positions)."""
    target = tiny_lm("llama")
    res = SpeculativeEngine(target, SelfDrafter(FullKV()), FixedK(5)).generate(random_prompt(100), 31)
    assert res.acceptance_rate == 1.0
    assert res.mean_accepted_tokens == pytest.approx(6.0)


def test_budget_covering_context_equals_full_cache():
    """A sparse view whose budget covers the context gives the full cache's logits."""
    target = tiny_lm("qwen2")
    prompt = torch.tensor(random_prompt(80))
    cache = target.new_cache()
    target.prefill(prompt, cache)
    nxt = torch.tensor([5])
    view = StreamingKV(budget=500, k_sink=4)
    assert view.select(DecodeState(target, cache, prompt.tolist(), 80)) is None
    # force the gather path with every index: the compact copy must be exact
    idx = torch.arange(80, device=target.device).expand(target.n_layers, target.n_kv_heads, 80)
    compact = cache.gather(idx)
    a = target.forward(nxt, compact, positions=torch.tensor([80]))
    b = target.forward(nxt, cache)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # and a drafter computing its KV under a covering streaming mask equals plain causal
    m = view.mask(0, 80, 80)
    assert bool(m.equal(torch.ones(80, 80, dtype=torch.bool).tril()))


def test_eos_stops_like_ar():
    target = tiny_lm("llama")
    prompt = random_prompt(60, seed=4)
    ar_full = SpeculativeEngine(target).generate(prompt, 30)
    eos = ar_full.output_ids[10]
    ar = SpeculativeEngine(target).generate(prompt, 30, eos_token_ids=(eos,))
    stop = ar_full.output_ids.index(eos) + 1
    assert ar.output_ids == ar_full.output_ids[:stop]
    res = SpeculativeEngine(target, SelfDrafter(FullKV()), FixedK(6)).generate(prompt, 30, eos_token_ids=(eos,))
    assert res.output_ids == ar.output_ids


def test_reused_prefilled_cache_gives_the_same_generation():
    """A cache prefilled once and cropped back serves many runs (benchmarks): same tokens, same
    acceptance as a fresh prefill, for AR and for views that capture prefill attention."""
    target = tiny_lm("llama")
    prompt = random_prompt(150, seed=4)
    shared = target.new_cache(len(prompt) + 64)
    target.prefill(torch.tensor(prompt[:-20]), shared)
    for make in (lambda: None, lambda: SelfDrafter(RecallIndex(ratio=0.2, k_sink=2, k_recent=4, window=8))):
        fresh = SpeculativeEngine(target, make(), FixedK(3)).generate(prompt, 30)
        for _ in range(2):
            reused = SpeculativeEngine(target, make(), FixedK(3)).generate(prompt, 30, cache=shared)
            shared.crop(len(prompt) - 20)
            assert reused.output_ids == fresh.output_ids and reused.accepted == fresh.accepted
    with pytest.raises(ValueError, match="fewer tokens"):
        SpeculativeEngine(target).generate(prompt[:10], 5, cache=shared)


@pytest.mark.parametrize("k", [2, 5])
def test_model_drafter_that_is_the_target_is_always_accepted(family, k):
    """A separate-model drafter identical to the target, reading its full cache, must have every
    draft accepted: catches a drafter cache that drifts from the accepted sequence (stale entries
    after a rejection, a missed catch-up token, a draft fed twice), which exactness alone hides."""
    lm = tiny_lm(family)
    prompt = random_prompt(40, seed=3)
    res = SpeculativeEngine(lm, ModelDrafter(lm, FullKV()), FixedK(k)).generate(prompt, 30)
    assert res.output_ids == SpeculativeEngine(lm).generate(prompt, 30).output_ids
    assert res.acceptance_rate == 1.0 and all(a == d for d, a in res.rounds)


SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "method").glob("*.yaml"))
TINY_SIZES = {"sd_sparse": ["method.drafter.policy.budget=48"], "budgetdraft": ["method.drafter.policy.budget=48"],
              "sd_recall": ["method.drafter.policy.budget=40", "method.drafter.policy.k_recent=8"],
              "sparsespec_l": ["method.controller.candidates=[2,4,6]"]}


@pytest.mark.parametrize("attention", ["kernel", "pytorch"])
@pytest.mark.parametrize("family,prompt_len,seed", FAMILY_PROMPTS)
def test_every_shipped_method_config_builds_and_is_exact(family, prompt_len, seed, attention, monkeypatch):
    """Every conf/method file, composed and instantiated as evaluate.py does, decodes ar's tokens,
    with the CPU attention kernel (where it builds) and with PyTorch's attention (where it does not)."""
    if attention == "pytorch":
        monkeypatch.setenv(cpu_attention.ENV, "0")
    target, small = tiny_lm(family), tiny_lm(family, seed=7, layers=1)
    prompt = random_prompt(prompt_len, seed=seed)
    ar = SpeculativeEngine(target).generate(prompt, 24).output_ids
    assert len(SHIPPED) >= 8
    for name in SHIPPED:
        method = load_method(name, TINY_SIZES.get(name, []))
        res = method.build(target, small if method.needs_drafter_model else None, prefill_chunk=64).generate(prompt, 24)
        assert res.output_ids == ar, f"{family} {name}"
        assert (res.drafted > 0) == method.speculative or name == "lookup", f"{family} {name}"


@pytest.mark.parametrize("refresh", [True, False], ids=["recall", "snapkv"])
def test_small_drafter_scores_its_own_cache_from_its_own_attention(refresh):
    """A recall / SnapKV-style policy on a small drafter: the index holds the drafter's layers and is
    refreshed from the drafter's own catch-up passes; each round's first draft is the drafter's
    forward over exactly the positions the policy selects; the output is ar's."""
    target, small = tiny_lm("llama"), tiny_lm("llama", seed=7, layers=1)
    prompt = random_prompt(300, seed=4)
    ar = SpeculativeEngine(target).generate(prompt, 40).output_ids
    policy = RecallIndex(budget=40, k_sink=4, k_recent=8, window=4, refresh=refresh)
    drafter = ModelDrafter(small, policy, prefill_chunk=64)
    res = SpeculativeEngine(target, drafter, FixedK(3)).generate(prompt, 40)
    assert res.output_ids == ar and res.drafted > 0
    assert policy._sum.shape[:2] == (small.n_layers, small.n_kv_heads)  # the drafter's own statistics
    report = drafter.report()
    assert report["drafter_kv_tokens"] >= 300 + len(ar) - 8  # a scored cache keeps every position
    assert (report["index_updates"] > 0) == refresh
    # the next round drafts from the selected positions: its first logits are the drafter's forward of
    # the pending token over the gathered cache, and differ from the full cache's
    pending, length = drafter._own.tokens[-1], drafter.cache.length
    assert length == len(drafter._own.tokens) - 1  # caught up on every real token but the pending one
    compact = drafter.cache.gather(policy.select(drafter._own), extra=4)
    expect = small.forward([pending], compact, positions=[length], logits="last")
    round_ = drafter.steps(DecodeState(target, None, drafter._own.tokens, 300), 1)
    got = small.forward_many([round_.block(round_.first)])[0]
    torch.testing.assert_close(got, expect)
    full = small.forward([pending], drafter.cache, logits="last")
    assert not torch.allclose(got, full)


@pytest.mark.parametrize("view", [StreamingKV(budget=24, k_sink=4), StreamingKV(ratio=0.1, k_sink=2)],
                         ids=["budget", "ratio"])
def test_windowed_drafter_cache_gives_the_masked_full_cache_logits(view):
    """A small drafter under a streaming view keeps only the sinks and the window (evicting as it
    moves on, prefill included), yet each block's logits are those of the whole cache under the
    view's mask, which is the training-time mask."""
    lm, ids = tiny_lm("qwen2"), random_prompt(400, seed=9)
    ref = lm.forward(ids, lm.new_cache(400), mask=view.mask(0, 400, 400))
    drafter = ModelDrafter(lm, view, prefill_chunk=50)
    drafter.start(DecodeState(lm, None, ids[:200], 200))
    assert drafter.cache.length < 200 and drafter._window > view.k_sink  # prefill already evicted
    got, pos = [], 200
    for n in (1, 3, 1, 2, 1, 1, 4) * 7:  # draft steps and catch-up blocks, as rounds feed them
        got.append(lm.forward_many([drafter._block(ids[pos : pos + n], logits="all")])[0])
        pos += n
        drafter._evict()
        assert drafter.cache.length <= drafter.held_entries(pos) + 4  # flat in the context
    torch.testing.assert_close(torch.cat(got), ref[200:pos], atol=5e-5, rtol=1e-4)  # summation order only
    assert drafter.report()["drafter_kv_tokens"] <= drafter.held_entries(400) + 50 < 400  # + a prefill chunk
