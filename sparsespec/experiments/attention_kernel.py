"""The CPU attention kernel's builds against PyTorch's path and a plain read of the cache, cold:
every layer's keys and values in turn, as a decode step reads them, on synthetic tensors shaped like
SmolLM2-135M's cache. Each build this machine makes is timed (the processor's own, and on x86-64 the
AVX2 one), so one run on an AVX-512 processor measures both instruction sets. The paths are timed
in turns within each repeat, so that a change in the machine's speed during the run reaches all of
them alike, and a timing during which another process used the CPU is discarded and taken again.
`markdown` renders a saved report (no torch needed); docs/performance.md shows it.

    python -m sparsespec.experiments attention_kernel --ctx 4k,32k,64k --out results/attention_kernel.json
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from sparsespec.experiments import Say
from sparsespec.experiments.common.cpu_timing import in_turns

ATTENTION_TOKENS = (1, 2, 3, 5, 9, 17)  # new tokens per step: decode, then verification of k + 1
MASS_QUERIES = (1, 5, 16)  # accepted queries per index refresh
OPTIONS = {"ctx": "32k", "repeats": 7}


def measure(args, checkpoint) -> dict:
    """bench_attention at every --ctx."""
    return bench_attention(args.ctx, args.repeats, print)
def _isa(build: str, width: int) -> str:
    if build == "avx2":
        return "AVX2 + FMA (x86-64-v3)"
    return "AVX-512 (native)" if width == 16 else "AVX2 or other (native)"


def _spread(ms: list[float]) -> dict:
    return {"ms": statistics.median(ms), "min": min(ms), "max": max(ms), "n": len(ms)}


def _context_rows(ctx: int, builds: list[str], repeats: int, say: Say) -> list[dict]:
    """bench_attention's rows at one context."""
    import torch

    from sparsespec.experiments.gather import HKV, HQ, LAYERS, D
    from sparsespec.kernels import cpu_attention
    from sparsespec.kv.capture import _pytorch_mass
    from sparsespec.models.attention import _pytorch_few_rows

    ks = [torch.randn(HKV, ctx, D) for _ in range(LAYERS)]
    vs = [torch.randn(HKV, ctx, D) for _ in range(LAYERS)]
    layers = list(zip(ks, vs, strict=True))
    gb = 2 * LAYERS * HKV * ctx * D * 4 / 1e9

    def read():
        return [(k.sum(), v.sum()) for k, v in layers]

    def measured(paths: dict, half: bool = False) -> tuple[float, dict[str, list[float]]]:
        """The paths and the plain read in turns: (the read's median ms, K only if half; times)."""
        times = in_turns({"read": read, **paths}, repeats)
        return statistics.median(times.pop("read")) / (2 if half else 1), times

    def attention(build: str, q: torch.Tensor) -> Callable[[], object]:
        if build == "pytorch":
            return lambda: [_pytorch_few_rows(q, k, v, 0.125) for k, v in layers]
        return lambda: [cpu_attention.few_rows_attention(q, k, v, 0.125, build) for k, v in layers]

    def mass(build: str, q: torch.Tensor, lse: torch.Tensor) -> Callable[[], object]:
        if build == "pytorch":
            return lambda: [_pytorch_mass(q, lse, k, 0.125) for k in ks]
        return lambda: [cpu_attention.attention_mass(q, lse, k, 0.125, build) for k in ks]

    rows = []
    say(f"{ctx} keys: K and V {gb * 1000:.0f} MB")
    for n in ATTENTION_TOKENS:
        q = torch.randn(HQ, n, D)
        read_ms, times = measured({b: attention(b, q) for b in [*builds, "pytorch"]})
        rows.append({"ctx": ctx, "op": "attention", "rows": n, "read_ms": read_ms, "bytes": gb * 1e9,
                     "paths": {name: _spread(ms) for name, ms in times.items()}})
        say(f"  attention, {n:2d} new tokens: read {read_ms:.1f} ms, " + ", ".join(
            f"{name} {statistics.median(ms):6.1f} ms ({read_ms / statistics.median(ms):.2f} of the read)"
            for name, ms in times.items()))
    for c in MASS_QUERIES:
        q, lse = torch.randn(HQ, c, D), torch.full((HQ, c), 5.0)
        read_ms, times = measured({b: mass(b, q, lse) for b in [*builds, "pytorch"]}, half=True)
        rows.append({"ctx": ctx, "op": "index refresh", "rows": c, "read_ms": read_ms, "bytes": gb / 2 * 1e9,
                     "paths": {name: _spread(ms) for name, ms in times.items()}})
        say(f"  index refresh, {c:2d} queries: read of K {read_ms:.1f} ms, " + ", ".join(
            f"{name} {statistics.median(ms):6.1f} ms ({read_ms / statistics.median(ms):.2f} of the read)"
            for name, ms in times.items()))
    return rows


def bench_attention(ctxs: list[int], repeats: int, say: Say = print) -> dict:
    """Cold, as a step reads them (all 30 layers' K/V in turn): per number of new tokens the
    attention of each kernel build and of PyTorch's path, and per number of accepted queries the
    recall index's mass pass the same ways, each beside a plain read of the same keys (and values)
    timed in the same turns.
    {rows, builds, processor, threads, repeats}."""
    import torch

    from sparsespec.kernels import cpu_attention
    from sparsespec.provenance import cpu_info

    builds = [b for b in cpu_attention.builds() if cpu_attention.available(b)]
    if not builds:
        raise RuntimeError("the CPU attention kernel could not be built here; nothing to compare")
    isa = {b: _isa(b, cpu_attention.vector_width(b)) for b in builds}
    say("builds: " + ", ".join(f"{b} = {isa[b]}" for b in builds))

    rows = []
    for ctx in ctxs:
        rows += _context_rows(ctx, builds, repeats, say)
    return {"rows": rows, "builds": isa, "processor": cpu_info()[0], "threads": torch.get_num_threads(),
            "repeats": repeats}


def markdown(report: dict) -> str:
    """Per context, operation and row count: the plain read, each build's time and share of the read
    rate, PyTorch's time, and each build's speedup over PyTorch (median of the repeats, with the
    range of the kernel's share of the read)."""
    builds = list(report["builds"])
    head = ["keys", "operation", "new tokens / queries", "plain read ms"]
    for b in builds:
        head += [f"{report['builds'][b]} ms", "share of the read"]
    head += ["PyTorch ms", "share of the read"] + [f"{report['builds'][b].split(' (')[0]} vs PyTorch" for b in builds]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["rows"]:
        p = r["paths"]
        cells = [f"{r['ctx'] // 1024}k", r["op"], str(r["rows"]), f"{r['read_ms']:.1f}"]
        for name in [*builds, "pytorch"]:
            t = p[name]
            cells += [f"{t['ms']:.1f}",
                      f"{r['read_ms'] / t['ms']:.2f} ({r['read_ms'] / t['max']:.2f}–{r['read_ms'] / t['min']:.2f})"]
        cells += [f"{p['pytorch']['ms'] / p[b]['ms']:.2f}×" for b in builds]
        lines.append("| " + " | ".join(cells) + " |")
    n = min(t["n"] for r in report["rows"] for t in r["paths"].values())
    return "\n".join(lines) + (
        f"\n\n<sub>{report['processor']}; {report['threads']} threads; median of {report['repeats']} cold passes "
        f"over all 30 layers after one warm-up (at least {n} timings each, taken in turns, redone while another "
        "process used the CPU); share of the read: the plain read's time over the path's, its range over the "
        "repeats in brackets.</sub>")
