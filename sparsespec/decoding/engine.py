"""The speculative engine: one loop for every method.

    prefill the prompt, sample the first token
    repeat: the drafter proposes up to k tokens (the controller decides how many),
            the target verifies [pending, d1..dk] in one pass over its full cache,
            the verifier keeps a prefix and adds one token of its own,
            the target cache (and the drafter) roll back to the kept tokens.

With no drafter this is plain autoregressive decoding (k = 0 every round), so `ar` and every
speculative method share the same prefill, forward and sampling code. With `lookup` set, prompt
lookup drafts first each round and the drafter only where the lookup finds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sparsespec.decoding.controllers import Controller, FixedK, RoundStats
from sparsespec.decoding.drafters import DecodeState, Drafter, PromptLookup, Proposal
from sparsespec.decoding.sampling import Sampling
from sparsespec.decoding.verify import accept_greedy, accept_speculative
from sparsespec.kv.cache import KVCache
from sparsespec.models.device import DeviceClock, to_device_ids
from sparsespec.models.runner import CausalLM


@dataclass
class GenerationResult:
    output_ids: list[int]
    prompt_tokens: int
    prefill_s: float
    wall_s: float  # decoding after prefill
    draft_s: float = 0.0
    verify_s: float = 0.0
    draft_steps: int = 0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round
    extra: dict = field(default_factory=dict)  # controller / view reports

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def overhead_s(self) -> float:
        return max(self.wall_s - self.draft_s - self.verify_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def gamma(self) -> float:
        """Relative drafting cost: mean draft step time / mean verification pass time (0 when no
        drafter forward ran, as with prompt lookup alone: a copy is not a model step)."""
        if not self.draft_steps:
            return 0.0
        return (self.draft_s / self.draft_steps) / (self.verify_s / max(self.verify_steps, 1))

    @property
    def acceptance_rate(self) -> float | None:
        """alpha: accepted / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else None

    def acceptance_by_part(self, parts: int = 4) -> list[float | None] | None:
        """alpha over each of `parts` equal stretches of the output, a round counted in the stretch
        where its first emitted token falls (does acceptance decay over a long generation?); None,
        like acceptance_rate, when nothing was drafted (AR)."""
        if not any(d for d, _ in self.rounds):
            return None
        drafted, accepted = [0] * parts, [0] * parts
        pos = 1  # the first output token comes from the prefill
        for d, a in self.rounds:
            part = min(pos * parts // max(self.new_tokens, 1), parts - 1)
            drafted[part] += d
            accepted[part] += a
            pos += a + 1
        return [a / d if d else None for a, d in zip(accepted, drafted, strict=True)]

    @property
    def mean_accepted_tokens(self) -> float | None:
        """tau: tokens emitted per verification round (accepted drafts + the verifier's token)."""
        if not self.rounds:
            return None
        return sum(a + 1 for _, a in self.rounds) / len(self.rounds)


@dataclass
class SpeculativeEngine:
    target: CausalLM
    drafter: Drafter | None = None  # None: AR (or prompt lookup alone)
    controller: Controller = field(default_factory=FixedK)
    prefill_chunk: int = 1024
    lookup: PromptLookup | None = None

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        sampling: Sampling | None = None,
        seed: int = 0,
        eos_token_ids: tuple[int, ...] = (),
        progress: Callable[[int], None] | None = None,
        cache: KVCache | None = None,
        on_token: Callable[[int], None] | None = None,
    ) -> GenerationResult:
        """Decode up to max_new_tokens after prompt_ids.

        cache: optionally a target cache that already holds the first `cache.length` tokens of this
        prompt (fewer than all of them: the last prompt tokens are always run here, so a view's
        prefill capture sees real queries). Benchmarks use it to prefill a long prompt once for many
        runs; on return the cache holds the generated tokens too, `cache.crop` restores it.
        on_token: called with every output token as soon as it is verified (streaming).
        """
        if max_new_tokens <= 0:
            raise ValueError(f"gen.max_new_tokens must be positive, got {max_new_tokens}")
        if not prompt_ids:
            raise ValueError("empty prompt: nothing to condition on")
        sampling = sampling or Sampling()
        self._clock = DeviceClock(self.target.device)
        gen = torch.Generator(device=self.target.device).manual_seed(seed)
        target, drafter = self.target, self.drafter
        if cache is None:
            cache = target.new_cache(len(prompt_ids) + max_new_tokens + 64)
        done = cache.length
        if not 0 <= done < len(prompt_ids):
            raise ValueError(f"a reused cache must hold fewer tokens ({done}) than the prompt ({len(prompt_ids)})")

        if self.lookup is not None:
            self.lookup.looked_up = self.lookup.missed = 0
        t0 = time.perf_counter()
        capture = drafter.prefill_capture() if drafter else None
        logits = target.prefill(prompt_ids[done:], cache, self.prefill_chunk, capture=capture,
                                progress=progress)[-1]
        first = int(sampling.draw(logits, gen)[0])
        state = DecodeState(target, cache, list(prompt_ids) + [first], len(prompt_ids))
        if drafter:
            drafter.start(state)
        res = GenerationResult([first], len(prompt_ids), prefill_s=time.perf_counter() - t0, wall_s=0.0)
        if on_token is not None:
            on_token(first)

        t0 = time.perf_counter()
        eos = set(eos_token_ids)
        while len(res.output_ids) < max_new_tokens and first not in eos:
            remaining = max_new_tokens - len(res.output_ids)
            first = self._round(state, res, remaining, sampling, gen)
            new = state.tokens[state.prompt_len :]
            if eos and eos.intersection(new):  # cut after the first EOS, as AR would stop there
                stop = next(i for i, t in enumerate(new) if t in eos) + 1
                new = new[:stop]
                first = new[-1]
            emitted = len(res.output_ids)
            res.output_ids = new[:max_new_tokens]
            if on_token is not None:
                for t in res.output_ids[emitted:]:
                    on_token(t)
        res.wall_s = time.perf_counter() - t0
        for part in (self.controller, drafter, self.lookup):
            if part is not None:
                res.extra.update(part.report())
        return res

    def _round(self, state: DecodeState, res: GenerationResult, remaining: int, sampling, gen) -> int:
        """One draft-verify round; appends the kept tokens to state.tokens, returns the last one.

        On the greedy path with a controller that reads no entropy, the host waits for the device
        once per round: the draft stays on the device, and one read brings back the draft and the
        target's tokens together for the acceptance decision (tests/test_syncs.py counts this)."""
        target, cache, drafter, clock = state.target, state.cache, self.drafter, self._clock
        length = cache.length
        proposal: Proposal | None = None
        start = clock.mark()
        # with one token left a draft can never be used: verify-only (an AR step)
        if remaining > 1:
            state.draft_limit = remaining - 1
            if self.lookup is not None:
                proposal = self.lookup.propose(state, self.controller, sampling)
            if proposal is None and drafter is not None:
                proposal = drafter.propose(state, self.controller, sampling, gen)
            if proposal is not None:  # a drafter that ignores the limit still cannot emit past it
                proposal.tokens = proposal.tokens[: state.draft_limit]
                if proposal.q is not None:
                    proposal.q = proposal.q[: len(proposal.tokens)]
        drafted = clock.mark()
        k = len(proposal) if proposal else 0
        ids = to_device_ids([state.tokens[-1]], target.device)
        if k:
            ids = torch.cat([ids, to_device_ids(proposal.tokens, target.device)])

        capture = drafter.verify_capture() if drafter else None
        logits = target.forward(ids, cache, capture=capture)
        if sampling.greedy:
            n_acc, nxt, draft = accept_greedy(ids[1:], logits)
        else:
            draft = ids[1:].tolist()
            p = sampling.probs(logits)
            n_acc, nxt = accept_speculative(ids[1:], proposal.q, p, gen) if k else (
                0, int(torch.multinomial(p[0], 1, generator=gen)))
        verified = clock.mark()  # after the host read above: every mark before it is complete
        cache.crop(length + 1 + n_acc)
        verify_s = clock.seconds(drafted, verified)
        state.tokens.extend([*draft[:n_acc], nxt])
        res.verify_s += verify_s
        res.verify_steps += 1
        if drafter is not None:  # also after a verify-only or lookup round: the index saw its query
            drafter.on_verified(state, n_acc)
        if proposal is not None:
            proposal.seconds = clock.seconds(start, drafted)
            res.draft_s += proposal.seconds
            res.draft_steps += proposal.steps
            res.drafted += k
            res.accepted += n_acc
            res.rounds.append((k, n_acc))
            if proposal.controlled:
                self.controller.observe(RoundStats(k, n_acc, proposal.entropies, proposal.seconds, verify_s))
        return nxt
