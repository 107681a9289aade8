"""Sliding-window attention (Mistral): our full attention is exact while no sequence exceeds the
window, and a longer sequence is refused, early by load_model and in any case by CausalLM.

transformers' Mistral applies `sliding_window` on every layer whenever it is set (no
`use_sliding_window` flag); Qwen2/Qwen3 apply it only on the layers their config types
"sliding_attention". `test_rule_agrees_with_transformers` checks the rule against transformers'
own forward, and that the first position the window changes is exactly the window's length.
"""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, random_prompt, tiny_config
from helpers import assert_blocks_match_transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, MistralConfig, PreTrainedTokenizerFast

from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import ModelDrafter, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.policies import StreamingKV
from sparsespec.kv.recall import RecallIndex
from sparsespec.models.loading import ModelLoadError, load_model
from sparsespec.models.runner import CausalLM, UnsupportedModelError, applied_sliding_window

DEFAULT = object()  # MistralConfig's own default window (4096, as Mistral-7B-v0.1 ships)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: intra-op threads only add synchronisation (many times slower on a loaded machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def mistral_hf(sliding_window=DEFAULT, seed: int = 0, layers: int = 2):
    """A tiny random Mistral shaped like conftest's tiny_config, with no EOS (generate runs to the end)."""
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
              initializer_range=0.25, bos_token_id=None, eos_token_id=None)
    if sliding_window is not DEFAULT:
        kw["sliding_window"] = sliding_window
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(MistralConfig(**kw)).eval()


def family_hf(family: str, **over):
    if family == "mistral":
        return mistral_hf(over.pop("sliding_window", DEFAULT), **over)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(family, **over)).eval()


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def save_with_tokenizer(hf, d) -> str:
    """save_pretrained plus a word-level tokenizer over the model's vocabulary (load_model needs one)."""
    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {"<unk>": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save_pretrained(d)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(d)
    return str(d)


# ---------------------------------------------------------------------------------------------
# the rule, against transformers


@pytest.mark.parametrize("family,over,window", [
    ("mistral", dict(sliding_window=16), 16),
    ("mistral", dict(sliding_window=None), None),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16, max_window_layers=0), 16),
    ("qwen3", dict(use_sliding_window=True, sliding_window=16, max_window_layers=1), 16),  # the 2nd layer slides
    # more max_window_layers (default 28) than layers: no layer slides, the flag notwithstanding
    ("qwen2", dict(use_sliding_window=True, sliding_window=16), None),
    ("qwen2", dict(use_sliding_window=False, sliding_window=16, max_window_layers=0), None),
    ("llama", dict(sliding_window=16), None),  # a stray key Llama's modeling never reads
], ids=["mistral16", "mistral_none", "qwen2_sliding", "qwen3_last_layer", "qwen2_no_sliding_layer",
        "qwen2_flag_off", "llama_stray_key"])
def test_rule_agrees_with_transformers(family, over, window):
    """Over 40 tokens, our full attention equals transformers' forward exactly up to position W - 1
    and differs from position W on (a query at index i sees keys i-W+1..i), or everywhere equals it
    when the rule says no window applies. This is also the proof that the refusal is needed: with
    sliding_window=16 and 40 tokens transformers' last logits are not ours."""
    hf = family_hf(family, **over)
    ids = torch.tensor(random_prompt(40, seed=1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    lm = CausalLM(hf)
    assert applied_sliding_window(hf.config) == lm.sliding_window == window
    lm.sliding_window = None  # what the guard stops: our full attention past the window
    ours = lm.forward(ids, lm.new_cache())
    differs = (ours - ref).abs().amax(-1) > 1e-4
    if window is None:
        torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
    else:
        torch.testing.assert_close(ours[:window], ref[:window], atol=2e-5, rtol=1e-4)
        assert bool(differs[window:].all()), differs.nonzero().flatten().tolist()
        assert float((ours[-1] - ref[-1]).abs().max()) > 1e-2


# ---------------------------------------------------------------------------------------------
# inside the window: exact


@pytest.mark.parametrize("family,over", [
    ("mistral", dict(sliding_window=90)),  # exactly the sequence: the window cuts nothing
    ("mistral", dict()),  # 4096
    ("mistral", dict(sliding_window=None)),
    ("qwen2", dict(use_sliding_window=True, sliding_window=90, max_window_layers=0)),  # refused before
], ids=["mistral_w90", "mistral_default", "mistral_none", "qwen2_sliding_w90"])
def test_logits_match_transformers_within_the_window(family, over):
    assert_blocks_match_transformers(family_hf(family, **over))


@pytest.mark.parametrize("window", [64, None], ids=["w64", "none"])
def test_greedy_identical_to_transformers_generate(window):
    """40 prompt tokens + 24 new: transformers runs 63 tokens through its window of 64 (or none)."""
    hf = mistral_hf(window)
    target = CausalLM(hf)
    prompt = random_prompt(40, seed=2)
    expected = hf_greedy(hf, prompt, 24)
    assert SpeculativeEngine(target).generate(prompt, 24).output_ids == expected
    small = CausalLM(mistral_hf(seed=7, layers=1))  # a windowed (4096) drafter model
    for name, make in {
        "magicdec": lambda: (SelfDrafter(StreamingKV(budget=12, k_sink=2)), FixedK(3)),
        "recall_entropy": lambda: (SelfDrafter(RecallIndex(budget=12, k_sink=2, k_recent=4, window=4)),
                                   EntropyController(candidates=(2, 4))),
        "sd": lambda: (ModelDrafter(small), FixedK(3)),
    }.items():
        res = SpeculativeEngine(target, *make()).generate(prompt, 24)
        assert res.output_ids == expected, name
        assert res.drafted > 0, name


# ---------------------------------------------------------------------------------------------
# past the window: refused


@pytest.mark.parametrize("family,over", [
    ("mistral", dict(sliding_window=16)),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16, max_window_layers=0)),
], ids=["mistral", "qwen2_sliding"])
def test_load_model_refuses_a_context_past_the_window(tmp_path, family, over):
    d = save_with_tokenizer(family_hf(family, **over), tmp_path / "m")
    with pytest.raises(ModelLoadError, match="sliding_window=16") as e:
        load_model(d, ctx=40 + 8)
    msg = str(e.value)
    assert d in msg and "context of 48 tokens" in msg and "at most 16 tokens" in msg
    assert "model without a sliding window" in msg and "\n" not in msg
    # a context within the window loads; no ctx defers the refusal to the forward
    assert applied_sliding_window(load_model(d, ctx=16).model.config) == 16
    lm = CausalLM(load_model(d).model)
    with pytest.raises(UnsupportedModelError, match="sliding_window=16"):
        lm.prefill(torch.tensor(random_prompt(40)), lm.new_cache())


@pytest.mark.parametrize("family,over", [
    ("mistral", dict(sliding_window=None)),
    ("qwen2", dict(use_sliding_window=False, sliding_window=16)),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16)),  # no layer slides (max_window_layers=28)
], ids=["mistral_none", "qwen2_flag_off", "qwen2_no_sliding_layer"])
def test_load_model_accepts_any_context_without_an_applied_window(tmp_path, family, over):
    d = save_with_tokenizer(family_hf(family, **over), tmp_path / "m")
    assert applied_sliding_window(load_model(d, ctx=1000).model.config) is None


def test_causal_lm_refuses_to_run_past_the_window():
    hf = mistral_hf(16)
    lm = CausalLM(hf)
    prompt = random_prompt(40, seed=3)
    cache = lm.new_cache()
    with pytest.raises(UnsupportedModelError, match="sliding_window=16") as e:
        lm.prefill(torch.tensor(prompt), cache)
    assert "context of 40 tokens" in str(e.value) and "at most 16 tokens" in str(e.value)
    assert cache.length == 0 and lm.forward_calls == 0  # refused before any chunk ran
    lm.forward(torch.tensor(prompt[:15]), cache)
    lm.forward(torch.tensor(prompt[15:16]), cache)  # 16 tokens: the window still cuts nothing
    for n in (1, 4):  # a decode step and a verification block past it
        with pytest.raises(UnsupportedModelError, match=f"context of {16 + n} tokens"):
            lm.forward(torch.tensor(prompt[16 : 16 + n]), cache)
        assert cache.length == 16
    with pytest.raises(UnsupportedModelError, match="sliding_window=16"):
        SpeculativeEngine(lm).generate(prompt, 8)
    # up to the window, decoding is transformers' own: 10 prompt + 7 new runs 16 tokens
    short = prompt[:10]
    expected = hf_greedy(hf, short, 7)
    assert SpeculativeEngine(lm).generate(short, 7).output_ids == expected
    res = SpeculativeEngine(lm, SelfDrafter(StreamingKV(budget=6, k_sink=1)), FixedK(3)).generate(short, 7)
    assert res.output_ids == expected


def test_windowed_drafter_model_at_a_context_of_exactly_the_window():
    hf = mistral_hf(64)
    prompt = random_prompt(40, seed=1)
    expected = hf_greedy(hf, prompt, 24)  # 40 + 24 = 64 = the window: load_model(ctx=64) accepts it
    res = SpeculativeEngine(CausalLM(hf), ModelDrafter(CausalLM(mistral_hf(64, seed=3))), FixedK(5)
                            ).generate(prompt, 24)
    assert res.output_ids == expected
