"""A few rows against every weight of a decode step: F.linear (x W^T) against models.runner.linear
(the project's few-rows kernel where it is built, else MKL's product taken as (W x^T)^T), beside a
plain read of the same weights. A batch's decode step has B rows, a verification block k + 1. Timed
cold, as a step reads them: all 30 layers' weights in turn, then the lm_head (SmolLM2-135M's
shapes), the three in turns within each repeat (a timing during which another process used the CPU
is taken again). `markdown` renders a saved report (no torch needed); docs/performance.md shows it.

    python -m sparsespec.experiments skinny --out results/skinny_products.json
"""

from __future__ import annotations

from sparsespec.experiments import Say

LAYERS = 30
# SmolLM2-135M's weight matrices per layer ([out, in]: fused q/k/v, o, fused gate/up, down) and its lm_head
LAYER_WEIGHTS = ((960, 576), (576, 576), (3072, 576), (576, 1536))
LM_HEAD = (49152, 576)
ROWS = (1, 2, 3, 4, 5, 8, 10, 16, 20, 32, 64)
OPTIONS = {"repeats": 7}


def measure(args, checkpoint) -> dict:
    """bench_skinny with the command line's repeats."""
    return bench_skinny(args.repeats, print)


def bench_skinny(repeats: int, say: Say) -> dict:
    """{weight_bytes, repeats, threads, rows}: per row count, both products' time and read rate."""
    import statistics

    import torch

    from sparsespec.experiments.common.cpu_timing import in_turns
    from sparsespec.models.runner import linear

    weights = [[torch.randn(n, k) for n, k in LAYER_WEIGHTS] for _ in range(LAYERS)] + [[torch.randn(*LM_HEAD)]]
    nbytes = sum(w.numel() * 4 for ws in weights for w in ws)

    def step(product, xs):
        return lambda: [product(xs[w.shape[1]], w) for ws in weights for w in ws]

    rows = []
    for m in ROWS:
        xs = {k: torch.randn(m, k) for _, k in (*LAYER_WEIGHTS, LM_HEAD)}
        times = in_turns({"read": lambda: [w.sum() for ws in weights for w in ws],
                           "F.linear": step(torch.nn.functional.linear, xs), "runner.linear": step(linear, xs)}, repeats)
        read, plain, ours = (statistics.median(times[k]) for k in ("read", "F.linear", "runner.linear"))
        rows.append({"rows": m, "linear_ms": plain, "ours_ms": ours, "linear_gbs": nbytes / plain / 1e6,
                     "ours_gbs": nbytes / ours / 1e6, "read_ms": read,
                     "ours_range_ms": [min(times["runner.linear"]), max(times["runner.linear"])]})
        say(f"{m:3d} rows: read {read:6.1f} ms, F.linear {plain:6.1f} ms, runner.linear {ours:6.1f} ms "
            f"({nbytes / 1e6:.0f} MB of weights)")
    return {"weight_bytes": nbytes, "repeats": repeats, "threads": torch.get_num_threads(), "rows": rows}


def markdown(report: dict) -> str:
    """The saved benchmark as markdown."""
    read = "read_ms" in report["rows"][0]  # plain-read columns from the runs that timed one
    head = "| rows | F.linear ms | GB/s | runner.linear ms | GB/s | faster |" + (
        " plain read ms | runner.linear share of the read |" if read else "")
    lines = [head, "|---|---|---|---|---|---|" + ("---|---|" if read else "")]
    for r in report["rows"]:
        line = (f"| {r['rows']} | {r['linear_ms']:.1f} | {r['linear_gbs']:.1f} | {r['ours_ms']:.1f} "
                f"| {r['ours_gbs']:.1f} | {r['linear_ms'] / r['ours_ms']:.2f}× |")
        if read:
            low, high = r["ours_range_ms"]
            line += (f" {r['read_ms']:.1f} | {r['read_ms'] / r['ours_ms']:.2f} "
                     f"({r['read_ms'] / high:.2f}–{r['read_ms'] / low:.2f}) |")
        lines.append(line)
    note = (f"\n<sub>{report['threads']} threads; median of {report['repeats']} cold passes after one warm-up, "
            "taken in turns; share of the read: the plain read's time over runner.linear's (its range over the "
            "repeats in brackets).</sub>\n") if read else ""
    return "\n".join(lines) + "\n" + note
