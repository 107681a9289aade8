"""Drafters: who proposes tokens. The seam is transformers' candidate-generator idea: `propose`
drafts from the current state, `on_verified` updates the drafter from the verification result.

A drafter subclasses `Drafter`; every hook but `propose` does nothing by default, so the engine
calls them all unconditionally.
SelfDrafter: the target drafts for itself through a KV policy over its own (exact) cache.
ModelDrafter: a small model with its own cache, optionally computing its KV under a sparse policy.
PromptLookup (not a drafter: an option of the engine, tried before the drafter each round) copies
what followed the latest earlier occurrence of the last n-gram.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from sparsespec.decoding.controllers import Controller
from sparsespec.decoding.sampling import Sampling, entropy
from sparsespec.kv.cache import KVCache
from sparsespec.kv.capture import Capture
from sparsespec.kv.policies import FullKV, KVPolicy, KVPolicyError
from sparsespec.models.runner import CausalLM


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
    # the draft: token ids on the model's device ([k], as drafted: nothing waits for them) or a list
    tokens: torch.Tensor | list[int]
    q: torch.Tensor | None  # [k, V] distributions the tokens were drawn from (None when greedy)
    entropies: list[float]  # per draft token, where the controller reads them (else empty)
    steps: int  # drafter forward passes
    seconds: float = 0.0  # set by the engine, from device-side marks around `propose`
    # False when the controller did not size this draft (prompt lookup): it must not learn from
    # the round (its entropies and cost describe the drafter it steers, not a copy)
    controlled: bool = True

    def __len__(self) -> int:
        return len(self.tokens)


def draft(step: Callable[[torch.Tensor | list[int]], torch.Tensor], first: torch.Tensor | list[int], kmax: int,
          controller: Controller, sampling: Sampling, gen: torch.Generator) -> Proposal:
    """The drafting loop a model drafter runs: `step(ids)` feeds tokens and returns the next logits;
    draw, and stop at kmax or when the controller says so. The tokens stay on the device (each is
    the next step's input), so with a controller that reads no entropy nothing here waits for the GPU."""
    logits, out, qs, ents = step(first), [], [], []
    while True:
        tok, q = sampling.draw(logits, gen)
        out.append(tok)
        qs.append(q)
        if controller.reads_entropy:
            ents.append(float(entropy(logits)))
        if len(out) >= kmax or not controller.keep_drafting(len(out), ents):
            break
        logits = step(tok)
    q = None if sampling.greedy else torch.stack(qs)
    return Proposal(torch.cat(out), q, ents, steps=len(out))


class Drafter(ABC):
    """A source of draft tokens. `propose` is the one method a drafter must have."""

    # True when the drafter decodes with a second model, which the harness loads (drafter.path)
    needs_model: ClassVar[bool] = False
    policy: KVPolicy | None = None  # the KV view it drafts from, if it has one (results report it)

    def prefill_capture(self) -> Capture | None:
        """What the target's prefill should report to this drafter (None: nothing)."""
        return None

    def verify_capture(self) -> Capture | None:
        """What every verification pass should report (None: nothing)."""
        return None

    def start(self, state: DecodeState) -> None:  # noqa: B027 (an optional hook)
        """After the target's prefill, before the first round."""

    @abstractmethod
    def propose(self, state: DecodeState, controller: Controller, sampling: Sampling,
                gen: torch.Generator) -> Proposal:
        """Up to min(controller.max_draft(), state.draft_limit) tokens, stopping when the
        controller says so."""

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:  # noqa: B027 (an optional hook)
        """After every verification (also of rounds it did not draft): state.tokens holds the kept
        tokens and the verifier's own, the target cache all but the last of them."""

    def report(self) -> dict:
        """Extra fields for the result row (`engine_<key>`)."""
        return {}

    def memory_bytes(self, n_layers: int, n_kv_heads: int, tokens: int) -> int:
        """Bytes allocated beyond a drafter model's own KV at a context of `tokens`."""
        return 0


@dataclass
class SelfDrafter(Drafter):
    """Self-speculation: the target model drafts with attention restricted to a KV policy."""

    policy: KVPolicy = field(default_factory=FullKV)
    _compact: KVCache | None = field(default=None, repr=False)  # reused by every round's gather

    def prefill_capture(self) -> Capture | None:
        return self.policy.prefill_capture()

    def start(self, state: DecodeState) -> None:
        self.policy.start(state)

    def verify_capture(self) -> Capture | None:
        return self.policy.verify_capture()

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:
        self.policy.update(state, n_accepted)

    def report(self) -> dict:
        return self.policy.report()

    def memory_bytes(self, n_layers: int, n_kv_heads: int, tokens: int) -> int:
        return self.policy.memory_bytes(n_layers, n_kv_heads, tokens)

    def propose(self, state: DecodeState, controller: Controller, sampling: Sampling,
                gen: torch.Generator) -> Proposal:
        model, length = state.target, state.cache.length
        kmax = min(controller.max_draft(), state.draft_limit)
        idx = self.policy.select(state)
        # Full view: draft straight into the target cache and roll back; else a compact copy.
        if idx is None:
            cache = state.cache
        else:
            cache = self._compact = state.cache.gather(idx, extra=kmax + 1, out=self._compact)
        base = cache.length
        positions = iter(torch.arange(length, length + kmax, device=model.device).split(1))

        def step(ids: torch.Tensor | list[int]) -> torch.Tensor:  # the compact cache keeps true positions
            return model.forward(ids, cache, positions=next(positions))[-1]

        proposal = draft(step, [state.tokens[-1]], kmax, controller, sampling, gen)
        if idx is None:
            cache.crop(base)
        return proposal


@dataclass
class ModelDrafter(Drafter):
    """A separate small LM sharing the target's tokenizer, with its own cache, computed under a
    position-only KV policy (FullKV: every position)."""

    needs_model: ClassVar[bool] = True
    # model and prefill_chunk come from the harness (drafter.path, runtime.prefill_chunk), not the
    # method file: repr=False keeps them out of the generated config node
    model: CausalLM | None = field(default=None, repr=False)
    policy: KVPolicy = field(default_factory=FullKV)
    prefill_chunk: int = field(default=1024, repr=False)
    cache: KVCache | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.policy.position_only:
            raise KVPolicyError(
                f"ModelDrafter computes its own KV under a position-only policy; {type(self.policy).__name__} "
                "scores the target's cache, so it works with SelfDrafter. Use StreamingKV or FullKV here.")

    def start(self, state: DecodeState) -> None:
        if self.model is None:
            raise KVPolicyError("ModelDrafter needs its model: load one with drafter.path (evaluate.py) or "
                                "pass model=CausalLM(...)")
        self.cache = self.model.new_cache(len(state.tokens) + 64)
        self.model.prefill(state.tokens[: state.prompt_len], self.cache, chunk=self.prefill_chunk,
                           mask_fn=self.policy.mask)

    def _step(self, ids: torch.Tensor | list[int]) -> torch.Tensor:
        n = len(ids)
        mask = self.policy.mask(self.cache.length, n, self.cache.length + n, self.model.device)
        return self.model.forward(ids, self.cache, mask=mask, logits="last")[-1]

    def propose(self, state: DecodeState, controller: Controller, sampling: Sampling,
                gen: torch.Generator) -> Proposal:
        kmax = min(controller.max_draft(), state.draft_limit)
        vocab = state.target.vocab_size
        # the first step catches up on every token the drafter has not processed (the pending one,
        # plus the verifier's correction or the last draft when all were accepted)
        return draft(lambda ids: self._step(ids)[:vocab], state.tokens[self.cache.length :], kmax, controller,
                     sampling, gen)

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:
        # state.tokens now ends with the accepted drafts and the verifier's token; keep only the
        # drafter entries that lie on that sequence.
        valid = len(state.tokens) - 1
        self.cache.crop(min(self.cache.length, valid))


@dataclass
class PromptLookup:
    """Prompt lookup (Saxena 2023): if the last `ngram` tokens occurred before, draft the tokens that
    followed their latest earlier occurrence. The engine tries it before the method's drafter each
    round; where the n-gram has no earlier occurrence the drafter drafts (or, with none, the round
    is a plain verification step).

    It reads token ids only, no KV and no model, so a draft costs ~nothing. That pays off where the
    target repeats itself, which its greedy continuations of long books do a lot (docs/benchmarks.md).
    Under sampling the draft is deterministic: q is one-hot, so speculative sampling accepts token x
    with probability p(x) and resamples from p without x, which keeps the target's distribution.
    """

    ngram: int = 2
    # most tokens one copy drafts (None: the controller's maximum). An entropy controller may allow
    # 20, sized for drafts it can stop early; a copy has no entropy to stop on, and a wrong long
    # copy costs a long verification
    k: int | None = None
    looked_up: int = field(default=0, init=False)  # rounds drafted by lookup / not, reported
    missed: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.ngram, bool) or not isinstance(self.ngram, int) or self.ngram < 1:
            raise ValueError(f"ngram={self.ngram!r} is out of range: an n-gram size >= 1")
        if self.k is not None and (not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"k={self.k!r} is out of range: a draft length >= 1, or null for the controller's")

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of tokens[-ngram:] ([] if none).
        A copy that runs past the end continues from its own start, i.e. a repeating stretch is
        extended periodically (in "a b a b" the last "a b" follows the first: draft "a b a ...")."""
        n = self.ngram
        if len(tokens) <= n:
            return []
        ids = torch.tensor(tokens, device="cpu")  # host-side: token ids are host data
        # every earlier n-gram start i (its next token, ids[i + n], must exist: i < len - n)
        hits = (ids[:-1].unfold(0, n, 1) == ids[-n:]).all(-1).nonzero()
        if hits.numel() == 0:
            return []
        start, out = int(hits[-1]) + n, []
        for j in range(k):
            pos = start + j
            out.append(tokens[pos] if pos < len(tokens) else out[pos - len(tokens)])
        return out

    def propose(self, state: DecodeState, controller: Controller, sampling: Sampling) -> Proposal | None:
        """A copied draft, or None when the n-gram has no earlier occurrence."""
        kmax = min(controller.max_draft(), state.draft_limit, *([self.k] if self.k is not None else []))
        out = self.lookup(state.tokens, kmax)
        if not out:
            self.missed += 1
            return None
        self.looked_up += 1
        vocab = state.target.vocab_size
        q = None if sampling.greedy else torch.nn.functional.one_hot(
            torch.tensor(out, device=state.target.device), vocab).float()
        return Proposal(out, q, [], steps=0, controlled=False)

    def report(self) -> dict[str, int]:
        return {"lookup_rounds": self.looked_up, "fallback_rounds": self.missed}
