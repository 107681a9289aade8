"""Which product reads a draft's weights fastest on this machine: every linear layer of the embedded
SmolLM2 applied to one row, cold, in each draft weight format (models/quantized.py) against float32.

    .venv/bin/python scripts/weight_formats.py --threads 2 --json results/weight_formats.json
    .venv/bin/python scripts/weight_formats.py --threads 2 --rows 5 --json results/weight_formats_5rows.json
    .venv/bin/python scripts/weight_formats.py --torchao      # also torchao's configs, where it imports

The benchmark is sparsespec.reports.weight_formats.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--rows", type=int, default=1, help="rows a product takes: 1 for a draft step, k + 1 for verification")
    p.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: torch's)")
    p.add_argument("--torchao", action="store_true", help="also time torchao's weight-only int8 / int4 configs")
    p.add_argument("--json", default=None, help="save the report here")
    args = p.parse_args(argv)
    import torch

    from sparsespec.provenance import Provenance
    from sparsespec.reports.weight_formats import bench_weight_formats, weight_formats_table

    if args.threads:
        torch.set_num_threads(args.threads)
    prov = Provenance.begin()
    report = bench_weight_formats(args.repeats, print, rows=args.rows, torchao=args.torchao)
    report["command"] = "python scripts/weight_formats.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report["provenance"] = prov.end()
    print(weight_formats_table(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
