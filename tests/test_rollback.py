"""Rollback after every possible number of accepted tokens leaves the caches exactly as if the
kept tokens had been decoded one by one."""

from dataclasses import dataclass

import pytest
import torch
from conftest import random_prompt, tiny_lm

from sparsespec.decoding.controllers import FixedK
from sparsespec.decoding.drafters import Drafter, ModelDrafter, Proposal
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.policies import StreamingKV


@dataclass
class ScriptedDrafter(Drafter):
    """Proposes the AR continuation's next `good` tokens, then wrong ones (every other hook: the
    base's no-op)."""

    reference: list[int]
    good: int
    k: int

    def propose(self, state, controller, sampling, gen):
        done = len(state.tokens) - state.prompt_len
        right = self.reference[done : done + self.k]
        toks = [t if i < self.good else (t + 1) % 61 for i, t in enumerate(right)]
        return Proposal(toks, None, [0.0] * len(toks), steps=len(toks))


@pytest.mark.parametrize("good", [0, 1, 2, 3, 4])
def test_target_cache_after_partial_acceptance(good):
    target = tiny_lm("llama")
    prompt = random_prompt(50, seed=good)
    ar = SpeculativeEngine(target).generate(prompt, 16).output_ids
    engine = SpeculativeEngine(target, ScriptedDrafter(ar, good, 4), FixedK(4))
    res = engine.generate(prompt, 16)
    assert res.output_ids == ar
    assert all(a == min(good, d) for d, a in res.rounds)
    # the final cache equals a fresh prefill of the same tokens
    tokens = prompt + res.output_ids[:-1]
    fresh = target.new_cache()
    target.prefill(torch.tensor(tokens), fresh)
    state_cache = engine_cache(target, prompt, ar, good)
    assert state_cache.length == fresh.length
    for layer in range(target.n_layers):
        torch.testing.assert_close(state_cache.k[layer][:, : fresh.length], fresh.k[layer][:, : fresh.length],
                                   atol=1e-5, rtol=1e-5)


def engine_cache(target, prompt, ar, good):
    """Run the engine and return the target cache it ends with."""
    seen = {}
    drafter = ScriptedDrafter(ar, good, 4)
    orig = drafter.on_verified

    def spy(state, n):
        seen["cache"] = state.cache
        orig(state, n)

    drafter.on_verified = spy
    SpeculativeEngine(target, drafter, FixedK(4)).generate(prompt, 16)
    return seen["cache"]


@pytest.mark.parametrize("budget", [None, 12])
def test_model_drafter_cache_rolls_back(budget):
    target, small = tiny_lm("qwen2"), tiny_lm("qwen2")
    torch.manual_seed(3)  # a perturbed copy of the target: agrees often, not always
    for p in small.hf.parameters():
        p.data += 0.08 * torch.randn_like(p)
    view = StreamingKV(budget=budget, k_sink=2) if budget else StreamingKV(ratio=1.0, k_sink=0)
    drafter = ModelDrafter(small, view)
    prompt = random_prompt(70, seed=9)
    res = SpeculativeEngine(target, drafter, FixedK(5)).generate(prompt, 30)
    assert res.output_ids == SpeculativeEngine(target).generate(prompt, 30).output_ids
    assert 0 < res.accepted < res.drafted  # partial acceptances happened
    tokens = prompt + res.output_ids
    seen, n = drafter.seen, drafter.cache.length
    fresh = small.new_cache()
    small.forward(torch.tensor(tokens[:seen]), fresh, mask=view.mask(0, seen, seen), logits="none")
    # a windowed cache holds the sinks and the window [_window, seen) of what a fresh prefill computes
    held = list(range(view.k_sink)) + list(range(drafter._window, seen)) if budget else list(range(seen))
    assert len(held) == n and (n < seen) == bool(budget)  # the budget view really evicted
    for layer in range(small.n_layers):
        torch.testing.assert_close(drafter.cache.k[layer][:, :n], fresh.k[layer][:, held], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(drafter.cache.v[layer][:, :n], fresh.v[layer][:, held], atol=2e-5, rtol=1e-5)
