"""Drafters: who proposes tokens. The seam is transformers' candidate-generator idea: `propose`
drafts from the current state, `on_verified` updates the drafter from the verification result.

A drafter subclasses `Drafter`; every hook does nothing by default, so the engine calls them all
unconditionally. A drafter that runs a model gives its round as `steps` (forward inputs), so the
engine runs the steps of every sequence in a batch together (`draft`); any other implements `propose`.
SelfDrafter: the target drafts for itself through a KV policy over its own (exact) cache.
ModelDrafter (decoding/model_drafters.py): a small model with its own cache, of the kind its
policy needs (whole, a window, or scored).
PromptLookup (not a drafter: an option of the engine, tried before the drafter each round) copies
what followed the latest earlier occurrence of the last n-gram.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from sparsespec.checks import SettingError
from sparsespec.clock import DeviceClock
from sparsespec.decoding.controllers import Controller
from sparsespec.decoding.sampling import Sampling, entropy
from sparsespec.kv.cache import KVCache
from sparsespec.kv.capture import Capture
from sparsespec.kv.footprint import Part, Sizing, refuse_memory_bytes
from sparsespec.kv.policies import FullKV, KVPolicy
from sparsespec.kv.quantized import DraftView, check_kv_format, view_bytes
from sparsespec.kv.quantized import format_label as kv_label
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
        here). Raises SettingError (its field, value and why) when the target cannot run a setting."""

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

    def memory(self, target: CausalLM, at: Sizing) -> list[Part]:
        """What this drafter allocates in the run `at` besides the target's own cache and passes,
        asked of a fresh drafter before the run (kv/footprint.py: the memory guard adds the parts
        up). A drafter that allocates returns its parts, e.g. `[Part("my buffer", nbytes)]`: held
        from drafter start on unless it says otherwise."""
        return []

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        refuse_memory_bytes(cls, "memory(target, at)")


def check_weight_format(weights: str, head_weights: str | None, weights_group: int,
                        activations: str = "auto") -> None:
    """The draft weight settings' values, before any model is known (WeightFormatError: the drafter's
    field, its value and why)."""
    if activations not in quantized.ACTIVATIONS:
        raise quantized.WeightFormatError("activations", activations, "is not allowed: the rows of the draft's "
                                          f"low-bit products are one of {', '.join(quantized.ACTIVATIONS)}")
    here = "cuda" if torch.cuda.is_available() else "cpu"
    for key, fmt in (("weights", weights), ("head_weights", head_weights)):
        if fmt is not None and fmt not in quantized.WEIGHT_FORMATS:
            raise quantized.WeightFormatError(key, fmt, "is not a draft weight format; the formats that work here "
                                              f"({here}): {', '.join(quantized.working_formats(here))}")
    if isinstance(weights_group, bool) or not isinstance(weights_group, int) or weights_group < 1:
        raise quantized.WeightFormatError("weights_group", weights_group,
                                          "is out of range: a positive number of weights per int4 group")


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

    def memory(self, target: CausalLM, at: Sizing) -> list[Part]:
        return self._copy_parts(target)

    def _copy_parts(self, model: CausalLM) -> list[Part]:
        """The copy of `model`'s linear layers in the draft weight formats (none in fp), made once
        before prefill and shared by every sequence of a batch."""
        if self.weights == "fp" and self.head_weights in (None, "fp"):
            return []
        return [Part("draft weights copy", quantized.copy_bytes(model, self.weights, self.head_weights,
                                                               self.weights_group), "prefill", per_sequence=False)]

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

    def memory(self, target: CausalLM, at: Sizing) -> list[Part]:
        # the target's cache holds tokens + 64 entries (the engine's allocation)
        return [*self._copy_parts(target), *self.policy.memory(target, at),
                *DraftView.memory(self.kv, target, self.policy, at, at.tokens + 64)]

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
            raise SettingError("ngram", self.ngram, "is out of range: an n-gram size >= 1")
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1):
            raise SettingError("k", self.k, "is out of range: a draft length >= 1, or null for the controller's")

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


def __getattr__(name: str) -> type:
    # the model drafters live in model_drafters.py (they import this module); their names still
    # import from here, as method files and scripts have written them
    if name in ("ModelDrafter", "FullCacheDrafter", "WindowDrafter", "ScoredDrafter"):
        from sparsespec.decoding import model_drafters

        return getattr(model_drafters, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
