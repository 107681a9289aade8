"""scripts/soak.py's measurement: one long decode at one ctx, watching acceptance per round and
memory over time, then the comparison methods on the same shared prefill for the speedup and the
first law. "Nothing grows without bound" is judged on the decode phase: the KV cache is preallocated
for prompt + new tokens and the recall index is sized at prefill, so RSS should stay flat."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from sparsespec.config import load_method
from sparsespec.data.continuation import window
from sparsespec.decoding.sampling import Sampling
from sparsespec.eval.prefill import SharedPrefill
from sparsespec.eval.summary import distinct_by_part
from sparsespec.models.loading import load_model
from sparsespec.models.runner import CausalLM
from sparsespec.reports import ReportError, Say, silent
from sparsespec.reports.probes import RssSampler


@dataclass(frozen=True)
class SoakPlan:
    """The soaked method (conf/method name and `method...` overrides) and what it is compared with."""

    method: str
    overrides: list[str]
    compare: list[str]
    new_tokens: int
    model_path: str | None
    dtype: str
    temperature: float
    top_p: float
    seed: int
    prefill_chunk: int
    interval: float  # seconds between RSS samples
    memory_guard: bool


def source_text(path: str | None) -> str:
    """The text prompts are cut from: a file, or the shipped PG-19 books one after another, each
    after its Gutenberg front matter (2% of its characters)."""
    if path:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    from sparsespec.data.pg19 import load_books

    return "\n\n".join(b["text"][int(len(b["text"]) * 0.02) :] for b in load_books(None))


def prompt_ids(tokenizer, text: str, ctx: int) -> list[int]:
    """The first `ctx` tokens of the text, cut as evaluate.py cuts a continuation window."""
    ids = window(tokenizer, text, ctx, 0).ids
    if ids is None:
        raise ReportError(f"the source text has fewer than ctx={ctx} tokens: pass a longer --text")
    return ids


class _RoundLog:
    """Wraps the engine's controller.observe to record each verification round (time, drafted,
    accepted, tokens so far, RSS) and to mark the sampler's decode phase."""

    def __init__(self, engine, sampler: RssSampler, t0: float, new_tokens: int, say: Say, ctx: int):
        self.rounds: list[dict] = []
        self.emitted = 1  # the first token comes from prefill
        self.observe, self.sampler, self.t0, self.new_tokens, self.say, self.ctx = (
            engine.controller.observe, sampler, t0, new_tokens, say, ctx)
        engine.controller.observe = self

    def __call__(self, stats) -> None:
        self.sampler.phase = "decode"
        self.emitted += stats.accepted + 1
        self.rounds.append({"t": round(time.perf_counter() - self.t0, 3), "drafted": stats.drafted,
                            "accepted": stats.accepted, "tokens": min(self.emitted, self.new_tokens),
                            "rss_mib": round(self.sampler.rss_mib(), 1)})
        if len(self.rounds) % 10 == 0:
            self.say(f"ctx {self.ctx}: round {len(self.rounds)}, {self.rounds[-1]['tokens']} tokens, "
                     f"RSS {self.rounds[-1]['rss_mib']:.0f} MiB")
        self.observe(stats)


def _compared(name: str, r, res, greedy: bool) -> dict:
    """A compared method's record: its speed and acceptance, and whether it decoded the soaked run's tokens."""
    return {"method": name, "new_tokens": r.new_tokens, "tokens_per_s": round(r.tokens_per_s, 3),
            "acceptance_rate": r.acceptance_rate, "mean_accepted_tokens": r.mean_accepted_tokens,
            "acceptance_by_quarter": r.acceptance_by_part(4), "distinct_by_quarter": distinct_by_part(r.output_ids, 4),
            "output_ids": r.output_ids,
            # greedy: the first law says identical; sampling: the same distribution, not the same draw
            "same_output": r.output_ids == res.output_ids if greedy else None}


def soak_one(plan: SoakPlan, ctx: int, text: str, t0: float, say: Say = silent, rounds_say: Say = silent) -> dict:
    """One soak at `ctx`: the run's numbers, its rounds, the RSS samples and the comparisons
    (`rounds_say` hears every tenth round, `say` the phases)."""
    sampler = RssSampler(plan.interval, t0)
    sampler.start()
    method = load_method(plan.method, plan.overrides)
    loaded = load_model(plan.model_path, plan.dtype, ctx=ctx + plan.new_tokens)
    target = CausalLM(loaded.model)
    prompt = prompt_ids(loaded.tokenizer, text, ctx)
    if plan.memory_guard:
        from sparsespec.eval.memory import check_memory

        est = check_memory(target, ctx + plan.new_tokens, [method], None, plan.prefill_chunk, ReportError)
        say(f"memory estimate {est.needed / 1024**3:.2f} GiB beyond the weights")
    engine = method.build(target, None, plan.prefill_chunk)
    log = _RoundLog(engine, sampler, t0, plan.new_tokens, rounds_say, ctx)
    sampler.phase = "prefill"
    say(f"ctx {ctx}: prefill of {len(prompt)} tokens")
    # one prefill for the soaked method and every compared method (the harness' SharedPrefill)
    shared = SharedPrefill(target, plan.prefill_chunk)
    sample = SimpleNamespace(sample_id=f"soak-{ctx}", prompt_tokens=len(prompt), prompt_ids=prompt)
    cache, shared_s = shared.get(sample, plan.new_tokens)
    head = cache.length if cache is not None else 0
    sampling = Sampling(plan.temperature, plan.top_p)
    res = engine.generate(prompt, plan.new_tokens, sampling, seed=plan.seed, cache=cache)
    if cache is not None:
        cache.crop(head)
        res.prefill_s += shared_s
    sampler.phase = "compare"
    compare = []
    for name in plan.compare:
        other = load_method(name, [])
        say(f"ctx {ctx}: {name} on the same prefill")
        r = other.build(target, None, plan.prefill_chunk).generate(prompt, plan.new_tokens, sampling, seed=plan.seed,
                                                                   cache=cache)
        if cache is not None:
            cache.crop(head)
        compare.append(_compared(other.name, r, res, plan.temperature == 0))
    sampler.stop()
    run = _run_row(ctx, method.name, res, log.rounds, sampler.samples, compare)
    del engine, target, loaded, cache, shared
    gc.collect()
    return run


def _run_row(ctx: int, method: str, res, rounds: list[dict], memory: list[dict], compare: list[dict]) -> dict:
    """The run's record in soak.json: its numbers, whether RSS stayed flat while decoding (growth <=
    max(64 MiB, 5% of the decode-start RSS)), and the comparisons."""
    decode = [r["rss_mib"] for r in rounds]
    start = decode[0] if decode else memory[-1]["rss_mib"]
    end = decode[-1] if decode else start
    growth = end - start
    return {
        "ctx": ctx, "method": method, "prompt_tokens": res.prompt_tokens, "new_tokens": res.new_tokens,
        "prefill_s": round(res.prefill_s, 2), "wall_s": round(res.wall_s, 2),
        "tokens_per_s": round(res.tokens_per_s, 3), "acceptance_rate": res.acceptance_rate,
        "mean_accepted_tokens": res.mean_accepted_tokens, "verify_steps": res.verify_steps,
        "acceptance_by_quarter": res.acceptance_by_part(4),
        "distinct_by_quarter": distinct_by_part(res.output_ids, 4), "output_ids": res.output_ids,
        "rss_peak_mib": max(s["rss_mib"] for s in memory + rounds) if rounds else None,
        "rss_decode_start_mib": start, "rss_decode_end_mib": end, "decode_growth_mib": round(growth, 1),
        "bounded": growth <= max(64.0, 0.05 * start),
        "compare": compare,
        "speedup_vs_ar": next((round(res.tokens_per_s / c["tokens_per_s"], 3) for c in compare
                               if c["method"] == "ar"), None),
        "rounds": rounds, "memory": memory,
        "engine": {k: v for k, v in res.extra.items() if isinstance(v, int | float | str)},
    }
