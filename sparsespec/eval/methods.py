"""A method is a config that composes the engine's parts (docs/architecture.md's method table).

conf/method/<name>.yaml instantiates `Method` (flat keys, so `method.k=8` or `method.ratio=0.05`
mean the same for every method that has them); `build` wires drafter, KV view and controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from sparsespec.decoding.controllers import EntropyController, FixedK
from sparsespec.decoding.drafters import LookupDrafter, ModelDrafter, SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.recall import RecallIndex
from sparsespec.kv.views import FullView, KVView, StreamingView
from sparsespec.models.runner import CausalLM

DRAFTERS = ("none", "self", "model", "lookup")
VIEWS = ("full", "streaming", "snapkv", "recall")
CONTROLLERS = ("fixed", "entropy")


class MethodConfigError(ValueError):
    pass


@dataclass
class MethodConfig:
    """The schema of conf/method/*.yaml: every key a sweep may set exists, with its type."""

    _target_: str = "sparsespec.eval.methods.Method"
    name: str = MISSING
    drafter: str = "none"  # none (AR) | self (target drafts for itself) | model (small drafter) | lookup
    lookup: int = 0  # n-gram size of prompt lookup tried before the drafter each round (0: off); copies <= k
    view: str = "full"  # which cached positions the drafter attends to
    controller: str = "fixed"
    k: int = 4  # fixed draft length
    budget: int | None = None  # view size in tokens per KV head ...
    ratio: float | None = None  # ... or as a share of the context
    k_sink: int = 16
    k_recent: int | None = None
    window: int = 16  # recall index: verification queries that score the history
    refresh_every: int = 1  # recall index: verification rounds per refresh (1: every round, the paper)
    candidates: list[int] = field(default_factory=lambda: [4, 8, 12, 16, 20])
    beta: float = 0.9
    h_acc_init: float = 0.5
    h_rej_init: float = 3.0
    gamma_init: float = 0.2
    needs_trained_drafter: bool = False  # budgetdraft: default to the latest exported drafter


@dataclass
class Method(MethodConfig):
    """A validated method, built from its config by hydra.utils.instantiate."""

    def __post_init__(self) -> None:
        for key, value, allowed in (("drafter", self.drafter, DRAFTERS), ("view", self.view, VIEWS),
                                    ("controller", self.controller, CONTROLLERS)):
            if value not in allowed:
                raise MethodConfigError(f"method.{key}={value!r} is not one of {', '.join(allowed)}")
        self._check_ranges()
        if self.drafter != "none":
            self.make_view()  # validates budget / ratio / k_sink / k_recent together
            self.make_controller()
        if self.view in ("snapkv", "recall") and self.drafter == "model":
            raise MethodConfigError(
                f"method.view={self.view} scores the target's verification attention; it works with "
                "method.drafter=self. Small-model drafters take view=streaming or full."
            )

    def _check_ranges(self) -> None:
        """Every numeric key, whichever parts this method uses (a sweep sets them for all methods)."""

        def bad(key: str, allowed: str) -> MethodConfigError:
            return MethodConfigError(f"method.{key}={getattr(self, key)!r} is out of range: allowed {allowed}")

        def is_num(v) -> bool:
            return isinstance(v, int | float) and not isinstance(v, bool) and v == v  # not nan

        for key in ("k", "window", "refresh_every", "k_sink", "lookup") + (("budget",) if self.budget is not None else ()) + (
                ("k_recent",) if self.k_recent is not None else ()):
            if not isinstance(getattr(self, key), int) or isinstance(getattr(self, key), bool):
                raise MethodConfigError(f"method.{key}={getattr(self, key)!r} has the wrong type: expected an integer")
        if self.k <= 0:
            raise bad("k", "a positive draft length (>= 1)")
        if self.lookup < 0 or (self.drafter == "lookup" and self.lookup < 1):
            raise bad("lookup", "an n-gram size >= 1 for drafter=lookup, else >= 0 (0: no lookup)")
        if self.window <= 0:
            raise bad("window", "a positive number of verification queries (>= 1)")
        if self.refresh_every <= 0:
            raise bad("refresh_every", "a positive number of verification rounds (>= 1)")
        if self.k_sink < 0:
            raise bad("k_sink", "values >= 0")
        if self.k_recent is not None and self.k_recent < 0:
            raise bad("k_recent", "values >= 0 (or null)")
        if self.ratio is not None and not (is_num(self.ratio) and 0 < self.ratio <= 1):
            raise bad("ratio", "(0, 1]: the share of the context the view keeps (or null with method.budget)")
        if self.budget is not None:
            floor = self.k_sink + (self.k_recent or 0)
            if self.budget <= 0 or self.budget < floor:
                raise bad("budget", f"a number of tokens >= k_sink + k_recent = {floor} (or null with method.ratio)")
        if not self.candidates or any(not isinstance(c, int) or isinstance(c, bool) or c <= 0
                                      for c in self.candidates):
            raise bad("candidates", "a non-empty list of positive draft lengths")
        if not (is_num(self.beta) and 0 <= self.beta < 1):
            raise bad("beta", "[0, 1)")
        for key in ("h_acc_init", "h_rej_init"):
            if not (is_num(getattr(self, key)) and getattr(self, key) >= 0):
                raise bad(key, "an entropy in nats >= 0")
        if not (is_num(self.gamma_init) and self.gamma_init > 0):
            raise bad("gamma_init", "a cost ratio > 0")

    @property
    def speculative(self) -> bool:
        return self.drafter != "none"

    def make_view(self) -> KVView:
        sizes = {"budget": self.budget, "ratio": None if self.budget is not None else self.ratio}
        try:
            if self.view == "full":
                return FullView()
            if self.view == "streaming":
                return StreamingView(**sizes, k_sink=self.k_sink, k_recent=self.k_recent)
            return RecallIndex(**sizes, k_sink=self.k_sink, k_recent=self.k_recent if self.k_recent is not None else 64,
                               window=self.window, refresh=self.view == "recall", refresh_every=self.refresh_every)
        except ValueError as e:
            raise MethodConfigError(str(e)) from e

    def make_controller(self):
        try:
            if self.controller == "fixed":
                return FixedK(int(self.k))
            return EntropyController(tuple(self.candidates), self.beta, self.h_acc_init, self.h_rej_init,
                                     self.gamma_init)
        except ValueError as e:
            raise MethodConfigError(str(e)) from e

    def build(self, target: CausalLM, drafter_model: CausalLM | None = None, prefill_chunk: int = 1024
              ) -> SpeculativeEngine:
        """A fresh engine (fresh controller and view state) for one generation."""
        if self.drafter == "none":
            return SpeculativeEngine(target, None, FixedK(1), prefill_chunk)
        if self.drafter == "lookup":
            drafter = None
        elif self.drafter == "self":
            drafter = SelfDrafter(self.make_view())
        else:
            if drafter_model is None:
                raise MethodConfigError(f"method {self.name} needs a drafter model: pass drafter.path=DIR")
            drafter = ModelDrafter(drafter_model, self.make_view(), prefill_chunk)
        if self.lookup:
            drafter = LookupDrafter(self.lookup, fallback=drafter, k=self.k)  # copies up to method.k tokens
        return SpeculativeEngine(target, drafter, self.make_controller(), prefill_chunk)
