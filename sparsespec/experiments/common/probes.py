"""What the machine and this process do while a benchmark runs: the read bandwidth (and so the
decode speed it allows), the peak resident memory, and a thread sampling RSS over time."""

from __future__ import annotations

import math
import resource
import threading
import time
from dataclasses import dataclass

import psutil
import torch

from sparsespec.eval.memory import kv_bytes
from sparsespec.models.runner import CausalLM

MiB = 1024**2


def read_bandwidth_gbs(gb: float = 1.0) -> float:
    """Bytes per second a reduction over a large fp32 tensor reads (best of 5)."""
    x = torch.ones(int(gb * 2**30 / 4))
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def peak_rss_gb() -> float:
    """This process' peak resident memory so far (monotone over a run)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@dataclass(frozen=True)
class BandwidthFloor:
    """Decoding reads every weight and the KV cache once per token, so the measured read bandwidth
    bounds its speed: bandwidth / (weight bytes + KV bytes read per token)."""

    bandwidth_gbs: float
    weight_bytes: int
    kv_per_token: int

    @classmethod
    def measure(cls, hf_model: torch.nn.Module, target: CausalLM) -> BandwidthFloor:
        weights = sum(p.numel() * p.element_size() for p in hf_model.parameters())
        return cls(read_bandwidth_gbs(), weights, kv_bytes(target, 1))

    def tok_s(self, cached_tokens: int) -> float:
        """The fastest decode step rate with `cached_tokens` in the KV cache."""
        return self.bandwidth_gbs * 1e9 / (self.weight_bytes + self.kv_per_token * cached_tokens)


class RssSampler(threading.Thread):
    """Samples this process's RSS every `interval` seconds, tagged with the current phase."""

    def __init__(self, interval: float, t0: float):
        super().__init__(daemon=True)
        self.interval, self.t0 = interval, t0
        self.phase = "load"
        self.samples: list[dict] = []
        self._halt = threading.Event()
        self._proc = psutil.Process()

    def rss_mib(self) -> float:
        return self._proc.memory_info().rss / MiB

    def mark(self) -> None:
        self.samples.append({"t": round(time.perf_counter() - self.t0, 3), "phase": self.phase,
                             "rss_mib": round(self.rss_mib(), 1)})

    def run(self) -> None:
        while not self._halt.is_set():
            self.mark()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.mark()
