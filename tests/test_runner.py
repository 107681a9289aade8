"""Our forward (runner + KVCache + grouped attention) equals transformers' own forward."""

import pytest
import torch
from conftest import random_prompt, tiny_hf
from helpers import assert_blocks_match_transformers

from sparsespec.kv.cache import KVCache
from sparsespec.kv.capture import attention_mass, causal_block_mask
from sparsespec.models.attention import attend
from sparsespec.models.runner import CausalLM


def test_logits_match_transformers_block_by_block(family):
    assert_blocks_match_transformers(tiny_hf(family))


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
    from sparsespec.models.attention import _attend_reference

    # the fast path (LSE from the fused kernel), the reference path with a mask, and the reference
    # path without one (what non-CPU devices run: SDPA with is_causal for prefill-sized blocks)
    for out, lse in (attend(q, k, v, 0.25, lse_rows=2), attend(q, k, v, 0.25, mask=mask, lse_rows=2),
                     _attend_reference(q, k, v, 0.25, None, lse_rows=min(2, n))):
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        c = min(2, n)
        torch.testing.assert_close(lse, scores.logsumexp(-1)[:, n - c :], atol=1e-5, rtol=1e-4)
        # the probabilities recovered from the LSE, summed over each KV head's query group
        ref_p = scores.softmax(-1)[:, n - c :].reshape(hkv, hq // hkv, c, total).sum(1)
        torch.testing.assert_close(attention_mass(q[:, n - c :], lse, k, 0.25), ref_p, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv", [(9, 3), (4, 4), (8, 1)])
def test_fast_attention_equals_reference_path(dtype, hq, hkv):
    """The split prefix/block path (LSE merge) equals the masked reference for q = 1..k+1 new
    tokens and prefill-sized blocks, over cache slices that are views of a larger buffer."""
    from sparsespec.models.attention import _attend_reference

    torch.manual_seed(1)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for total in (21, 300, 4100, 4103):  # >= SPLIT_FROM: the prefix is cut into key ranges
        kbuf, vbuf = torch.randn(hkv, total + 40, 64, dtype=dtype), torch.randn(hkv, total + 40, 64, dtype=dtype)
        k, v = kbuf[:, :total], vbuf[:, :total]  # strided like KVCache.write's return
        for n in (1, 2, 5, 9, 17, 21, 65, 130):
            if n > total:
                continue
            q = torch.randn(hq, n, 64, dtype=dtype)
            fast, lse = attend(q, k, v, 0.125, lse_rows=n)
            ref, _ = _attend_reference(q.float(), k.float(), v.float(), 0.125, None)
            assert fast.dtype == dtype and fast.shape == (hq, n, 64)
            torch.testing.assert_close(fast.float(), ref, **tol, msg=f"total={total} n={n}")
            # the merged log-sum-exp the recall index relies on
            _, ref_lse = attend(q.float(), k.float(), v.float(), 0.125, mask=causal_block_mask(n, total), lse_rows=n)
            torch.testing.assert_close(lse, ref_lse, **tol, msg=f"lse total={total} n={n}")


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
    assert g.length == 2 and g.capacity >= 5
    assert g.k[0][0, :2, 0].tolist() == [0.0, 3.0]
    assert g.v[1][1, :2, 0].tolist() == [-2.0, -3.0]
    # a later round gathers into the same buffers (no allocation) when they are large enough
    again = c.gather(torch.tensor([[[1, 2], [0, 3]], [[2, 3], [0, 1]]]), extra=3, out=g)
    assert again is g and again.k[0][0, :2, 0].tolist() == [1.0, 2.0] and again.v[1][1, :2, 0].tolist() == [0.0, -1.0]
    bigger = c.gather(torch.zeros(2, 2, 4, dtype=torch.long), extra=g.capacity, out=g)
    assert bigger is not g and bigger.capacity >= 4 + g.capacity
