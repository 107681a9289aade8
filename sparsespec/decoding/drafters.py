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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from sparsespec.decoding.controllers import Controller
from sparsespec.decoding.sampling import Sampling, entropy
from sparsespec.kv.cache import KVCache
from sparsespec.kv.capture import Capture
from sparsespec.kv.policies import FullKV, KVPolicy, KVPolicyError
from sparsespec.models.device import DeviceClock
from sparsespec.models.runner import Block, CausalLM


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
    done_at: object = None  # the engine's clock mark when this draft was complete

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class DraftSteps:
    """One round of a model drafter as forward passes: feed `first`, then each drawn token, up to
    `kmax` times. Given as steps rather than run by the drafter, the steps of every sequence in a
    batch run as one packed forward (`draft`), so the drafter's weights are read once per step."""

    model: CausalLM
    first: torch.Tensor | list[int]
    kmax: int
    block: Callable[[torch.Tensor | list[int]], Block]  # a step's ids -> its forward input (cache, positions, mask)
    vocab: int | None = None  # logits past the target's vocabulary are cut (a drafter with a larger one)
    finish: Callable[[], None] | None = None  # after the last step (e.g. roll back a draft written in place)


def draft(rounds: list[DraftSteps], controllers: list[Controller], sampling: Sampling,
          generators: list[torch.Generator], clock: DeviceClock | None = None) -> list[Proposal]:
    """The drafting loop of model drafters, for one sequence or a batch in lockstep: each step feeds
    every still-drafting sequence's token in one forward per model, then each sequence draws and stops
    at its kmax or when its controller says so. The tokens stay on the device (each is the next
    step's input), so with a controller that reads no entropy nothing here waits for the GPU.
    clock: marks when each sequence's draft was complete (Proposal.done_at)."""
    n = len(rounds)
    toks, qs, ents = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
    done_at: list = [None] * n
    ids = [r.first for r in rounds]
    active = list(range(n))
    while active:
        by_model: dict[int, list[int]] = {}
        for i in active:
            by_model.setdefault(id(rounds[i].model), []).append(i)
        logits = {}
        for members in by_model.values():
            out = rounds[members[0]].model.forward_many([rounds[i].block(ids[i]) for i in members])
            logits.update(zip(members, out, strict=True))
        still = []
        for i in active:
            row = logits[i][-1] if rounds[i].vocab is None else logits[i][-1, : rounds[i].vocab]
            tok, q = sampling.draw(row, generators[i])
            toks[i].append(tok)
            qs[i].append(q)
            if controllers[i].reads_entropy:
                ents[i].append(float(entropy(row)))
            if len(toks[i]) < rounds[i].kmax and controllers[i].keep_drafting(len(toks[i]), ents[i]):
                still.append(i)
                ids[i] = tok
        mark = clock.mark() if clock is not None else None
        for i in set(active) - set(still):
            done_at[i] = mark
        active = still
    for r in rounds:
        if r.finish is not None:
            r.finish()
    return [Proposal(torch.cat(t), None if sampling.greedy else torch.stack(q), e, steps=len(t), done_at=m)
            for t, q, e, m in zip(toks, qs, ents, done_at, strict=True)]


class Drafter:
    """A source of draft tokens. A drafter that runs a model implements `steps` (the engine then
    batches its forwards with other sequences'); any other implements `propose`."""

    # True when the drafter decodes with a second model, which the harness loads (drafter.path)
    needs_model: ClassVar[bool] = False
    policy: KVPolicy | None = None  # the KV view it drafts from, if it has one (results report it)

    def prefill_capture(self) -> Capture | None:
        """What the target's prefill should report to this drafter (None: nothing)."""
        return None

    def verify_capture(self) -> Capture | None:
        """What every verification pass should report (None: nothing)."""
        return None

    def start(self, state: DecodeState) -> None:
        """After the target's prefill, before the first round."""

    def steps(self, state: DecodeState, kmax: int) -> DraftSteps | None:
        """This round's drafting as forward passes of at most kmax steps (None: `propose` drafts)."""
        return None

    def propose(self, state: DecodeState, controller: Controller, sampling: Sampling,
                gen: torch.Generator) -> Proposal:
        """Up to min(controller.max_draft(), state.draft_limit) tokens, stopping when the
        controller says so."""
        steps = self.steps(state, min(controller.max_draft(), state.draft_limit))
        if steps is None:
            raise NotImplementedError(f"{type(self).__name__} implements neither steps() nor propose()")
        return draft([steps], [controller], sampling, [gen])[0]

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:
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

    def steps(self, state: DecodeState, kmax: int) -> DraftSteps:
        model, length = state.target, state.cache.length
        idx = self.policy.select(state)
        # Full view: draft straight into the target cache and roll back; else a compact copy.
        if idx is None:
            cache = state.cache
        else:
            cache = self._compact = state.cache.gather(idx, extra=kmax + 1, out=self._compact)
        base = cache.length
        positions = iter(torch.arange(length, length + kmax, device=model.device).split(1))

        def block(ids: torch.Tensor | list[int]) -> Block:  # the compact cache keeps true positions
            return Block(ids, cache, positions=next(positions), logits="last")

        return DraftSteps(model, [state.tokens[-1]], kmax, block,
                          finish=(lambda: cache.crop(base)) if idx is None else None)


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

    def _block(self, ids: torch.Tensor | list[int]) -> Block:
        n = len(ids)
        mask = self.policy.mask(self.cache.length, n, self.cache.length + n, self.model.device)
        return Block(ids, self.cache, mask=mask, logits="last")

    def steps(self, state: DecodeState, kmax: int) -> DraftSteps:
        # the first step catches up on every token the drafter has not processed (the pending one,
        # plus the verifier's correction or the last draft when all were accepted)
        return DraftSteps(self.model, state.tokens[self.cache.length :], kmax, self._block,
                          vocab=state.target.vocab_size)

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
