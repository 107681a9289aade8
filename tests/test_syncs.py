"""The greedy speculative round waits for the device once: at its acceptance decision. Counted with
tests/syncs.py (on a GPU through torch.cuda.set_sync_debug_mode, on the CPU by the host reads that
would wait), for a self-drafter over the recall index, a streaming self-drafter and a drafter model,
on three model families; and the counter itself is shown to see the reads it counts."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import random_prompt, tiny_lm
from syncs import SyncCounter

from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import ModelDrafter, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.policies import FullKV, StreamingKV
from sparsespec.kv.recall import RecallIndex

DEVICE = torch.device(os.environ.get("SPARSESPEC_TEST_DEVICE", "cpu"))


def test_counter_sees_host_reads():
    x = torch.arange(6, device=DEVICE)
    with SyncCounter(DEVICE) as syncs:
        y = x * 2  # stays on the device: not counted
        int(y[3])
        y.tolist()
        bool((y > 4).any())
    assert syncs.count == 3, syncs.names


DRAFTERS = {
    "sparsespec_l": lambda small: SelfDrafter(RecallIndex(ratio=0.10, k_sink=2, k_recent=4, window=8)),
    "sparsespec_l_every4": lambda small: SelfDrafter(RecallIndex(ratio=0.10, k_sink=2, k_recent=4, refresh_every=4)),
    "magicdec": lambda small: SelfDrafter(StreamingKV(budget=24, k_sink=4)),
    "sd": lambda small: ModelDrafter(small, FullKV()),
    "sd_sparse": lambda small: ModelDrafter(small, StreamingKV(budget=16, k_sink=2)),
}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_one_sync_per_greedy_round(family):
    target, small = tiny_lm(family), tiny_lm(family, seed=7, layers=1)
    prompt = random_prompt(150, seed=3)
    ar = SpeculativeEngine(target).generate(prompt, 30)
    for name, make in DRAFTERS.items():
        engine = SpeculativeEngine(target, make(small), FixedK(4))
        with SyncCounter(DEVICE) as syncs:
            res = engine.generate(prompt, 30)
        assert res.output_ids == ar.output_ids, name  # the counted run is still the target's output
        assert res.drafted > res.verify_steps  # rounds really drafted (several tokens each)
        # one read per round, plus the first token sampled after the prefill
        assert syncs.count <= res.verify_steps + 1, f"{family} {name}: {syncs.count} syncs in " \
            f"{res.verify_steps} rounds: {syncs.names}"


def test_entropy_controller_reads_each_draft_step():
    """The documented exception: the entropy controller decides after every draft token from its
    entropy, so it waits for the device once per draft step as well."""
    target = tiny_lm("llama")
    engine = SpeculativeEngine(target, SelfDrafter(StreamingKV(budget=24, k_sink=4)),
                               EntropyController(candidates=(2, 4)))
    prompt = random_prompt(150, seed=3)
    with SyncCounter(DEVICE) as syncs:
        res = engine.generate(prompt, 30)
    assert res.verify_steps + 1 < syncs.count <= res.verify_steps + res.drafted + 1


def test_one_sync_per_greedy_round_for_a_whole_batch():
    """A batch of three waits for the device once per round too (not once per sequence): the drafts
    and the target's tokens of every sequence come back in one read."""
    target, small = tiny_lm("qwen2"), tiny_lm("qwen2", seed=7, layers=1)
    prompts = [random_prompt(n, seed=i) for i, n in enumerate((150, 90, 120))]
    for name in ("sparsespec_l", "sd_sparse"):
        engine = SpeculativeEngine(target, DRAFTERS[name](small), FixedK(4))
        with SyncCounter(DEVICE) as syncs:
            res = engine.generate_batch(prompts, 30)
        rounds = max(r.verify_steps for r in res)
        assert sum(r.drafted for r in res) > rounds  # rounds really drafted
        # one read per round of the batch, plus each sequence's first token after its prefill
        assert syncs.count <= rounds + len(prompts), f"{name}: {syncs.count} syncs in {rounds} rounds: {syncs.names}"
