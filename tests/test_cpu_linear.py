"""The few-rows linear kernel (sparsespec.kernels.cpu_linear): each build equals F.linear, and a
row's result does not depend on the rows computed with it (bit for bit), so a verification block
through the model gives the logits of one-token steps exactly; without the kernel, PyTorch's
products serve (equal up to rounding, not bit for bit)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import random_prompt, tiny_lm

from sparsespec.kernels import cpu_attention, cpu_linear
from sparsespec.models.runner import linear

# (in, out): the tiny test models' projections and SmolLM2-135M's, and odd sizes with a tail
SHAPES = ((64, 96), (64, 128), (96, 64), (64, 61), (576, 960), (576, 576), (576, 3072), (1536, 576), (100, 37))


def _builds():
    if not cpu_attention.available():
        return [pytest.param("native", marks=pytest.mark.skip(reason="no kernel build here"))]
    return [pytest.param(b, id=b) for b in cpu_attention.builds()]


@pytest.mark.parametrize("build", _builds())
def test_each_build_equals_f_linear(build):
    g = torch.Generator().manual_seed(0)
    for inp, out in SHAPES:
        w, b, x = torch.randn(out, inp, generator=g), torch.randn(out, generator=g), torch.randn(32, inp, generator=g)
        for rows in (1, 2, 5, 16, 32):
            torch.testing.assert_close(cpu_linear.linear(x[:rows], w, b, build), F.linear(x[:rows], w, b),
                                       atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(cpu_linear.linear(x[:rows], w, None, build), F.linear(x[:rows], w),
                                       atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("build", _builds())
def test_a_row_is_computed_the_same_whatever_rows_come_with_it(build):
    g = torch.Generator().manual_seed(1)
    for inp, out in SHAPES:
        w, b, x = torch.randn(out, inp, generator=g), torch.randn(out, generator=g), torch.randn(32, inp, generator=g)
        alone = torch.cat([cpu_linear.linear(x[r : r + 1], w, b, build) for r in range(32)])
        for rows in range(1, 33):
            assert torch.equal(cpu_linear.linear(x[:rows], w, b, build), alone[:rows]), (inp, out, rows)
        shifted = cpu_linear.linear(x[3:20], w, b, build)  # the same rows at other places in the block
        assert torch.equal(shifted, alone[3:20])


def test_the_model_takes_the_kernel_for_a_few_rows(monkeypatch):
    if not cpu_attention.available():
        pytest.skip("no kernel build here")
    calls = []
    real = cpu_linear.linear
    monkeypatch.setattr(cpu_linear, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    w, x = torch.randn(40, 64), torch.randn(cpu_linear.MAX_ROWS + 1, 64)
    linear(x[:1], w)
    linear(x[:5], w)
    linear(x, w)  # a prefill chunk: PyTorch's product
    linear(x[:3].double(), w.double())  # not float32: PyTorch's product
    assert calls == [1, 5]


def test_the_switch_turns_the_linear_kernel_off(monkeypatch):
    monkeypatch.setenv(cpu_attention.ENV, "0")
    assert not cpu_linear.applies(torch.randn(1, 64), torch.randn(8, 64))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_verification_block_gives_the_logits_of_one_token_steps_bit_for_bit(family):
    """Through the whole model with the kernels on: forward of [t1..t5] against five one-token steps
    from the same cache, every logit equal (so greedy identity with ar is exact, not observed)."""
    if not cpu_attention.available():
        pytest.skip("no kernel build here")
    lm = tiny_lm(family, layers=3)
    prompt, block = random_prompt(40, seed=3), random_prompt(16, seed=4)
    for n in (1, 2, 5, 16):
        together, alone = lm.new_cache(), lm.new_cache()
        lm.prefill(prompt, together)
        lm.prefill(prompt, alone)
        logits = lm.forward(block[:n], together)
        steps = torch.cat([lm.forward(block[i : i + 1], alone) for i in range(n)])
        assert torch.equal(logits, steps), (family, n)


@pytest.mark.embedded
def test_on_smollm2_a_verification_block_gives_one_token_steps_logits_bit_for_bit():
    """The same on the embedded SmolLM2 (its own shapes: 9 query heads over 3 KV heads of 64, hidden
    576, a 49k vocabulary), blocks of 1 to 16 tokens after a 300-token prompt."""
    if not cpu_attention.available():
        pytest.skip("no kernel build here")
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    loaded = load_model(None)
    lm = CausalLM(loaded.model)
    ids = loaded.tokenizer("The river ran past the mill and under the old stone bridge, " * 40)["input_ids"]
    prompt, block = ids[:300], ids[300:316]
    for n in (1, 2, 3, 5, 8, 16):
        together, alone = lm.new_cache(512), lm.new_cache(512)
        lm.prefill(prompt, together)
        lm.prefill(prompt, alone)
        logits = lm.forward(block[:n], together)
        steps = torch.cat([lm.forward(block[i : i + 1], alone) for i in range(n)])
        assert torch.equal(logits, steps), n
