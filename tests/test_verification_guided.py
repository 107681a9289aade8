"""The verification-guided baselines: PillarAttn (the recall index configured as the paper's) and
Vegas (one set of positions per layer, shared by every KV head): the target's tokens under greedy
decoding, with rejections along the way, and Vegas's selection against brute force."""

from types import SimpleNamespace

import pytest
import torch
from conftest import random_prompt, tiny_hf
from test_sparsespec_l import brute_force_scores

from sparsespec.config import load_method
from sparsespec.decoding.controllers import FixedK
from sparsespec.decoding.drafters import SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.layer_index import LayerRecallIndex
from sparsespec.kv.policies import KVPolicyError
from sparsespec.kv.recall import RecallIndex
from sparsespec.models.runner import CausalLM

# the shipped budgets keep every position of a tiny prompt; these keep a small share of it
SMALL = {"pillarattn": ["method.drafter.policy.budget=24"],
         "vegas": ["method.drafter.policy.budget=24", "method.drafter.policy.min_budget=0"]}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("name", ["pillarattn", "vegas"])
def test_shipped_config_decodes_ars_tokens_with_rejections(family, name):
    target = CausalLM(tiny_hf(family))
    prompt = random_prompt(200, seed=3)
    ar = SpeculativeEngine(target).generate(prompt, 30).output_ids
    method = load_method(name, SMALL[name])
    res = method.build(target, None, prefill_chunk=64).generate(prompt, 30)
    assert res.output_ids == ar
    assert res.drafted > res.accepted > 0  # drafts were made, some accepted, some rejected
    assert res.extra["index_updates"] == res.verify_steps  # refreshed after every verification


def test_vegas_config_is_the_layer_wide_index_and_pillarattn_the_recall_index():
    vegas, pillar = load_method("vegas"), load_method("pillarattn")
    v = vegas.build(CausalLM(tiny_hf("llama")), None).drafter.policy
    p = pillar.build(CausalLM(tiny_hf("llama")), None).drafter.policy
    assert type(v) is LayerRecallIndex and type(p) is RecallIndex
    assert (v.ratio, v.min_budget, v.k_sink, v.window) == (0.05, 256, 0, 2)
    assert (p.ratio, p.k_sink, p.k_recent, p.window) == (0.05, 0, 9, 9)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_layer_index_selects_one_set_per_layer_by_all_heads_attention(family):
    hf = tiny_hf(family)
    target = CausalLM(hf)
    prompt = random_prompt(150, seed=5)
    view = LayerRecallIndex(budget=40, k_sink=2, k_recent=6, window=2)
    cache = target.new_cache(200)
    res = SpeculativeEngine(target, SelfDrafter(view), FixedK(3)).generate(prompt, 20, cache=cache)
    length = len(prompt) + res.new_tokens - 1
    ref = brute_force_scores(hf, prompt + res.output_ids, length, 2).sum(1)  # [layers, length]: all heads
    idx = view.select(SimpleNamespace(cache=cache))
    assert idx.shape == (hf.config.num_hidden_layers, hf.config.num_key_value_heads, 40)
    assert torch.equal(idx, idx[:, :1].expand_as(idx))  # every KV head reads the layer's one set
    top = ref[:, 2 : length - 6].topk(40 - 8, dim=-1).indices + 2
    expect = torch.cat([torch.arange(2).expand(len(top), 2), top, torch.arange(length - 6, length).expand(len(top), 6)],
                       -1).sort(-1).values
    assert torch.equal(idx[:, 0], expect)
    per_head = RecallIndex.score(view, SimpleNamespace(cache=cache))
    assert not torch.equal(per_head[:, 0], per_head[:, 1])  # the heads' own scores differ: the sharing is real
    assert res.output_ids == SpeculativeEngine(target).generate(prompt, 20).output_ids


def test_min_budget_is_a_floor_under_the_share_and_is_checked():
    v = LayerRecallIndex(ratio=0.05, min_budget=256, k_sink=0, k_recent=6)
    assert v.budget_for(4096) == 256 and v.budget_for(100) == 100 and v.budget_for(65536) == 3277
    assert LayerRecallIndex(budget=40, min_budget=256, k_recent=8).budget_for(4096) == 40  # a set budget wins
    with pytest.raises(KVPolicyError, match="min_budget"):
        LayerRecallIndex(min_budget=-1)
