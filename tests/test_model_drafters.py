"""The model drafters: `ModelDrafter(model, policy)` builds the class that holds the cache its policy
needs, from Python and from every shipped method file; a class given a policy whose cache it does
not hold is refused; the windowed cache's bookkeeping (kv/window.py). Their outputs are tested
against ar in test_exactness, test_rollback, test_batch and test_quantized_draft."""

from __future__ import annotations

import copy

import pytest
from conftest import random_prompt, tiny_lm

from sparsespec.config import load_method
from sparsespec.decoding.drafters import ModelDrafter as OldPath
from sparsespec.decoding.model_drafters import FullCacheDrafter, ModelDrafter, ScoredDrafter, WindowDrafter
from sparsespec.kv.policies import FullKV, KVPolicyError, StreamingKV
from sparsespec.kv.recall import RecallIndex
from sparsespec.kv.window import WindowedCache


def test_model_drafter_builds_the_cache_its_policy_needs():
    small = tiny_lm("llama", layers=1)
    assert OldPath is ModelDrafter  # the name method files and scripts import
    for policy, kind in ((FullKV(), FullCacheDrafter), (StreamingKV(budget=16, k_sink=2), WindowDrafter),
                         (RecallIndex(budget=16, k_sink=2, k_recent=4), ScoredDrafter)):
        for drafter in (ModelDrafter(small, policy), ModelDrafter(model=small, policy=policy, weights="fp")):
            assert type(drafter) is kind and drafter.policy is policy and drafter.model is small
            assert type(copy.deepcopy(drafter)) is kind  # a batch's copies keep their class
    assert type(ModelDrafter(small)) is FullCacheDrafter and type(ModelDrafter()) is FullCacheDrafter


@pytest.mark.parametrize("name,kind", [("sd", FullCacheDrafter), ("sd_sparse", WindowDrafter),
                                       ("budgetdraft", WindowDrafter), ("sd_recall", ScoredDrafter)])
def test_method_files_build_their_drafter_class(name, kind):
    small = tiny_lm("llama", layers=1)
    assert type(load_method(name, []).build(None, small).drafter) is kind
    if name == "sd":
        return
    # a policy swapped from the command line picks the class that fits it
    swapped = load_method(name, ["method/drafter/policy=full"]).build(None, small).drafter
    assert type(swapped) is FullCacheDrafter


def test_a_class_given_a_policy_whose_cache_it_does_not_hold_is_refused():
    streaming = r"^policy\._target_='sparsespec\.kv\.policies\.StreamingKV' needs a cache FullCacheDrafter "
    with pytest.raises(KVPolicyError, match=streaming + ".* use WindowDrafter"):
        FullCacheDrafter(None, StreamingKV(budget=16, k_sink=2))
    recall = r"^policy\._target_='sparsespec\.kv\.recall\.RecallIndex' needs a cache WindowDrafter "
    with pytest.raises(KVPolicyError, match=recall + ".* use ScoredDrafter"):
        WindowDrafter(None, RecallIndex(budget=16, k_sink=2, k_recent=4))
    # through a method file: at the key the user sets
    with pytest.raises(ValueError) as e:
        load_method("sd_sparse", ["method.drafter._target_=sparsespec.decoding.model_drafters.FullCacheDrafter"])
    assert str(e.value).startswith("method sd_sparse: method.drafter.policy._target_='sparsespec.kv.policies."
                                   "StreamingKV' needs a cache FullCacheDrafter does not hold; use WindowDrafter")


def test_windowed_cache_holds_the_sinks_and_the_window_and_evicts_in_steps():
    lm = tiny_lm("llama", layers=1)
    policy = StreamingKV(budget=24, k_sink=4)
    kept = WindowedCache(policy, lm.new_cache(200), evict_every=8)
    ids = random_prompt(120, seed=1)
    for start in range(0, 120, 10):
        positions, mask = kept.next_block(10)
        assert positions.tolist() == list(range(start, start + 10))
        lm.forward(ids[start : start + 10], kept.cache, positions=positions, mask=mask, logits="none")
        kept.evict()
        assert kept.seen == start + 10
        held = kept.cache.length
        assert held <= WindowedCache.held_entries(policy, kept.seen, 8)
        # everything the next query sees is held: the sinks and [window_start, seen)
        assert kept.first <= max(policy.k_sink, policy.window_start(kept.seen)) and held == policy.k_sink + kept.seen - kept.first
    assert kept.first > policy.k_sink and kept.cache.length < 60  # it evicted
    before = kept.cache.length
    kept.keep(kept.seen - 3)  # three rejected drafts dropped
    assert kept.seen == 117 and kept.cache.length == before - 3
    assert WindowedCache.capacity(policy, 120, 50, 8) >= WindowedCache.held_entries(policy, 120, 8) + 50
