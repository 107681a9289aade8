"""The prefill every method of a sample shares (evaluate.py, the benchmarks and the GPU check).
No Hydra here: a machine without it can still import this."""

from __future__ import annotations

import time

from sparsespec.kv.cache import KVCache
from sparsespec.models.runner import CausalLM


class SharedPrefill:
    """One prefill of the target per sample, shared by every method and repeat (runtime.share_prefill).

    The target's cache after the prompt is the same whatever the method, so it is computed once, up
    to the last TAIL prompt tokens; each run prefills that tail itself (so a view's prefill capture
    sees real queries), decodes, and crops the cache back. At a long context the prefill is most of
    a run's time, and every method after the first is spared it. A run's prefill_s is the shared
    prefill's time plus its own tail. The caches of the samples passed to `hold` (a batch's) are
    kept together; any other is freed when a new one is made.
    """

    TAIL = 64

    def __init__(self, target: CausalLM, chunk: int, enabled: bool = True) -> None:
        self.target, self.chunk, self.enabled = target, chunk, enabled
        self.caches: dict[str, tuple[KVCache, float]] = {}
        self.held: set[str] = set()

    def hold(self, samples) -> None:
        """Keep these samples' caches together (the samples decoded as one batch); free the others."""
        self.held = {s.sample_id for s in samples}
        self._free_unheld()

    def _free_unheld(self) -> None:
        self.caches = {k: v for k, v in self.caches.items() if k in self.held}

    def get(self, sample, max_new: int, bar=None) -> tuple[KVCache | None, float]:
        """(cache holding all but the prompt's tail, seconds it took) or (None, 0.0) when not shared."""
        if not self.enabled or sample.prompt_tokens <= 2 * self.TAIL:
            return None, 0.0
        if sample.sample_id not in self.caches:
            self._free_unheld()  # before allocating the new one
            head = sample.prompt_ids[: -self.TAIL]
            cache = self.target.new_cache(sample.prompt_tokens + max_new + 64)
            t0 = time.perf_counter()
            self.target.prefill(head, cache, self.chunk, progress=bar.update if bar else None)
            self.caches[sample.sample_id] = (cache, time.perf_counter() - t0)
        return self.caches[sample.sample_id]
