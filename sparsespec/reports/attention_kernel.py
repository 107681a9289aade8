"""The CPU attention kernel against PyTorch's path and a plain read of the cache, cold: every
layer's keys and values in turn, as a decode step reads them, on synthetic tensors shaped like
SmolLM2-135M's cache. Used by `scripts/microbench.py --attention`; `attention_table` renders a saved
report (no torch needed)."""

from __future__ import annotations

from sparsespec.reports import Say

ATTENTION_TOKENS = (1, 2, 3, 5, 9, 17)  # new tokens per step: decode, then verification of k + 1
MASS_QUERIES = (1, 5, 16)  # accepted queries per index refresh


def bench_attention(ctxs: list[int], repeats: int, say: Say = print) -> dict:
    """Cold, as a step reads them (all 30 layers' K/V in turn): a plain read of the cache, then per
    number of new tokens the attention of `attend` with the CPU kernel and with PyTorch's path, and
    per number of accepted queries the recall index's mass pass both ways. {rows, threads, kernel}."""
    import torch

    from sparsespec.kernels import cpu_attention
    from sparsespec.kv.capture import attention_mass
    from sparsespec.models.attention import attend
    from sparsespec.reports.kernels import HKV, HQ, LAYERS, D, median_ms

    if not cpu_attention.available():
        raise RuntimeError("the CPU attention kernel could not be built here; nothing to compare")

    def pytorch(fn):  # the same call with the kernel switched off
        def run():
            with cpu_attention.switched_off():
                return fn()
        return run

    rows = []
    for ctx in ctxs:
        ks = [torch.randn(HKV, ctx, D) for _ in range(LAYERS)]
        vs = [torch.randn(HKV, ctx, D) for _ in range(LAYERS)]
        gb = 2 * LAYERS * HKV * ctx * D * 4 / 1e9
        read = median_ms(lambda ks=ks, vs=vs: [(k.sum(), v.sum()) for k, v in zip(ks, vs, strict=True)], repeats)
        say(f"{ctx} keys: plain read of K and V ({gb * 1000:.0f} MB) {read:.1f} ms ({gb / read * 1000:.1f} GB/s)")
        for n in ATTENTION_TOKENS:
            q = torch.randn(HQ, n, D)

            def step(q=q, ks=ks, vs=vs, n=n):
                return [attend(q, k, v, 0.125, lse_rows=n) for k, v in zip(ks, vs, strict=True)]

            ours, theirs = median_ms(step, repeats), median_ms(pytorch(step), repeats)
            rows.append({"ctx": ctx, "op": "attention", "rows": n, "read_ms": read, "kernel_ms": ours,
                         "pytorch_ms": theirs, "bytes": gb * 1e9})
            say(f"  attention, {n:2d} new tokens: kernel {ours:6.1f} ms ({gb / ours * 1000:4.1f} GB/s, "
                f"{read / ours:.2f} of the read), PyTorch {theirs:6.1f} ms ({gb / theirs * 1000:4.1f} GB/s)")
        for c in MASS_QUERIES:
            q, lse = torch.randn(HQ, c, D), torch.full((HQ, c), 5.0)

            def refresh(q=q, lse=lse, ks=ks):
                return [attention_mass(q, lse, k, 0.125) for k in ks]

            ours, theirs = median_ms(refresh, repeats), median_ms(pytorch(refresh), repeats)
            rows.append({"ctx": ctx, "op": "index refresh", "rows": c, "read_ms": read / 2, "kernel_ms": ours,
                         "pytorch_ms": theirs, "bytes": gb / 2 * 1e9})
            say(f"  index refresh, {c:2d} queries: kernel {ours:6.1f} ms ({gb / 2 / ours * 1000:4.1f} GB/s of keys), "
                f"PyTorch {theirs:6.1f} ms ({gb / 2 / theirs * 1000:4.1f} GB/s)")
        del ks, vs
    return {"rows": rows, "threads": torch.get_num_threads(), "repeats": repeats}


def attention_table(report: dict) -> str:
    """The kernel against PyTorch's path and a plain read, per context, operation and row count."""
    lines = ["| keys | operation | new tokens / queries | plain read ms | kernel ms | GB/s | share of the read rate "
             "| PyTorch ms | GB/s | kernel speedup |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        gb = r["bytes"] / 1e9
        lines.append(f"| {r['ctx'] // 1024}k | {r['op']} | {r['rows']} | {r['read_ms']:.1f} | {r['kernel_ms']:.1f} | "
                     f"{gb / r['kernel_ms'] * 1000:.1f} | {r['read_ms'] / r['kernel_ms']:.2f} | {r['pytorch_ms']:.1f} | "
                     f"{gb / r['pytorch_ms'] * 1000:.1f} | {r['pytorch_ms'] / r['kernel_ms']:.2f}× |")
    return "\n".join(lines) + f"\n\n<sub>{report['threads']} threads; median of {report['repeats']} cold passes " \
        "over all 30 layers after one warm-up.</sub>"
