"""A small drafter's draft step under a streaming KV budget, its whole cache masked against the
windowed cache that holds only the sinks and the window, at several contexts.

    python scripts/drafter_kv.py --ctx 4k,16k,32k --json results/drafter_kv.json

The measurement and the table are sparsespec.reports.drafter_kv; docs/benchmarks.md renders the
saved report (`python scripts/docs.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparsespec.config import parse_ctx  # noqa: E402
from sparsespec.provenance import Provenance  # noqa: E402
from sparsespec.reports import ReportError, exit_on_error  # noqa: E402
from sparsespec.reports.drafter_kv import measure, table  # noqa: E402


@exit_on_error
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4k,16k,32k")
    p.add_argument("--steps", type=int, default=40, help="timed draft steps per (ctx, variant)")
    p.add_argument("--budget", type=int, default=1024, help="the streaming budget (budgetdraft's default)")
    p.add_argument("--layers", type=int, default=2, help="layers of the truncated drafter")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    try:
        ctxs = [parse_ctx(c) for c in args.ctx.split(",")]
    except ValueError as e:
        raise ReportError(f"--ctx: {e}") from None
    if args.steps < 5:
        raise ReportError("--steps: at least 5 (the first 3 are not counted)")
    prov = Provenance.begin()
    report = {**measure(ctxs, args.steps, args.budget, args.layers, print),
              "command": "python scripts/drafter_kv.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    report["provenance"] = prov.end()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(table(report))
    return report


if __name__ == "__main__":
    main()
