"""How fast the CPU attention kernel reads a draft's int8 K/V, per byte, against float32 K/V.

    python -m sparsespec.plan.kv_formats --out results/plan_kv_formats.json   # about a minute, under the bench lock

An int8 view holds a quarter of float32's bytes (and a float32 scale per row), but the kernel
dequantizes keys and values as they stream past, so on a CPU with few cores it does not run four
times faster. This times one new token's attention over every layer's K/V of the embedded model's
shape, float32 and int8 in turns, at a few contexts; the profile (`format_share` of attention) takes
the int8 rate per byte as a share of float32's, as it takes the weight formats' from their
microbenchmark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from sparsespec.plan.profile import ROOT

OUT = ROOT / "results" / "plan_kv_formats.json"
COMMAND = "python -m sparsespec.plan.kv_formats --out results/plan_kv_formats.json"


def bench(ctxs: list[int], repeats: int = 5) -> dict:
    import torch

    from sparsespec.kernels import cpu_attention
    from sparsespec.plan.shapes import load_shape

    shape = load_shape("smollm2-135m")  # the embedded model's K/V, as a draft step reads them
    LAYERS, HKV, HQ, D = shape.layers, shape.kv_heads, shape.heads, shape.head_dim  # noqa: N806

    if not cpu_attention.available():
        raise RuntimeError("the CPU attention kernel could not be built here; nothing to time")
    rows = []
    for ctx in ctxs:
        fp = [(torch.randn(HKV, ctx, D), torch.randn(HKV, ctx, D)) for _ in range(LAYERS)]
        i8 = [(torch.randint(-127, 128, (HKV, ctx, D), dtype=torch.int8), torch.rand(HKV, ctx),
               torch.randint(-127, 128, (HKV, ctx, D), dtype=torch.int8), torch.rand(HKV, ctx)) for _ in range(LAYERS)]
        q = torch.randn(HQ, 1, D)
        paths = {"float32": lambda q=q, fp=fp: [cpu_attention.few_rows_attention(q, k, v, 0.125) for k, v in fp],
                 "int8": lambda q=q, i8=i8: [cpu_attention.few_rows_attention_int8(q, k, ks, v, vs, 0.125)
                                            for k, ks, v, vs in i8]}
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(repeats + 1):  # in turns, the first turn a warm-up
            for name, fn in paths.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        ms = {name: statistics.median(t[1:]) * 1e3 for name, t in times.items()}
        b = {"float32": 2 * LAYERS * HKV * ctx * D * 4, "int8": 2 * LAYERS * HKV * ctx * (D + 4)}
        rows.append({"ctx": ctx, "ms": ms, "bytes": b,
                     "int8_share": (b["int8"] / ms["int8"]) / (b["float32"] / ms["float32"])})
        print(f"{ctx} keys: float32 {ms['float32']:.1f} ms, int8 {ms['int8']:.1f} ms: int8 reads at "
              f"{rows[-1]['int8_share']:.2f} of float32's rate per byte")
    return {"rows": rows, "rows_per_step": 1, "layers": LAYERS, "kv_heads": HKV, "heads": HQ, "head_dim": D,
            "threads": torch.get_num_threads(), "repeats": repeats}


def share(report: dict) -> float:
    """The int8 K/V rate per byte over float32's: the median over the contexts timed."""
    return statistics.median(r["int8_share"] for r in report["rows"])


def main(argv: list[str] | None = None) -> int:
    from sparsespec.config import parse_ctx
    from sparsespec.provenance import Provenance

    p = argparse.ArgumentParser(prog="python -m sparsespec.plan.kv_formats", description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4k,16k,32k")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    prov = Provenance.begin()
    rep = bench([parse_ctx(c) for c in args.ctx.split(",")], args.repeats)
    rep.update(command=COMMAND if args.out == OUT else f"python -m sparsespec.plan.kv_formats --out {args.out}",
               provenance=prov.end())
    args.out.write_text(json.dumps(rep, indent=1) + "\n")
    print(f"wrote {args.out}: int8 K/V at {share(rep):.2f} of float32's rate per byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
