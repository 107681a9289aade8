"""Drafters: who proposes tokens. The seam is transformers' candidate-generator idea: `propose`
drafts from the current state, `on_verified` updates the drafter from the verification result.

A drafter subclasses `Drafter`; every hook does nothing by default, so the engine calls them all
unconditionally. A drafter that runs a model gives its round as `steps` (forward inputs), so the
engine runs the steps of every sequence in a batch together (`draft`); any other implements `propose`.
SelfDrafter: the target drafts for itself through a KV policy over its own (exact) cache.
ModelDrafter: a small model with its own cache, optionally computing its KV under a sparse policy
(then holding only the sinks and the window).
PromptLookup (not a drafter: an option of the engine, tried before the drafter each round) copies
what followed the latest earlier occurrence of the last n-gram.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from sparsespec.clock import DeviceClock
from sparsespec.decoding.controllers import Controller
from sparsespec.decoding.sampling import Sampling, entropy
from sparsespec.kv.cache import KVCache
from sparsespec.kv.capture import Capture
from sparsespec.kv.policies import FullKV, KVPolicy, KVPolicyError
from sparsespec.kv.quantized import DraftView, QuantizedKVCache, check_kv_format, view_bytes
from sparsespec.kv.quantized import format_label as kv_label
from sparsespec.kv.quantized import new_cache as new_view_cache
from sparsespec.models import quantized
from sparsespec.models.device import to_device_ids
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

    def prepare(self, target: CausalLM) -> None:
        """Once the target is known, before any generation (a quantized copy of its weights is made
        here). Raises ValueError naming the setting when the target cannot run it."""

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


def check_weight_format(weights: str, head_weights: str | None, weights_group: int,
                        activations: str = "auto") -> None:
    """The draft weight settings' values, before any model is known (ValueError: `key=value: why`)."""
    if activations not in quantized.ACTIVATIONS:
        raise ValueError(f"activations={activations!r}: the rows of the draft's low-bit products are one of "
                         f"{', '.join(quantized.ACTIVATIONS)}")
    here = "cuda" if torch.cuda.is_available() else "cpu"
    for key, fmt in (("weights", weights), ("head_weights", head_weights)):
        if fmt is not None and fmt not in quantized.WEIGHT_FORMATS:
            raise ValueError(f"{key}={fmt!r}: not a draft weight format; the formats that work here ({here}): "
                             f"{', '.join(quantized.working_formats(here))}")
    if isinstance(weights_group, bool) or not isinstance(weights_group, int) or weights_group < 1:
        raise ValueError(f"weights_group={weights_group!r}: a positive number of weights per int4 group")


@dataclass
class WeightFormatDrafter(Drafter):
    """A drafter whose forward passes read the weights in a draft format (models/quantized.py):
    weights for the layers' projections (fp, bf16, int8, int4), head_weights for the lm_head (None:
    as weights), weights_group for int4's group size, activations for the rows their low-bit products
    take (auto, fp32, bf16: models/quantized.py); and attend to K/V in a draft KV format
    (kv/quantized.py): kv for the view a draft step reads (fp: the cache's own dtype, bf16, int8
    with a scale per token and KV head). Keyword-only, so a subclass's own fields keep their
    positions. The verification pass always runs the unmodified target over its own cache."""

    weights: str = field(default="fp", kw_only=True)
    head_weights: str | None = field(default=None, kw_only=True)
    weights_group: int = field(default=32, kw_only=True)
    activations: str = field(default="auto", kw_only=True)
    kv: str = field(default="fp", kw_only=True)
    _weight_bytes: int = field(default=0, repr=False, kw_only=True)  # what a draft step reads of the weights
    _view_bytes: list[int] = field(default_factory=lambda: [0, 0], repr=False, kw_only=True)  # K/V read, rounds
    _labels: tuple[str, str] = field(default=("", ""), repr=False, kw_only=True)  # (weights, KV) as rows say them

    def __post_init__(self) -> None:
        check_weight_format(self.weights, self.head_weights, self.weights_group, self.activations)
        check_kv_format(self.kv)

    def draft_model(self, model: CausalLM) -> CausalLM:
        """The model the draft pass runs: `model` itself, or its copy in this drafter's weight formats
        (made on first use, then shared)."""
        return quantized.draft_model(model, self.weights, self.head_weights, self.weights_group, self.activations)

    def _start_reads(self, model: CausalLM, kv_dtype: torch.dtype) -> None:
        """Start counting what the draft steps of a generation read (the row's draft_* fields)."""
        head = self.weights if self.head_weights is None else self.head_weights
        self._weight_bytes = quantized.linear_bytes(model, self.weights, head, self.weights_group, self.activations)
        self._view_bytes = [0, 0]
        where = (model.dtype, self.weights_group, model.device.type, self.activations)
        weights = quantized.format_label(self.weights, *where)
        if head != self.weights:
            weights += f", lm_head {quantized.format_label(head, *where)}"
        self._labels = (weights, kv_label(self.kv, kv_dtype))

    def _count_read(self, view: KVCache) -> None:
        """A round drafts over `view`: each of its steps reads the view's K and V in every layer (in
        the view's format, an int8 view's scales included)."""
        self._view_bytes[0] += view_bytes(view)
        self._view_bytes[1] += 1

    def _reads(self) -> dict:
        read, rounds = self._view_bytes
        return {"draft_weights": self._labels[0], "draft_kv": self._labels[1],
                "draft_step_bytes": self._weight_bytes + (read // rounds if rounds else 0)}


@dataclass
class SelfDrafter(WeightFormatDrafter):
    """Self-speculation: the target model drafts with attention restricted to a KV policy, its
    weights read in the drafter's weight format (WeightFormatDrafter)."""

    policy: KVPolicy = field(default_factory=FullKV)
    _view: DraftView | None = field(default=None, repr=False)  # the rounds' view, its storage reused

    def prepare(self, target: CausalLM) -> None:
        self.draft_model(target)

    def prefill_capture(self) -> Capture | None:
        return self.policy.prefill_capture()

    def start(self, state: DecodeState) -> None:
        self.policy.start(state)
        self._view = DraftView(self.kv)
        self._start_reads(state.target, state.cache.dtype)

    def verify_capture(self) -> Capture | None:
        return self.policy.verify_capture()

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:
        self.policy.update(state, n_accepted)

    def report(self) -> dict:
        return {**self.policy.report(), **self._reads()}

    def memory_bytes(self, n_layers: int, n_kv_heads: int, tokens: int) -> int:
        return self.policy.memory_bytes(n_layers, n_kv_heads, tokens)

    def steps(self, state: DecodeState, kmax: int) -> DraftSteps:
        round_, view = selected_steps(state, self.policy, kmax, self._view, self.draft_model(state.target))
        self._count_read(view)
        return round_


def selected_steps(state: DecodeState, policy: KVPolicy, kmax: int, view: DraftView | None,
                   model: CausalLM | None = None) -> tuple[DraftSteps, KVCache]:
    """A round drafted by `model` (default `state.target`; a copy of it in a draft weight format)
    from the positions `policy` selects in `state.cache` (which holds every token but the pending
    one), in the view format of `view` (None: fp), and the cache the round attends to. A sparse
    view is gathered into `view`'s compact cache (reused next round); a full view is the cache
    itself (fp) or `view`'s copy of it in the format; the round drafts into it and rolls back."""
    model, length = model or state.target, state.cache.length
    view = view if view is not None else DraftView()
    idx = policy.select(state)
    cache = view.full(state.cache, kmax + 1) if idx is None else view.gathered(state.cache, idx, kmax + 1)
    base = cache.length
    positions = iter(torch.arange(length, length + kmax, device=model.device).split(1))

    def block(ids: torch.Tensor | list[int]) -> Block:  # the compact cache keeps true positions
        return Block(ids, cache, positions=next(positions), logits="last")

    return DraftSteps(model, [state.tokens[-1]], kmax, block,
                      finish=(lambda: cache.crop(base)) if idx is None else None), cache


@dataclass
class ModelDrafter(WeightFormatDrafter):
    """A separate small LM sharing the target's tokenizer, with its own cache.

    A policy that scores positions (the recall index; with refresh off, a SnapKV-style static
    view) scores the drafter's own cache from the drafter's own attention: its prefill's last
    queries and, after each verification, the queries of the accepted tokens it catches up on (with
    full attention). The cache then keeps every position, and each round drafts from the ones the
    policy selects, as SelfDrafter does over the target's cache.

    Under a position-only sparse policy (StreamingKV) the cache holds only what the policy can still show: the
    sinks and the window of the next query, evicted as the window moves on (in steps of EVICT_EVERY
    entries, so a compaction is amortised), prefill included. Its size, and a draft step's cost,
    are then flat in the context. Entries keep their RoPE positions: the cache holds positions
    [0, k_sink) and then one contiguous run [window, seen), and each block's mask is the policy's
    visibility over exactly those positions, which is the mask over the whole cache restricted to
    what is kept (tests/test_exactness.py checks the two give the same logits)."""

    needs_model: ClassVar[bool] = True
    EVICT_EVERY: ClassVar[int] = 64
    # model and prefill_chunk come from the harness (drafter.path, runtime.prefill_chunk), not the
    # method file: repr=False keeps them out of the generated config node
    model: CausalLM | None = field(default=None, repr=False)
    policy: KVPolicy = field(default_factory=FullKV)
    prefill_chunk: int = field(default=1024, repr=False)
    cache: KVCache | None = field(default=None, repr=False)
    _window: int = field(default=0, repr=False)  # the first non-sink position the cache holds
    _peak: int = field(default=0, repr=False)  # most entries per layer held at once
    _own: DecodeState | None = field(default=None, repr=False)  # the drafter's cache, as a scored policy reads it
    _view: DraftView | None = field(default=None, repr=False)  # a scored policy's view of that cache

    @property
    def scored(self) -> bool:
        """Whether the policy scores positions (the cache then keeps them all)."""
        return not self.policy.position_only

    @property
    def seen(self) -> int:
        """Tokens the drafter has processed: the next one's position."""
        return self.cache.length + self._window - self.policy.k_sink

    @property
    def windowed(self) -> bool:
        """Whether the cache drops what the policy no longer shows (a sparse position-only policy)."""
        return not (isinstance(self.policy, FullKV) or self.scored)

    def held_entries(self, tokens: int) -> int:
        """The most entries per layer the cache holds between blocks at a context of `tokens`."""
        if not self.windowed:
            return tokens
        return min(tokens, tokens - self.policy.window_start(tokens) + self.policy.k_sink + self.EVICT_EVERY)

    def capacity(self, prompt: int) -> int:
        """The cache allocated at start: what is held after the prompt, room for a prefill chunk
        while the window has not moved on yet (windowed), and for the first drafts."""
        return self.held_entries(prompt) + (min(self.prefill_chunk, prompt) if self.windowed else 0) + 65

    def start(self, state: DecodeState) -> None:
        if self.model is None:
            raise KVPolicyError("ModelDrafter needs its model: load one with drafter.path (evaluate.py) or "
                                "pass model=CausalLM(...)")
        n = state.prompt_len
        self._window, self._peak = self.policy.k_sink, 0  # nothing evicted yet: positions [0, length) held
        # a scored policy reads the whole cache (kept as the model computes it) and drafts from a
        # view of it in the draft KV format; otherwise the cache is the view, held in that format
        m = self.model
        self.cache = new_view_cache("fp" if self.scored else self.kv, m.n_layers, m.n_kv_heads, m.head_dim, m.dtype,
                                    m.device, self.capacity(n))
        self._view = DraftView(self.kv)
        self._start_reads(self.model, self.cache.dtype)
        model = self.draft_model(self.model)  # every pass of the drafter, its own prefill included
        if self.scored:
            self._own = DecodeState(model, self.cache, state.tokens, n)
            model.prefill(state.tokens[:n], self.cache, self.prefill_chunk, capture=self.policy.prefill_capture())
            self.policy.start(self._own)
            self._peak = self.cache.length
            return
        for start in range(0, n, self.prefill_chunk):
            ids = state.tokens[start : min(start + self.prefill_chunk, n)]
            model.forward_many([self._block(ids, logits="none")])
            self._evict()

    def _block(self, ids: torch.Tensor | list[int], logits: str = "last") -> Block:
        n, seen, device = len(ids), self.seen, self.model.device
        positions = torch.arange(seen, seen + n, device=device)
        if self._window == self.policy.k_sink:
            held = torch.arange(seen + n, device=device)
        else:
            held = torch.cat([torch.arange(self.policy.k_sink, device=device),
                              torch.arange(self._window, seen + n, device=device)])
        self._peak = max(self._peak, self.cache.length + n)
        return Block(ids, self.cache, positions=positions, mask=self.policy.visible(positions, held), logits=logits)

    def _evict(self) -> None:
        """Drop the held positions no later query can see, once EVICT_EVERY of them have gathered."""
        first = self.policy.window_start(self.seen)
        drop = first - self._window
        if drop < self.EVICT_EVERY:
            return
        s, end = self.policy.k_sink, self.cache.length
        if isinstance(self.cache, QuantizedKVCache):  # its scales move with the entries
            self.cache.shift(s, end, drop)
        else:
            for store in (self.cache.k, self.cache.v):
                for t in store:
                    t[:, s : end - drop] = t[:, s + drop : end].clone()
        self.cache.crop(end - drop)
        self._window = first

    def steps(self, state: DecodeState, kmax: int) -> DraftSteps:
        if self.scored:
            round_, view = selected_steps(self._own, self.policy, kmax, self._view)
            round_.vocab = state.target.vocab_size
            self._count_read(view)
            return round_
        self._count_read(self.cache)
        # the first step catches up on every token the drafter has not processed (the pending one,
        # plus the verifier's correction or the last draft when all were accepted)
        return DraftSteps(self.draft_model(self.model), state.tokens[self.seen :], kmax, self._block,
                          vocab=state.target.vocab_size)

    def on_verified(self, state: DecodeState, n_accepted: int) -> None:
        # state.tokens now ends with the accepted drafts and the verifier's token; keep only the
        # drafter entries that lie on that sequence (they are the last ones, inside the window).
        valid = len(state.tokens) - 1
        if self.scored:  # run the new real tokens through the drafter; its policy sees their queries
            new = state.tokens[self.cache.length : valid]
            if new:
                self.draft_model(self.model).forward(new, self.cache, capture=self.policy.verify_capture(),
                                                    logits="none")
                self.policy.update(self._own, len(new) - 1)
            self._own.tokens = state.tokens
            self._peak = max(self._peak, self.cache.length)
            return
        if self.seen > valid:
            self.cache.crop(self.cache.length - (self.seen - valid))
        self._evict()

    def report(self) -> dict:
        return {"drafter_kv_tokens": self._peak, **(self.policy.report() if self.scored else {}), **self._reads()}

    def prepare(self, target: CausalLM) -> None:
        if self.model is not None:
            self.draft_model(self.model)

    def memory_bytes(self, n_layers: int, n_kv_heads: int, tokens: int) -> int:
        return self.policy.memory_bytes(n_layers, n_kv_heads, tokens) if self.scored else 0


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
        q = None if sampling.greedy else torch.nn.functional.one_hot(  # copied without making the host wait
            to_device_ids(out, state.target.device), vocab).float()
        return Proposal(out, q, [], steps=0, controlled=False)

    def report(self) -> dict[str, int]:
        return {"lookup_rounds": self.looked_up, "fallback_rounds": self.missed}
