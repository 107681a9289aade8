"""The memory guard: its estimate covers what a run really allocates, and it refuses (with the fix
named) before prefill when that would not fit."""

import pytest
from conftest import random_prompt, tiny_lm

from sparsespec.decoding.controllers import FixedK
from sparsespec.decoding.drafters import SelfDrafter
from sparsespec.decoding.engine import SpeculativeEngine
from sparsespec.eval import memory
from sparsespec.eval.methods import Method
from sparsespec.kv.recall import RecallIndex


def test_estimate_covers_the_measured_cache_and_recall_index(monkeypatch):
    target = tiny_lm("llama", max_position_embeddings=4096)
    prompt, new = random_prompt(1500, seed=5), 20
    caches = []
    real_new_cache = target.new_cache
    monkeypatch.setattr(target, "new_cache", lambda cap=256: caches.append(real_new_cache(cap)) or caches[-1])
    view = RecallIndex(ratio=0.1, k_sink=4, k_recent=8, window=16)
    SpeculativeEngine(target, SelfDrafter(view), FixedK(4)).generate(prompt, new)
    policy = {"_target_": "sparsespec.kv.recall.RecallIndex", "ratio": 0.1, "k_sink": 4, "k_recent": 8}
    method = Method(name="sparsespec_l", drafter={"_target_": "sparsespec.decoding.drafters.SelfDrafter",
                                                  "policy": policy})
    est = memory.estimate_bytes(target, len(prompt) + new, [method], None, chunk=1024)
    kv = caches[0].nbytes()
    assert kv <= est["target_kv"] <= 1.1 * kv  # the cache the engine allocated, within 10%
    index = view._rows.nbytes + view._sum.nbytes
    assert index <= est["kv_policy"] <= 1.5 * index
    assert est["total"] >= kv + index


def test_guard_refuses_with_the_fix_named(monkeypatch):
    target = tiny_lm("llama")
    monkeypatch.setattr(memory, "available_bytes", lambda: 10 * 2**20)  # 10 MiB "free"
    with pytest.raises(MemoryError, match="lower ctx.*bfloat16"):
        memory.check_memory(target, 200_000, [Method(name="ar")], None, 1024)
    est = memory.check_memory(target, 200, [Method(name="ar")], None, 1024)  # small: passes
    assert est["total"] < 10 * 2**20
