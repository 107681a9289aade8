"""The speculative engine: one loop for every method.

    prefill the prompt, sample the first token
    repeat: the drafter proposes up to k tokens (the controller decides how many),
            the target verifies [pending, d1..dk] in one pass over its full cache,
            the verifier keeps a prefix and adds one token of its own,
            the target cache (and the drafter) roll back to the kept tokens.

With no drafter this is plain autoregressive decoding (k = 0 every round), so `ar` and every
speculative method share the same prefill, forward and sampling code. With `prompt_lookup` set,
prompt lookup drafts first each round and the drafter only where the lookup finds nothing.

`generate_batch` runs the same loop for several prompts: each sequence with its own parts, cache
and generator, the forward passes of all of them packed into one (`CausalLM.forward_many`).
`generate` is a batch of one.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sparsespec.checks import positive
from sparsespec.clock import DeviceClock
from sparsespec.decoding.controllers import Controller, FixedK, RoundStats
from sparsespec.decoding.drafters import DecodeState, Drafter, PromptLookup, Proposal, draft
from sparsespec.decoding.sampling import Sampling
from sparsespec.decoding.verify import accept_greedy_many, accept_speculative
from sparsespec.kv.cache import KVCache
from sparsespec.models.device import to_device_ids
from sparsespec.models.runner import Block, CausalLM


@dataclass
class GenerationResult:
    output_ids: list[int]
    prompt_tokens: int
    prefill_s: float
    # the decoding time after the prefill, not the whole call's (that adds prefill_s); the result
    # rows keep this name (their contract), so it is not renamed here either
    wall_s: float
    draft_s: float = 0.0
    verify_s: float = 0.0
    draft_steps: int = 0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round
    extra: dict = field(default_factory=dict)  # controller / view reports
    batch_size: int = 1  # sequences decoded together (generate_batch)
    # the tokens of the whole batch over the batch's decoding time (for one sequence: tokens_per_s)
    aggregate_tokens_per_s: float | None = None

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


@dataclass(eq=False)  # compared by identity
class _Sequence:
    """One sequence of a batch: its own state, parts (drafter, controller and lookup hold
    per-sequence state), random generator and result."""

    state: DecodeState
    res: GenerationResult
    gen: torch.Generator
    drafter: Drafter | None
    controller: Controller
    prompt_lookup: PromptLookup | None
    max_new: int
    done: bool = False


@dataclass
class SpeculativeEngine:
    target: CausalLM
    drafter: Drafter | None = None  # None: AR (or prompt lookup alone)
    controller: Controller = field(default_factory=FixedK)
    prefill_chunk: int = 1024
    prompt_lookup: PromptLookup | None = None  # the part (a Method's `lookup` is its n-gram size)

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
        return self.generate_batch([prompt_ids], max_new_tokens, sampling, seed, eos_token_ids, progress,
                                   [cache], None if on_token is None else lambda _, t: on_token(t))[0]

    def generate_batch(
        self,
        prompts: list[list[int]],
        max_new_tokens: int | list[int],
        sampling: Sampling | None = None,
        seed: int | list[int] = 0,
        eos_token_ids: tuple[int, ...] = (),
        progress: Callable[[int], None] | None = None,
        caches: list[KVCache | None] | None = None,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[GenerationResult]:
        """Decode several prompts together, one result per prompt, each exactly what `generate`
        gives for that prompt alone (its own seed, draft lengths, KV view and rollback; the batch
        only shares the forward passes). A sequence that finishes leaves the batch.

        max_new_tokens, seed: one for all or one per prompt; caches: per prompt, as `generate`'s
        cache; on_token(i, token): token of prompt i, as soon as it is verified."""
        n = len(prompts)
        if n == 0:
            raise ValueError("no prompt to decode")
        max_new = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
        seeds = [seed] * n if isinstance(seed, int) else list(seed)
        caches = list(caches) if caches is not None else [None] * n
        if not len(max_new) == len(seeds) == len(caches) == n:
            raise ValueError(f"{n} prompts need as many max_new_tokens, seeds and caches")
        for m in max_new:  # the check evaluate.py's gen.max_new_tokens gets, for callers of this API
            positive("max_new_tokens", m, int)
        sampling = sampling or Sampling()
        self._clock = DeviceClock(self.target.device)
        parts = [(self.drafter, self.controller, self.prompt_lookup)] + [self._parts_for_another_sequence()
                                                                   for _ in range(n - 1)]
        seqs = [self._start(*args, sampling, progress) for args in zip(prompts, max_new, seeds, caches, parts, strict=True)]
        eos = set(eos_token_ids)
        for i, s in enumerate(seqs):
            if on_token is not None:
                on_token(i, s.res.output_ids[0])
            s.done = s.max_new <= 1 or s.res.output_ids[0] in eos

        t0 = time.perf_counter()
        active = [s for s in seqs if not s.done]
        while active:
            self._round(active, sampling)
            now = time.perf_counter()
            for i, s in enumerate(seqs):
                if s not in active:
                    continue
                self._emit(s, eos, None if on_token is None else lambda t, i=i: on_token(i, t))
                if s.done:
                    s.res.wall_s = now - t0
            active = [s for s in active if not s.done]
        batch_s = max(s.res.wall_s for s in seqs)  # until the last sequence finished
        total = sum(s.res.new_tokens for s in seqs)
        for s in seqs:
            s.res.batch_size = n
            s.res.aggregate_tokens_per_s = total / batch_s if batch_s > 0 else float("nan")
            for part in (s.controller, s.drafter, s.prompt_lookup):
                if part is not None:
                    s.res.extra.update(part.report())
        return [s.res for s in seqs]

    def _parts_for_another_sequence(self) -> tuple[Drafter | None, Controller, PromptLookup | None]:
        """Fresh copies of the drafter, controller and lookup for one more sequence of a batch: their
        state (a recall index, a drafter cache, an entropy estimate) is per sequence. The models are
        shared, not copied."""
        memo = {id(self.target): self.target}
        model = getattr(self.drafter, "model", None)
        if model is not None:
            memo[id(model)] = model
        return copy.deepcopy((self.drafter, self.controller, self.prompt_lookup), memo)

    def _start(self, prompt_ids, max_new, seed, cache, parts, sampling, progress) -> _Sequence:
        """Prefill one prompt (into `cache` if given) and draw its first token."""
        if not prompt_ids:
            raise ValueError("empty prompt: nothing to condition on")
        target = self.target
        drafter, controller, prompt_lookup = parts
        gen = torch.Generator(device=target.device).manual_seed(seed)
        if cache is None:
            cache = target.new_cache(len(prompt_ids) + max_new + 64)
        done = cache.length
        if not 0 <= done < len(prompt_ids):
            raise ValueError(f"a reused cache must hold fewer tokens ({done}) than the prompt ({len(prompt_ids)})")
        if prompt_lookup is not None:
            prompt_lookup.looked_up = prompt_lookup.missed = 0
        t0 = time.perf_counter()
        capture = drafter.prefill_capture() if drafter else None
        logits = target.prefill(prompt_ids[done:], cache, self.prefill_chunk, capture=capture,
                                progress=progress)[-1]
        first = int(sampling.draw(logits, gen)[0])
        state = DecodeState(target, cache, list(prompt_ids) + [first], len(prompt_ids))
        if drafter:
            drafter.start(state)
        res = GenerationResult([first], len(prompt_ids), prefill_s=time.perf_counter() - t0, wall_s=0.0)
        return _Sequence(state, res, gen, drafter, controller, prompt_lookup, max_new)

    @staticmethod
    def _emit(s: _Sequence, eos: set[int], on_token: Callable[[int], None] | None) -> None:
        """Move a sequence's kept tokens into its output (cut after the first EOS, as AR would stop
        there, and at max_new_tokens); mark it done."""
        new = s.state.tokens[s.state.prompt_len :]
        if eos and eos.intersection(new):
            new = new[: next(i for i, t in enumerate(new) if t in eos) + 1]
        emitted = len(s.res.output_ids)
        s.res.output_ids = new[: s.max_new]
        if on_token is not None:
            for t in s.res.output_ids[emitted:]:
                on_token(t)
        s.done = len(s.res.output_ids) >= s.max_new or s.res.output_ids[-1] in eos

    def _propose(self, seqs: list[_Sequence], sampling: Sampling) -> list[Proposal | None]:
        """Each sequence's draft: prompt lookup first, else its drafter; the model drafters' steps of
        all sequences run together (`draft`)."""
        clock = self._clock
        proposals: list[Proposal | None] = [None] * len(seqs)
        steps = []
        for j, s in enumerate(seqs):
            remaining = s.max_new - len(s.res.output_ids)
            if remaining <= 1:  # with one token left a draft can never be used: verify-only (an AR step)
                continue
            s.state.draft_limit = remaining - 1
            if s.prompt_lookup is not None:
                proposals[j] = s.prompt_lookup.propose(s.state, s.controller, sampling)
            if proposals[j] is None and s.drafter is not None:
                step = s.drafter.steps(s.state, min(s.controller.max_draft(), s.state.draft_limit))
                if step is None:
                    proposals[j] = s.drafter.propose(s.state, s.controller, sampling, s.gen)
                else:
                    steps.append((j, step))
            if proposals[j] is not None:
                proposals[j].done_at = clock.mark()
        if steps:
            made = draft([st for _, st in steps], [seqs[j].controller for j, _ in steps], sampling,
                         [seqs[j].gen for j, _ in steps], clock)
            for (j, _), p in zip(steps, made, strict=True):
                proposals[j] = p
        for s, p in zip(seqs, proposals, strict=True):
            if p is not None:  # a drafter that ignores the limit still cannot emit past it
                p.tokens = p.tokens[: s.state.draft_limit]
                if p.q is not None:
                    p.q = p.q[: len(p.tokens)]
        return proposals

    def _round(self, seqs: list[_Sequence], sampling: Sampling) -> None:
        """One draft-verify round of every sequence in `seqs`; appends each one's kept tokens to its
        state.tokens.

        On the greedy path with controllers that read no entropy, the host waits for the device
        once per round: the drafts stay on the device, and one read brings back the drafts and the
        target's tokens of every sequence together for the acceptance decisions
        (tests/test_syncs.py counts this)."""
        target, clock = self.target, self._clock
        start = clock.mark()
        proposals = self._propose(seqs, sampling)
        drafted = clock.mark()
        blocks, lengths = [], []
        drafts: list[torch.Tensor | list[int]] = []
        for s, p in zip(seqs, proposals, strict=True):
            if p is None or isinstance(p.tokens, list):
                # host tokens (the pending one, a prompt-lookup copy): one copy that does not make the
                # host wait, and the greedy decision reads the draft from the host, not back from the device
                ids = to_device_ids([s.state.tokens[-1], *(p.tokens if p else [])], target.device)
                drafts.append(list(p.tokens) if p else [])
            else:
                ids = torch.cat([to_device_ids([s.state.tokens[-1]], target.device), p.tokens])
                drafts.append(ids[1:])
            lengths.append(s.state.cache.length)
            blocks.append(Block(ids, s.state.cache, capture=s.drafter.verify_capture() if s.drafter else None))
        logits = target.forward_many(blocks)
        if sampling.greedy:
            decisions = accept_greedy_many(drafts, logits)
        else:
            decisions = [self._accept_sampled(b.ids[1:], p, sampling.probs(lg), s.gen)
                         for b, p, lg, s in zip(blocks, proposals, logits, seqs, strict=True)]
        verified = clock.mark()  # after the host read above: every mark before it is complete
        verify_s = clock.seconds(drafted, verified)
        for s, p, (n_acc, nxt, tokens), length in zip(seqs, proposals, decisions, lengths, strict=True):
            s.state.cache.crop(length + 1 + n_acc)
            s.state.tokens.extend([*tokens[:n_acc], nxt])
            res = s.res
            res.verify_s += verify_s
            res.verify_steps += 1
            if s.drafter is not None:  # also after a verify-only or lookup round: the index saw its query
                s.drafter.on_verified(s.state, n_acc)
            if p is not None:
                p.seconds = clock.seconds(start, p.done_at if p.done_at is not None else drafted)
                res.draft_s += p.seconds
                res.draft_steps += p.steps
                res.drafted += len(p)
                res.accepted += n_acc
                res.rounds.append((len(p), n_acc))
                if p.controlled:
                    s.controller.observe(RoundStats(len(p), n_acc, p.entropies, p.seconds, verify_s))

    @staticmethod
    def _accept_sampled(draft: torch.Tensor, proposal: Proposal | None, p: torch.Tensor,
                        gen: torch.Generator) -> tuple[int, int, list[int]]:
        if not len(draft):
            return 0, int(torch.multinomial(p[0], 1, generator=gen)), []
        n_acc, nxt = accept_speculative(draft, proposal.q, p, gen)
        return n_acc, nxt, draft.tolist()
