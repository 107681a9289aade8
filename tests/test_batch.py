"""Batched decoding: B sequences per forward, each one exactly its own B = 1 run.

Ragged prompt lengths and output lengths (a sequence that finishes leaves the batch), every kind of
drafter, three model families; under sampling each sequence's output is the one its own seed gives
alone, whichever sequences share its batch."""

import pytest
from conftest import random_prompt, tiny_lm

from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import ModelDrafter, PromptLookup, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.decoding.sampling import Sampling
from sparsespec.kv.policies import FullKV, StreamingKV
from sparsespec.kv.recall import RecallIndex

LENGTHS = [37, 120, 80, 150, 61]  # prompt lengths of the five sequences
NEW = [24, 30, 12, 30, 20]  # and their max_new_tokens: the third leaves the batch early


def methods(small):
    """(drafter, controller, prompt lookup) factories: one per shipped method, and lookup in front
    of a drafter."""
    return {
        "magicdec": lambda: (SelfDrafter(StreamingKV(budget=24, k_sink=4)), FixedK(4), None),
        "sparsespec_l": lambda: (SelfDrafter(RecallIndex(ratio=0.10, k_sink=2, k_recent=4, window=8)),
                                 EntropyController(candidates=(2, 4, 8)), None),
        "snapkv_every3": lambda: (SelfDrafter(RecallIndex(budget=32, k_sink=4, k_recent=8, refresh_every=3)),
                                  FixedK(3), None),
        "self_full": lambda: (SelfDrafter(FullKV()), FixedK(5), None),
        "sd": lambda: (ModelDrafter(small, FullKV()), FixedK(4), None),
        "sd_sparse": lambda: (ModelDrafter(small, StreamingKV(budget=16, k_sink=2), prefill_chunk=50), FixedK(4), None),
        "lookup": lambda: (None, FixedK(5), PromptLookup(1)),
        "lookup_sd_sparse": lambda: (ModelDrafter(small, StreamingKV(budget=16, k_sink=2)), FixedK(4), PromptLookup(1)),
    }


def build(target, made) -> SpeculativeEngine:
    drafter, controller, lookup = made
    return SpeculativeEngine(target, drafter, controller, prompt_lookup=lookup)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_batched_greedy_equals_each_sequences_own_ar(family):
    target, small = tiny_lm(family), tiny_lm(family, seed=7, layers=1)
    prompts = [random_prompt(n, seed=i) for i, n in enumerate(LENGTHS)]
    ar = [SpeculativeEngine(target).generate(p, m).output_ids for p, m in zip(prompts, NEW, strict=True)]
    batched_ar = SpeculativeEngine(target).generate_batch(prompts, NEW)
    assert [r.output_ids for r in batched_ar] == ar
    for name, make in methods(small).items():
        for b in (5, 2) if name == "sparsespec_l" else (5,):
            res = build(target, make()).generate_batch(prompts[:b], NEW[:b])
            assert [r.output_ids for r in res] == ar[:b], f"{family} {name} B={b}"
            assert all(r.batch_size == b for r in res)
            assert sum(r.drafted for r in res) > 0, f"{family} {name}: nothing drafted"  # the test has power
    for b in (1, 3, 4):  # the other batch sizes, on one method
        res = build(target, methods(small)["magicdec"]()).generate_batch(prompts[:b], NEW[:b])
        assert [r.output_ids for r in res] == ar[:b], f"{family} magicdec B={b}"


def test_one_forward_per_step_for_the_whole_batch():
    """The batch shares its forward passes: B sequences of AR decode in as many target forwards as
    the longest one alone (not B times as many), and a finished sequence stops costing anything."""
    target = tiny_lm("llama")
    prompts = [random_prompt(n, seed=i) for i, n in enumerate(LENGTHS[:4])]
    engine = SpeculativeEngine(target, prefill_chunk=1 << 12)
    target.forward_calls = 0
    res = engine.generate_batch(prompts, [20, 20, 8, 20])
    prefills = len(prompts)  # one chunk each
    assert target.forward_calls - prefills == 19  # rounds of the longest (the first token is the prefill's)
    assert [r.verify_steps for r in res] == [19, 19, 7, 19]
    assert res[2].wall_s < res[0].wall_s  # it left the batch early


def test_batch_aggregate_throughput_and_eos():
    target = tiny_lm("qwen2")
    prompts = [random_prompt(n, seed=i) for i, n in enumerate(LENGTHS[:3])]
    alone = SpeculativeEngine(target).generate(prompts[1], 30)
    eos = alone.output_ids[6]
    ar = [SpeculativeEngine(target).generate(p, 30, eos_token_ids=(eos,)).output_ids for p in prompts]
    assert len(ar[1]) == alone.output_ids.index(eos) + 1  # one sequence really stops at EOS
    res = build(target, methods(None)["magicdec"]()).generate_batch(prompts, 30, eos_token_ids=(eos,))
    assert [r.output_ids for r in res] == ar
    total = sum(r.new_tokens for r in res)
    assert res[0].aggregate_tokens_per_s == pytest.approx(total / max(r.wall_s for r in res))
    one = SpeculativeEngine(target).generate(prompts[0], 10)
    assert one.batch_size == 1 and one.aggregate_tokens_per_s == pytest.approx(one.tokens_per_s)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_batched_sampling_does_not_depend_on_the_batch(family):
    """Per-sequence generators: sequence i sampled in a batch is what its own seed gives alone
    (so its distribution is the target's, tests/test_sampling.py), and does not change with the
    sequences beside it."""
    target, small = tiny_lm(family), tiny_lm(family, seed=7, layers=1)
    prompts = [random_prompt(n, seed=i) for i, n in enumerate(LENGTHS[:3])]
    sampling, seeds = Sampling(temperature=1.0), [11, 12, 13]
    for name in ("sparsespec_l", "sd_sparse", "lookup_sd_sparse"):
        make = methods(small)[name]
        alone = [build(target, make()).generate(p, 20, sampling, seed=s).output_ids
                 for p, s in zip(prompts, seeds, strict=True)]
        batch = build(target, make()).generate_batch(prompts, 20, sampling, seed=seeds)
        assert [r.output_ids for r in batch] == alone, f"{family} {name}"
        other = build(target, make()).generate_batch([prompts[2], prompts[0]], 20, sampling, seed=[13, 11])
        assert [r.output_ids for r in other] == [alone[2], alone[0]], f"{family} {name}"
    assert len({tuple(a) for a in alone}) == 3


def test_each_sequence_keeps_its_own_parts():
    """A batch drafts from per-sequence copies of the drafter, policy and controller (their state
    is per sequence), sharing the models."""
    target, small = tiny_lm("llama"), tiny_lm("llama", seed=7, layers=1)
    drafter = ModelDrafter(small, StreamingKV(budget=16, k_sink=2))
    engine = SpeculativeEngine(target, drafter, EntropyController(candidates=(2, 4)))
    copies = [engine._parts_for_another_sequence() for _ in range(2)]
    assert all(c[0] is not drafter and c[0].model is small and c[1] is not engine.controller for c in copies)
    assert copies[0][0].policy is not copies[1][0].policy
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate_batch([[1, 2, 3]], [0])
    with pytest.raises(ValueError, match="no prompt"):
        engine.generate_batch([], 4)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate_batch([[1, 2], []], 4)
