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
from sparsespec.reports.control import add_text_args, markdown, text_args  # noqa: E402

log = logging.getLogger("control")


@exit_on_error
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4k", help="window length")
    p.add_argument("--layers", default="2,8,16,30", help="drafter depths N (the target's layer count = itself)")
    p.add_argument("--budgets", default="64,256,1024,full", help="streaming KV budgets (tokens, or full)")
    add_text_args(p, offsets="0.02,0.3")
    add_checkpoint_args(p, "windows")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        ctx = parse_ctx(args.ctx)
    except ValueError as e:
        raise ReportError(f"--ctx: {e}") from None
    offsets, distances = text_args(args)
    layers, budgets = int_list("layers", args.layers), int_list("budgets", args.budgets, full=True)
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
