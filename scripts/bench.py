"""Side-by-side decoding benchmark: Hugging Face generate / assisted / prompt lookup vs this
project's methods, in one process, on the same prompts.

    python scripts/bench.py --ctx 4k,8k,16k,32k --new-tokens 128 --repeats 3 --write docs/benchmarks.md

Protocol (docs/benchmarks.md repeats it next to the numbers):
- prompts: windows of `--ctx` tokens from PG-19 books (the six shipped with the package by default);
- our methods: the target cache is prefilled once per prompt (all but the last 64 tokens) and
  reused, so a run times its decoding only: decode tok/s = (new_tokens - 1) / wall_s;
- HF `generate()`: given the same prefilled cache as a DynamicCache (it runs the last 64 prompt
  tokens itself), decode tok/s =
  (N - 1) / (t(N) - t(1)) — the first token, produced by the prefill, is excluded on both sides;
- HF assisted / prompt lookup (which re-prefill their own state): (N - 1) / (t(N) - t(1)) with a
  full prefill in both calls, only at ctx <= --hf-full-max (their prefills dominate the run);
- bandwidth floor: (weight bytes + KV bytes read per token) / the read bandwidth measured here;
- peak memory: the process' peak RSS so far (monotone over the run).
- each method on each prompt: --warmup untimed runs of --warmup-tokens, then --repeats timed runs;
- each finished prompt is checkpointed beside --json; `--resume` picks a stopped run up there.
Every speculative method's greedy output is compared with our ar and with HF generate.
The measurement is sparsespec.reports.bench_run; the tables and plot sparsespec.reports.bench.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparsespec.config import parse_ctx  # noqa: E402
from sparsespec.reports import ReportError, exit_on_error  # noqa: E402
from sparsespec.reports.bench import publish  # noqa: E402

log = logging.getLogger("bench")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4k,8k,16k,32k", help="comma-separated context lengths")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each method before its repeats, each "
                   "decoding --warmup-tokens (threads, allocator and kernels warm up; the tokens are not needed)")
    p.add_argument("--warmup-tokens", type=int, default=32)
    p.add_argument("--samples", type=int, default=1, help="books (prompts) per ctx")
    p.add_argument("--methods", default="hf,hf_assisted,hf_lookup,ar,sd,magicdec,sparsespec_l,budgetdraft",
                   help="comma-separated; a method may carry overrides: sparsespec_l:controller=fixed:k=8")
    p.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--drafter-path", default=None,
                   help="drafter for sd / budgetdraft / hf_assisted (default: latest train.py export)")
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")
    p.add_argument("--split", default="test", choices=("test", "train", "eval"),
                   help="PG-19 books: test = all, eval = the 2 held out from drafter training (use it when a "
                        "trained drafter runs: its training windows start where these prompts do)")
    p.add_argument("--hf-full-max", default="8k", help="largest ctx for HF assisted / prompt lookup")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="write raw results here; each finished sample is also kept in "
                   "JSON.partial.jsonl until the run ends")
    p.add_argument("--resume", action="store_true", help="reuse the finished samples in JSON.partial.jsonl")
    p.add_argument("--render", default=None, metavar="JSON", help="run nothing: re-render a saved --json report "
                   "(with --write/--name/--plot)")
    p.add_argument("--write", default=None, help="markdown file to put the table in (a section per --name)")
    p.add_argument("--name", default="decode", help="section name in the markdown file")
    p.add_argument("--plot", default=None, help="PNG of decode tok/s vs ctx per method")
    return p.parse_args(argv)


def show(report: dict, args: argparse.Namespace) -> None:
    """The report's markdown on stdout, and in --write's section and --plot's PNG when asked."""
    print(publish(report, Path(args.write) if args.write else None, args.name, Path(args.plot) if args.plot else None))


@exit_on_error
def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.render:  # a saved report's markdown again (after the table format changed), without rerunning it
        if not Path(args.render).is_file():
            raise ReportError(f"--render: {args.render} is not a file (a report written by --json)")
        report = json.loads(Path(args.render).read_text())
        show(report, args)
        return report
    import torch

    from sparsespec.provenance import Provenance
    from sparsespec.reports.bench_run import BenchPlan, measure
    from sparsespec.reports.checkpoint import Checkpoint

    prov = Provenance.begin()
    torch.set_num_threads(args.threads or torch.get_num_threads())
    plan = BenchPlan(ctxs=[parse_ctx(c) for c in args.ctx.split(",")], specs=[s for s in args.methods.split(",") if s],
                     new_tokens=args.new_tokens, repeats=args.repeats, warmup=args.warmup,
                     warmup_tokens=args.warmup_tokens, samples=args.samples, model_path=args.model_path,
                     dtype=args.dtype, drafter_path=args.drafter_path, data=args.data, split=args.split,
                     hf_full_max=parse_ctx(args.hf_full_max))
    checkpoint = Checkpoint.open(args.json, plan.settings(), args.resume)
    report = {"args": vars(args), **measure(plan, checkpoint, log.info),
              "command": "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    report["provenance"] = checkpoint.provenance(prov)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    show(report, args)
    checkpoint.close()
    return report


if __name__ == "__main__":
    main()
