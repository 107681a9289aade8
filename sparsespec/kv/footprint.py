"""What a part of a method allocates, as the part itself declares it.

Every part that allocates per run (a drafter, its KV policy, the view it drafts from) answers
`memory(model, at) -> list[Part]` next to the code that allocates: each `Part` is some bytes that
exist from a phase of the generation on, either held until the run ends (or until `until`) or
transient within one step of that phase. The memory guard (sparsespec.eval.memory) only adds the
parts up, per phase, with the target's own cache and forward transients. A part that allocates
nothing declares nothing: the base classes answer `[]`.

A generation runs in three phases (`PHASES`): the target's prefill, the start of its drafter (after
prefill, before the first round: a recall index is seeded, a drafter model prefills its own cache)
and decoding. `Sizing` is the run a part is asked about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sparsespec.kv.capture import Capture
from sparsespec.kv.quantized import entry_bytes

PHASES = ("prefill", "drafter start", "decode")
F32 = 4  # bytes of a float32: LSEs, attention probabilities and index rows are float32



def refuse_memory_bytes(cls: type, hook: str) -> None:
    """A part class that still defines the old `memory_bytes(n_layers, n_kv_heads, tokens)`: say it is
    now `hook` (called by the base classes' __init_subclass__)."""
    if "memory_bytes" in vars(cls):
        raise TypeError(f"{cls.__name__}.memory_bytes(n_layers, n_kv_heads, tokens) is now {hook} -> list[Part] "
                        "(sparsespec.kv.footprint): rename it and return [Part(name, nbytes)]")


@dataclass(frozen=True)
class Part:
    """Bytes one part of a run allocates from `phase` on: held until the run ends (or through the
    phase `until`), or transient, within one step of `phase`."""

    name: str
    nbytes: int
    phase: str = "drafter start"  # one of PHASES
    held: bool = True
    largest: int = 0  # a transient's largest single tensor (the host allocator keeps some of it)
    per_sequence: bool = True  # a batch of B sequences holds B of it (a decode step's transient: B times the rows)
    until: str | None = None  # a held part freed after this phase (None: held to the end)

    def __post_init__(self) -> None:
        for key in ("phase", "until"):
            value = getattr(self, key)
            if value is not None and value not in PHASES:
                raise ValueError(f"Part {self.name!r}: {key}={value!r}: one of {', '.join(PHASES)}")

    def alive(self, phase: str) -> bool:
        """Whether a held part exists during `phase`."""
        i = PHASES.index(phase)
        return self.held and PHASES.index(self.phase) <= i and (self.until is None or i <= PHASES.index(self.until))


@dataclass(frozen=True)
class Sizing:
    """The run a part is asked about: a context of `tokens` (prompt + generated), `new_tokens` of them
    generated (None: unknown, so every growth is assumed), a prompt prefilled `chunk` tokens at a
    time, rounds of at most `kmax` draft tokens. `prefill_phase`: the phase in which the model a
    policy views is prefilled (the target's prefill; a drafter model's own at drafter start)."""

    tokens: int
    new_tokens: int | None = None
    chunk: int = 1024
    kmax: int = 0
    prefill_phase: str = "prefill"

    @property
    def prompt(self) -> int:
        return self.tokens - (self.new_tokens or 0)


class Shape(Protocol):
    """What sizing reads of a model (a CausalLM has it)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype


def kv_bytes(model: Shape | Any, tokens: int, fmt: str = "fp") -> int:
    """A KV cache of `tokens` entries for `model` (keys and values, every layer), in the model's
    dtype, or in a draft KV format `fmt` (bf16, int8 with its scales: kv/quantized.py)."""
    return entry_bytes(fmt, model.n_layers, model.n_kv_heads, model.head_dim, model.dtype) * tokens


def capture_parts(model: Shape | Any, capture: Capture, at: Sizing) -> list[Part]:
    """What a prefill capture costs (kv/capture.py). The last prompt chunk's queries and LSEs are kept
    for every layer until the policy reads them at drafter start (a view keeps its chunk's whole
    rotated q/k tensor alive); then, layer by layer, turned into probabilities over the keys
    (attention_mass): q k^T for c queries, [Hq, c, T] float32 (plus the product in the model dtype
    when that is not float32), their sum per KV group [Hkv, c, T], while the previous layer's sum and
    the rows it replaces in the index (both [c, Hkv, T]) still exist. One sequence at a time."""
    e = torch.empty((), dtype=model.dtype).element_size()
    n = min(at.chunk, at.tokens)
    c = min(capture.last, n)
    kept = model.n_layers * ((model.n_heads + model.n_kv_heads) * n * model.head_dim * e + model.n_heads * n * F32)
    scores = model.n_heads * c * at.tokens * (F32 + (e if e != F32 else 0)) + 3 * model.n_kv_heads * c * at.tokens * F32
    return [Part("prefill capture", kept, at.prefill_phase, until="drafter start", per_sequence=False),
            Part("capture to probabilities", scores, "drafter start", False, model.n_heads * c * at.tokens * F32)]
