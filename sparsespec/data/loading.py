"""``load_samples`` and ``score``: one entry point for every benchmark, the package's and a user's.

A dataset is its loader: a function ``load(tokenizer, ctx, *, path=None, task=None, limit=None,
split="test", seed=0, use_chat_template=True, **its own options) -> list[Sample]``, named by a
config's ``_target_`` (conf/dataset/pg19.yaml: ``_target_: sparsespec.data.pg19.load``). A loader
takes only the common arguments it declares, so the smallest is ``load(tokenizer, ctx, *, path=None,
limit=None)``. A ``score(sample, prediction)`` function in the loader's module is the dataset's
metric. The package's own loaders can be named by their module alone (``load_samples("pg19", ...)``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any

from sparsespec.data.base import DatasetError, Sample

Loader = Callable[..., list[Sample]]
Scorer = Callable[[Sample, str], "float | None"]
COMMON = ("path", "task", "limit", "split", "seed", "use_chat_template")  # what the run passes every loader
PACKAGE = "sparsespec.data"


@functools.cache
def built_in() -> list[str]:
    """The package's datasets: its modules that define ``load``."""
    pkg = importlib.import_module(PACKAGE)
    names = [m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.ispkg]
    return [n for n in names if callable(getattr(importlib.import_module(f"{PACKAGE}.{n}"), "load", None))]


def resolve_loader(target: str | Loader) -> Loader:
    """The loader a ``_target_`` names: a dotted path (``my_data.load``), the name of one of the
    package's datasets (``pg19``), or the function itself. Raises DatasetError."""
    if callable(target):
        return target
    name = str(target)
    if "." not in name:
        if name not in built_in():
            raise DatasetError(f"unknown dataset {name!r}; known datasets: {', '.join(built_in())} (a dataset of your "
                               "own is a config whose _target_ names its loader, e.g. _target_: my_data.load)")
        name = f"{PACKAGE}.{name}.load"
    module, _, attr = name.rpartition(".")
    try:
        loader = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise DatasetError(f"dataset._target_={name!r} cannot be imported ({type(e).__name__}: {e}); check the module "
                           "path, and that a module outside the package is on PYTHONPATH") from None
    if not callable(loader):
        raise DatasetError(f"dataset._target_={name!r} is not a function: name a loader, e.g. my_data.load")
    return loader


def _params(loader: Loader) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(loader).parameters)


def loader_options(target: str | Loader) -> list[str]:
    """The loader's own ``**options`` (its keyword arguments beyond tokenizer, ctx and COMMON)."""
    params = list(_params(resolve_loader(target)).values())[2:]  # after tokenizer and ctx
    return [p.name for p in params if p.name not in COMMON and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def scorer(target: str | Loader) -> Scorer | None:
    """The dataset's metric: ``score`` beside its loader, None when it has none."""
    fn = getattr(inspect.getmodule(resolve_loader(target)), "score", None)
    return fn if callable(fn) else None


def load_samples(
    target: str | Loader,
    tokenizer: Any,
    ctx: int,
    path: str | None = None,
    task: str | None = None,
    limit: int | None = None,
    split: str = "test",
    seed: int = 0,
    use_chat_template: bool = True,
    **options: Any,
) -> list[Sample]:
    """Samples of the dataset ``target`` names, prompts tokenized and fitted to ``ctx`` tokens.

    ``options`` are the loader's own settings (``offset`` for pg19, ``depth`` for ruler); one the
    loader does not know is an error naming the ones it does. Of the common arguments a loader
    gets those it declares (a set ``path`` or ``task`` it does not declare is an error).
    """
    loader = resolve_loader(target)
    label = target if isinstance(target, str) else f"{loader.__module__}.{loader.__qualname__}"
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx <= 0:
        raise DatasetError(f"ctx must be a positive number of tokens, got {ctx!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise DatasetError(f"limit must be a positive number of samples or None, got {limit!r}")
    known = loader_options(loader)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise DatasetError(f"dataset={label} has no option {unknown[0]!r}; its options are: {', '.join(known) or 'none'}")
    params = _params(loader)
    common = {"path": None if path is None else str(path), "task": task, "limit": limit, "split": split,
              "seed": int(seed), "use_chat_template": bool(use_chat_template)}
    for key in ("path", "task"):  # a setting the loader would silently ignore
        if common[key] is not None and key not in params:
            raise DatasetError(f"dataset.{key}={common[key]}: dataset={label} takes no {key}")
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    samples = loader(tokenizer, int(ctx), **{k: v for k, v in common.items() if takes_all or k in params}, **options)
    for s in samples:
        if not isinstance(s, Sample):
            raise DatasetError(f"dataset={label}: the loader returned a {type(s).__name__}, not a "
                               "sparsespec.data.Sample")
        # A loader bug here would silently overrun the model's context: fail loudly instead.
        if len(s.prompt_ids) > ctx:
            raise DatasetError(f"dataset={label}: sample {s.sample_id} has {len(s.prompt_ids)} prompt tokens, more "
                               f"than ctx={ctx}; a loader fits each prompt to ctx (sparsespec.data.prompts.fit_text)")
    return samples[:limit] if limit is not None else samples


def score(sample: Sample, prediction: str, metric: Scorer | None = None) -> float | None:
    """The task metric of ``prediction`` for ``sample`` (in [0, 1]); None when it has no answers.
    ``metric``: the dataset's (``scorer(target)``); by default the package's dataset of that name."""
    if not sample.answers:
        return None
    if metric is None and sample.dataset in built_in():
        metric = scorer(sample.dataset)
    if metric is None:
        raise DatasetError(f"dataset {sample.dataset!r} has no metric, but sample {sample.sample_id} has answers: "
                           "define score(sample, prediction) beside its loader")
    return metric(sample, prediction)
