"""How often bf16 greedy output differs from fp32 on the embedded model (docs/performance.md).

    python scripts/dtype_divergence.py --ctx 1024 --samples 12 --new-tokens 64 --json results/dtype_divergence.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsespec.provenance import Provenance  # noqa: E402
from sparsespec.reports import dtypes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=int, default=1024, help="prompt length in tokens")
    ap.add_argument("--samples", type=int, default=12, help="prompts (one PG-19 book each)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--methods", default="ar,magicdec,sparsespec_l", help="comma-separated method names")
    ap.add_argument("--json", required=True, help="where the report goes (written once the run is complete)")
    args = ap.parse_args(argv)
    for key in ("ctx", "samples", "new_tokens"):
        if getattr(args, key) <= 0:
            ap.error(f"--{key.replace('_', '-')} must be positive")
    prov = Provenance.begin()
    report = dtypes.measure(args.ctx, args.samples, args.new_tokens, args.methods.split(","),
                            say=lambda s: print(s, file=sys.stderr, flush=True))
    report["provenance"] = prov.end()
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(dtypes.markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
