"""BudgetDraft's Figure 1 where a budget effect can show: trained drafters of each recipe (one
directory per seed) scored on held-out book text and on far-copy text, by context and KV budget.

    python scripts/figure1.py untrained multi='outputs/figure1/multi_s*/drafter' \
        single='outputs/figure1/single_s*/drafter' full='outputs/figure1/full_s*/drafter' \
        --ctx 4k,8k,16k --json results/figure1.json

Train the drafters first (conf/experiment/figure1.yaml gives the commands). Each finished window is
kept in JSON.partial.jsonl; `--resume` picks a stopped run up there. The measurement, the tables and
the plot are sparsespec.reports.figure1; docs/training.md renders the saved report
(`python scripts/docs.py`).
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
from sparsespec.reports.control import add_text_args, text_args  # noqa: E402
from sparsespec.reports.figure1 import markdown  # noqa: E402

log = logging.getLogger("figure1")


@exit_on_error
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("drafters", nargs="+", help="LABEL=DIR[,DIR...] (globs allowed; one dir per seed) or `untrained`")
    p.add_argument("--ctx", default="4k,8k,16k", help="comma-separated context lengths")
    p.add_argument("--budgets", default="64,256,1024,2048,full", help="streaming KV budgets (tokens, or full)")
    add_text_args(p, offsets="0.02")
    p.add_argument("--n-layers", type=int, default=2, help="layers of the `untrained` drafter")
    p.add_argument("--threads", type=int, default=None)
    add_checkpoint_args(p, "windows")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        ctxs = [parse_ctx(c) for c in args.ctx.split(",")]
    except ValueError as e:
        raise ReportError(f"--ctx: {e}") from None
    offsets, distances = text_args(args)
    budgets = int_list("budgets", args.budgets, full=True)
    import torch

    from sparsespec.reports.agreement import parse_groups
    from sparsespec.reports.figure1 import measure

    if args.threads:
        torch.set_num_threads(args.threads)
    groups = parse_groups(args.drafters)
    settings = {"ctx": ctxs, "groups": groups, "budgets": budgets, "distances": distances, "span": args.span,
                "warmup": args.warmup, "offsets": offsets, "data": args.data, "model": args.model}
    return checkpointed_report(
        "figure1.py", args, argv, settings,
        lambda checkpoint: measure(ctxs, groups, budgets=budgets, distances=distances, span=args.span,
                                   warmup=args.warmup, offsets=offsets, books=args.books, data=args.data,
                                   checkpoint=checkpoint, n_layers=args.n_layers, model_path=args.model,
                                   say=log.info), markdown)


if __name__ == "__main__":
    main()
