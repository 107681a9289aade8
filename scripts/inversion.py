"""Efficiency inversion (SparseSpec-L, referee objection on the speedup model): sweep a fixed draft
length k at one budget and context, and compare the measured speedup with S = (αk + 1) / (kγ + 1).

    python scripts/inversion.py --ctx 16k --ratio 0.10 --ks 1,2,4,8,12,16,20 --write docs/benchmarks.md

Longer drafts pay γ per token but the share of them accepted falls; once the acceptance α of the
drafted tokens drops below γ a longer draft costs more than it returns, and the speedup turns
down. The plot marks the first k where α < γ. The entropy controller's run is shown for reference.
The runs are timed as scripts/bench.py times them (sparsespec.reports.timing); the rows, table and
plot are sparsespec.reports.inversion.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsespec.provenance import Provenance  # noqa: E402
from sparsespec.reports import exit_on_error  # noqa: E402
from sparsespec.reports.inversion import markdown, plot, sweep_rows, sweep_specs  # noqa: E402
from sparsespec.reports.sections import write_section  # noqa: E402

log = logging.getLogger("inversion")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="16k")
    p.add_argument("--ratio", type=float, default=0.10)
    p.add_argument("--method", default="sparsespec_l", help="self-speculative method whose k is swept")
    p.add_argument("--ks", default="1,2,4,8,12,16,20")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--model-path", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="outputs/inversion", help="directory for inversion.png / .json")
    p.add_argument("--write", default=None, help="markdown file for the table (section 'inversion')")
    return p.parse_args(argv)


@exit_on_error
def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import torch

    from sparsespec.config import parse_ctx
    from sparsespec.data import load_samples
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM
    from sparsespec.reports.timing import interleaved_runs, our_method, prefill_once

    if args.threads:
        torch.set_num_threads(args.threads)
    prov = Provenance.begin()
    ctx = parse_ctx(args.ctx)
    loaded = load_model(args.model_path, args.dtype, ctx=ctx + args.new_tokens)
    target = CausalLM(loaded.model)
    methods = {s: our_method(s) for s in sweep_specs(args.method, [int(k) for k in args.ks.split(",")], args.ratio)}
    rows = []
    for sample in load_samples("pg19", loaded.tokenizer, ctx, path=args.data, limit=args.samples):
        shared, prefill_s = prefill_once(target, sample, args.new_tokens)
        log.info("%s: prefill %.1f s", sample.sample_id, prefill_s)
        # the methods take turns within each repeat, so drift in machine load hits every k alike
        runs = interleaved_runs(methods, target, sample.prompt_ids, args.new_tokens, shared, args.repeats)
        for r in sweep_rows(sample.sample_id, runs):
            rows.append(r)
            log.info("%-40s k=%.1f α=%.2f γ=%.3f S=%.2f Ŝ=%.2f", r["method"], r["k"], r["alpha"], r["gamma"],
                     r["speedup"], r["predicted"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "rows": rows,
              "command": "python scripts/inversion.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "provenance": prov.end()}
    (out / "inversion.json").write_text(json.dumps(report, indent=1))
    plot(rows, out / "inversion.png", f"{args.method}, ctx {args.ctx}, ratio {args.ratio}")
    table = markdown(report, out / "inversion.png")
    print(table)
    if args.write:
        write_section(Path(args.write), "inversion", table)
    return report


if __name__ == "__main__":
    main()
