"""Rebuild every results table and plot in README.md and docs/ from the committed files in results/.

    python scripts/docs.py            # rewrite the marked sections and the plots (make docs)
    python scripts/docs.py --check    # change nothing; exit 1 listing the sections that differ

A section of a markdown file is marked, and everything between the two lines is generated:

    <!-- results: RENDERER PATH [PATH ...] [key=value ...] -->
    <!-- /results -->

PATH is a results file (`.json`, a scripts/bench.py or budgetdraft_results.py report) or an
evaluate.py run directory (its results files and command.txt), relative to the repository root;
globs are expanded. Each section ends with the command that made its numbers and a link to them.
sparsespec.reports.renderers lists the renderers; a `plot.*` renderer also writes the PNG named by
`img=`. The rebuild itself is sparsespec.reports.rebuild.

A number quoted in prose is read from a table the same way, so it cannot go stale either:

    <!-- table speed = bench.speed results/decode.json -->           (once per file, on its own line)
    ... is <!-- n speed: 64k,ar @ × HF generate -->7.22<!-- /n -->× Hugging Face ...

(sparsespec.reports.quoted: rows by their cells, a column by its header, ranges, one ÷, digits).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparsespec.reports import rebuild  # noqa: E402


def sections(root: Path = ROOT) -> dict[str, list[str]]:
    """doc -> the specs of its marked sections."""
    return rebuild.sections(root)


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; fail if a section is out of date")
    args = ap.parse_args(argv)
    try:
        stale = rebuild.stale_docs(root, write=not args.check)
    except (OSError, KeyError, ValueError) as e:  # a DocsError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check and stale:
        print("out of date (run `make docs`): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "every results section is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
