"""SparseSpec-L's entropy controller against fixed draft lengths and a hindsight oracle, greedy and
sampled, with its calibration by entropy bin and a test of its independence assumption.

    python scripts/controller.py --ctx 4k,16k,32k --json results/controller.json

Each finished (window, mode) is kept in JSON.partial.jsonl; `--resume` picks a stopped run up there.
The measurement, the tables and the plot are sparsespec.reports.controller; docs/benchmarks.md
renders the saved report (`python scripts/docs.py`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparsespec.config import parse_ctx  # noqa: E402
from sparsespec.reports import ReportError, exit_on_error  # noqa: E402
from sparsespec.reports.checkpoint import add_checkpoint_args, checkpointed_report  # noqa: E402
from sparsespec.reports.controller import markdown  # noqa: E402

log = logging.getLogger("controller")


@exit_on_error
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4k,16k,32k", help="comma-separated context lengths")
    p.add_argument("--ks", default="1,2,4,8", help="fixed draft lengths")
    p.add_argument("--k-max", type=int, default=16, help="the oracle's round length (also run as a fixed k)")
    p.add_argument("--small", default="1,2,4,8,12,16", help="the entropy controller's candidates that reach small k")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--books", type=int, default=2, help="held-out windows per context (one per book)")
    p.add_argument("--model", default=None, help="the target (default: the embedded model)")
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")
    p.add_argument("--threads", type=int, default=None)
    add_checkpoint_args(p, "windows")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        ctxs = [parse_ctx(c) for c in args.ctx.split(",")]
        ks, small = [int(k) for k in args.ks.split(",")], [int(k) for k in args.small.split(",")]
    except ValueError as e:
        raise ReportError(f"--ctx / --ks / --small: {e}") from None
    if min(ks + small) < 1 or max(ks) > args.k_max or args.new_tokens < 8:
        raise ReportError("--ks and --small take positive lengths, --ks at most --k-max; --new-tokens at least 8")
    import torch

    from sparsespec.reports.controller import measure

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = {"ctx": ctxs, "ks": ks, "k_max": args.k_max, "small": small, "new_tokens": args.new_tokens,
                "data": args.data, "model": args.model}
    return checkpointed_report(
        "controller.py", args, argv, settings,
        lambda checkpoint: measure(ctxs, ks=ks, k_max=args.k_max, small=small, new_tokens=args.new_tokens,
                                   books=args.books, data=args.data, checkpoint=checkpoint, model_path=args.model,
                                   say=log.info), markdown)


if __name__ == "__main__":
    main()
