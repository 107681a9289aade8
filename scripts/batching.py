"""Batched decoding: aggregate tokens/s of ar, magicdec and sparsespec_l at several contexts and
batch sizes, on windows of the held-out PG-19 books, on the embedded model in float32.

    python scripts/batching.py --ctx 4k,16k,32k --batch 1,2,4,8 --max-batch-tokens 64k --json results/batching.json

Each finished (ctx, batch) is kept in JSON.partial.jsonl; `--resume` picks a stopped run up there.
The measurement and the table are sparsespec.reports.batching; docs/benchmarks.md renders the saved
report (`python scripts/docs.py`).
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
from sparsespec.reports.batching import markdown  # noqa: E402
from sparsespec.reports.checkpoint import add_checkpoint_args, checkpointed_report  # noqa: E402

log = logging.getLogger("batching")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4k,16k,32k", help="comma-separated context lengths")
    p.add_argument("--batch", default="1,2,4,8", help="comma-separated batch sizes")
    p.add_argument("--max-batch-tokens", default=None, help="leave out a (ctx, batch) whose prompts hold more "
                   "tokens than this together (e.g. 128k: B = 8 at 16k, B = 4 at 32k); default: none left out")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")
    p.add_argument("--threads", type=int, default=None)
    add_checkpoint_args(p, "cells")
    return p.parse_args(argv)


@exit_on_error
def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        ctxs = [parse_ctx(c) for c in args.ctx.split(",")]
        batches = sorted({int(b) for b in args.batch.split(",")})
        max_tokens = parse_ctx(args.max_batch_tokens) if args.max_batch_tokens else None
    except ValueError as e:
        raise ReportError(f"--ctx / --batch: {e}") from None
    if not batches or min(batches) < 1 or args.new_tokens < 2 or args.repeats < 1:
        raise ReportError("--batch takes positive sizes, --new-tokens at least 2, --repeats at least 1")
    import torch

    from sparsespec.reports.batching import measure

    torch.set_num_threads(args.threads or torch.get_num_threads())
    settings = {"ctx": ctxs, "new_tokens": args.new_tokens, "repeats": args.repeats, "data": args.data}
    return checkpointed_report(
        "batching.py", args, argv, settings,
        lambda checkpoint: measure(ctxs, batches, args.new_tokens, args.repeats, args.data, checkpoint, log.info,
                                   max_tokens), markdown)


if __name__ == "__main__":
    main()
