"""SparseSpec-L's parts: the recall index scores, no extra forward, the entropy controller."""

from types import SimpleNamespace

import pytest
import torch
from conftest import random_prompt, tiny_hf

from sparsespec.decoding.controllers import EntropyController, FixedK, RoundStats
from sparsespec.decoding.drafters import SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.policies import StreamingKV
from sparsespec.kv.recall import RecallIndex
from sparsespec.models.runner import CausalLM


def brute_force_scores(hf, tokens, length, window):
    """Attention mass of the last `window` real queries (positions length-window .. length-1) on
    keys [0, length), summed over each KV group's query heads, from transformers' eager path."""
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        att = hf(torch.tensor([tokens[:length]]), output_attentions=True).attentions
    hf.config._attn_implementation = "sdpa"
    hkv = hf.config.num_key_value_heads
    out = []
    for a in att:  # [1, Hq, T, T]
        a = a[0, :, length - window : length, :length].sum(1)  # [Hq, T]
        out.append(a.reshape(hkv, -1, length).sum(1))
    return torch.stack(out)


@pytest.mark.parametrize("family,window,refresh,every", [("llama", 16, True, 1), ("qwen2", 4, True, 1),
                                                         ("llama", 8, False, 1), ("llama", 16, True, 3)])
def test_recall_index_equals_brute_force_topk(family, window, refresh, every):
    hf = tiny_hf(family)
    target = CausalLM(hf)
    prompt = random_prompt(150, seed=2)
    view = RecallIndex(budget=40, k_sink=4, k_recent=8, window=window, refresh=refresh, refresh_every=every)
    cache = target.new_cache(200)
    res = SpeculativeEngine(target, SelfDrafter(view), FixedK(3)).generate(prompt, 25, cache=cache)
    if refresh:  # one refresh per `every` rounds; then bring in the rounds still waiting
        assert res.extra["index_updates"] == res.verify_steps // every
        if view._waiting:
            view.ingest(SimpleNamespace(cache=cache, target=target), view._waiting)
    tokens = prompt + res.output_ids
    length = len(prompt) + res.new_tokens - 1  # the target cache: all but the pending token
    if refresh:
        ref = brute_force_scores(hf, tokens, length, window)
        torch.testing.assert_close(view.score(SimpleNamespace(cache=cache)), ref, atol=1e-4, rtol=1e-4)
        scores = ref
    else:  # static: the last W prompt queries only
        ref = brute_force_scores(hf, prompt, len(prompt), window)
        at_prompt = SimpleNamespace(cache=SimpleNamespace(length=len(prompt)))
        torch.testing.assert_close(view.score(at_prompt), ref, atol=1e-4, rtol=1e-4)
        scores = torch.cat([ref, torch.zeros(*ref.shape[:2], length - len(prompt))], -1)
    assert cache.length == length
    idx = view.select(SimpleNamespace(cache=cache))
    middle = scores[..., 4 : length - 8]
    top = middle.topk(40 - 12, dim=-1).indices + 4
    expect = torch.cat([torch.arange(4).expand(*top.shape[:2], 4), top,
                        torch.arange(length - 8, length).expand(*top.shape[:2], 8)], -1).sort(-1).values
    assert torch.equal(idx, expect)
    assert res.output_ids == SpeculativeEngine(target).generate(prompt, 25).output_ids


def test_index_refresh_adds_no_target_forward():
    target = CausalLM(tiny_hf("llama"))
    prompt = random_prompt(200, seed=1)
    for view in (RecallIndex(ratio=0.1, k_sink=4, k_recent=8), StreamingKV(ratio=0.1, k_sink=4)):
        target.forward_calls = 0
        res = SpeculativeEngine(target, SelfDrafter(view), FixedK(4), prefill_chunk=128).generate(prompt, 20)
        prefill_chunks = 2
        assert target.forward_calls == prefill_chunks + res.draft_steps + res.verify_steps
        if isinstance(view, RecallIndex):  # the refresh cost is reported with the run: one per verify,
            # and the prefill seeding apart from it (it is prefill time, not decode time)
            assert res.extra["index_updates"] == res.verify_steps and res.extra["index_update_s"] > 0
            assert res.extra["index_seed_s"] > 0


def test_controller_short_when_alpha_below_gamma_long_when_far_above():
    c = EntropyController(candidates=(4, 8, 12, 16, 20), gamma_init=0.6)
    c.max_draft()
    n = 0
    while True:  # entropies at the rejected centre: p ~ p_min, far below gamma
        n += 1
        if not c.keep_drafting(n, [3.0] * n):
            break
    assert n == 4
    c = EntropyController(candidates=(4, 8, 12, 16, 20), gamma_init=0.02)
    c.max_draft()
    n = 0
    while True:  # confident tokens: p ~ p_max >> gamma
        n += 1
        if not c.keep_drafting(n, [0.5] * n):
            break
    assert n == 20


def test_controller_first_round_and_updates():
    c = EntropyController(beta=0.5)
    assert c.max_draft() == 20  # before any statistics: initial centres decide
    assert 0 < c.estimate(1.0) < 1
    c.keep_drafting(1, [0.2])
    c.observe(RoundStats(drafted=2, accepted=1, entropies=[0.2, 4.0], draft_s=0.02, verify_s=0.1))
    assert c.h_acc == pytest.approx(0.5 * 0.5 + 0.5 * 0.2)
    assert c.h_rej == pytest.approx(0.5 * 3.0 + 0.5 * 4.0)
    assert c.gamma == pytest.approx(0.5 * 0.2 + 0.5 * (0.01 / 0.1))
    rep = c.report()
    assert rep["calibration"]["n"] == 1 and rep["prefix_acceptance"][1]["observed"] == 1.0
    with pytest.raises(ValueError):
        EntropyController(candidates=(0, 4))
