"""SparseSpec-L's sensitivity to its index budget (ratio of the context) and query window W: α, γ
and speedup over ar on the held-out books, with the speedup identity's prediction beside each.

    python scripts/sensitivity.py --ctx 16k,32k --json results/sensitivity.json

Each finished window of text is kept in JSON.partial.jsonl; `--resume` picks a stopped run up there.
The measurement, the table and the plot are sparsespec.reports.sensitivity; docs/benchmarks.md
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
from sparsespec.reports.sensitivity import markdown  # noqa: E402

log = logging.getLogger("sensitivity")


@exit_on_error
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="16k,32k", help="comma-separated context lengths")
    p.add_argument("--ratios", default="0.02,0.05,0.1,0.2", help="index budgets, as shares of the context")
    p.add_argument("--windows", default="4,16,64", help="verification queries W that score the index")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--books", type=int, default=2, help="held-out windows per context (one per book)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs of every setting per window")
    p.add_argument("--model", default=None, help="the target (default: the embedded model)")
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")
    p.add_argument("--threads", type=int, default=None)
    add_checkpoint_args(p, "windows")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        ctxs = [parse_ctx(c) for c in args.ctx.split(",")]
        ratios = [float(r) for r in args.ratios.split(",")]
        windows = [int(w) for w in args.windows.split(",")]
    except ValueError as e:
        raise ReportError(f"--ctx / --ratios / --windows: {e}") from None
    if not all(0 < r <= 1 for r in ratios) or min(windows) < 1 or args.new_tokens < 8 or args.repeats < 1:
        raise ReportError("--ratios take shares in (0, 1], --windows positive counts, --new-tokens at least 8, "
                          "--repeats at least 1")
    import torch

    from sparsespec.reports.sensitivity import measure

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = {"ctx": ctxs, "ratios": ratios, "windows": windows, "new_tokens": args.new_tokens,
                "repeats": args.repeats, "data": args.data, "model": args.model}
    return checkpointed_report(
        "sensitivity.py", args, argv, settings,
        lambda checkpoint: measure(ctxs, ratios=ratios, windows=windows, new_tokens=args.new_tokens, books=args.books,
                                   repeats=args.repeats, data=args.data, checkpoint=checkpoint,
                                   model_path=args.model, say=log.info), markdown)


if __name__ == "__main__":
    main()
