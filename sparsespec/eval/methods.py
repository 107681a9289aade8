"""A method is a config of parts: conf/method/<name>.yaml names a drafter (with its KV policy), a
length controller (the `method/controller` group: fixed or entropy) and prompt lookup, each part a
`_target_` node that Hydra instantiates afresh for every generation.

The top of a method file may hold short keys (`ratio: 0.10`) that its parts read by interpolation
(`ratio: ${...ratio}`), so `method.ratio=0.05` works on the command line and in sweeps; they exist
only in the methods that declare them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from sparsespec.decoding.controllers import Controller, FixedK
from sparsespec.decoding.drafters import Drafter, PromptLookup
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.policies import KVPolicy
from sparsespec.models.runner import CausalLM


class MethodConfigError(ValueError):
    pass


def _cause(e: BaseException) -> BaseException:
    while isinstance(e, InstantiationException) and e.__cause__ is not None:
        e = e.__cause__
    return e


@dataclass
class Method:
    name: str
    drafter: dict | None = None  # a Drafter's `_target_` node (None: AR, or prompt lookup alone)
    controller: dict | None = None  # a Controller's `_target_` node (None: FixedK's defaults)
    lookup: int = 0  # n-gram size of prompt lookup tried before the drafter each round (0: off)
    lookup_k: int | None = None  # most tokens one copy drafts (None: the controller's maximum)
    needs_trained_drafter: bool = False  # drafter.path defaults to the latest exported BudgetDraft drafter
    knobs: dict = field(default_factory=dict)  # the file's short keys, read by its parts

    @classmethod
    def from_config(cls, node: Any) -> Method:
        """A composed conf/method node (or a plain dict) -> a checked Method. Raises MethodConfigError."""
        d = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else dict(node)
        known = {f.name for f in fields(cls)} - {"knobs"}
        if "name" not in d:
            raise MethodConfigError("a method config needs a name (name: my_method)")
        method = cls(**{k: d.pop(k) for k in list(d) if k in known}, knobs=d)
        method.check()
        return method

    def as_dict(self) -> dict:
        """The method as its config (interpolations unresolved): what results record and resume compares."""
        return {"name": self.name, "drafter": self.drafter, "controller": self.controller, "lookup": self.lookup,
                "lookup_k": self.lookup_k, "needs_trained_drafter": self.needs_trained_drafter, **self.knobs}

    # -- the parts ----------------------------------------------------------------------------
    def _build(self, key: str, base: type, **extra: Any) -> Any:
        node = OmegaConf.select(OmegaConf.create(self.as_dict()), key)  # interpolations: the method's keys
        self._check_targets(node, f"method.{key}")
        try:
            part = instantiate(node, _convert_="all", **extra)
        except Exception as e:  # instantiate wraps the part's own error; show that one
            cause = str(_cause(e))
            raise MethodConfigError(f"method {self.name}: {self._where(key, cause)}: {cause}") from None
        if not isinstance(part, base):
            raise MethodConfigError(f"method {self.name}: method.{key}._target_ builds a {type(part).__name__}, "
                                    f"not a {base.__name__}: subclass sparsespec.{base.__module__.split('.', 1)[1]}"
                                    f".{base.__name__}")
        return part

    def _where(self, key: str, message: str) -> str:
        """The keys a user set: `method.ratio=1.5` when the part's failing field reads that short key."""
        node = OmegaConf.select(OmegaConf.create(self.as_dict()), key)
        found = []
        if OmegaConf.is_dict(node):
            for field_name, value in node.items_ex(resolve=False):
                knob = str(value).strip("${}").lstrip(".")
                if str(value).startswith("${") and knob in self.knobs and f"{field_name}=" in message:
                    found.append(f"method.{knob}={self.knobs[knob]!r}")
        return f"{', '.join(found)} (method.{key})" if found else f"method.{key}"

    def _check_targets(self, node: Any, path: str) -> None:
        """Every `_target_` under node imports (one clear line instead of Hydra's traceback)."""
        if not OmegaConf.is_dict(node):
            return
        target = node.get("_target_")
        if target is not None:
            try:
                get_class(str(target))
            except Exception as e:
                first = str(_cause(e)).strip().splitlines()[-1]
                raise MethodConfigError(
                    f"method {self.name}: {path}._target_={target!r} cannot be imported ({first}); check the "
                    "module path, and that a module outside the package is on PYTHONPATH") from None
        for k, v in node.items_ex(resolve=False):
            if k != "_target_":
                self._check_targets(v, f"{path}.{k}")

    def _drafter_class(self) -> type | None:
        if self.drafter is None:
            return None
        target = self.drafter.get("_target_") if isinstance(self.drafter, dict) else None
        if not target:
            raise MethodConfigError(f"method {self.name}: method.drafter needs a _target_ (a Drafter class)")
        self._check_targets(OmegaConf.create(self.drafter), "method.drafter")
        cls = get_class(target)
        if not (isinstance(cls, type) and issubclass(cls, Drafter)):
            raise MethodConfigError(f"method {self.name}: method.drafter._target_={target!r} is not a "
                                    "sparsespec.decoding.drafters.Drafter")
        return cls

    @property
    def needs_drafter_model(self) -> bool:
        cls = self._drafter_class()
        return bool(cls and cls.needs_model)

    @property
    def speculative(self) -> bool:
        return self.drafter is not None or self.lookup > 0

    def policy(self) -> KVPolicy | None:
        """A fresh instance of the drafter's KV policy (None when it has none)."""
        if not isinstance(self.drafter, dict) or self.drafter.get("policy") is None:
            return None
        return self._build("drafter.policy", KVPolicy)

    def make_controller(self) -> Controller:
        if self.controller is None:
            return FixedK()
        return self._build("controller", Controller)

    def make_lookup(self) -> PromptLookup | None:
        if not self.lookup:
            return None
        try:
            return PromptLookup(self.lookup, k=self.lookup_k)
        except ValueError as e:
            raise MethodConfigError(f"method {self.name}: method.lookup: {e}") from None

    def check(self) -> None:
        """Build every part that needs no model once, so bad values fail before any model loads."""
        if not isinstance(self.lookup, int) or isinstance(self.lookup, bool) or self.lookup < 0:
            raise MethodConfigError(f"method {self.name}: method.lookup={self.lookup!r} is out of range: an "
                                    "n-gram size >= 1, or 0 for no prompt lookup")
        self.make_lookup()
        self._drafter_class()
        self.make_controller()
        policy = self.policy()
        if policy is not None and self.needs_drafter_model and not policy.position_only:
            raise MethodConfigError(
                f"method {self.name}: {type(policy).__name__} scores the target's verification attention; it "
                "works with SelfDrafter. A small-model drafter takes StreamingKV or FullKV.")

    def memory_bytes(self, target: CausalLM, tokens: int) -> int:
        """Bytes the method's parts allocate beyond the caches at a context of `tokens`."""
        policy = self.policy()
        return policy.memory_bytes(target.n_layers, target.n_kv_heads, tokens) if policy else 0

    def build(self, target: CausalLM, drafter_model: CausalLM | None = None, prefill_chunk: int = 1024
              ) -> SpeculativeEngine:
        """A fresh engine (fresh controller and policy state) for one generation."""
        drafter = None
        if self.drafter is not None:
            if self.needs_drafter_model:
                if drafter_model is None:
                    raise MethodConfigError(f"method {self.name} decodes with a drafter model: set drafter.path")
                drafter = self._build("drafter", Drafter, model=drafter_model, prefill_chunk=prefill_chunk)
            else:
                drafter = self._build("drafter", Drafter)
        return SpeculativeEngine(target, drafter, self.make_controller(), prefill_chunk, lookup=self.make_lookup())
