"""The first law on the real embedded SmolLM2 (not only tiny random models): every method as its
config ships, run on a book prompt, gives the target's greedy output token for token."""


import pytest

from sparsespec.config import load_method
from sparsespec.data.pg19 import load_books, select_split
from sparsespec.decoding.controllers import FixedK
from sparsespec.decoding.drafters import ModelDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.models.loading import load_model
from sparsespec.models.runner import CausalLM

# one process loads SmolLM2 and decodes its reference once for the whole file (`--dist loadgroup`)
pytestmark = pytest.mark.xdist_group("smollm2")

PROMPT_TOKENS, NEW_TOKENS = 1000, 32


def shipped_method(name: str, overrides: list[str]):
    """conf/method/<name>.yaml composed and checked as evaluate.py does."""
    return load_method(name, overrides)


@pytest.fixture(scope="module")
def smollm2():
    loaded = load_model(None)
    lm = CausalLM(loaded.model)
    book = select_split(load_books(), "eval")[0]["text"]  # a book held out from drafter training
    prompt = loaded.tokenizer(book[100_000:120_000])["input_ids"][:PROMPT_TOKENS]
    assert len(prompt) == PROMPT_TOKENS
    return lm, prompt, SpeculativeEngine(lm).generate(prompt, NEW_TOKENS).output_ids


@pytest.mark.embedded
@pytest.mark.parametrize("name,over", [
    ("magicdec", ["method.drafter.policy.budget=64"]),
    ("sparsespec_l", ["method.drafter.policy.ratio=0.05"]),
    ("sparsespec_l", ["method.drafter.policy.ratio=0.05", "method.drafter.policy.refresh_every=4", "method.controller.candidates=[1,2,3]"]),
    ("snapkv_self", ["method.drafter.policy.ratio=0.05"]),
    ("lookup", []),
    # the draft pass through a copy of the weights in a low-bit format
    ("magicdec_q", ["method.drafter.policy.budget=64"]),
    ("sparsespec_l_q", ["method.drafter.policy.ratio=0.05"]),
    ("sparsespec_l", ["method.drafter.policy.ratio=0.05", "method.drafter.weights=int8"]),
    ("snapkv_self", ["method.drafter.policy.ratio=0.05", "method.drafter.weights=bf16"]),
])
def test_shipped_methods_are_exact_on_smollm2(smollm2, name, over):
    lm, prompt, ar = smollm2
    res = shipped_method(name, over).build(lm).generate(prompt, NEW_TOKENS)
    assert res.output_ids == ar, f"{name} {over}"
    if name != "lookup":  # the drafts were really made and checked, some rejected (the test has power)
        assert res.drafted > res.accepted > 0


@pytest.mark.embedded
def test_target_as_its_own_model_drafter_is_always_accepted_on_smollm2(smollm2):
    lm, prompt, ar = smollm2
    res = SpeculativeEngine(lm, ModelDrafter(lm), FixedK(4)).generate(prompt, NEW_TOKENS)
    assert res.output_ids == ar
    assert res.accepted == res.drafted > 0


@pytest.mark.embedded
def test_a_batch_of_book_prompts_is_exact_on_smollm2(smollm2):
    """Batched on the real model: three prompts of different lengths decoded together by sparsespec_l,
    each sequence's greedy output that prompt's own ar output (the packed forward must not move a
    near-tie)."""
    lm, prompt, _ = smollm2
    prompts, new = [prompt[:300], prompt[300:500], prompt[500:750]], 20
    alone = [SpeculativeEngine(lm).generate(p, new).output_ids for p in prompts]
    res = shipped_method("sparsespec_l", ["method.drafter.policy.ratio=0.05"]).build(lm).generate_batch(prompts, new)
    assert [r.output_ids for r in res] == alone
    assert sum(r.drafted for r in res) > sum(r.accepted for r in res) > 0
