"""Drafters: who proposes tokens. The seam is transformers' candidate-generator idea — `propose`
drafts from the current state, `accepted` updates the drafter from the verification result.

SelfDrafter: the target drafts for itself through a KV view over its own (exact) cache.
ModelDrafter: a small model with its own cache, optionally computing its KV under a sparse view.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from sparsespec.decoding.sampling import Sampling, entropy
from sparsespec.kv.cache import KVCache
from sparsespec.kv.views import FullView, KVView
from sparsespec.models.runner import Capture, CausalLM


@dataclass
class DecodeState:
    """What drafter and verifier share. The target cache holds every token but the last
    (`tokens[-1]` is the pending token: sampled, not yet run through the target)."""

    target: CausalLM
    cache: KVCache
    tokens: list[int]
    prompt_len: int
    # the most tokens this round may draft (set by the engine: a draft past max_new_tokens is
    # never used, and a windowed drafter must not run past its window for it)
    draft_limit: int = 1 << 30


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # [k, V] distributions the tokens were drawn from (None when greedy)
    entropies: list[float]
    steps: int  # drafter forward passes
    seconds: float = 0.0
    # False when the controller did not size this draft (prompt lookup): it must not learn from
    # the round (its entropies and cost describe the drafter it steers, not a copy)
    controlled: bool = True


@dataclass
class SelfDrafter:
    """Self-speculation: the target model drafts with attention restricted to a KV view."""

    view: KVView = field(default_factory=FullView)
    _compact: KVCache | None = field(default=None, repr=False)  # reused by every round's gather

    def prefill_capture(self) -> Capture | None:
        return getattr(self.view, "prefill_capture", lambda: None)()

    def start(self, state: DecodeState) -> None:
        start = getattr(self.view, "start", None)
        if start is not None:
            start(state)

    def verify_capture(self) -> Capture | None:
        return getattr(self.view, "verify_capture", lambda: None)()

    def propose(self, state: DecodeState, controller, sampling: Sampling, gen: torch.Generator) -> Proposal:
        t0 = time.perf_counter()
        model, length = state.target, state.cache.length
        kmax = min(controller.max_draft(), state.draft_limit)
        idx = self.view.select(length, model.n_layers, model.n_kv_heads, model.device)
        # Full view: draft straight into the target cache and roll back; else a compact copy.
        if idx is None:
            cache = state.cache
        else:
            cache = self._compact = state.cache.gather(idx, extra=kmax + 1, out=self._compact)
        base = cache.length
        tok, out, qs, ents = state.tokens[-1], [], [], []
        while True:
            logits = model.forward(torch.tensor([tok]), cache, positions=torch.tensor([length + len(out)]))[-1]
            tok, q = sampling.sample(logits, gen)
            out.append(tok)
            qs.append(q)
            ents.append(entropy(logits))
            if len(out) >= kmax or not controller.keep_drafting(len(out), ents):
                break
        if idx is None:
            cache.crop(base)
        q = None if sampling.greedy else torch.stack(qs)
        return Proposal(out, q, ents, steps=len(out), seconds=time.perf_counter() - t0)

    def accepted(self, state: DecodeState, n_accepted: int) -> None:
        update = getattr(self.view, "update", None)
        if update is not None:
            update(state, n_accepted)


@dataclass
class ModelDrafter:
    """A separate small LM sharing the target's tokenizer, with its own cache and optional view."""

    model: CausalLM
    view: KVView = field(default_factory=FullView)
    prefill_chunk: int = 1024
    cache: KVCache | None = field(default=None, repr=False)

    def prefill_capture(self) -> Capture | None:
        return None

    def verify_capture(self) -> Capture | None:
        return None

    def start(self, state: DecodeState) -> None:
        self.cache = self.model.new_cache(len(state.tokens) + 64)
        prompt = torch.tensor(state.tokens[: state.prompt_len])
        self.model.prefill(prompt, self.cache, chunk=self.prefill_chunk, mask_fn=self.view.mask)

    def _step(self, ids: list[int]) -> torch.Tensor:
        n = len(ids)
        mask = self.view.mask(self.cache.length, n, self.cache.length + n)
        return self.model.forward(torch.tensor(ids), self.cache, mask=mask, logits="last")[-1]

    def propose(self, state: DecodeState, controller, sampling: Sampling, gen: torch.Generator) -> Proposal:
        t0 = time.perf_counter()
        kmax = min(controller.max_draft(), state.draft_limit)
        vocab = state.target.vocab_size
        # catch up on every token the drafter has not processed (the pending one, plus the
        # verifier's correction or the last draft when all were accepted)
        logits = self._step(state.tokens[self.cache.length :])[:vocab]
        out, qs, ents, steps = [], [], [], 1
        while True:
            tok, q = sampling.sample(logits, gen)
            out.append(tok)
            qs.append(q)
            ents.append(entropy(logits))
            if len(out) >= kmax or not controller.keep_drafting(len(out), ents):
                break
            logits = self._step([tok])[:vocab]
            steps += 1
        q = None if sampling.greedy else torch.stack(qs)
        return Proposal(out, q, ents, steps=steps, seconds=time.perf_counter() - t0)

    def accepted(self, state: DecodeState, n_accepted: int) -> None:
        # state.tokens now ends with the accepted drafts and the verifier's token; keep only the
        # drafter entries that lie on that sequence.
        valid = len(state.tokens) - 1
        self.cache.crop(min(self.cache.length, valid))


@dataclass
class LookupDrafter:
    """Prompt lookup (Saxena 2023): if the last `ngram` tokens occurred before, draft the tokens that
    followed their latest earlier occurrence; otherwise ask `fallback` (any drafter; None: no draft
    this round, a plain verification step).

    It reads token ids only, no KV and no model, so a draft costs ~nothing. That pays off where the
    target repeats itself, which its greedy continuations of long books do a lot (docs/training.md).
    Under sampling the draft is deterministic: q is one-hot, so speculative sampling accepts token x
    with probability p(x) and resamples from p without x, which keeps the target's distribution.
    """

    ngram: int = 2
    fallback: SelfDrafter | ModelDrafter | None = None
    # most tokens one copy drafts (None: the controller's maximum). An entropy controller may allow
    # 20, sized for drafts it can stop early; a copy has no entropy to stop on, and a wrong
    # 20-token copy costs a 21-token verification (measured: 0.18 acceptance at 16k)
    k: int | None = None
    looked_up: int = 0  # rounds drafted by lookup / not (by the fallback, or no draft), reported
    fell_back: int = 0

    def __post_init__(self) -> None:
        if self.ngram < 1:
            raise ValueError(f"lookup n-gram size must be >= 1, got {self.ngram}")
        if self.k is not None and self.k < 1:
            raise ValueError(f"lookup draft length must be >= 1, got {self.k}")

    @property
    def view(self) -> KVView | None:  # the engine collects the fallback view's report
        return getattr(self.fallback, "view", None)

    def prefill_capture(self) -> Capture | None:
        return self.fallback.prefill_capture() if self.fallback else None

    def verify_capture(self) -> Capture | None:
        return self.fallback.verify_capture() if self.fallback else None

    def start(self, state: DecodeState) -> None:
        self.looked_up = self.fell_back = 0
        if self.fallback:
            self.fallback.start(state)

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of tokens[-ngram:] ([] if none).
        A copy that runs past the end continues from its own start, i.e. a repeating stretch is
        extended periodically (in "a b a b" the last "a b" follows the first: draft "a b a ...")."""
        n = self.ngram
        if len(tokens) <= n:
            return []
        ids = torch.tensor(tokens)
        # every earlier n-gram start i (its next token, ids[i + n], must exist: i < len - n)
        hits = (ids[:-1].unfold(0, n, 1) == ids[-n:]).all(-1).nonzero()
        if hits.numel() == 0:
            return []
        start, out = int(hits[-1]) + n, []
        for j in range(k):
            pos = start + j
            out.append(tokens[pos] if pos < len(tokens) else out[pos - len(tokens)])
        return out

    def propose(self, state: DecodeState, controller, sampling: Sampling, gen: torch.Generator) -> Proposal:
        t0 = time.perf_counter()
        kmax = min(controller.max_draft(), state.draft_limit, *([self.k] if self.k is not None else []))
        out = self.lookup(state.tokens, kmax)
        if not out:
            self.fell_back += 1
            if self.fallback is not None:
                return self.fallback.propose(state, controller, sampling, gen)
        else:
            self.looked_up += 1
        vocab = state.target.vocab_size
        q = None if sampling.greedy or not out else torch.nn.functional.one_hot(torch.tensor(out), vocab).float()
        return Proposal(out, q, [0.0] * len(out), steps=0, seconds=time.perf_counter() - t0, controlled=False)

    def accepted(self, state: DecodeState, n_accepted: int) -> None:
        if self.fallback:
            self.fallback.accepted(state, n_accepted)

    def report(self) -> dict[str, int]:
        return {"lookup_rounds": self.looked_up, "fallback_rounds": self.fell_back}
