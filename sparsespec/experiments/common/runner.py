"""The studies' one runner: prefill a prompt once (the harness' SharedPrefill: all but its tail),
build a method, decode from that cache, crop it back, and make the run a row. Every run reuses the
prefill, so a run times its decoding alone: decode tok/s = (new_tokens - 1) / wall_s."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

from sparsespec.experiments import ExperimentError
from sparsespec.kv.cache import KVCache
from sparsespec.models.runner import CausalLM

if TYPE_CHECKING:  # eval.methods needs Hydra; the GPU check runs these on machines without it
    from sparsespec.decoding.engine import GenerationResult, SpeculativeEngine
    from sparsespec.eval.methods import Method

# per-run numbers a bench row averages over its timed runs (None where a method has none)
RUN_STATS = ("acceptance", "tau", "gamma", "k_mean", "index_share", "draft_ms", "verify_ms", "index_ms", "other_ms")


# A spec part that runs the method with PyTorch's attention instead of the CPU kernel (before/after)
PYTORCH_ATTENTION = "attention=pytorch"


def our_method(spec: str) -> Method:
    """'sparsespec_l:controller=fixed:k=8' -> conf/method/sparsespec_l.yaml with the fixed controller at
    k = 8 (`candidates=[1,2,4]`: the entropy controller's lengths); `weights=int8`, `head_weights=`,
    `activations=`, `kv=`: the draft's formats; `attention=pytorch`: run_ours turns the CPU attention kernel off for
    it; other `key=value` parts set the drafter's KV policy
    (`method.drafter.policy.ratio`, ...)."""
    name, *over = spec.split(":")
    overrides = []
    for o in over:
        if o == PYTORCH_ATTENTION:
            continue
        key, _, value = o.partition("=")
        overrides.append({"controller": f"method/controller={value}", "k": f"method.controller.k={value}",
                          "candidates": f"method.controller.candidates={value}",
                          "weights": f"method.drafter.weights={value}", "head_weights": f"method.drafter.head_weights={value}",
                          "activations": f"method.drafter.activations={value}", "kv": f"method.drafter.kv={value}"}.get(key, f"method.drafter.policy.{o}"))
    from sparsespec.config import load_method

    method = load_method(name, overrides)
    method.name = spec
    return method


def prefill_once(target: CausalLM, sample, new_tokens: int, chunk: int = 1024,
                 progress: bool = True) -> tuple[KVCache, float]:
    """The harness' shared prefill (all but the prompt's tail) of `sample` (a Sample, or a prompt's
    token ids), reused by every run on this prompt: (cache, seconds)."""
    import torch
    from tqdm.auto import tqdm

    from sparsespec.data.base import Sample
    from sparsespec.eval.prefill import SharedPrefill

    if not isinstance(sample, Sample):
        sample = Sample("prompt", "prompt", None, list(sample), None, None)
    with tqdm(total=sample.prompt_tokens, desc=f"prefill {sample.sample_id}", unit="tok", leave=False,
              mininterval=10, disable=not progress) as bar, torch.no_grad():
        cache, seconds = SharedPrefill(target, chunk).get(sample, new_tokens, bar)
    if cache is None:
        raise ExperimentError(f"--ctx must exceed {2 * SharedPrefill.TAIL} tokens (prompt {sample.sample_id})")
    return cache, seconds


def decode(engine: SpeculativeEngine, prompt: list[int], n: int, shared: KVCache, **generate) -> GenerationResult:
    """One run of `engine` from the shared cache, which is cropped back after (`generate`: the
    engine's generate() options: sampling, seed, ...)."""
    head = shared.length
    try:
        return engine.generate(prompt, n, cache=shared, **generate)
    finally:
        shared.crop(head)


def decode_batch(engine: SpeculativeEngine, prompts: list[list[int]], n: int, caches: list[KVCache],
                 **generate) -> list[GenerationResult]:
    """One batched run of `engine`, each prompt from its own shared cache, every cache cropped back."""
    heads = [c.length for c in caches]
    try:
        return engine.generate_batch(prompts, n, caches=caches, **generate)
    finally:
        for c, h in zip(caches, heads, strict=True):
            c.crop(h)


def run_ours(method: Method, target: CausalLM, drafter: CausalLM | None, prompt: list[int], n: int,
             shared: KVCache) -> dict:
    """One run of `method` from the shared cache: its output, decode rate and where its time went."""
    from sparsespec.kernels import cpu_attention

    with cpu_attention.switched_off() if PYTORCH_ATTENTION in method.name.split(":") else nullcontext():
        res = decode(method.build(target, drafter), prompt, n, shared)
    row = {"output_ids": res.output_ids, "decode_s": res.wall_s, "decode_tok_s": (n - 1) / res.wall_s,
           "acceptance": res.acceptance_rate, "tau": res.mean_accepted_tokens,
           "acceptance_quarters": res.acceptance_by_part(4)}
    if res.draft_steps and res.verify_steps:
        row["gamma"] = res.gamma
        row["k_mean"] = res.drafted / max(len(res.rounds), 1)
        row["index_share"] = res.extra.get("index_update_s", 0.0) / res.wall_s
        # where a round's time goes (the index update runs after the verify pass, in the overhead)
        row["draft_ms"] = 1000 * res.draft_s / len(res.rounds)
        row["verify_ms"] = 1000 * res.verify_s / res.verify_steps
        row["index_ms"] = 1000 * res.extra.get("index_update_s", 0.0) / res.verify_steps
        row["other_ms"] = 1000 * (res.overhead_s - res.extra.get("index_update_s", 0.0)) / res.verify_steps
    return row


def timed_runs(run: Callable[[int], dict], new_tokens: int, repeats: int, warmup: int = 0,
               warmup_tokens: int = 32) -> list[dict]:
    """`repeats` runs of `run(new_tokens)` after `warmup` untimed runs of up to `warmup_tokens` (threads,
    allocator and kernels warm up; their tokens are not needed)."""
    runs = []
    for rep in range(warmup + repeats):
        n = new_tokens if rep >= warmup else min(new_tokens, warmup_tokens)
        r = run(n)
        if rep >= warmup:
            runs.append(r)
    return runs


def interleaved_runs(methods: dict[str, Method], target: CausalLM, prompt: list[int], n: int, shared: KVCache,
                     repeats: int) -> dict[str, list[dict]]:
    """Per method, `repeats` runs after one warm-up round, the methods taking turns within each round
    so that drift in the machine's load hits every method alike."""
    runs: dict[str, list[dict]] = {}
    for rep in range(repeats + 1):
        for spec, method in methods.items():
            r = run_ours(method, target, None, prompt, n, shared)
            if rep:
                runs.setdefault(spec, []).append(r)
    return runs


def bench_row(head: dict, runs: list[dict], **measured) -> dict:
    """A report row: `head` (ctx, sample, method, ...), the timed runs' mean decode rate and its
    spread, the first run's output, `measured` (floor, prefill times) and the means of RUN_STATS."""
    from sparsespec.experiments.common.probes import peak_rss_gb

    rates = [r["decode_tok_s"] for r in runs]
    row = {**head, "tok_s": statistics.fmean(rates), "tok_s_std": statistics.stdev(rates) if len(rates) > 1 else 0.0,
           "output_ids": runs[0]["output_ids"], **measured, "peak_rss_gb": peak_rss_gb()}
    for key in RUN_STATS:
        vals = [r[key] for r in runs if r.get(key) is not None]
        row[key] = statistics.fmean(vals) if vals else None
    row["acceptance_quarters"] = runs[0].get("acceptance_quarters")
    return row


def compare(rows: list[dict]) -> None:
    """Ratios against HF generate and our ar, and greedy identity, per (ctx, sample), in place."""
    for row in rows:
        peers = {r["method"]: r for r in rows if r["ctx"] == row["ctx"] and r["sample"] == row["sample"]}
        for ref, key in (("hf", "vs_hf"), ("ar", "vs_ar")):
            row[key] = row["tok_s"] / peers[ref]["tok_s"] if ref in peers else None
            row[f"identical_{ref}"] = row["output_ids"] == peers[ref]["output_ids"] if ref in peers else None
