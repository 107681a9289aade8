"""Rebuild the evaluation report from one or more results files or run directories.

    python scripts/report.py RUN1/results.jsonl RUN2/results.jsonl --out DIR
    python scripts/report.py OUT_DIR --out DIR      # a sharded run: merges every shard's file

Writes DIR/summary.json, DIR/summary.md and the plots (speedup vs ctx, acceptance vs ctx and vs
budget, accepted-length histogram) exactly as evaluate.py does at the end of a run, over the rows
of every file given. A run directory stands for all its results files: results.jsonl and the
results.shard-<i>-of-<n>.jsonl that `shard=i/n` processes write (a missing shard is warned about).
Joining runs at several ctx or budgets draws the curves across them; a row present in two files
counts once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsespec.eval.summary import build_report, to_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="results files or run directories (all their results*.jsonl)")
    ap.add_argument("--out", required=True, help="directory for summary.json, summary.md and the plots")
    args = ap.parse_args(argv)
    try:
        report = build_report(args.results, args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(to_markdown(report["summary"]))
    for p in report["plots"]:
        print(f"plot: {p}")
    print(f"summary: {Path(args.out) / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
