"""The shared evaluation harness: every method on the same samples, in one process.

`run_evaluation` goes through its steps in an order chosen so that bad input fails before anything
is written: check the settings and build each method once (settings.check_run); lock this process's
results file and check that a resumed out_dir holds results of the same run (rundir.RunDir); load the
model, the samples and the drafter; check memory and prepare each method on the model; only then
write out_dir's files and append result lines; last, the summary.

Within a sample, `ar` runs first so every other method's row gets its paired speedup and its
token-identity check against AR as soon as it is written. A rerun with the same out_dir skips the
(sample, method) pairs already in results.jsonl (see results.py for the line-atomic writes).

Several processes may share one out_dir: with `shard=i/n` (or a launcher's RANK/WORLD_SIZE or SLURM
array) a process runs every n-th sample into its own results.shard-<i>-of-<n>.jsonl; rundir.py has
the locks, and the summary covers every results file there.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from sparsespec.decoding.sampling import Sampling
from sparsespec.eval.methods import Method, MethodConfigError
from sparsespec.eval.prefill import SharedPrefill
from sparsespec.eval.results import ResultsFile
from sparsespec.eval.rundir import RUN_FILE, RunDir, config_yaml, run_fingerprint
from sparsespec.eval.settings import EvaluationError, RunSettings, check_run, with_baseline
from sparsespec.eval.summary import headline, to_markdown
from sparsespec.kv.policies import FullKV
from sparsespec.models.runner import CausalLM
from sparsespec.provenance import Provenance

log = logging.getLogger(__name__)

__all__ = ["RUN_FILE", "EvaluationError", "answer_text", "planned_speedup", "run_evaluation", "with_baseline"]


@dataclass
class Inputs:
    """What a run decodes with, loaded once: the target, its tokenizer, this process's samples, the
    dataset's scorer and the drafter model (None when no method needs one)."""

    target: CausalLM
    tokenizer: Any
    samples: list
    metric: Callable
    drafter: CausalLM | None


def run_evaluation(cfg: DictConfig, method_cfgs: list[DictConfig] | None = None, command: str | None = None) -> Path:
    """Run every method on every sample (of this process's shard) and write out_dir's results and
    report. `command` (the command line, as evaluate.py passes it) is kept in out_dir/command.txt, so
    a table built from the results can say what made them. Raises EvaluationError for bad input."""
    prov = Provenance.begin()
    run = check_run(cfg, method_cfgs)
    fingerprint = run_fingerprint(cfg, run.ctx, run.device, run.dtype)
    with RunDir.of(run) as out:
        out.lock()
        out.check_resume(fingerprint, run.methods)
        torch.set_num_threads(int(cfg.runtime.threads or len(os.sched_getaffinity(0)) or 1))
        inputs = _load(run)
        if inputs is None:
            return run.out_dir
        planned = _prepare(run, inputs)
        results = out.start(config_yaml(cfg, run.out_dir), fingerprint, command)
        written = _decode(run, inputs, results, planned)
        if written:  # the rows this process wrote, and where
            out.add_provenance({**prov.end(), "rows": written})
        _report(run, out, results)
    return run.out_dir


# ---------------------------------------------------------------------------------------------
# loading: the target, the samples, the drafter


def _load(run: RunSettings) -> Inputs | None:
    """The target, this process's samples and the drafter; None when this shard has no sample."""
    target, tokenizer = _load_target(run)
    samples, metric = _load_samples(run, tokenizer)
    if run.shard is not None:  # after `limit`, so the shards together are exactly the unsharded run
        total, samples = len(samples), run.shard.select(samples)
        if not samples:  # more shards than samples (a large job array): nothing to do is not an error
            log.warning("shard %s has no sample (the run has %d): nothing to do", run.shard, total)
            return None
    drafter = _load_drafter(run, tokenizer, target) if any(m.needs_drafter_model for m in run.methods) else None
    return Inputs(target, tokenizer, samples, metric, drafter)


def _load_target(run: RunSettings) -> tuple[CausalLM, Any]:
    from sparsespec.models.loading import ModelLoadError, load_model

    m = run.cfg.model
    try:
        loaded = load_model(m.path, run.dtype, ctx=run.ctx + run.max_new, rope_scaling=m.rope_scaling, device=run.device)
    except (ModelLoadError, ValueError) as e:
        raise EvaluationError(str(e)) from e
    target = CausalLM(loaded.model)
    if target.dtype != torch.float32 and any(m.speculative for m in run.methods):
        # a verification pass runs k+1 tokens through kernels shaped differently from ar's one-token
        # step; in low precision their rounding differs, and a near-tie can flip (docs/architecture.md,
        # Precision)
        log.warning("model.dtype=%s: speculative greedy outputs can differ from ar at near-tied logits "
                    "(low-precision rounding differs between a k+1-token verification and a 1-token step); "
                    "use model.dtype=float32 for token-identical outputs", str(run.dtype)[6:])
    return target, loaded.tokenizer


def _load_samples(run: RunSettings, tokenizer) -> tuple[list, Callable]:
    from sparsespec.data import DatasetError, load_samples, score, scorer

    d = run.cfg.dataset
    try:
        samples = load_samples(d._target_, tokenizer, run.ctx, path=d.path, task=d.task, limit=run.cfg.limit,
                               split=d.split, seed=run.seed, use_chat_template=d.use_chat_template,
                               **dict(d.options or {}))
        metric = functools.partial(score, metric=scorer(d._target_))
    except DatasetError as e:
        raise EvaluationError(str(e)) from e
    except OSError as e:  # a file that exists but cannot be read (permissions, a device, ...)
        raise EvaluationError(f"dataset.path={d.path}: cannot be read ({e}); pass a readable file or directory") from e
    if not samples:
        raise EvaluationError(f"dataset={d.name} gave no sample at ctx={run.ctx}; check dataset.path / dataset.task")
    return samples, metric


def _load_drafter(run: RunSettings, tokenizer, target: CausalLM) -> CausalLM:
    from sparsespec.models.loading import ModelLoadError, check_same_tokenizer, load_model

    path = run.cfg.drafter.path
    if path is None and any(m.needs_trained_drafter for m in run.methods):
        from sparsespec.models.exports import latest_drafter_path

        latest = latest_drafter_path()
        if latest is None:
            raise EvaluationError(
                "method budgetdraft needs a trained drafter: run `python train.py budget=multi` first, "
                "or pass drafter.path=DIR")
        path = str(latest)
    if path is None:
        names = [m.name for m in run.methods if m.needs_drafter_model]
        raise EvaluationError(f"methods {names} need a small drafter: pass drafter.path=DIR (a model "
                              "directory with the target's tokenizer, e.g. a train.py export)")
    try:
        drafter = load_model(path, run.drafter_dtype, device=run.device, key="drafter.path")
    except ModelLoadError as e:  # its message names drafter.path, the key passed to load_model
        raise EvaluationError(str(e)) from e
    try:
        check_same_tokenizer(tokenizer, drafter.tokenizer, what=f"drafter.path={path}")
    except ValueError as e:
        raise EvaluationError(str(e)) from e
    model = CausalLM(drafter.model)
    if model.vocab_size < target.vocab_size:
        raise EvaluationError(f"drafter.path={path} has a smaller vocabulary than the target; use a drafter "
                              "from the target's model family")
    return model


# ---------------------------------------------------------------------------------------------
# before decoding: memory, the methods on the model, the plan


def _prepare(run: RunSettings, inputs: Inputs) -> dict[str, float | None]:
    """The checks that need the model: the memory guard, and each method built on it once (what
    the target's device and shapes allow: a draft weight format's kernel, ...). The planner's
    speedup of each method, by name."""
    from sparsespec.eval.memory import check_memory

    target, drafter, cfg = inputs.target, inputs.drafter, run.cfg
    batch_size = _batch_size(run, inputs)
    if cfg.runtime.memory_guard:
        check_memory(target, run.ctx + run.max_new, run.methods, drafter, run.chunk, EvaluationError,
                     new_tokens=run.max_new, batch_size=batch_size)
    for method in run.methods:
        try:
            method.build(target, drafter, run.chunk)
        except MethodConfigError as e:
            raise EvaluationError(str(e)) from None
    return {m.name: planned_speedup(m, target, run.ctx, batch_size, drafter) for m in run.methods}


def _batch_size(run: RunSettings, inputs: Inputs) -> int:
    return min(int(run.cfg.gen.batch_size), len(inputs.samples))  # a batch larger than the samples shrinks to them


def planned_speedup(method: Method, target, ctx: int, batch: int, drafter_model=None) -> float | None:
    """The planner's speedup over ar for this method, made before it runs (sparsespec.plan: this
    device's profile, the committed acceptance curves): None for ar, for a device with no profile, or
    for a method the planner has no acceptance data for. A prediction, so it never stops a run."""
    if method.name == "ar" or target.device.type != "cpu":  # GPU profiles are datasheet figures until probed
        return None
    from sparsespec.plan import Dtypes, planned

    dtype = str(target.dtype).removeprefix("torch.")
    try:
        prediction = planned(method.as_dict(), target.config.to_dict(), ctx, batch, profile="cpu",
                             dtypes=Dtypes(weights=dtype, kv=dtype, blocks=dtype == "float32"),
                             drafter=None if drafter_model is None else drafter_model.config.to_dict())
    except Exception as e:  # a shape, method or user's part the planner does not price: no prediction
        log.debug("no planned speedup for %s: %s: %s", method.name, type(e).__name__, e)
        return None
    return None if prediction is None else round(prediction.speedup, 3)


# ---------------------------------------------------------------------------------------------
# decoding: every (sample, method) pair not yet in the results file, a batch at a time


def _decode(run: RunSettings, inputs: Inputs, results: ResultsFile, planned: dict[str, float | None]) -> int:
    """Decode the pairs results does not hold yet and append their rows; the number written."""
    from tqdm.auto import tqdm

    cfg, samples, methods = run.cfg, inputs.samples, run.methods
    stop_ids = set(_eos_ids(inputs.tokenizer))
    eos = tuple(stop_ids) if cfg.gen.stop_at_eos else ()
    pairs = [(s, m) for s in samples for m in methods]
    todo = [p for p in pairs if results.done(p[0].sample_id, p[1].name) is None]
    if len(todo) < len(pairs):
        log.info("resuming in %s: %d of %d (sample, method) pairs are done", run.out_dir, len(pairs) - len(todo),
                 len(pairs))
    if cfg.runtime.warmup and todo:
        _warmup(methods, inputs.target, inputs.drafter, samples[0].prompt_ids, run.chunk)
    progress = bool(cfg.runtime.progress)
    bar = tqdm(total=len(pairs), initial=len(pairs) - len(todo), desc="evaluate", disable=not progress, unit="run")
    shared = SharedPrefill(inputs.target, run.chunk, enabled=bool(cfg.runtime.get("share_prefill", True)))
    size = _batch_size(run, inputs)
    for batch in [samples[i : i + size] for i in range(0, len(samples), size)]:
        shared.hold(batch)
        for method in methods:
            pending = [s for s in batch if results.done(s.sample_id, method.name) is None]
            if not pending:
                continue
            bar.set_postfix_str(f"{pending[0].sample_id}{f' +{len(pending) - 1}' if len(pending) > 1 else ''} "
                                f"{method.name}")
            n_new = [min(run.max_new, int(s.max_new_tokens)) if cfg.gen.get("use_task_length") and s.max_new_tokens
                     else run.max_new for s in pending]
            show = progress and sum(s.prompt_tokens for s in pending) > 2 * run.chunk
            rows = _run_batch(run, inputs, method, pending, n_new, eos, show, shared)
            for sample, row in zip(pending, rows, strict=True):
                _finish_row(row, sample, method, run.ctx, results.done(sample.sample_id, "ar"), run.sampling,
                            inputs.tokenizer, stop_ids, inputs.metric)
                row["planned_speedup"] = planned[method.name]
                results.append(row)
                bar.update(1)
                if row.get("exact_match_ar") is False:
                    log.error("%s on %s is NOT identical to ar: a correctness bug", method.name, sample.sample_id)
    bar.close()
    return len(todo)


def _report(run: RunSettings, out: RunDir, results: ResultsFile) -> None:
    """The summary over every results file of out_dir, printed and written."""
    rows, files, reports = out.write_summary(results)
    print(to_markdown(reports["summary"]))
    for sentence in headline(rows):
        print(sentence + "\n")
    print(f"results: {results.path}")
    if run.shard is not None or len(files) > 1:
        print(f"summary: {run.out_dir / 'summary.md'}, over the {len(rows)} rows of {len(files)} results file(s) in "
              f"{run.out_dir} so far; `python -m sparsespec.experiments report {run.out_dir} --out DIR` rebuilds it "
              "once every shard is done")


def answer_text(tokenizer, ids: list[int], stop_ids: set[int]) -> tuple[str, str | None]:
    """(the answer up to the first EOS, the text decoded after it or None when there is no EOS)."""
    end = next((i for i, t in enumerate(ids) if t in stop_ids), len(ids))
    after = tokenizer.decode(ids[end:], skip_special_tokens=True) if end < len(ids) else None
    return tokenizer.decode(ids[:end], skip_special_tokens=True), after


def _prefill_bar(n_tokens: int, label: str):
    from tqdm.auto import tqdm

    return tqdm(total=n_tokens, desc=f"prefill {label}", unit="tok", leave=False)


def _finish_row(row: dict, sample, method: Method, ctx: int, ar_row: dict | None, sampling: Sampling, tokenizer,
                stop_ids: set[int], score) -> None:
    """What a row gets from outside its run: the pairing with ar's row of the same sample (speedup,
    token identity), the answer text and its score."""
    row["ctx"] = ctx
    row["method_config"] = method.as_dict()
    if ar_row is not None and method.name != "ar":
        row["speedup"] = ar_row["wall_s"] / row["wall_s"] if row["wall_s"] > 0 else None
        agg, ar_agg = row.get("aggregate_tokens_per_s"), ar_row.get("aggregate_tokens_per_s")
        row["aggregate_speedup"] = agg / ar_agg if agg and ar_agg else None
        row["exact_match_ar"] = (row["output_ids"] == ar_row["output_ids"]) if sampling.greedy else None
    elif method.name == "ar":
        row["exact_match_ar"] = True if sampling.greedy else None
    # Every method decodes the same number of tokens (gen.stop_at_eos=false) so speeds compare;
    # the answer that is scored ends where the model ended its turn, at the first EOS.
    row["text"], after = answer_text(tokenizer, row["output_ids"], stop_ids)
    if after is not None:
        row["text_after_eos"] = after
    row["score"] = score(sample, row["text"]) if sample.answers else None


def _run_batch(run: RunSettings, inputs: Inputs, method: Method, samples: list, max_new: list[int],
               eos: tuple[int, ...], show_prefill: bool, shared: SharedPrefill) -> list[dict]:
    """One method on a batch of samples decoded together (runtime.repeats times): a row per sample.
    Each repeat builds a fresh engine: parts hold per-generation state (a recall index, an entropy
    estimate), so no repeat or sample starts from another's."""
    runs = []
    for rep in range(max(int(run.cfg.runtime.repeats), 1)):
        engine = method.build(inputs.target, inputs.drafter, run.chunk)
        bar = _prefill_bar(sum(s.prompt_tokens for s in samples), method.name) if show_prefill else None
        try:
            got = [shared.get(s, n, bar) for s, n in zip(samples, max_new, strict=True)]
            heads = [c.length if c is not None else 0 for c, _ in got]
            res = engine.generate_batch([s.prompt_ids for s in samples], max_new, run.sampling, seed=run.seed,
                                        eos_token_ids=eos, progress=bar.update if bar is not None else None,
                                        caches=[c for c, _ in got])
            for r, (cache, shared_s), head in zip(res, got, heads, strict=True):
                if cache is not None:
                    cache.crop(head)
                    r.prefill_s += shared_s
        finally:
            if bar is not None:
                bar.close()
        runs.append(res)
        if rep and run.sampling.greedy and any(a.output_ids != b.output_ids for a, b in zip(res, runs[0], strict=True)):
            log.error("%s gave different greedy outputs across repeats", method.name)
    return [_row(method, sample, [r[i] for r in runs], engine, run.sampling, run.seed)
            for i, sample in enumerate(samples)]


def _row(method: Method, sample, runs: list, engine, sampling: Sampling, seed: int) -> dict:
    """A sample's row from its runs (repeats) of one method."""
    res = runs[0]
    walls = [r.wall_s for r in runs]
    wall = statistics.fmean(walls)
    policy = engine.drafter.policy if engine.drafter is not None else None
    sparse = policy is not None and not isinstance(policy, FullKV)
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
        "batch_size": res.batch_size,
        # the whole batch's tokens over its decoding time (for one sequence: tokens_per_s)
        "aggregate_tokens_per_s": statistics.fmean(r.aggregate_tokens_per_s for r in runs),
        "acceptance_rate": res.acceptance_rate if method.speculative else None,
        "mean_accepted_tokens": res.mean_accepted_tokens if method.speculative else None,
        "draft_steps": res.draft_steps,
        "verify_steps": res.verify_steps,
        "speedup": None,
        "aggregate_speedup": None,  # the batch's aggregate throughput over batched ar's (filled when paired)
        "draft_s": res.draft_s,
        "verify_s": res.verify_s,
        "overhead_s": res.overhead_s,
        "repeats": len(runs),
        "temperature": sampling.temperature,
        "seed": seed,
        # the parts, by class (FullKV, StreamingKV, RecallIndex, ...; FixedK, EntropyController, ...)
        "view": type(policy).__name__ if method.speculative and policy is not None else None,
        "controller": type(engine.controller).__name__ if method.speculative else None,
        # the KV budget the drafter saw at this prompt (tokens per KV head), for acceptance-vs-budget
        "budget_tokens": min(policy.budget_for(res.prompt_tokens), res.prompt_tokens) if sparse else None,
        # a drafter model's most KV entries per layer at once (its own cache: a window under a sparse view)
        "drafter_kv_tokens": res.extra.get("drafter_kv_tokens"),
        # the formats a draft step read its weights and its K/V in, and the bytes it read of both
        "draft_weights": res.extra.get("draft_weights"),
        "draft_kv": res.extra.get("draft_kv"),
        "draft_step_bytes": res.extra.get("draft_step_bytes"),
    }
    if method.speculative and res.rounds:
        k_mean = res.drafted / len(res.rounds)
        gamma = res.gamma
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


def _warmup(methods, target, drafter_model, prompt_ids, chunk) -> None:
    """A short run of each method so one-off costs (allocator, kernels) don't land on a sample."""
    short = prompt_ids[: min(len(prompt_ids), 256)]
    for m in methods:
        m.build(target, drafter_model, chunk).generate(short, 8)


def _eos_ids(tokenizer) -> list[int]:
    eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])
