"""``load_samples`` and ``score``: one entry point for every benchmark, dispatched by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from sparsespec.data import infinitebench, longbench, longbench_v2, pg19, ruler, text
from sparsespec.data.base import DatasetError, Sample

LOADERS: dict[str, Callable[..., list[Sample]]] = {
    "text": text.load,
    "pg19": pg19.load,
    "longbench": longbench.load,
    "longbench_v2": longbench_v2.load,
    "infinitebench": infinitebench.load,
    "ruler": ruler.load,
}
SCORERS: dict[str, Callable[[Sample, str], float | None]] = {
    "longbench": longbench.score,
    "longbench_v2": longbench_v2.score,
    "infinitebench": infinitebench.score,
    "ruler": ruler.score,
}
_COMMON = ("tokenizer", "ctx", "path", "task", "limit", "split", "seed", "use_chat_template")


def loader_options(name: str) -> list[str]:
    """The extra ``**options`` a loader accepts (beyond the common arguments)."""
    params = inspect.signature(LOADERS[name]).parameters
    return [p for p in params if p not in _COMMON]


def load_samples(
    name: str,
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
    """Samples of benchmark ``name`` with prompts tokenized and fitted to ``ctx`` tokens.

    ``options`` are the loader's own settings (e.g. ``offset`` for pg19, ``depth`` for ruler); an
    option the loader does not know is an error naming the ones it does.
    """
    if name not in LOADERS:
        raise DatasetError(f"unknown dataset {name!r}; known datasets: {', '.join(LOADERS)}")
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx <= 0:
        raise DatasetError(f"ctx must be a positive number of tokens, got {ctx!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise DatasetError(f"limit must be a positive number of samples or None, got {limit!r}")
    known = loader_options(name)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise DatasetError(
            f"dataset={name} has no option {unknown[0]!r}; its options are: {', '.join(known) or 'none'}"
        )
    samples = LOADERS[name](
        tokenizer, int(ctx), path=None if path is None else str(path), task=task, limit=limit, split=split,
        seed=int(seed), use_chat_template=bool(use_chat_template), **options,
    )
    for s in samples:
        # A loader bug here would silently overrun the model's context: fail loudly instead.
        if len(s.prompt_ids) > ctx:
            raise AssertionError(f"{s.sample_id}: {len(s.prompt_ids)} prompt tokens > ctx={ctx}")
    return samples[:limit] if limit is not None else samples


def score(sample: Sample, prediction: str) -> float | None:
    """The task metric of ``prediction`` for ``sample`` (in [0, 1]); None when it has no answers."""
    if not sample.answers:
        return None
    scorer = SCORERS.get(sample.dataset)
    if scorer is None:
        raise DatasetError(f"dataset {sample.dataset!r} has no metric, but sample {sample.sample_id} has answers")
    return scorer(sample, prediction)
