"""A method is a config of parts: conf/method/<name>.yaml picks a drafter (`method/drafter`), its
KV policy (`method/drafter/policy`), a draft-length controller (`method/controller`) and prompt
lookup. Each part is a `_target_` node that Hydra instantiates afresh for every generation; the
shipped groups are generated from the parts' dataclasses (config.py), so their defaults live in the
class alone and every field can be set from the command line (`method.drafter.policy.ratio=0.05`).
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, fields
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from sparsespec.checks import SettingError
from sparsespec.decoding.controllers import Controller, FixedK
from sparsespec.decoding.drafters import Drafter, PromptLookup
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.kv.policies import KVPolicy


class MethodConfigError(ValueError):
    pass


@dataclass
class Method:
    name: str
    drafter: dict | None = None  # a Drafter's `_target_` node (None: AR, or prompt lookup alone)
    controller: dict | None = None  # a Controller's `_target_` node (None: FixedK's defaults)
    lookup: int = 0  # n-gram size of prompt lookup tried before the drafter each round (0: off)
    lookup_k: int | None = None  # most tokens one copy drafts (None: the controller's maximum)
    needs_trained_drafter: bool = False  # drafter.path defaults to the latest exported BudgetDraft drafter

    @classmethod
    def from_config(cls, node: Any) -> Method:
        """A composed conf/method node (or a plain dict) -> a checked Method. Raises MethodConfigError."""
        d = OmegaConf.to_container(node if OmegaConf.is_config(node) else OmegaConf.create(dict(node)), resolve=True)
        known = [f.name for f in fields(cls)]
        if "name" not in d:
            raise MethodConfigError("a method config needs a name (name: my_method)")
        for key in d:
            if key not in known:
                raise MethodConfigError(f"method {d['name']}: method.{key} is not a method key; a method has "
                                        f"{', '.join(known)} (a part's settings go under its node, e.g. "
                                        "method.drafter.policy.ratio)")
        method = cls(**d)
        method.build(None)  # every part that needs no model, so bad values fail before any model loads
        return method

    def as_dict(self) -> dict:
        """The method as its config: what results record and resume compares."""
        return asdict(self)

    def _build(self, key: str, base: type, **extra: Any) -> Any:
        node = self.as_dict()  # plain values: from_config resolved the interpolations
        for part in key.split("."):
            node = node[part]
        self._import(node, f"method.{key}")
        if key == "drafter" and node.get("policy") is not None:  # built first, so its errors name its key
            node = {k: v for k, v in node.items() if k != "policy"}
            extra["policy"] = self._build("drafter.policy", KVPolicy)
        try:  # objects are passed to the partial: instantiate would turn a dataclass back into a config
            part = instantiate({**node, "_partial_": True}, _convert_="all")(**extra)
        except Exception as e:  # instantiate wraps the part's own error: show that one, at its key
            while isinstance(e, InstantiationException) and e.__cause__ is not None:
                e = e.__cause__
            raise MethodConfigError(f"method {self.name}: {_at(e, f'method.{key}')}") from None
        if not isinstance(part, base):
            raise MethodConfigError(f"method {self.name}: method.{key}._target_ builds a {type(part).__name__}, "
                                    f"not a {base.__name__}: subclass {base.__module__}.{base.__name__}")
        return part

    def _import(self, node: Any, path: str) -> type | None:
        """The class of node's `_target_` after checking every `_target_` under node imports."""
        if not isinstance(node, dict):
            return None
        for k, v in node.items():
            if k != "_target_":
                self._import(v, f"{path}.{k}")
        if node.get("_target_") is None:
            return None
        module, _, name = str(node["_target_"]).rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except Exception as e:  # hydra's get_class would log a traceback first
            raise MethodConfigError(
                f"method {self.name}: {path}._target_={node['_target_']!r} cannot be imported ({type(e).__name__}: "
                f"{e}); check the module path, and that a module outside the package is on PYTHONPATH") from None

    @property
    def needs_drafter_model(self) -> bool:
        cls = self._import(self.drafter, "method.drafter")
        return bool(cls is not None and getattr(cls, "needs_model", False))

    @property
    def speculative(self) -> bool:
        return self.drafter is not None or self.lookup > 0

    def policy(self) -> KVPolicy | None:
        """A fresh instance of the drafter's KV policy (None when it has none)."""
        if self.drafter is None or self.drafter.get("policy") is None:
            return None
        return self._build("drafter.policy", KVPolicy)

    def build(self, target: Any, drafter_model: Any = None, prefill_chunk: int = 1024) -> SpeculativeEngine:
        """A fresh engine (fresh drafter, policy and controller state) for one generation."""
        if self.drafter is not None and self.needs_drafter_model:
            if drafter_model is None and target is not None:
                raise MethodConfigError(f"method {self.name} decodes with a drafter model: set drafter.path")
            drafter = self._build("drafter", Drafter, model=drafter_model, prefill_chunk=prefill_chunk)
        else:
            drafter = None if self.drafter is None else self._build("drafter", Drafter)
        if drafter is not None and target is not None:
            try:  # what the target's device and shapes allow (a draft weight format's kernel)
                drafter.prepare(target)
            except ValueError as e:
                raise MethodConfigError(f"method {self.name}: {_at(e, 'method.drafter')}") from None
        controller = FixedK() if self.controller is None else self._build("controller", Controller)
        self._check_lookup()
        prompt_lookup = PromptLookup(self.lookup, k=self.lookup_k) if self.lookup else None
        return SpeculativeEngine(target, drafter, controller, prefill_chunk, prompt_lookup=prompt_lookup)

    def _check_lookup(self) -> None:
        """The method's own prompt-lookup fields (PromptLookup's ngram and k), at their keys."""
        try:
            if isinstance(self.lookup, bool) or not isinstance(self.lookup, int) or self.lookup < 0:
                raise SettingError("method.lookup", self.lookup, "is out of range: an n-gram size >= 1, or 0 for "
                                   "no prompt lookup")
            k = self.lookup_k
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
                raise SettingError("method.lookup_k", k, "is out of range: a draft length >= 1, or null for the "
                                   "controller's")
        except SettingError as e:
            raise MethodConfigError(f"method {self.name}: {e}") from None


def _at(e: Exception, where: str) -> str:
    """A part's error at the key the user set (`where`: the part's node, e.g. method.drafter.policy).
    A SettingError carries the part's own field, so its key is `where` + that field; any other error
    is shown at the part's node."""
    if isinstance(e, SettingError):
        return str(e.at(where))
    return f"{where}: {e}"
