"""How often greedy output in bfloat16 differs from float32 on the same prompts: `ar` and the
self-speculative methods, each in bf16, against `ar` in fp32 (the output the exactness tests hold
every method to), and each bf16 method against bf16 `ar` (what a bf16 benchmark compares).
`markdown` renders the saved report for docs/performance.md.

    python -m sparsespec.experiments dtype_divergence --ctx 1024 --books 12 --new-tokens 64 --out results/dtype_divergence.json
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from sparsespec.experiments import Say, silent

OPTIONS = {"ctx": "1024", "books": 12, "new_tokens": 64}


def arguments(p) -> None:
    p.add_argument("--methods", default="ar,magicdec,sparsespec_l", help="comma-separated method names")


def check(args) -> None:
    from sparsespec.experiments import ExperimentError

    if len(args.ctx) != 1:
        raise ExperimentError(f"--ctx: one prompt length, got {len(args.ctx)}")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (None: identical)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def measure(args, checkpoint) -> dict[str, Any]:
    """compare() on --books prompts (one PG-19 book each) of --ctx tokens."""
    import sys

    return compare(args.ctx[0], args.books, args.new_tokens, args.methods.split(","),
                   say=lambda s: print(s, file=sys.stderr, flush=True))


def compare(ctx: int, samples: int, new_tokens: int, methods: list[str], say: Say = silent) -> dict[str, Any]:
    """Greedy outputs of `methods` (ar first) in fp32 and bf16 on `samples` PG-19 windows of the
    embedded model, compared position by position. Runs on the CPU (bf16 upcasts nothing but the
    logits, as on a GPU)."""
    from sparsespec.config import load_method
    from sparsespec.data import load_samples
    from sparsespec.decoding.sampling import Sampling
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    methods = ["ar", *[m for m in methods if m != "ar"]]
    built = {m: load_method(m) for m in methods}
    outputs: dict[str, dict[str, list[list[int]]]] = {}
    prompts = None
    for dtype in ("float32", "bfloat16"):
        loaded = load_model(None, dtype=dtype, device="cpu", ctx=ctx + new_tokens)
        target = CausalLM(loaded.model)
        if prompts is None:
            prompts = [s.prompt_ids for s in load_samples("pg19", loaded.tokenizer, ctx, limit=samples, split="test")]
        for m in methods if dtype == "bfloat16" else ["ar"]:
            outs = outputs.setdefault(dtype, {}).setdefault(m, [])
            for i, prompt in enumerate(prompts):
                res = built[m].build(target).generate(prompt, new_tokens, Sampling())
                outs.append(res.output_ids)
                say(f"{dtype} {m} sample {i + 1}/{len(prompts)}")
        del loaded, target
    reference = outputs["float32"]["ar"]
    rows = []
    for m, outs in outputs["bfloat16"].items():
        vs_fp32 = [first_difference(o, r) for o, r in zip(outs, reference, strict=True)]
        vs_bf16_ar = [first_difference(o, r) for o, r in zip(outs, outputs["bfloat16"]["ar"], strict=True)]
        rows.append({"method": m, "dtype": "bfloat16", "samples": len(outs),
                     "identical_to_fp32_ar": sum(d is None for d in vs_fp32),
                     "first_difference_vs_fp32": vs_fp32,
                     "identical_to_bf16_ar": sum(d is None for d in vs_bf16_ar),
                     "first_difference_vs_bf16_ar": vs_bf16_ar})
    return {"model": "embedded SmolLM2-135M-Instruct", "device": "cpu", "ctx": ctx, "new_tokens": new_tokens,
            "dataset": "pg19 (test split, one window per book)", "torch": torch.__version__, "rows": rows}


def _where(diffs: list[int | None]) -> str:
    d = [x for x in diffs if x is not None]
    return "—" if not d else f"median {statistics.median(d):g} (range {min(d)}–{max(d)})"


def markdown(report: dict) -> str:
    n = report["rows"][0]["samples"] if report["rows"] else 0
    lines = [f"{report['model']}, greedy, {n} prompts of {report['ctx']} tokens ({report['dataset']}), "
             f"{report['new_tokens']} new tokens, on the {report['device']}.", "",
             "| method (bf16) | same as fp32 ar | first differing token vs fp32 ar | same as bf16 ar "
             "| first differing token vs bf16 ar |", "|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['method']} | {r['identical_to_fp32_ar']}/{r['samples']} | {_where(r['first_difference_vs_fp32'])} "
                     f"| {r['identical_to_bf16_ar']}/{r['samples']} | {_where(r['first_difference_vs_bf16_ar'])} |")
    return "\n".join(lines)
