"""The shared evaluation harness: every method on the same samples, in one process.

Order of work is chosen so that bad input fails before anything is written: validate methods, gen,
ctx and shard; lock this process's results file (which creates out_dir, removed again if the run
stops before writing); check that a resumed out_dir holds results of the same run; load the model;
load the samples; load the drafter; check memory; only then write out_dir's files and append result
lines.

Within a sample, `ar` runs first so every other method's row gets its paired speedup and its
token-identity check against AR as soon as it is written. A rerun with the same out_dir skips the
(sample, method) pairs already in results.jsonl (see results.py for the line-atomic writes).

Several processes may share one out_dir: with `shard=i/n` (or a launcher's RANK/WORLD_SIZE or SLURM
array) a process runs every n-th sample into its own results.shard-<i>-of-<n>.jsonl. Each process
locks its results file before the model loads, so a second process on the same file stops at once
(`RunLock`); the files every process shares (config.yaml, run.json, command.txt, the summary and
plots) are written under a short second lock, and the summary covers every results file there.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import statistics
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sparsespec.config import parse_ctx
from sparsespec.decoding.sampling import Sampling
from sparsespec.eval.methods import Method, MethodConfigError
from sparsespec.eval.prefill import SharedPrefill
from sparsespec.eval.results import (
    LockedError,
    ResultsFile,
    RunLock,
    read_rows,
    resolve_shard,
    results_files,
    results_name,
    split_of,
    write_atomic,
)
from sparsespec.eval.summary import headline, load_results, to_markdown, write_reports
from sparsespec.kv.policies import FullKV
from sparsespec.models.runner import CausalLM
from sparsespec.provenance import Provenance

log = logging.getLogger(__name__)

RUN_FILE = "run.json"  # what every row of out_dir/results.jsonl was produced under (checked on resume)
SHARED_LOCK = ".shared.lock"  # held briefly while writing the files all shards of an out_dir share


class EvaluationError(ValueError):
    """Bad input: the message names the key or file and the fix."""


def build_methods(method_cfgs: list[DictConfig], baseline: str | None) -> list[Method]:
    """The requested methods, checked; `ar` first when it takes part."""
    methods = []
    for mc in method_cfgs:
        try:
            m = Method.from_config(mc)
        except MethodConfigError as e:
            raise EvaluationError(str(e)) from None
        methods.append(m)
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise EvaluationError(f"method list {names} names a method twice; list each method once")
    if baseline not in (None, "ar"):
        raise EvaluationError(f"baseline={baseline!r}: use baseline=ar or baseline=null")
    if baseline == "ar" and "ar" not in names:
        ar = Method(name="ar")
        methods.insert(0, ar)
    # AR first: the paired speedup and the identity check need its row.
    methods.sort(key=lambda m: m.name != "ar")
    return methods


def run_fingerprint(cfg: DictConfig, ctx: int, device: torch.device, dtype: torch.dtype) -> dict:
    """The settings every row of one out_dir must share (methods and limit may change on resume);
    `auto` device and dtype as they resolved, so a resume on another machine is told."""
    model = {**OmegaConf.to_container(cfg.model, resolve=True), "device": device.type, "dtype": str(dtype)[6:]}
    return {
        "model": model,
        "dataset": _dataset_fingerprint(cfg.dataset),
        "ctx": ctx,
        "gen": OmegaConf.to_container(cfg.gen, resolve=True),
        "drafter": OmegaConf.to_container(cfg.drafter, resolve=True),
    }


def _dataset_fingerprint(dataset: DictConfig) -> dict:
    """The dataset's settings; a package dataset's own loader is implied by its name, so out_dirs
    written before datasets named their loader keep resuming."""
    d = OmegaConf.to_container(dataset, resolve=True)
    if d.get("_target_") == f"sparsespec.data.{d.get('name')}.load":
        del d["_target_"]
    return d


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}={old!r} before, {new!r} now"]


def _split_label(split: tuple[int, int] | None) -> str:
    return "unsharded" if split is None or split[1] == 1 else f"shard={split[0]}/{split[1]}"


def check_resume(out_dir: Path, fingerprint: dict, methods: list[Method], results_path: Path | None = None) -> None:
    """Refuse to mix results of different settings in one out_dir (before anything is written). The
    rows of every results file there count (shards of one run share its settings), and a split other
    than theirs is refused too: its shards would run samples the files there already hold."""
    results_path = results_path or out_dir / results_name(None)
    mine = split_of(results_path)
    others = [f for f in results_files(out_dir) if split_of(f)[1] != mine[1]]
    if others:
        old = split_of(others[0])
        raise EvaluationError(
            f"out_dir={out_dir} holds {others[0].name} ({_split_label(old)}{' and others' if len(others) > 1 else ''}) "
            f"and this run is {_split_label(mine)}: their samples would overlap and run twice; split this run as "
            f"before ({'shard=i/' + str(old[1]) if old[1] > 1 else 'shard=null'}), or use a new out_dir")
    rows = [r for f in results_files(out_dir) for r in read_rows(f)]
    if not rows:
        return
    fix = (f"use a new out_dir, or delete {out_dir / 'results.jsonl'} to start over" if mine[1] == 1 else
           f"use a new out_dir, or delete {out_dir}'s results*.jsonl files to start over")
    run_file = out_dir / RUN_FILE
    if run_file.exists():
        try:
            old = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if old is not None and old != fingerprint:
            diff = _diff(old, fingerprint)
            raise EvaluationError(
                f"out_dir={out_dir} holds results of a different run ({'; '.join(diff[:4])}): resuming would mix "
                f"them; {fix}")
    for m in methods:
        conf = m.as_dict()
        old = next((r.get("method_config") for r in rows if r.get("method") == m.name and r.get("method_config")), None)
        if old is not None and old != conf:
            raise EvaluationError(
                f"out_dir={out_dir} holds {m.name} results with other method settings "
                f"({'; '.join(_diff(old, conf, 'method.')[:4])}); {fix}")


def _validate(cfg: DictConfig, method_cfgs: list[DictConfig] | None) -> None:
    """sparsespec.config's schema and range checks (a misspelt key, a wrong type, a value out of range)."""
    from sparsespec.config import ConfigError, validate_evaluate_config

    try:
        validate_evaluate_config(cfg, method_cfgs)
    except ConfigError as e:
        raise EvaluationError(str(e)) from e


COMMAND_FILE = "command.txt"  # the command line(s) that wrote out_dir, one per distinct invocation
PROVENANCE_FILE = "provenance.json"  # where each process that wrote rows ran (sparsespec.provenance): a list


def add_provenance(out_dir: Path, prov: dict) -> None:
    """Append one process's provenance to out_dir's list (under the shared lock: shards append too)."""
    path = out_dir / PROVENANCE_FILE
    with RunLock(out_dir / SHARED_LOCK):
        known = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
        write_atomic(path, json.dumps([*known, prov], indent=1) + "\n")


def run_evaluation(cfg: DictConfig, method_cfgs: list[DictConfig] | None = None, command: str | None = None) -> Path:
    """Run every method on every sample (of this process's shard) and write out_dir's results and
    report. `command` (the command line, as evaluate.py passes it) is kept in out_dir/command.txt, so
    a table built from the results can say what made them."""
    locks: list[RunLock] = []
    try:
        return _evaluate(cfg, method_cfgs, command, locks)
    finally:
        # however the run ends: the lock file goes, and so does an out_dir this run created and left empty
        for lock in reversed(locks):
            lock.release()


def lock_results(out_dir: Path, results_path: Path) -> RunLock:
    """This process's exclusive hold on `results_path` for the whole run (see results.RunLock)."""
    lock = RunLock(results_path.with_name(results_path.name + ".lock"))
    try:
        return lock.acquire()
    except LockedError as e:
        by = f" ({e.holder})" if e.holder else ""
        raise EvaluationError(
            f"out_dir={out_dir} is in use: another evaluate.py{by} is writing {results_path.name} there; wait for "
            "it to finish, pass another out_dir, or split the samples with shard=i/n") from None
    except OSError as e:
        raise EvaluationError(f"out_dir={out_dir}: cannot create {lock.path} ({e.strerror or e}); pass a writable "
                              "out_dir") from e


def _evaluate(cfg: DictConfig, method_cfgs: list[DictConfig] | None, command: str | None,
              locks: list[RunLock]) -> Path:
    from sparsespec.data import DatasetError, load_samples, score, scorer
    from sparsespec.models.loading import ModelLoadError, check_same_tokenizer, load_model

    # -- validate everything that needs no model ----------------------------------------------------
    prov = Provenance.begin()
    _validate(cfg, method_cfgs)
    methods = build_methods(method_cfgs or [cfg.method], cfg.baseline)
    try:
        ctx = parse_ctx(cfg.ctx)
        sampling = Sampling(float(cfg.gen.temperature), float(cfg.gen.top_p))
    except ValueError as e:
        raise EvaluationError(str(e)) from e
    try:
        out_dir = Path(str(cfg.out_dir))
    except Exception as e:  # the default names the run from Hydra's runtime, which compose() does not set
        raise EvaluationError(f"out_dir could not be resolved ({type(e).__name__}); pass out_dir=DIR") from e
    if out_dir.exists() and not out_dir.is_dir():
        raise EvaluationError(f"out_dir={out_dir} is a file; pass a directory")
    try:
        shard = resolve_shard(cfg.get("shard"))
    except ValueError as e:
        raise EvaluationError(str(e)) from None
    results_path = out_dir / results_name(shard)
    if shard is not None:
        log.info("shard %s (%s): samples %d, %d, %d, ... of the list, into %s", shard, shard.source, shard.index,
                 shard.index + shard.count, shard.index + 2 * shard.count, results_path)
    from sparsespec.models.device import resolve_device, resolve_dtype

    try:
        device = resolve_device(cfg.model.device)
        dtype = resolve_dtype(cfg.model.dtype, device)
        drafter_dtype = resolve_dtype(cfg.drafter.dtype or cfg.model.dtype, device, key="drafter.dtype")
    except ValueError as e:
        raise EvaluationError(str(e)) from e
    fingerprint = run_fingerprint(cfg, ctx, device, dtype)
    # Taken before the model loads, so a second process on this file stops at once; the shard is
    # kept out of the fingerprint, so every shard of one run passes check_resume.
    locks.append(lock_results(out_dir, results_path))
    check_resume(out_dir, fingerprint, methods, results_path)
    torch.set_num_threads(int(cfg.runtime.threads or len(os.sched_getaffinity(0)) or 1))
    max_new = int(cfg.gen.max_new_tokens)

    # -- model, samples, drafter ----------------------------------------------------------------------
    try:
        loaded = load_model(cfg.model.path, dtype, ctx=ctx + max_new, rope_scaling=cfg.model.rope_scaling,
                            device=device)
    except (ModelLoadError, ValueError) as e:
        raise EvaluationError(str(e)) from e
    target = CausalLM(loaded.model)
    if target.dtype != torch.float32 and any(m.speculative for m in methods):
        # Verification runs k+1 tokens through kernels shaped differently from AR's one-token step; in
        # fp32 the logits agree to ~1e-6 and greedy outputs have matched on every run, in bf16/fp16
        # they differ by ~1e-2 and a near-tie can flip (seen at 64k in bf16). exact_match_ar reports it.
        log.warning("model.dtype=%s: speculative greedy outputs can differ from ar at near-tied logits "
                    "(low-precision rounding differs between a k+1-token verification and a 1-token step); "
                    "use model.dtype=float32 for token-identical outputs", str(dtype)[6:])
    tokenizer = loaded.tokenizer
    d = cfg.dataset
    try:
        samples = load_samples(d._target_, tokenizer, ctx, path=d.path, task=d.task, limit=cfg.limit,
                               split=d.split, seed=int(cfg.gen.seed), use_chat_template=d.use_chat_template,
                               **dict(d.options or {}))
        metric = functools.partial(score, metric=scorer(d._target_))
    except DatasetError as e:
        raise EvaluationError(str(e)) from e
    except OSError as e:  # a file that exists but cannot be read (permissions, a device, ...)
        raise EvaluationError(f"dataset.path={d.path}: cannot be read ({e}); pass a readable file or directory") from e
    if not samples:
        raise EvaluationError(f"dataset={d.name} gave no sample at ctx={ctx}; check dataset.path / dataset.task")
    if shard is not None:  # after `limit`, so the shards together are exactly the unsharded run
        total, samples = len(samples), shard.select(samples)
        if not samples:  # more shards than samples (a large job array): nothing to do is not an error
            log.warning("shard %s has no sample (the run has %d): nothing to do", shard, total)
            return out_dir
    drafter_model = None
    if any(m.needs_drafter_model for m in methods):
        drafter_model = _load_drafter(cfg, methods, loaded, load_model, check_same_tokenizer,
                                      ModelLoadError, drafter_dtype, device)

    batch_size = min(int(cfg.gen.batch_size), len(samples))  # a batch larger than the samples shrinks to them
    from sparsespec.eval.memory import check_memory

    if cfg.runtime.memory_guard:
        check_memory(target, ctx + max_new, methods, drafter_model, cfg.runtime.prefill_chunk,
                     EvaluationError, new_tokens=max_new, batch_size=batch_size)

    for method in methods:  # what needs the model: a draft weight format its device cannot run, ...
        try:
            method.build(target, drafter_model, int(cfg.runtime.prefill_chunk))
        except MethodConfigError as e:
            raise EvaluationError(str(e)) from None

    planned = {m.name: planned_speedup(m, target, ctx, batch_size, drafter_model) for m in methods}

    # -- run ------------------------------------------------------------------------------------------
    out_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(out_dir / SHARED_LOCK):  # shards share these files: command.txt is read, then rewritten
        write_atomic(out_dir / "config.yaml", _config_yaml(cfg, out_dir))
        write_atomic(out_dir / RUN_FILE, json.dumps(fingerprint, indent=2))
        if command:
            known = (out_dir / COMMAND_FILE).read_text(encoding="utf-8").splitlines() if (out_dir / COMMAND_FILE).exists() else []
            if command not in known:
                write_atomic(out_dir / COMMAND_FILE, "".join(line + "\n" for line in [*known, command]))
    results = ResultsFile(results_path)
    stop_ids = set(_eos_ids(tokenizer))
    eos = tuple(stop_ids) if cfg.gen.stop_at_eos else ()
    chunk = int(cfg.runtime.prefill_chunk)
    pairs = [(s, m) for s in samples for m in methods]
    todo = [p for p in pairs if results.done(p[0].sample_id, p[1].name) is None]
    if len(todo) < len(pairs):
        log.info("resuming in %s: %d of %d (sample, method) pairs are done", out_dir, len(pairs) - len(todo), len(pairs))
    if cfg.runtime.warmup and todo:
        _warmup(methods, target, drafter_model, samples[0].prompt_ids, chunk)

    from tqdm.auto import tqdm

    progress = bool(cfg.runtime.progress)
    bar = tqdm(total=len(pairs), initial=len(pairs) - len(todo), desc="evaluate", disable=not progress, unit="run")
    shared = SharedPrefill(target, chunk, enabled=bool(cfg.runtime.get("share_prefill", True)))
    for batch in [samples[i : i + batch_size] for i in range(0, len(samples), batch_size)]:
        shared.hold(batch)
        for method in methods:
            pending = [s for s in batch if results.done(s.sample_id, method.name) is None]
            if not pending:
                continue
            bar.set_postfix_str(f"{pending[0].sample_id}{f' +{len(pending) - 1}' if len(pending) > 1 else ''} "
                                f"{method.name}")
            n_new = [min(max_new, int(s.max_new_tokens)) if cfg.gen.get("use_task_length") and s.max_new_tokens
                     else max_new for s in pending]
            show = progress and sum(s.prompt_tokens for s in pending) > 2 * chunk
            rows = _run_batch(method, pending, target, drafter_model, n_new, sampling, cfg, eos, chunk, show, shared)
            for sample, row in zip(pending, rows, strict=True):
                _finish_row(row, sample, method, ctx, results.done(sample.sample_id, "ar"), sampling, tokenizer,
                            stop_ids, metric)
                row["planned_speedup"] = planned[method.name]
                results.append(row)
                bar.update(1)
                if row.get("exact_match_ar") is False:
                    log.error("%s on %s is NOT identical to ar: a correctness bug", method.name, sample.sample_id)
    bar.close()
    if todo:  # the rows this process wrote, and where
        add_provenance(out_dir, {**prov.end(), "rows": len(todo)})
    rows, files, reports = _write_summary(out_dir, results)
    print(to_markdown(reports["summary"]))
    for sentence in headline(rows):
        print(sentence + "\n")
    print(f"results: {results.path}")
    if shard is not None or len(files) > 1:
        print(f"summary: {out_dir / 'summary.md'}, over the {len(rows)} rows of {len(files)} results file(s) in "
              f"{out_dir} so far; `python scripts/report.py {out_dir} --out DIR` rebuilds it once every shard is done")
    return out_dir


def _write_summary(out_dir: Path, results: ResultsFile) -> tuple[list[dict], list[Path], dict]:
    """summary.json/.md and the plots over every results file of out_dir, not this process's alone:
    shards that finish one after another each rewrite the same summary.json, and under the lock the
    last one reads every row of the others (which were appended before they took it)."""
    with RunLock(out_dir / SHARED_LOCK):
        files = results_files(out_dir)
        rows = load_results([out_dir]) if len(files) > 1 else results.rows
        return rows, files, write_reports(rows, out_dir)


def answer_text(tokenizer, ids: list[int], stop_ids: set[int]) -> tuple[str, str | None]:
    """(the answer up to the first EOS, the text decoded after it or None when there is no EOS)."""
    end = next((i for i, t in enumerate(ids) if t in stop_ids), len(ids))
    after = tokenizer.decode(ids[end:], skip_special_tokens=True) if end < len(ids) else None
    return tokenizer.decode(ids[:end], skip_special_tokens=True), after


def _config_yaml(cfg: DictConfig, out_dir: Path) -> str:
    """The composed config, resolved where it can be (out_dir as used), to rerun or audit the run."""
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation only Hydra's runtime can resolve: keep it as written
        return OmegaConf.to_yaml(cfg)
    plain["out_dir"] = str(out_dir)
    return OmegaConf.to_yaml(plain)


def _prefill_bar(n_tokens: int, label: str):
    from tqdm.auto import tqdm

    return tqdm(total=n_tokens, desc=f"prefill {label}", unit="tok", leave=False)


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


def _run_batch(method, samples, target, drafter_model, max_new: list[int], sampling, cfg, eos, chunk,
               show_prefill=False, shared: SharedPrefill | None = None) -> list[dict]:
    """One method on a batch of samples decoded together (runtime.repeats times): a row per sample."""
    runs = []
    for rep in range(max(int(cfg.runtime.repeats), 1)):
        engine = method.build(target, drafter_model, chunk)
        bar = _prefill_bar(sum(s.prompt_tokens for s in samples), method.name) if show_prefill else None
        try:
            got = [shared.get(s, n, bar) if shared is not None else (None, 0.0)
                   for s, n in zip(samples, max_new, strict=True)]
            heads = [c.length if c is not None else 0 for c, _ in got]
            res = engine.generate_batch([s.prompt_ids for s in samples], max_new, sampling, seed=int(cfg.gen.seed),
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
        if rep and sampling.greedy and any(a.output_ids != b.output_ids for a, b in zip(res, runs[0], strict=True)):
            log.error("%s gave different greedy outputs across repeats", method.name)
    return [_row(method, sample, [r[i] for r in runs], engine, sampling, cfg) for i, sample in enumerate(samples)]


def _row(method, sample, runs, engine, sampling, cfg) -> dict:
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
        "seed": int(cfg.gen.seed),
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


def _load_drafter(cfg, methods, loaded, load_model, check_same_tokenizer, ModelLoadError, dtype, device) -> CausalLM:
    path = cfg.drafter.path
    if path is None and any(m.needs_trained_drafter for m in methods):
        from sparsespec.models.exports import latest_drafter_path

        latest = latest_drafter_path()
        if latest is None:
            raise EvaluationError(
                "method budgetdraft needs a trained drafter: run `python train.py budget=multi` first, "
                "or pass drafter.path=DIR")
        path = str(latest)
    if path is None:
        names = [m.name for m in methods if m.needs_drafter_model]
        raise EvaluationError(f"methods {names} need a small drafter: pass drafter.path=DIR (a model "
                              "directory with the target's tokenizer, e.g. a train.py export)")
    try:
        drafter = load_model(path, dtype, device=device)
    except ModelLoadError as e:  # its message speaks of model.path, the key load_model knows
        raise EvaluationError(f"drafter.path={path}: the drafter could not be loaded ({e})") from e
    try:
        check_same_tokenizer(loaded.tokenizer, drafter.tokenizer, what=f"drafter.path={path}")
    except ValueError as e:
        raise EvaluationError(str(e)) from e
    model = CausalLM(drafter.model)
    if model.vocab_size < CausalLM(loaded.model).vocab_size:
        raise EvaluationError(f"drafter.path={path} has a smaller vocabulary than the target; use a drafter "
                              "from the target's model family")
    return model


def _warmup(methods, target, drafter_model, prompt_ids, chunk) -> None:
    """A short run of each method so one-off costs (allocator, kernels) don't land on a sample."""
    short = prompt_ids[: min(len(prompt_ids), 256)]
    for m in methods:
        m.build(target, drafter_model, chunk).generate(short, 8)


def _eos_ids(tokenizer) -> list[int]:
    eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])
