"""Speculative sampling reproduces the target distribution (fixed seeds, tight tolerances)."""

import pytest
import torch
from conftest import random_prompt, tiny_lm
from helpers import BATCH, TV_BOUND, exact_marginals, tv

from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import ModelDrafter, PromptLookup, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.decoding.sampling import Sampling
from sparsespec.decoding.verify import accept_speculative
from sparsespec.kv.policies import StreamingKV
from sparsespec.kv.recall import RecallIndex


def test_accept_speculative_emits_target_distribution():
    """First token ~ p0; given draft 0 accepted, second ~ p1; given both accepted, the bonus ~ p2.
    Resampling from p instead of norm(max(p - q, 0)), or a bonus from q, fails these bounds."""
    g = torch.Generator().manual_seed(0)
    V, n = 5, 30000
    p = torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.1], [0.05, 0.05, 0.3, 0.3, 0.3], [0.7, 0.1, 0.1, 0.05, 0.05]])
    q = torch.tensor([[0.1, 0.1, 0.1, 0.2, 0.5], [0.2, 0.2, 0.2, 0.2, 0.2]])
    first, second, third = torch.zeros(V), torch.zeros(V), torch.zeros(V)
    for _ in range(n):
        draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
        n_acc, nxt = accept_speculative(draft, q, p, g)
        out = draft[:n_acc] + [nxt]
        first[out[0]] += 1
        if len(out) >= 2:
            second[out[1]] += 1
        if len(out) == 3:
            third[out[2]] += 1
    assert tv(first / first.sum(), p[0]) < 0.015
    assert tv(second / second.sum(), p[1]) < 0.025
    assert tv(third / third.sum(), p[2]) < 0.04
    # acceptance of draft 0 happens with probability sum(min(p0, q0))
    assert abs(second.sum() / n - float(torch.minimum(p[0], q[0]).sum())) < 0.015


def test_top_p_and_temperature_apply_to_both():
    s = Sampling(temperature=0.7, top_p=0.8)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    probs = s.probs(logits)[0]
    full = torch.softmax(logits[0] / 0.7, -1)
    kept = full[:2] / full[:2].sum()  # the top two reach 0.8 of the mass
    assert probs[2:].sum() == 0
    torch.testing.assert_close(probs[:2], kept)


@pytest.fixture
def one_thread():
    """Tiny models decode fastest on one thread (and do not fight a busy machine for two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sampled_marginals(target, make, control, prompt, steps: int, sampling: Sampling, n: int = 1500,
                      lookup: bool = False) -> torch.Tensor:
    """[steps, V] frequencies of the engine's tokens at each position over n seeded draws, decoded as
    batches, one seed per sequence (a sequence's draw is the one its seed gives alone,
    tests/test_batch.py): so this is also the distribution of batched sampling."""
    counts = torch.zeros(steps, target.vocab_size)
    for seeds in torch.arange(n).split(BATCH):
        engine = SpeculativeEngine(target, make(), control(), prompt_lookup=PromptLookup(1) if lookup else None)
        for res in engine.generate_batch([prompt] * len(seeds), steps, sampling, seed=seeds.tolist()):
            for i, t in enumerate(res.output_ids):
                counts[i, t] += 1
    return counts / n


def worst_tv(freqs: torch.Tensor, exact: list[torch.Tensor]) -> float:
    """The statistical check: the largest per-position total variation from the exact marginals."""
    return max(tv(f, e) for f, e in zip(freqs, exact, strict=True))


def magicdec_parts():
    """MagicDec's self-draft: the target drafts from a streaming view of its own cache."""
    return lambda: SelfDrafter(StreamingKV(budget=6, k_sink=1)), lambda: FixedK(2)


def sparsespec_l_parts():
    """SparseSpec-L's self-draft: a recall index under the entropy controller (draft lengths 1-3)."""
    return (lambda: SelfDrafter(RecallIndex(budget=5, k_sink=1, k_recent=2, window=2)),
            lambda: EntropyController(candidates=(1, 2, 3)))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_engine_sampling_matches_target_marginals(family, one_thread):
    """End to end: speculative sampling with a mismatched drafter gives the target's per-position
    marginals (V = 6, temperature 1), while the drafter's own distribution is clearly different.
    Drafters: a small model, MagicDec's streaming self-draft, SparseSpec-L's recall index under its
    entropy controller (draft lengths 1-3, so the controller's stop rule is exercised), and lookup."""
    V, steps = 6, 3
    target = tiny_lm(family, vocab=V, seed=1, layers=1)
    drafter = tiny_lm(family, vocab=V, seed=2, layers=1)
    prompt = random_prompt(12, seed=5, vocab=V)
    sampling = Sampling(temperature=1.0)
    exact = exact_marginals(target, prompt, steps, sampling)
    draft_exact = exact_marginals(drafter, prompt, steps, sampling)
    assert max(tv(a, b) for a, b in zip(exact, draft_exact, strict=True)) > 0.15  # the test has power
    # PromptLookup(1): with 6 tokens every unigram recurs, so it drafts deterministically (one-hot q)
    for make, control, lookup in ((lambda: ModelDrafter(drafter), lambda: FixedK(2), False),
                                  (*magicdec_parts(), False), (*sparsespec_l_parts(), False),
                                  (lambda: None, lambda: FixedK(2), True)):
        freqs = sampled_marginals(target, make, control, prompt, steps, sampling, lookup=lookup)
        for i in range(steps):
            assert tv(freqs[i], exact[i]) < TV_BOUND, f"position {i}"


PUBLISHED = Sampling(temperature=0.8, top_p=0.95)  # the sampled runs in docs/benchmarks.md use these


def _published_case():
    V, steps = 6, 3
    target = tiny_lm("llama", vocab=V, seed=1, layers=1)
    prompt = random_prompt(12, seed=5, vocab=V)
    return target, prompt, steps, exact_marginals(target, prompt, steps, PUBLISHED)


def test_self_drafting_at_the_published_temperature_and_top_p_gives_the_target_distribution(one_thread):
    """At temperature 0.8 and top-p 0.95 (the published sampled runs), MagicDec's and SparseSpec-L's
    self-drafts give the target's marginals; top-p really cuts tokens here, and the marginals differ
    from temperature 1's, so a verifier that skipped either transform would be caught."""
    target, prompt, steps, exact = _published_case()
    assert int((exact[0] < 1e-6).sum()) >= 1  # top-p removed a token at the first position
    assert worst_tv(torch.stack(exact), exact_marginals(target, prompt, steps, Sampling(temperature=1.0))) > TV_BOUND
    for make, control in (magicdec_parts(), sparsespec_l_parts()):
        assert worst_tv(sampled_marginals(target, make, control, prompt, steps, PUBLISHED), exact) < TV_BOUND


def test_the_check_rejects_a_verifier_that_resamples_from_the_wrong_distribution(monkeypatch, one_thread):
    """The same check, against a verifier that resamples a rejected draft from the target's p instead
    of the residual norm(max(p - q, 0)): its output is biased toward the drafter, and the check sees it."""
    import sparsespec.decoding.engine as engine_module

    def wrong_residual(draft, q, p, generator=None):
        k = len(draft)
        rows, idx = torch.arange(k, device=p.device), torch.as_tensor(draft, device=p.device)
        rejected = (torch.rand(k, generator=generator, device=p.device) >= p[rows, idx] / q[rows, idx]).tolist()
        i = rejected.index(True) if True in rejected else k
        return i, int(torch.multinomial(p[i], 1, generator=generator))  # p[i], not the residual

    target, prompt, steps, exact = _published_case()
    make, control = magicdec_parts()
    assert worst_tv(sampled_marginals(target, make, control, prompt, steps, PUBLISHED), exact) < TV_BOUND
    monkeypatch.setattr(engine_module, "accept_speculative", wrong_residual)
    assert worst_tv(sampled_marginals(target, make, control, prompt, steps, PUBLISHED), exact) > TV_BOUND
