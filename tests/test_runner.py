"""Our forward (runner + KVCache + grouped attention) equals transformers' own forward."""

import pytest
import torch
from conftest import random_prompt, tiny_hf

from sparsespec.kv.cache import KVCache
from sparsespec.models.attention import attend, causal_block_mask
from sparsespec.models.runner import CausalLM


def test_logits_match_transformers_block_by_block(family):
    hf = tiny_hf(family)
    ids = torch.tensor(random_prompt(90))
    ref = hf(ids[None]).logits[0]
    lm = CausalLM(hf)
    cache = lm.new_cache(capacity=8)  # forces several capacity doublings
    out, start = [], 0
    for n in (70, 1, 2, 5, 12):  # a prefill, then decode and verification-sized blocks
        out.append(lm.forward(ids[start : start + n], cache))
        start += n
    torch.testing.assert_close(torch.cat(out), ref, atol=2e-5, rtol=1e-4)
    assert cache.length == 90


def test_chunked_prefill_equals_one_pass(family):
    lm = CausalLM(tiny_hf(family))
    ids = torch.tensor(random_prompt(150, seed=3))
    a = lm.prefill(ids, lm.new_cache(), chunk=1000)
    c = lm.new_cache()
    b = lm.prefill(ids, c, chunk=33)
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    assert c.length == 150


@pytest.mark.parametrize("n,total,hq,hkv", [(1, 50, 4, 2), (3, 50, 4, 1), (9, 200, 8, 2), (100, 300, 6, 3)])
def test_attend_equals_reference(n, total, hq, hkv):
    torch.manual_seed(0)
    q, k, v = torch.randn(hq, n, 16), torch.randn(hkv, total, 16), torch.randn(hkv, total, 16)
    mask = causal_block_mask(n, total)
    rep_k, rep_v = k.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0)
    scores = (q @ rep_k.transpose(1, 2) * 0.25).masked_fill(~mask, float("-inf"))
    ref = scores.softmax(-1) @ rep_v
    out, probs = attend(q, k, v, 0.25, capture_last=2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    # captured probabilities: last 2 queries, summed over each KV head's query group
    ref_p = scores.softmax(-1)[:, n - min(2, n) :].reshape(hkv, hq // hkv, -1, total).sum(1)
    torch.testing.assert_close(probs, ref_p, atol=1e-5, rtol=1e-4)


def test_cache_crop_and_gather():
    c = KVCache(2, 2, 4, capacity=2)
    for t in range(6):
        c.reserve(1)
        for layer in range(2):
            c.write(layer, torch.full((2, 1, 4), float(t)), torch.full((2, 1, 4), float(-t)))
        c.advance(1)
    assert c.length == 6 and c.capacity >= 6
    c.crop(4)
    assert c.length == 4
    with pytest.raises(ValueError):
        c.crop(5)
    idx = torch.tensor([[[0, 3], [1, 2]], [[0, 1], [2, 3]]])
    g = c.gather(idx, extra=3)
    assert g.length == 2 and g.capacity == 5
    assert g.k[0][0, :2, 0].tolist() == [0.0, 3.0]
    assert g.v[1][1, :2, 0].tolist() == [-2.0, -3.0]
