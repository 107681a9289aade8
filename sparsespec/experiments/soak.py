"""Long-run soak: SparseSpec-L decoding 512 tokens at 64k and 128k context, watching acceptance and
memory over time. Not a test: hours on a 2-core CPU at 128k.

For each ctx: load the target (YaRN past its trained positions, as evaluate.py does), build a
ctx-token prompt from running text (the shipped PG-19 books, or --text), check the memory guard,
then decode --new-tokens with the method, and with each --compare method (default ar and magicdec)
on the same prefilled cache, for the speedup and the first law (same tokens as ar). Recorded:

  rounds  per verification round: time, tokens drafted / accepted, tokens emitted so far, RSS
  memory  RSS sampled every --interval seconds by a thread, tagged load / prefill / decode

"Nothing grows without bound" is judged on the decode phase: the KV cache is preallocated for
prompt + new tokens and the recall index is sized at prefill, so RSS should stay flat while
decoding; `decode_growth_mib` and `bounded` (growth <= max(64 MiB, 5% of the decode-start RSS))
say whether it did. Each finished ctx is kept beside --out (`--resume` goes on from there). The
tables: speed against ar on the same prefill, acceptance by quarter of a long output, and whether
memory stayed flat; the plot: acceptance per round with a running mean, and RSS over time.

  python -m sparsespec.experiments soak --out outputs/soak/soak.json --plot outputs/soak/soak.png
  python -m sparsespec.experiments soak --ctx 2048 --new-tokens 32 --out outputs/soak_smoke/soak.json
  python -m sparsespec.experiments soak --ctx 64k --set method.drafter.policy.ratio=0.05 --dtype bfloat16
"""

from __future__ import annotations

import gc
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sparsespec.eval.summary import ctx_label, distinct_by_part
from sparsespec.experiments import ExperimentError, Say, silent
from sparsespec.experiments.common.figures import pyplot, save_png

if TYPE_CHECKING:
    from sparsespec.experiments.common.probes import RssSampler

log = logging.getLogger(__name__)
OPTIONS = {"ctx": "64k,128k", "new_tokens": 512, "model": None, "dtype": "float32"}
RESUME = ("method", "set", "compare", "new_tokens", "model", "dtype", "text", "temperature", "top_p", "seed",
          "prefill_chunk", "memory_guard")
SUMMARY_KEYS = ("ctx", "new_tokens", "acceptance_rate", "mean_accepted_tokens", "tokens_per_s", "speedup_vs_ar",
                "acceptance_by_quarter", "distinct_by_quarter", "rss_peak_mib", "decode_growth_mib", "bounded")


def arguments(p) -> None:
    p.add_argument("--method", default="sparsespec_l", help="a conf/method name")
    p.add_argument("--compare", default="ar,magicdec", type=lambda v: [m for m in v.split(",") if m],
                   help="methods decoded after it on the same prefill, for speed and identity (\"\" for none)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra evaluate-config overrides, e.g. method.drafter.policy.ratio=0.05")
    p.add_argument("--text", default=None, help="prompt source text file (default: the shipped PG-19 books)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefill-chunk", type=int, default=1024)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--no-memory-guard", dest="memory_guard", action="store_false")
    p.add_argument("--verbose", action="store_true", help="log every tenth verification round")


def measure(args, checkpoint) -> dict:
    """{runs}: soak_one at every ctx (a finished one taken from the checkpoint)."""
    text = source_text(args.text)
    t0 = time.perf_counter()
    runs = []
    for ctx in args.ctx:
        done = checkpoint.rows(ctx, "soak", [args.method])
        if done:
            runs += done
            continue
        r = soak_one(args, ctx, text, t0, log.info, log.info if args.verbose else silent)
        log.info("ctx %d: %d tokens in %.1f s after a %.1f s prefill, acceptance %s, decode RSS growth %.1f MiB "
                 "(%s)", ctx, r["new_tokens"], r["wall_s"], r["prefill_s"], r["acceptance_rate"],
                 r["decode_growth_mib"], "bounded" if r["bounded"] else "GROWING")
        checkpoint.add([r])  # a crash keeps the finished contexts
        runs.append(r)
    log.info("summary: %s", json.dumps(summary(runs)))
    if not all(r["bounded"] for r in runs):
        log.warning("RSS grew during decoding in some run: see decode_growth_mib")
    return {"runs": runs}
def source_text(path: str | None) -> str:
    """The text prompts are cut from: a file, or the shipped PG-19 books one after another, each
    after its Gutenberg front matter (2% of its characters)."""
    if path:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    from sparsespec.data.pg19 import load_books

    return "\n\n".join(b["text"][int(len(b["text"]) * 0.02) :] for b in load_books(None))


def prompt_ids(tokenizer, text: str, ctx: int) -> list[int]:
    """The first `ctx` tokens of the text, cut as evaluate.py cuts a continuation window."""
    from sparsespec.data.continuation import window

    ids = window(tokenizer, text, ctx, 0).ids
    if ids is None:
        raise ExperimentError(f"the source text has fewer than ctx={ctx} tokens: pass a longer --text")
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


def soak_one(plan, ctx: int, text: str, t0: float, say: Say = silent, rounds_say: Say = silent) -> dict:
    """One soak at `ctx` (`plan`: the command line's options): the run's numbers, its rounds, the RSS
    samples and the comparisons (`rounds_say` hears every tenth round, `say` the phases)."""

    from sparsespec.config import load_method
    from sparsespec.decoding.sampling import Sampling
    from sparsespec.experiments.common.probes import RssSampler
    from sparsespec.experiments.common.runner import decode, prefill_once
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    sampler = RssSampler(plan.interval, t0)
    sampler.start()
    method = load_method(plan.method, plan.set)
    loaded = load_model(plan.model, plan.dtype, ctx=ctx + plan.new_tokens)
    target = CausalLM(loaded.model)
    prompt = prompt_ids(loaded.tokenizer, text, ctx)
    if plan.memory_guard:
        from sparsespec.eval.memory import check_memory

        est = check_memory(target, ctx + plan.new_tokens, [method], None, plan.prefill_chunk, ExperimentError)
        say(f"memory estimate {est.needed / 1024**3:.2f} GiB beyond the weights")
    engine = method.build(target, None, plan.prefill_chunk)
    log = _RoundLog(engine, sampler, t0, plan.new_tokens, rounds_say, ctx)
    sampler.phase = "prefill"
    say(f"ctx {ctx}: prefill of {len(prompt)} tokens")
    # one prefill for the soaked method and every compared method (the harness' SharedPrefill)
    cache, shared_s = prefill_once(target, prompt, plan.new_tokens, plan.prefill_chunk, progress=False)
    sampling = Sampling(plan.temperature, plan.top_p)
    res = decode(engine, prompt, plan.new_tokens, cache, sampling=sampling, seed=plan.seed)
    res.prefill_s += shared_s
    sampler.phase = "compare"
    compare = []
    for name in plan.compare:
        other = load_method(name, [])
        say(f"ctx {ctx}: {name} on the same prefill")
        r = decode(other.build(target, None, plan.prefill_chunk), prompt, plan.new_tokens, cache, sampling=sampling,
                   seed=plan.seed)
        compare.append(_compared(other.name, r, res, plan.temperature == 0))
    sampler.stop()
    run = _run_row(ctx, method.name, res, log.rounds, sampler.samples, compare)
    del engine, target, loaded, cache
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
        "ctx": ctx, "sample": "soak", "method": method, "prompt_tokens": res.prompt_tokens, "new_tokens": res.new_tokens,
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


def _quarters(xs: list | None) -> str:
    return " / ".join("—" if x is None else f"{x:.2f}" for x in xs) if xs else "—"


def markdown(report: dict) -> str:
    """One row per ctx and method: speed against ar on the same prefill, acceptance overall and by
    quarter, ar's distinct-token share by quarter, and the memory the run held (from soak.json)."""
    lines = ["| ctx | method | tok/s | × ar | α | α by quarter | distinct-token share by quarter | same as ar |",
             "|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        entries = sorted([run, *run["compare"]], key=lambda e: e["method"] != "ar")
        ar = entries[0] if entries[0]["method"] == "ar" else None
        greedy = report["args"].get("temperature", 0.0) == 0
        for e in entries:
            ratio = "—" if ar is None else f"{e['tokens_per_s'] / ar['tokens_per_s']:.2f}"
            alpha = "—" if e.get("acceptance_rate") is None else f"{e['acceptance_rate']:.2f}"
            same = "—" if ar is None or e is ar or not greedy else "yes" if e["output_ids"] == ar["output_ids"] else "NO"
            lines.append(f"| {ctx_label(run['ctx'])} | {e['method']} | {e['tokens_per_s']:.2f} | {ratio} | {alpha} | "
                         f"{_quarters(e.get('acceptance_by_quarter'))} | {_quarters(e.get('distinct_by_quarter'))} | "
                         f"{same} |")
    lines += ["", "| ctx | prefill s | peak RSS GiB | RSS at decode start → end (MiB) | bounded |", "|---|---|---|---|---|"]
    for run in report["runs"]:
        lines.append(f"| {ctx_label(run['ctx'])} | {run['prefill_s']:.0f} | {run['rss_peak_mib'] / 1024:.2f} | "
                     f"{run['rss_decode_start_mib']:.0f} → {run['rss_decode_end_mib']:.0f} "
                     f"({run['decode_growth_mib']:+.0f}) | {'yes' if run['bounded'] else 'NO'} |")
    return "\n".join(lines)


def summary(runs: list[dict]) -> list[dict]:
    """Per run, the numbers a soak logs at the end (the rest is in its report)."""
    return [{k: r[k] for k in SUMMARY_KEYS}
            | {f"{c['method']}_tok_s": c["tokens_per_s"] for c in r["compare"]}
            | {f"same_as_{c['method']}": c["same_output"] for c in r["compare"]} for r in runs]


def plot(report: dict, path: Path) -> None:
    """Acceptance per verification round with its running mean, and RSS over time (decoding shaded)."""
    runs = report["runs"]
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7))
    for run in runs:
        label = f"ctx {run['ctx']}"
        rs = run["rounds"]
        if rs:
            x = [r["tokens"] for r in rs]
            acc = [r["accepted"] / r["drafted"] if r["drafted"] else float("nan") for r in rs]
            ax1.plot(x, acc, ".", alpha=0.35)
            mean, num, den = [], 0, 0
            for r in rs:
                num, den = num + r["accepted"], den + r["drafted"]
                mean.append(num / den if den else float("nan"))
            ax1.plot(x, mean, "-", label=f"{label} (running mean)", color=ax1.lines[-1].get_color())
        mem = run["memory"]
        ax2.plot([m["t"] for m in mem], [m["rss_mib"] for m in mem], "-", label=label)
        dec = [m["t"] for m in mem if m["phase"] == "decode"]
        if dec:
            ax2.axvspan(min(dec), max(dec), alpha=0.08, color=ax2.lines[-1].get_color())
    ax1.set(xlabel="tokens generated", ylabel="accepted / drafted per round", ylim=(-0.05, 1.05),
            title=f"{runs[0]['method']}: acceptance per verification round")
    ax2.set(xlabel="seconds since start", ylabel="RSS (MiB)", title="memory (shaded: decoding)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_png(fig, path)
