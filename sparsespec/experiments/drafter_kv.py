"""A small drafter's draft step under a streaming KV budget: its cache holding every position and
masking all but the view (how it decoded before), against the windowed cache that holds only the
sinks and the window (ModelDrafter now). The drafter is a 2-layer truncated copy of the embedded
SmolLM2 (its speed is what is measured; acceptance is not), float32, after a prompt of ctx tokens.
`markdown` renders a saved report (no torch needed); docs/benchmarks.md shows it.

    python -m sparsespec.experiments drafter_kv --ctx 4k,16k,32k --out results/drafter_kv.json
"""

from __future__ import annotations

import statistics
import time

from sparsespec.experiments import ExperimentError

OPTIONS = {"ctx": "4k,16k,32k"}



def arguments(p) -> None:
    p.add_argument("--steps", type=int, default=40, help="timed draft steps per (ctx, variant)")
    p.add_argument("--budget", type=int, default=1024, help="the streaming budget (budgetdraft's default)")
    p.add_argument("--layers", type=int, default=2, help="layers of the truncated drafter")


def check(args) -> None:
    if args.steps < 5:
        raise ExperimentError("--steps: at least 5 (the first 3 are not counted)")


VARIANTS = {"whole cache, masked": 1 << 40, "windowed": None}  # EVICT_EVERY: never, or the class default


def measure(args, checkpoint) -> dict:
    """{budget, layers, rows}: per (ctx, variant) the median draft step in ms, the entries per layer
    held after the prompt and at the most, and the cache's allocated bytes."""
    import torch

    from sparsespec.decoding.drafters import DecodeState, ModelDrafter
    from sparsespec.kv.policies import StreamingKV
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM
    from sparsespec.training.drafters import truncated

    steps, budget, layers, say = args.steps, args.budget, args.layers, print
    rows = []
    for ctx in args.ctx:
        hf = load_model(None, "float32", ctx=ctx + 2 * steps, device="cpu").model
        lm = CausalLM(truncated(hf, layers))
        del hf
        ids = torch.randint(100, 40000, (ctx + steps,), generator=torch.Generator().manual_seed(ctx)).tolist()
        for name, evict_every in VARIANTS.items():
            drafter = ModelDrafter(lm, StreamingKV(budget=budget, k_sink=16))
            if evict_every is not None:
                drafter.EVICT_EVERY = evict_every
            t0 = time.perf_counter()
            drafter.start(DecodeState(lm, None, ids[:ctx], ctx))
            prefill_s = time.perf_counter() - t0
            held_after_prompt = drafter.cache.length
            times = []
            for i in range(steps):
                t0 = time.perf_counter()
                lm.forward_many([drafter._block(ids[ctx + i : ctx + i + 1])])
                drafter._evict()
                times.append(time.perf_counter() - t0)
            row = {"ctx": ctx, "variant": name, "step_ms": 1000 * statistics.median(times[3:]),
                   "step_ms_runs": [1000 * t for t in times], "prefill_s": prefill_s,
                   "entries_after_prompt": held_after_prompt, "peak_entries": drafter.report()["drafter_kv_tokens"],
                   "cache_mb": drafter.cache.nbytes() / 1e6}
            rows.append(row)
            say(f"ctx {ctx} {name}: {row['step_ms']:.1f} ms a draft step, {held_after_prompt} entries held "
                f"after the prompt, {row['cache_mb']:.0f} MB allocated")
            del drafter
    return {"budget": budget, "layers": layers, "steps": steps, "rows": rows}


def markdown(report: dict) -> str:
    lines = ["| ctx | variant | draft step ms | entries per layer after the prompt | most entries | cache MB "
             "| prefill s |", "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        ctx = f"{r['ctx'] // 1024}k" if r["ctx"] % 1024 == 0 else str(r["ctx"])
        spread = statistics.stdev(r["step_ms_runs"][3:]) if len(r["step_ms_runs"]) > 4 else 0.0
        lines.append(f"| {ctx} | {r['variant']} | {r['step_ms']:.1f} ± {spread:.1f} | {r['entries_after_prompt']} "
                     f"| {r['peak_entries']} | {r['cache_mb']:.0f} | {r['prefill_s']:.1f} |")
    return "\n".join(lines) + "\n"
