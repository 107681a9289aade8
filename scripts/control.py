"""The positive control for BudgetDraft's budget effect: agreement of layer-truncated drafters with
the target under streaming KV budgets, on held-out book text and on text whose last stretch is copied
from D tokens back.

    python scripts/control.py --ctx 4k --json results/control.json

Each finished window is kept in JSON.partial.jsonl; `--resume` picks a stopped run up there. The
measurement, the table and the plot are sparsespec.reports.control; docs/training.md renders the
saved report (`python scripts/docs.py`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparsespec.config import parse_ctx  # noqa: E402
from sparsespec.reports import ReportError, exit_on_error, int_list  # noqa: E402
from sparsespec.reports.checkpoint import add_checkpoint_args, checkpointed_report  # noqa: E402
from sparsespec.reports.control import markdown  # noqa: E402

log = logging.getLogger("control")


@exit_on_error
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4k", help="window length")
    p.add_argument("--distances", default="200,700,2000,3800", help="copy distances D, in tokens")
    p.add_argument("--layers", default="2,8,16,30", help="drafter depths N (the target's layer count = itself)")
    p.add_argument("--budgets", default="64,256,1024,full", help="streaming KV budgets (tokens, or full)")
    p.add_argument("--span", type=int, default=256, help="copied tokens at the end of each window")
    p.add_argument("--warmup", type=int, default=16, help="first tokens of the span not scored")
    p.add_argument("--offsets", default="0.02,0.3", help="where the windows start in each book (fractions)")
    p.add_argument("--books", type=int, default=2, help="held-out books")
    p.add_argument("--model", default=None, help="the target (default: the embedded model)")
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")
    add_checkpoint_args(p, "windows")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        ctx = parse_ctx(args.ctx)
        offsets = [float(o) for o in args.offsets.split(",")]
    except ValueError as e:
        raise ReportError(f"--ctx / --offsets: {e}") from None
    distances, layers = int_list("distances", args.distances), int_list("layers", args.layers)
    budgets = int_list("budgets", args.budgets, full=True)
    if not 0 <= args.warmup < args.span - 1:
        raise ReportError(f"--warmup: between 0 and --span - 2 ({args.span - 2})")
    from sparsespec.reports.control import measure

    settings = {"ctx": ctx, "distances": distances, "layers": layers, "budgets": budgets, "span": args.span,
                "warmup": args.warmup, "data": args.data, "model": args.model}
    return checkpointed_report(
        "control.py", args, argv, settings,
        lambda checkpoint: measure(ctx, distances=distances, layers=layers, budgets=budgets, span=args.span,
                                   warmup=args.warmup, offsets=offsets, books=args.books, data=args.data,
                                   checkpoint=checkpoint, model_path=args.model, say=log.info), markdown)


if __name__ == "__main__":
    main()
