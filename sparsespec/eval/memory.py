"""Memory guard: estimate what a run at this context will allocate and refuse before prefill
instead of being killed by the OS halfway through a long benchmark."""

from __future__ import annotations

from pathlib import Path

from sparsespec.models.runner import CausalLM

GiB = 1024**3


def available_bytes() -> int:
    """MemAvailable, capped by a cgroup limit when one is set."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            avail = min(avail or 1 << 62, int(limit) - used)
    except (OSError, ValueError):
        pass
    return avail if avail is not None else 1 << 62


def kv_bytes(model: CausalLM, tokens: int) -> int:
    elem = model.lm_head.weight.element_size()
    return 2 * model.n_layers * model.n_kv_heads * model.head_dim * elem * tokens


def estimate_bytes(target: CausalLM, tokens: int, methods, drafter: CausalLM | None, chunk: int) -> dict:
    """Bytes allocated beyond the loaded weights, by part (the largest method counts)."""
    parts = {"target_kv": kv_bytes(target, tokens + 64)}
    # prefill of one chunk: SDPA's visibility mask and scores for a chunk over the whole context,
    # plus the captured probabilities of the last W queries (float32)
    chunk = min(chunk, tokens)
    parts["prefill_attention"] = chunk * tokens * (1 + 4) + target.n_heads * 64 * tokens * 4
    drafters = [m.build(None).drafter for m in methods]  # asked without a model: their own allocations
    policies = max((d.memory_bytes(target.n_layers, target.n_kv_heads, tokens) for d in drafters if d), default=0)
    if policies:
        parts["kv_policy"] = policies
    if drafter is not None:
        parts["drafter_kv"] = kv_bytes(drafter, tokens + 64)
    parts["total"] = sum(parts.values())
    return parts


def check_memory(target, tokens, methods, drafter, chunk, error=MemoryError, headroom: float = 0.85) -> dict:
    est = estimate_bytes(target, tokens, methods, drafter, chunk)
    avail = available_bytes()
    if est["total"] > headroom * avail:
        detail = ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in est.items() if k != "total")
        raise error(
            f"this run needs about {est['total'] / GiB:.1f} GiB ({detail}) but only "
            f"{avail / GiB:.1f} GiB is available: lower ctx, use model.dtype=bfloat16 (halves the KV cache), "
            "lower runtime.prefill_chunk, or set runtime.memory_guard=false to try anyway"
        )
    return est
