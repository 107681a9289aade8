"""A few rows against every weight of a decode step: F.linear (x W^T) against (W x^T)^T, which
models.runner.linear takes for 2..64 rows on the CPU. A batch's decode step has B rows, a
verification block k + 1. Timed cold, as a step reads them: all 30 layers' weights in turn, then the
lm_head (SmolLM2-135M's shapes). `skinny_table` renders a saved report (no torch needed)."""

from __future__ import annotations

from sparsespec.reports import Say

LAYERS = 30
# SmolLM2-135M's weight matrices per layer ([out, in]: fused q/k/v, o, fused gate/up, down) and its lm_head
LAYER_WEIGHTS = ((960, 576), (576, 576), (3072, 576), (576, 1536))
LM_HEAD = (49152, 576)
ROWS = (1, 2, 3, 4, 5, 8, 10, 16, 20, 32, 64)


def bench_skinny(repeats: int, say: Say) -> dict:
    """{weight_bytes, repeats, threads, rows}: per row count, both products' time and read rate."""
    import torch

    from sparsespec.models.runner import linear
    from sparsespec.reports.kernels import median_ms

    weights = [[torch.randn(n, k) for n, k in LAYER_WEIGHTS] for _ in range(LAYERS)] + [[torch.randn(*LM_HEAD)]]
    nbytes = sum(w.numel() * 4 for ws in weights for w in ws)

    def step(product, xs):
        return lambda: [product(xs[w.shape[1]], w) for ws in weights for w in ws]

    rows = []
    for m in ROWS:
        xs = {k: torch.randn(m, k) for _, k in (*LAYER_WEIGHTS, LM_HEAD)}
        plain = median_ms(step(torch.nn.functional.linear, xs), repeats)
        ours = median_ms(step(linear, xs), repeats)
        rows.append({"rows": m, "linear_ms": plain, "ours_ms": ours, "linear_gbs": nbytes / plain / 1e6,
                     "ours_gbs": nbytes / ours / 1e6})
        say(f"{m:3d} rows: F.linear {plain:6.1f} ms, runner.linear {ours:6.1f} ms ({nbytes / 1e6:.0f} MB of weights)")
    return {"weight_bytes": nbytes, "repeats": repeats, "threads": torch.get_num_threads(), "rows": rows}


def skinny_table(report: dict) -> str:
    """The saved benchmark as markdown."""
    lines = ["| rows | F.linear ms | GB/s | runner.linear ms | GB/s | faster |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['rows']} | {r['linear_ms']:.1f} | {r['linear_gbs']:.1f} | {r['ours_ms']:.1f} "
                     f"| {r['ours_gbs']:.1f} | {r['linear_ms'] / r['ours_ms']:.2f}× |")
    return "\n".join(lines) + "\n"
