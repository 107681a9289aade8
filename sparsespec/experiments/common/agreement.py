"""How often a drafter's greedy token is the target's, teacher-forced (no decoding loop): on held-out
book text per KV budget (the paper's Figure 1, with τ@k for the draft length), and on the target's
own greedy continuation beside prompt lookup (the budgetdraft study), and the held-out windows the
studies score.

A drafter reads a window through the inference path: CausalLM.prefill under its view's mask,
chunked, then one forward over the scored positions under view.mask, as ModelDrafter does.
"""

from __future__ import annotations

import functools
import glob
from pathlib import Path

import torch

from sparsespec.config import load_method
from sparsespec.data import load_samples
from sparsespec.data.base import Sample
from sparsespec.experiments import ExperimentError
from sparsespec.kv.policies import FullKV, KVPolicy
from sparsespec.models.loading import load_model
from sparsespec.models.runner import CausalLM
from sparsespec.training.drafters import truncated


@functools.cache
def view_for(budget: int | None) -> KVPolicy:
    """The budgetdraft method's own policy (conf/method/budgetdraft.yaml) at another budget."""
    if budget is None:
        return FullKV()
    return load_method("budgetdraft", [f"method.drafter.policy.budget={budget}"]).policy()


def parse_groups(specs: list[str]) -> dict[str, list[str]]:
    """LABEL=PATTERN[,PATTERN...] (or `untrained`) -> {label: [dirs]}, globs expanded and sorted."""
    groups: dict[str, list[str]] = {}
    for spec in specs:
        if spec == "untrained":
            groups["untrained"] = ["untrained"]
            continue
        if "=" not in spec:
            raise ExperimentError(f"drafter group {spec!r}: use LABEL=DIR[,DIR...] (globs allowed) or `untrained`")
        label, patterns = spec.split("=", 1)
        dirs: list[str] = []
        for pat in patterns.split(","):
            hits = sorted(glob.glob(pat)) if any(c in pat for c in "*?[") else [pat]
            dirs += [h for h in hits if Path(h).is_dir()]
        if not dirs:
            raise ExperimentError(f"drafter group {label!r}: no directory matches {patterns!r}")
        groups[label] = dirs
    return groups


def load_models(model_path: str | None, n_layers: int, groups: dict[str, list[str]], ctx: int):
    """The target and every group's drafters (`untrained`: the target's first `n_layers` layers),
    loaded for `ctx` positions (YaRN past 8k)."""
    tgt = load_model(model_path, ctx=ctx)
    models = {label: [truncated(tgt.model, n_layers).eval() if d == "untrained" else load_model(d, ctx=ctx).model
                      for d in dirs] for label, dirs in groups.items()}
    return tgt, models


def held_out_samples(tokenizer, ctx: int, n_books: int, data: str | None, offset: float = 0.02) -> list[Sample]:
    """`ctx`-token windows of the books held out from drafter training, as evaluate.py cuts them
    (dataset=pg19 dataset.split=eval), so no drafter is scored on text it was trained on."""
    samples = load_samples("pg19", tokenizer, ctx, path=data, limit=n_books, split="eval", offset=offset)
    if not samples:
        raise ExperimentError(f"no held-out book has {ctx} tokens after the {offset:.0%} offset")
    return samples


def book_title(sample: Sample) -> str:
    """The book's title, as the tables name a prompt."""
    return sample.sample_id.split("/", 1)[-1]


def held_out_windows(tokenizer, ctx: int, n_books: int, data: str | None) -> list[tuple[str, list[int]]]:
    """(title, ids) of each held-out window (held_out_samples)."""
    return [(book_title(s), s.prompt_ids) for s in held_out_samples(tokenizer, ctx, n_books, data)]


@torch.inference_mode()
def greedy_on_spans(model, prefix: list[int], spans: list[list[int]], view: KVPolicy) -> list[torch.Tensor]:
    """The model's argmax at every position of each span, each read after the same `prefix`, its KV
    computed under `view` (the ModelDrafter path: the prefix in chunks under the view's visibility,
    then the span; FullKV: plain causal). The prefix is read once for all spans."""
    return [logits.argmax(-1) for logits in span_logits(model, prefix, spans, view)]


def reach(view: KVPolicy, n_layers: int, position: int) -> int:
    """The oldest non-sink position that can still affect a query at `position` or later through
    `n_layers` layers of a windowed view (each layer sees back to `view.window_start`)."""
    for _ in range(n_layers):
        position = max(view.window_start(position), 0)
    return position


def span_logits(model, prefix: list[int], spans: list[list[int]], view: KVPolicy) -> list[torch.Tensor]:
    """float32 logits [len(span), V] of each span after `prefix` (greedy_on_spans). Under a streaming
    view only the sinks and the prefix's last `reach` tokens can affect the spans, so only they are
    read, at their true positions: the same logits as the whole prefix, at a cost flat in its length."""
    lm = CausalLM(model)
    n = len(prefix)
    first = reach(view, lm.n_layers, n)
    held = torch.arange(n) if first <= view.k_sink else torch.cat([torch.arange(view.k_sink), torch.arange(first, n)])
    ids, held = torch.tensor(prefix)[held], held.to(lm.device)
    cache = lm.new_cache(len(held) + max(map(len, spans)))
    for start in range(0, len(held), 1024):
        pos = held[start : start + 1024]
        lm.forward(ids[start : start + 1024], cache, positions=pos, mask=view.visible(pos, held[: start + len(pos)]),
                   logits="none")
    base, out = cache.length, []
    for span in spans:
        pos = torch.arange(n, n + len(span), device=lm.device)
        out.append(lm.forward(torch.tensor(span), cache, positions=pos, mask=view.visible(pos, torch.cat([held, pos]))))
        cache.crop(base)
    return out


def target_greedy(target, ids: list[int], positions: int) -> torch.Tensor:
    """The target's greedy token at each of the last `positions` positions (full attention)."""
    return drafter_greedy(target, ids, positions, FullKV())


def drafter_greedy(model, ids: list[int], positions: int, view: KVPolicy) -> torch.Tensor:
    """The drafter's argmax at the last `positions` positions, its KV computed under `view`."""
    return greedy_on_spans(model, ids[:-positions], [ids[-positions:]], view)[0]
