"""Speculative sampling reproduces the target distribution (fixed seeds, tight tolerances)."""

import pytest
import torch
from conftest import random_prompt, tiny_lm

from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import ModelDrafter, PromptLookup, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.decoding.sampling import Sampling
from sparsespec.decoding.verify import accept_speculative
from sparsespec.kv.policies import StreamingKV
from sparsespec.kv.recall import RecallIndex


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


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


BATCH = 100  # sequences decoded together in the distribution tests


def exact_marginals(target, prompt, steps, sampling):
    """Exact per-position marginals of AR sampling by enumeration (tiny vocabulary)."""
    V = target.vocab_size
    marg = []
    frontier = {(): 1.0}
    for _ in range(steps):
        m = torch.zeros(V)
        nxt = {}
        for seq, w in frontier.items():
            cache = target.new_cache()
            logits = target.prefill(torch.tensor(prompt + list(seq)), cache)[-1]
            p = sampling.probs(logits).cpu()
            m += w * p
            for t in range(V):
                if p[t] > 1e-4:
                    nxt[seq + (t,)] = w * float(p[t])
        marg.append(m)
        frontier = nxt
    return marg


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_engine_sampling_matches_target_marginals(family):
    """End to end: speculative sampling with a mismatched drafter gives the target's per-position
    marginals (V = 6, temperature 1), while the drafter's own distribution is clearly different.
    Drafters: a small model, MagicDec's streaming self-draft, SparseSpec-L's recall index under its
    entropy controller (draft lengths 1-3, so the controller's stop rule is exercised), and lookup."""
    V, steps, n = 6, 3, 1500
    target = tiny_lm(family, vocab=V, seed=1, layers=1)
    drafter = tiny_lm(family, vocab=V, seed=2, layers=1)
    prompt = random_prompt(12, seed=5, vocab=V)
    sampling = Sampling(temperature=1.0)
    exact = exact_marginals(target, prompt, steps, sampling)
    draft_exact = exact_marginals(drafter, prompt, steps, sampling)
    assert max(tv(a, b) for a, b in zip(exact, draft_exact, strict=True)) > 0.15  # the test has power
    # PromptLookup(1): with 6 tokens every unigram recurs, so it drafts deterministically (one-hot q)
    recall = (lambda: SelfDrafter(RecallIndex(budget=5, k_sink=1, k_recent=2, window=2)),
              lambda: EntropyController(candidates=(1, 2, 3)))
    lookup = (lambda: None, lambda: FixedK(2))
    for make, control in ((lambda: ModelDrafter(drafter), lambda: FixedK(2)),
                          (lambda: SelfDrafter(StreamingKV(budget=6, k_sink=1)), lambda: FixedK(2)),
                          recall, lookup):
        counts = torch.zeros(steps, V)
        # the n draws decoded as batches, one seed per sequence (a sequence's draw is the one its seed
        # gives alone, tests/test_batch.py): so this is also the distribution of batched sampling
        for seeds in torch.arange(n).split(BATCH):
            copy = PromptLookup(1) if make is lookup[0] else None
            engine = SpeculativeEngine(target, make(), control(), lookup=copy)
            for res in engine.generate_batch([prompt] * len(seeds), steps, sampling, seed=seeds.tolist()):
                for i, t in enumerate(res.output_ids):
                    counts[i, t] += 1
        for i in range(steps):
            assert tv(counts[i] / n, exact[i]) < 0.06, f"position {i}"
