"""Micro-benchmarks behind the choices in docs/performance.md, on synthetic tensors shaped like
SmolLM2-135M's cache (30 layers, 3 KV heads of 64, 9 query heads) at one context length.

    .venv/bin/python scripts/microbench.py --ctx 32k            # gather of a sparse view
    .venv/bin/python scripts/microbench.py --attention --ctx 4k,32k,64k --json results/attention_kernel.json

- gather: a 10% sparse view copied into the reused compact cache, torch.gather (the index
  expanded over head_dim) vs index_select of whole rows per head (what KVCache.gather does);
- skinny products (`--skinny`): a few rows against every weight of a decode step, cold, as F.linear
  and as models.runner.linear takes them (`--json FILE` saves the table docs/performance.md shows);
- attention (`--attention`): a few new tokens against every layer's cache, cold, through each
  build of the CPU kernel (the processor's own and, on x86-64, the AVX2 one) and PyTorch's path,
  and the recall index's refresh (kv.capture.attention_mass) the same ways, against a plain read of
  the same keys and values (`--json FILE` saves the table docs/performance.md shows, with the
  processor and the instruction set of each build).
Prints the median of --repeats timed calls after one warm-up. The benchmarks are
sparsespec.reports.kernels; they call the library's own kernels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsespec.config import parse_ctx  # noqa: E402
from sparsespec.reports.kernels import bench_gather  # noqa: E402
from sparsespec.reports.skinny import bench_skinny  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="32k", help="context length (--attention: comma-separated lengths)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--skinny", action="store_true", help="only the skinny-product benchmark")
    p.add_argument("--attention", action="store_true", help="only the attention-kernel benchmark")
    p.add_argument("--json", default=None, help="with --skinny or --attention: save its report here")
    args = p.parse_args(argv)
    if args.skinny or args.attention:
        import json

        from sparsespec.provenance import Provenance
        from sparsespec.reports.attention_kernel import bench_attention

        ctxs = [parse_ctx(c) for c in args.ctx.split(",")]
        prov = Provenance.begin()
        report = bench_skinny(args.repeats, print) if args.skinny else bench_attention(ctxs, args.repeats, print)
        report["command"] = "python scripts/microbench.py " + " ".join(sys.argv[1:] if argv is None else argv)
        report["provenance"] = prov.end()
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1))
        return
    bench_gather(parse_ctx(args.ctx), args.repeats, print)


if __name__ == "__main__":
    main()
