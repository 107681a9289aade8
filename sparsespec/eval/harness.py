"""The shared evaluation harness: every method on the same samples, in one process.

Order of work is chosen so that bad input fails before anything is written: validate methods, gen
and ctx; load the model; load the samples; load the drafter; check memory; only then create
out_dir and start appending result lines.
"""

from __future__ import annotations

import logging
import os
import statistics
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from sparsespec.config import parse_ctx
from sparsespec.decoding.sampling import Sampling
from sparsespec.eval.methods import Method, MethodConfigError
from sparsespec.eval.results import ResultsFile, write_atomic
from sparsespec.eval.summary import to_markdown, write_reports
from sparsespec.models.runner import CausalLM

log = logging.getLogger(__name__)


class EvaluationError(ValueError):
    """Bad input: the message names the key or file and the fix."""


def build_methods(method_cfgs: list[DictConfig], baseline: str | None) -> list[Method]:
    methods = []
    for mc in method_cfgs:
        try:
            m = instantiate(mc, _convert_="all")
        except Exception as e:  # instantiate wraps the dataclass' ValueError
            cause = e.__cause__ if isinstance(e.__cause__, MethodConfigError) else e
            raise EvaluationError(f"method {mc.get('name')}: {cause}") from e
        methods.append(m)
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise EvaluationError(f"method list {names} names a method twice")
    if baseline not in (None, "ar"):
        raise EvaluationError(f"baseline={baseline!r}: use baseline=ar or baseline=null")
    if baseline == "ar" and "ar" not in names:
        methods.insert(0, Method(name="ar"))
    return methods


def run_evaluation(cfg: DictConfig, method_cfgs: list[DictConfig] | None = None) -> Path:
    from sparsespec.data import DatasetError, load_samples, score
    from sparsespec.models.loading import ModelLoadError, check_same_tokenizer, load_model

    # -- validate everything that needs no model ----------------------------------------------------
    methods = build_methods(method_cfgs or [cfg.method], cfg.baseline)
    try:
        ctx = parse_ctx(cfg.ctx)
        sampling = Sampling(float(cfg.gen.temperature), float(cfg.gen.top_p))
    except ValueError as e:
        raise EvaluationError(str(e)) from e
    if int(cfg.gen.max_new_tokens) <= 0:
        raise EvaluationError(f"gen.max_new_tokens must be positive, got {cfg.gen.max_new_tokens}")
    if cfg.limit is not None and int(cfg.limit) <= 0:
        raise EvaluationError(f"limit must be a positive number of samples or null, got {cfg.limit}")
    torch.set_num_threads(int(cfg.runtime.threads or os.cpu_count() or 1))
    max_new = int(cfg.gen.max_new_tokens)

    # -- model, samples, drafter ----------------------------------------------------------------------
    try:
        loaded = load_model(cfg.model.path, cfg.model.dtype, ctx=ctx + max_new, rope_scaling=cfg.model.rope_scaling)
    except ModelLoadError as e:
        raise EvaluationError(str(e)) from e
    target = CausalLM(loaded.model)
    tokenizer = loaded.tokenizer
    d = cfg.dataset
    try:
        samples = load_samples(d.name, tokenizer, ctx, path=d.path, task=d.task, limit=cfg.limit,
                               split=d.split, seed=int(cfg.gen.seed), use_chat_template=d.use_chat_template,
                               **dict(d.options or {}))
    except (DatasetError, FileNotFoundError) as e:
        raise EvaluationError(str(e)) from e
    if not samples:
        raise EvaluationError(f"dataset={d.name} gave no sample at ctx={ctx}")
    drafter_model = None
    if any(m.drafter == "model" for m in methods):
        drafter_model = _load_drafter(cfg, methods, loaded, load_model, check_same_tokenizer, ModelLoadError)

    from sparsespec.eval.memory import check_memory

    if cfg.runtime.memory_guard:
        check_memory(target, ctx + max_new, methods, drafter_model, cfg.runtime.prefill_chunk, EvaluationError)

    # -- run ------------------------------------------------------------------------------------------
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "config.yaml", OmegaConf.to_yaml(cfg))
    results = ResultsFile(out_dir / "results.jsonl")
    eos = tuple(_eos_ids(tokenizer)) if cfg.gen.stop_at_eos else ()
    chunk = int(cfg.runtime.prefill_chunk)
    if cfg.runtime.warmup:
        _warmup(methods, target, drafter_model, samples[0].prompt_ids, chunk)

    from tqdm.auto import tqdm

    pairs = [(s, m) for s in samples for m in methods]
    bar = tqdm(pairs, desc="evaluate", disable=not cfg.runtime.progress, unit="run")
    for sample, method in bar:
        bar.set_postfix_str(f"{sample.sample_id} {method.name}")
        if results.done(sample.sample_id, method.name):
            continue
        row = _run_one(method, sample, target, drafter_model, max_new, sampling, cfg, eos, chunk)
        row["ctx"] = ctx
        ar_row = results.done(sample.sample_id, "ar")
        if ar_row is not None and method.name != "ar":
            row["speedup"] = ar_row["wall_s"] / row["wall_s"] if row["wall_s"] > 0 else None
            row["exact_match_ar"] = (row["output_ids"] == ar_row["output_ids"]) if sampling.greedy else None
        elif method.name == "ar":
            row["exact_match_ar"] = True if sampling.greedy else None
        text = tokenizer.decode(row["output_ids"], skip_special_tokens=True)
        row["text"] = text
        row["score"] = score(sample, text) if sample.answers else None
        results.append(row)
        if row.get("exact_match_ar") is False:
            log.error("%s on %s is NOT identical to ar: a correctness bug", method.name, sample.sample_id)
    reports = write_reports(results.rows, out_dir)
    print(to_markdown(reports["summary"]))
    print(f"results: {out_dir / 'results.jsonl'}")
    return out_dir


def _run_one(method, sample, target, drafter_model, max_new, sampling, cfg, eos, chunk) -> dict:
    runs = []
    for rep in range(max(int(cfg.runtime.repeats), 1)):
        engine = method.build(target, drafter_model, chunk)
        res = engine.generate(sample.prompt_ids, max_new, sampling, seed=int(cfg.gen.seed), eos_token_ids=eos)
        runs.append(res)
        if rep and res.output_ids != runs[0].output_ids and sampling.greedy:
            log.error("%s gave different greedy outputs across repeats", method.name)
    res = runs[0]
    walls = [r.wall_s for r in runs]
    wall = statistics.fmean(walls)
    row = {
        "sample_id": sample.sample_id,
        "dataset": sample.dataset,
        "task": sample.task,
        "method": method.name,
        "ctx": None,
        "prompt_tokens": res.prompt_tokens,
        "new_tokens": res.new_tokens,
        "output_ids": res.output_ids,
        "prefill_s": statistics.fmean(r.prefill_s for r in runs),
        "wall_s": wall,
        "wall_s_std": statistics.stdev(walls) if len(walls) > 1 else 0.0,
        "tokens_per_s": res.new_tokens / wall if wall > 0 else None,
        "acceptance_rate": res.acceptance_rate if method.speculative else None,
        "mean_accepted_tokens": res.mean_accepted_tokens if method.speculative else None,
        "draft_steps": res.draft_steps,
        "verify_steps": res.verify_steps,
        "speedup": None,
        "draft_s": res.draft_s,
        "verify_s": res.verify_s,
        "overhead_s": res.overhead_s,
        "repeats": len(runs),
        "temperature": sampling.temperature,
        "seed": int(cfg.gen.seed),
    }
    if method.speculative and res.rounds:
        k_mean = res.drafted / len(res.rounds)
        gamma = (res.draft_s / max(res.draft_steps, 1)) / (res.verify_s / max(res.verify_steps, 1))
        alpha = res.acceptance_rate or 0.0
        row.update({
            "k_mean": k_mean,
            "gamma": gamma,
            # the paper's identity S = (alpha k + 1) / (k gamma + 1), from this run's alpha, k, gamma
            "predicted_speedup": (alpha * k_mean + 1) / (k_mean * gamma + 1),
            "accepted_per_round": [a for _, a in res.rounds],
            "drafted_per_round": [k for k, _ in res.rounds],
        })
        row.update({f"engine_{k}": v for k, v in res.extra.items()})
    return row


def _load_drafter(cfg, methods, loaded, load_model, check_same_tokenizer, ModelLoadError) -> CausalLM:
    path = cfg.drafter.path
    if path is None and any(m.needs_trained_drafter for m in methods):
        from sparsespec.training.export import latest_drafter_path

        latest = latest_drafter_path()
        if latest is None:
            raise EvaluationError(
                "method budgetdraft needs a trained drafter: run `python train.py budget=multi` first, "
                "or pass drafter.path=DIR")
        path = str(latest)
    if path is None:
        names = [m.name for m in methods if m.drafter == "model"]
        raise EvaluationError(f"methods {names} need a small drafter: pass drafter.path=DIR (a model "
                              "directory with the target's tokenizer, e.g. a train.py export)")
    try:
        drafter = load_model(path, cfg.drafter.dtype or cfg.model.dtype)
        check_same_tokenizer(loaded.tokenizer, drafter.tokenizer, what=f"drafter.path={path}")
    except (ModelLoadError, ValueError) as e:
        raise EvaluationError(str(e)) from e
    model = CausalLM(drafter.model)
    if model.vocab_size < CausalLM(loaded.model).vocab_size:
        raise EvaluationError(f"drafter.path={path} has a smaller vocabulary than the target")
    return model


def _warmup(methods, target, drafter_model, prompt_ids, chunk) -> None:
    """A short run of each method so one-off costs (allocator, kernels) don't land on a sample."""
    short = prompt_ids[: min(len(prompt_ids), 256)]
    for m in methods:
        m.build(target, drafter_model, chunk).generate(short, 8)


def _eos_ids(tokenizer) -> list[int]:
    eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])
