"""The block-quantized products (GGUF's Q4_1 and Q8_0 layouts, fp32 rows): packing gives back a
weight stored in these formats exactly, and the products equal, bit for bit, the float32 kernel's
against the decoded weight, so an int4 / int8 draft of a checkpoint stored in these formats computes
the target's own logits."""
import pytest
import torch
from conftest import random_prompt, tiny_lm

from sparsespec.config import ConfigError, load_method
from sparsespec.decoding.controllers import FixedK
from sparsespec.decoding.drafters import SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kernels import cpu_attention, cpu_linear
from sparsespec.kv.recall import RecallIndex
from sparsespec.models.quantized import PackedLinear, block_format, draft_model

pytestmark = pytest.mark.skipif(not cpu_attention.available(), reason="no kernel build here")


@pytest.mark.parametrize("fmt", cpu_linear.BLOCK_FORMATS)
def test_packing_a_decoded_weight_gives_back_its_blocks(fmt):
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(0))
    codes, scales, mins = cpu_linear.pack_blocks(w, fmt)
    decoded = cpu_linear.unpack_blocks(codes, scales, mins)
    assert 0 < (decoded - w).abs().max() < (0.5 if fmt == "q4_1" else 0.05)  # quantized: near, not equal
    again = cpu_linear.pack_blocks(decoded, fmt)
    assert all(torch.equal(a, b) for a, b in zip((codes, scales), again[:2], strict=True))
    assert (mins is None) == (again[2] is None) and (mins is None or torch.equal(mins, again[2]))


@pytest.mark.parametrize("build", cpu_attention.builds())
@pytest.mark.parametrize("fmt", cpu_linear.BLOCK_FORMATS)
def test_block_products_are_the_float32_kernels_on_the_decoded_weight(fmt, build):
    g = torch.Generator().manual_seed(1)
    w, bias = torch.randn(70, 160, generator=g), torch.randn(70, generator=g)  # 70: a partial tile of outputs
    codes, scales, mins = cpu_linear.pack_blocks(w, fmt)
    decoded = cpu_linear.unpack_blocks(codes, scales, mins)
    for rows in (1, 2, 3, 5, 8, 17):
        x = torch.randn(rows, 160, generator=g)
        y = cpu_linear.block_linear(x, codes, scales, mins, bias, build)
        assert torch.equal(y, cpu_linear.linear(x, decoded, bias, build)), (fmt, build, rows)
        # and a row's result does not depend on the rows computed with it
        assert torch.equal(y[-1:], cpu_linear.block_linear(x[-1:], codes, scales, mins, bias, build))


def test_a_draft_of_a_block_stored_target_gives_the_targets_logits_bit_for_bit():
    """A target whose weights are Q4_1-decoded (the lm_head Q8_0-decoded), as the embedded SmolLM2's
    are: its int4 draft (lm_head int8) holds them exactly and gives its logits bit for bit; the same
    draft of the original random target does not."""
    target = tiny_lm("qwen2")  # q/k/v biases: added by the kernel as the float32 path adds them
    prompt = list(range(1, 21))  # within the few-rows kernel (at most 32 rows)
    before = target.forward(prompt, target.new_cache(64))
    with torch.no_grad():
        for p in target.hf.parameters():
            if p.dim() == 2 and p.shape[1] % 32 == 0:
                fmt = "q8_0" if p.shape[0] == target.lm_head.weight.shape[0] else "q4_1"
                p.copy_(cpu_linear.unpack_blocks(*cpu_linear.pack_blocks(p, fmt)))
    target = type(target)(target.hf)  # re-fuse q/k/v and gate/up from the decoded weights
    draft = draft_model(target, "int4", head="int8")
    assert all(p.fmt == "q4_1" for layer in draft._packed for p in layer.values()) and draft._head.fmt == "q8_0"
    logits = target.forward(prompt, target.new_cache(64))
    assert torch.equal(draft.forward(prompt, draft.new_cache(64)), logits)
    assert not torch.equal(before, logits)


def test_block_formats_only_where_the_kernel_serves_float32_rows():
    assert block_format("int4", 32, "cpu", torch.float32, 576) == "q4_1"
    assert block_format("int8", 32, "cpu", torch.float32, 576) == "q8_0"
    assert block_format("int4", 64, "cpu", torch.float32, 576) is None  # torch's int4 op takes other groups
    assert block_format("int4", 32, "cpu", torch.bfloat16, 576) is None
    assert block_format("int4", 32, "cuda", torch.float32, 576) is None
    assert block_format("int8", 32, "cpu", torch.float32, 48) is None  # not whole blocks


def test_a_packed_block_linear_reads_what_it_holds():
    w = torch.randn(16, 64)
    p = PackedLinear.pack_blocks(w, None, "q4_1")
    assert p.nbytes == 16 * 32 + 2 * (16 * 2 * 2)  # codes, then an fp16 scale and minimum per block
    assert p(torch.randn(2, 3, 64)).shape == (2, 3, 16)


def test_bf16_activations_take_torchs_packed_ops_and_stay_exact():
    """activations=bf16 runs torch's int4 op (bf16 rows) even where the block kernel serves: the draft
    of a block-stored target is then no longer its logits bit for bit, its rows say so, and the
    output is still ar's, with rejections along the way."""
    assert block_format("int4", 32, "cpu", torch.float32, 576, "bf16") is None
    assert block_format("int4", 32, "cpu", torch.float32, 576, "fp32") == "q4_1"
    target = tiny_lm("llama")
    draft = draft_model(target, "int4", head="int8", activations="bf16")
    assert draft is not draft_model(target, "int4", head="int8")  # one copy per (formats, rows)
    assert all(p.fmt == "int4" for layer in draft._packed for p in layer.values()) and draft._head.fmt == "int8"
    prompt = random_prompt(64, seed=3)
    ar = SpeculativeEngine(target).generate(prompt, 24).output_ids
    drafter = SelfDrafter(RecallIndex(budget=40, k_sink=4, k_recent=8, window=4), weights="int4",
                          head_weights="int8", activations="bf16")
    res = SpeculativeEngine(target, drafter, FixedK(3)).generate(prompt, 24)
    assert res.output_ids == ar and 0 < res.accepted < res.drafted
    assert res.extra["draft_weights"] == "int4-g32 bf16-rows, lm_head int8 bf16-rows"


def test_fp32_activations_where_no_kernel_takes_them_are_refused_in_one_line():
    with pytest.raises(ValueError) as e:  # raised when the method is built for a model
        load_method("magicdec", ["method.drafter.weights=int4", "method.drafter.weights_group=64",
                                 "method.drafter.activations=fp32"]).build(tiny_lm("llama"))
    assert "method.drafter.activations='fp32' cannot run here" in str(e.value) and "activations=bf16" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_method("magicdec", ["method.drafter.activations=fp16"])
    assert "method.drafter.activations='fp16'" in str(e.value) and "auto, fp32, bf16" in str(e.value)
