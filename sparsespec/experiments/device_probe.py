"""The device probe: what one decoding round's parts cost on this device, in about a minute, no prefill.

    python -m sparsespec.experiments device_probe [--cpu] --out DIR/probe.json

1. Ceilings: a device-to-device copy of a few GB and a bf16 GEMV of 4096 x 14336 (Llama-3.1-8B's
   MLP), as GB/s: what a bandwidth-bound step can reach here.
2. On a random model of Llama-3.1-8B's shape whose K/V cache is filled with random values at 32k and
   128k tokens (no prefill: a cache's contents do not change a step's cost): the ar step (wall
   time, device time from CUDA events, and the host's time to enqueue it), verification passes of
   5 and 21 rows, a draft step over a 10% recall-index view, the view's select and gather, the
   recall index's update, and the kernels one step launches (torch.profiler).
3. `attend` against a float32 reference for 1, 5, 21 and 1024 query rows; whether PyTorch's fused
   flash kernel aligns a causal block of fewer queries than keys to the bottom right (what
   verification needs; the split path never asks it to, flash-attn is checked for >= 2.1); and how
   often a CUDA event was not yet complete when a round read it (the read then waits).

--cpu runs the same steps on tiny shapes (seconds), as the test suite does through
scripts/gpu_check.sh --cpu. Exit status 0 when every step ran. The planner reads the report
(sparsespec.plan.profile).
"""

from __future__ import annotations

import logging
import statistics
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparsespec.kv.cache import KVCache
    from sparsespec.models.runner import CausalLM

import torch

log = logging.getLogger("device_probe")

LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256)
TINY = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=256, vocab_size=512)
PLANS = {
    "gpu": dict(shape=LLAMA_8B, ctxs=(32768, 131072), dtype="bfloat16", copy_gib=2.0, gemv=(4096, 14336),
                repeats=10, attend_keys=4096, attend_heads=(32, 8, 128), event_steps=200),
    "cpu": dict(shape=TINY, ctxs=(256, 512), dtype="float32", copy_gib=1 / 64, gemv=(1024, 3584),
                repeats=1, attend_keys=256, attend_heads=(8, 2, 64), event_steps=10),
}
ROWS = (1, 5, 21, 1024)


def arguments(p) -> None:
    p.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (what the test suite runs)")


def check(args) -> None:
    from sparsespec.experiments import ExperimentError

    if not args.cpu and not torch.cuda.is_available():
        raise ExperimentError("no CUDA device here; use --cpu for the tiny CPU probe")


class Timer:
    """Median wall, device and enqueue milliseconds of a call, the device idle before each."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        from sparsespec.clock import DeviceClock

        self.device, self.repeats, self.clock = device, repeats, DeviceClock(device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, call: Callable[[], Any], setup: Callable[[], Any] | None = None,
                 after: Callable[[], Any] | None = None) -> dict[str, float]:
        wall, device, enqueue = [], [], []
        for i in range(self.repeats + 2):  # two untimed warm-ups
            if setup is not None:
                setup()
            self.sync()
            t0, e0 = time.perf_counter(), self.clock.mark()
            call()
            t_enq, e1 = time.perf_counter(), self.clock.mark()
            self.sync()
            t1 = time.perf_counter()
            if after is not None:
                after()
            if i >= 2:
                wall.append(t1 - t0)
                enqueue.append(t_enq - t0)
                device.append(self.clock.seconds(e0, e1))
        ms = lambda xs: round(1000 * statistics.median(xs), 4)  # noqa: E731
        return {"wall_ms": ms(wall), "device_ms": ms(device), "enqueue_ms": ms(enqueue)}


def ceilings(plan: dict, device: torch.device, dtype: torch.dtype, timer: Timer) -> dict:
    n = int(plan["copy_gib"] * 2**30) // 2
    pair = [torch.empty(n, dtype=torch.bfloat16, device=device).normal_()]
    pair.append(torch.empty_like(pair[0]))
    copy = timer(lambda: pair[1].copy_(pair[0]))
    pair.clear()
    rows, cols = plan["gemv"]
    w = torch.empty(cols, rows, dtype=torch.bfloat16, device=device).normal_()
    x = torch.empty(1, rows, dtype=torch.bfloat16, device=device).normal_()
    gemv = timer(lambda: torch.nn.functional.linear(x, w))
    gb = lambda nbytes, t: round(nbytes / (t["device_ms"] / 1000) / 1e9, 2) if t["device_ms"] > 0 else None  # noqa: E731
    return {"copy": {**copy, "bytes": 2 * n * 2, "gb_s": gb(2 * n * 2, copy)},  # read + write
            "gemv_bf16": {**gemv, "shape": [rows, cols], "gb_s": gb(w.numel() * 2, gemv)}}


def kernels_per_call(device: torch.device, call: Callable[[], Any]) -> int | None:
    """Device kernels one call launches (on the CPU: the aten ops it runs); None where the profiler
    cannot run here (no CUPTI)."""
    try:
        return _kernels(device, call)
    except Exception as e:
        log.warning("kernels per step not counted: %r", e)
        return None


def _kernels(device: torch.device, call: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        call()
        if cuda:
            torch.cuda.synchronize(device)
    events = prof.events()
    if cuda:
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::"))


def context(target: CausalLM, cache: KVCache, ctx: int, plan: dict, timer: Timer) -> dict:
    """Every step of a round at ctx tokens of cache (the cache's first ctx entries are random)."""
    from sparsespec.decoding.drafters import DecodeState
    from sparsespec.kv.recall import RecallIndex

    cache.crop(0)
    cache.advance(ctx)
    g = torch.Generator().manual_seed(ctx)
    tokens = torch.randint(target.vocab_size, (ctx + 32,), generator=g).tolist()
    state = DecodeState(target, cache, tokens[: ctx + 1], ctx)
    back = lambda: cache.crop(ctx)  # noqa: E731
    out: dict[str, Any] = {"ctx": ctx}
    out["ar_step"] = timer(lambda: target.forward(tokens[ctx : ctx + 1], cache, logits="last"), after=back)
    out["ar_kernels"] = kernels_per_call(target.device, lambda: (target.forward(tokens[ctx : ctx + 1], cache,
                                                                               logits="last"), back()))
    for n in (5, 21):
        out[f"verify_{n}"] = timer(lambda n=n: target.forward(tokens[ctx : ctx + n], cache), after=back)
    index = RecallIndex(ratio=0.1)
    index.prefill_capture()

    def verify_captured() -> None:
        target.forward(tokens[ctx : ctx + 5], cache, capture=index.verify_capture())

    def update() -> None:
        index.update(state, 4)

    def undo() -> None:
        back()

    out["recall_update"] = timer(update, setup=verify_captured, after=undo)
    compact: dict[str, Any] = {}

    def select() -> None:
        compact["idx"] = index.select(state)

    out["view_select"] = timer(select)

    def gather() -> None:
        compact["cache"] = cache.gather(compact["idx"], extra=8, out=compact.get("cache"))

    out["view_gather"] = timer(gather)
    view = compact["cache"]
    base = view.length
    positions = torch.tensor([ctx], device=target.device)
    step = lambda: target.forward(tokens[ctx : ctx + 1], view, positions=positions, logits="last")  # noqa: E731
    out["draft_step_10pct"] = timer(step, after=lambda: view.crop(base))
    out["draft_kernels"] = kernels_per_call(target.device, lambda: (step(), view.crop(base)))
    out["view_tokens"] = base
    return out


def event_reads(target: CausalLM, cache: KVCache, ctx: int, steps: int) -> dict:
    """Rounds marked as the engine marks them (an event after the host read), and how many of
    those events were still incomplete when read."""
    from sparsespec.clock import DeviceClock

    clock = DeviceClock(target.device)
    cache.crop(0)
    cache.advance(ctx)
    for _ in range(steps):
        start = clock.mark()
        logits = target.forward([1], cache, logits="last")
        logits.argmax(-1).tolist()  # the round's one host read
        end = clock.mark()
        clock.seconds(start, end)
        cache.crop(ctx)
    return {"reads": steps, "late": clock.late_reads, "cuda_events": clock.cuda}


def attend_error(device: torch.device, dtype: torch.dtype, keys: int, heads: tuple[int, int, int]) -> dict:
    """max |attend - float32 reference| / max |reference| for each number of query rows."""
    from sparsespec.kv.capture import causal_block_mask
    from sparsespec.models.attention import attend

    hq, hkv, d = heads
    g = torch.Generator(device="cpu").manual_seed(0)
    out = {}
    for rows in ROWS:
        total = max(keys, rows)
        q, k, v = (torch.randn(*s, generator=g).to(device, dtype) for s in ((hq, rows, d), (hkv, total, d), (hkv, total, d)))
        got, _ = attend(q, k, v, d**-0.5)
        kr, vr = k.float().repeat_interleave(hq // hkv, 0), v.float().repeat_interleave(hq // hkv, 0)
        s = (q.float() @ kr.transpose(1, 2) * d**-0.5).masked_fill(~causal_block_mask(rows, total, device), float("-inf"))
        ref = torch.softmax(s, -1) @ vr
        out[str(rows)] = float((got.float() - ref).abs().max() / ref.abs().max())
        del q, k, v, kr, vr, s, ref, got
    return out


def flash_alignment(device: torch.device, dtype: torch.dtype) -> str:
    """How PyTorch's fused flash kernel places a causal block of 3 queries over 8 keys."""
    g = torch.Generator(device="cpu").manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 64, generator=g).to(device, dtype) for n in (3, 8, 8))
    if device.type == "cuda":
        if dtype not in (torch.float16, torch.bfloat16):
            q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
        got = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=0.125)[0]
    else:
        got = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True, scale=0.125)[0]
    s = (q.float() @ k.float().transpose(-1, -2)) * 0.125
    ones = torch.ones(3, 8, dtype=torch.bool, device=device)
    found = []
    for name, mask in (("bottom-right", ones.tril(5)), ("top-left", ones.tril(0))):
        ref = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v.float()
        if torch.allclose(got.float(), ref, atol=2e-2, rtol=2e-2):
            found.append(name)
    return found[0] if len(found) == 1 else ("neither" if not found else "ambiguous")


def measure(args, checkpoint) -> dict:
    """Every step of the probe; a step that fails is recorded in `errors` (`ok`: none failed)."""
    plan_name = "cpu" if args.cpu else "gpu"
    plan = PLANS[plan_name]
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = getattr(torch, plan["dtype"])
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(device, plan["repeats"])
    report: dict[str, Any] = {"plan": plan_name, "torch": torch.__version__, "device": str(device),
                              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                              "dtype": plan["dtype"], "shape": plan["shape"], "errors": []}

    def step(name: str, call: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            report[name] = call()
        except Exception as e:  # one failed step is recorded; the others still run
            log.error("%s failed: %s", name, traceback.format_exc())
            report["errors"].append(f"{name}: {e!r}"[:500])
        log.info("%s done in %.1f s", name, time.perf_counter() - t0)

    torch.set_grad_enabled(False)
    step("ceilings", lambda: ceilings(plan, device, dtype, timer))
    step("attend_vs_fp32", lambda: attend_error(device, dtype, plan["attend_keys"], plan["attend_heads"]))
    step("flash_causal_alignment", lambda: flash_alignment(device, dtype))
    from sparsespec.experiments.gpu_speed import random_llama
    from sparsespec.models.attention import flash_attn_func
    from sparsespec.models.runner import CausalLM

    report["flash_attn"] = flash_attn_func() is not None
    target = cache = None
    try:
        target = CausalLM(random_llama(plan["shape"], max(plan["ctxs"]) + 64, dtype, device))
        cache = target.new_cache(max(plan["ctxs"]) + 64)
        for layer in range(cache.n_layers):  # random keys and values: a step's cost does not depend on them
            cache.k[layer].normal_()
            cache.v[layer].normal_()
    except Exception as e:
        log.error("model: %s", traceback.format_exc())
        report["errors"].append(f"model: {e!r}"[:500])
    if target is not None:
        report["contexts"] = []
        for ctx in plan["ctxs"]:
            step(f"ctx_{ctx}", lambda ctx=ctx: context(target, cache, ctx, plan, timer))
            report["contexts"].append(report.pop(f"ctx_{ctx}", {"ctx": ctx, "failed": True}))
        step("event_reads", lambda: event_reads(target, cache, plan["ctxs"][0], plan["event_steps"]))
        if device.type == "cuda":
            report["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    log.info("%d error(s)", len(report["errors"]))
    report["ok"] = not report["errors"]
    return report


def markdown(report: dict) -> str:
    """The probe's headline numbers (the rest is in the report)."""
    lines = [f"{report.get('gpu') or report['device']}, {report['dtype']}, plan {report['plan']}: "
             f"{len(report['errors'])} step(s) failed.", "", "| ctx | ar step ms | verify 5 ms | verify 21 ms | "
             "draft step (10% view) ms | view select ms | view gather ms | recall update ms |", "|---|---|---|---|---|---|---|---|"]
    for c in report.get("contexts", []):
        if c.get("failed"):
            lines.append(f"| {c['ctx']} | failed | | | | | | |")
            continue
        cells = [c[k]["wall_ms"] for k in ("ar_step", "verify_5", "verify_21", "draft_step_10pct", "view_select",
                                            "view_gather", "recall_update")]
        lines.append(f"| {c['ctx']} | " + " | ".join(f"{x:.3f}" for x in cells) + " |")
    return "\n".join(lines + [*(f"- {e}" for e in report["errors"])])
