"""scripts/bench.py's measurement: Hugging Face's generate() and our methods side by side, in one
process, on the same prompts (windows of PG-19 books), every method decoding from one shared prefill
per prompt. Each finished prompt goes to a Checkpoint, so that a stopped run resumes where it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sparsespec.eval.methods import Method
from sparsespec.kv.cache import KVCache
from sparsespec.models.runner import CausalLM
from sparsespec.reports import ReportError, Say, silent
from sparsespec.reports.bench import HF_METHODS
from sparsespec.reports.checkpoint import Checkpoint
from sparsespec.reports.hf import load_for_generate, prefill_seconds, run_hf
from sparsespec.reports.probes import BandwidthFloor
from sparsespec.reports.timing import bench_row, compare, our_method, prefill_once, run_ours, timed_runs

# the settings a resumed run must share with the run that wrote its checkpoint
RESUME_KEYS = ("new_tokens", "model_path", "dtype", "drafter_path", "data", "split", "repeats", "warmup",
               "warmup_tokens")
REPREFILLING = ("hf_assisted", "hf_lookup")  # keep their own state: their prefill dominates a long run


@dataclass(frozen=True)
class BenchPlan:
    """What to run: methods (`specs`, ours with `:key=value` overrides, see timing.our_method) at
    each ctx on `samples` books, `repeats` timed runs each after `warmup` short untimed ones."""

    ctxs: list[int]
    specs: list[str]
    new_tokens: int
    repeats: int
    warmup: int
    warmup_tokens: int
    samples: int
    model_path: str | None
    dtype: str
    drafter_path: str | None  # None: the latest exported drafter, where a method needs one
    data: str | None
    split: str
    hf_full_max: int  # the largest ctx at which the re-prefilling HF methods run

    def settings(self) -> dict:
        """The checkpoint's header: what a resumed run must not change."""
        return {k: getattr(self, k) for k in RESUME_KEYS}

    def specs_at(self, ctx: int) -> list[str]:
        return [s for s in self.specs if not (s in REPREFILLING and ctx > self.hf_full_max)]


def _drafter_path(plan: BenchPlan, ours: dict[str, Method]):
    """The drafter directory the plan's methods need (None where none needs one)."""
    if not any(m.needs_drafter_model for m in ours.values()) and "hf_assisted" not in plan.specs:
        return None
    if plan.drafter_path is not None:
        return plan.drafter_path
    from sparsespec.models.exports import latest_drafter_path

    path = latest_drafter_path()
    if path is None:
        raise ReportError("no drafter: pass --drafter-path DIR or run `python train.py budget=multi` first")
    return path


def _runner(spec: str, method: Method | None, hf_models: tuple, our_models: tuple, prompt: list[int],
            shared: KVCache) -> Callable[[int], dict]:
    """One run of `spec` decoding n tokens from the shared cache: HF's generate() for the HF methods
    (`hf_models`: target and drafter), else our engine (`our_models`)."""
    if spec in HF_METHODS:
        hf, drafter_hf = hf_models
        return lambda n: run_hf(spec, hf, drafter_hf, prompt, n, shared, hf.config)
    target, drafter = our_models
    return lambda n: run_ours(method, target, drafter, prompt, n, shared)


def measure(plan: BenchPlan, checkpoint: Checkpoint, say: Say = silent) -> dict:
    """{bandwidth_gbs, weight_bytes, rows}: a row per (ctx, sample, method) with its decode rate
    (mean and std over the timed runs), the bandwidth floor, prefill times and the per-run stats,
    each compared with HF generate() and our ar on the same prompt."""
    from sparsespec.data import load_samples

    ours = {s: our_method(s) for s in plan.specs if s not in HF_METHODS}
    drafter_path = _drafter_path(plan, ours)

    def models_for(ctx: int):
        return load_for_generate(plan.model_path, plan.dtype, ctx + plan.new_tokens, drafter_path)

    hf, _, _ = load_for_generate(plan.model_path, plan.dtype, min(plan.ctxs) + plan.new_tokens)
    floor = BandwidthFloor.measure(hf, CausalLM(hf))
    say(f"read bandwidth {floor.bandwidth_gbs:.1f} GB/s; weights {floor.weight_bytes / 1e6:.0f} MB; "
        f"KV {floor.kv_per_token / 1e3:.1f} KB/token")
    rows = []
    for ctx in plan.ctxs:
        hf, tok, drafter_hf = models_for(ctx)
        target, drafter = CausalLM(hf), CausalLM(drafter_hf) if drafter_hf is not None else None
        here = plan.specs_at(ctx)
        for sample in load_samples("pg19", tok, ctx, path=plan.data, limit=plan.samples, split=plan.split):
            done = checkpoint.rows(ctx, sample.sample_id, here)
            if done:
                say(f"ctx {ctx} {sample.sample_id}: resumed from {checkpoint.path}")
                rows += done
                continue
            prompt = sample.prompt_ids
            shared, prefill_s = prefill_once(target, sample, plan.new_tokens)
            hf_prefill_s = prefill_seconds(hf, prompt[: shared.length]) if ctx <= plan.hf_full_max else None
            say(f"ctx {ctx} {sample.sample_id}: prefill ours {prefill_s:.1f} s, HF "
                + (f"{hf_prefill_s:.1f} s" if hf_prefill_s else "-"))
            measured = {"floor_tok_s": floor.tok_s(len(prompt) + plan.new_tokens // 2), "prefill_s": prefill_s,
                        "hf_prefill_s": hf_prefill_s}
            sample_rows = []
            for spec in here:
                run = _runner(spec, ours.get(spec), (hf, drafter_hf), (target, drafter), prompt, shared)
                runs = timed_runs(run, plan.new_tokens, plan.repeats, plan.warmup, plan.warmup_tokens)
                del run  # it holds the shared cache
                head = {"ctx": ctx, "sample": sample.sample_id, "method": spec, "prompt_tokens": len(prompt)}
                row = bench_row(head, runs, **measured)
                sample_rows.append(row)
                alpha = f"{row['acceptance']:.2f}" if row["acceptance"] is not None else "-"
                say(f"ctx {ctx} {spec:<28} {row['tok_s']:6.2f} ± {row['tok_s_std']:.2f} tok/s  α={alpha}")
            checkpoint.add(sample_rows)
            rows += sample_rows
            del shared  # free this prompt's cache before the next prefill
    compare(rows)
    return {"bandwidth_gbs": floor.bandwidth_gbs, "weight_bytes": floor.weight_bytes, "rows": rows}
