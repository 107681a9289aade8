"""Teacher targets: the target model, attending to its full cache (plain causal attention over the
whole sequence), gives its greedy next token and optionally its top-k log-probabilities at every
position of every training sequence.

They are cached on disk so epochs, resumed runs and sweeps never rerun the target:
`<root>/<key>/shard_NNNNN.pt` (one shard per `shard_size` sequences) plus `meta.json`, where the
key hashes the model fingerprint, the token ids of all sequences and the teacher settings. Every
file is written to a temporary name and renamed into place, so a killed run leaves only whole
shards behind and the next run resumes from the first missing one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


def model_fingerprint(model: torch.nn.Module) -> str:
    """Content hash of a model: its config plus a slice of every parameter (cheap, and any retrained
    or different checkpoint changes it)."""
    h = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().flatten()[:4096].float().numpy().tobytes())
    return h.hexdigest()[:16]


def cache_key(fingerprint: str, sequences: torch.Tensor, dtype: str, topk: int) -> str:
    h = hashlib.sha256(f"v{FORMAT_VERSION}|{fingerprint}|{dtype}|{topk}|{tuple(sequences.shape)}".encode())
    h.update(sequences.to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:20]


class Teacher:
    """The target in its teacher dtype. `calls` counts forwards (tests prove cache reuse with it)."""

    def __init__(self, model: torch.nn.Module, dtype: str = "bfloat16", topk: int = 8, batch_size: int = 1):
        from sparsespec.models.loading import _torch_dtype

        self.dtype = str(dtype)
        self.model = model.to(_torch_dtype(dtype)).eval()
        self.topk, self.batch_size = int(topk), int(batch_size)
        self.calls = 0

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        logits = self.model(ids).logits.float()  # [b, L, V]
        out = {"targets": logits.argmax(-1).to(torch.int32)}
        if self.topk:
            logp = torch.log_softmax(logits, dim=-1)
            top = logp.topk(self.topk, dim=-1)
            out["topk_idx"] = top.indices.to(torch.int32)
            out["topk_logp"] = top.values
        return out


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class TeacherCache:
    """Sharded on-disk teacher targets for a fixed [N, L] tensor of token ids."""

    def __init__(self, root: str | Path, key: str, n: int, shard_size: int = 16):
        self.dir = Path(root) / key
        self.n, self.shard_size = n, max(1, int(shard_size))

    @property
    def n_shards(self) -> int:
        return (self.n + self.shard_size - 1) // self.shard_size

    def shard_path(self, i: int) -> Path:
        return self.dir / f"shard_{i:05d}.pt"

    def complete(self) -> bool:
        return (self.dir / "meta.json").is_file() and all(self.shard_path(i).is_file() for i in range(self.n_shards))

    def build(self, sequences: torch.Tensor, teacher: Callable[[], Teacher], meta: dict | None = None) -> int:
        """Compute the missing shards; `teacher` is a factory so a complete cache never even builds
        (or casts) the teacher. Returns the number of shards computed."""
        if self.complete():
            return 0
        self.dir.mkdir(parents=True, exist_ok=True)
        todo = [i for i in range(self.n_shards) if not self.shard_path(i).is_file()]
        log.info("teacher targets: %d/%d shards to compute in %s", len(todo), self.n_shards, self.dir)
        t = teacher()
        t0 = time.perf_counter()
        for i in todo:
            rows = sequences[i * self.shard_size : (i + 1) * self.shard_size]
            parts: list[dict[str, torch.Tensor]] = []
            for j in range(0, rows.shape[0], t.batch_size):
                parts.append(t(rows[j : j + t.batch_size].long()))
            shard = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            _atomic_save(shard, self.shard_path(i))
            log.info("teacher shard %d/%d done (%.0f s)", i + 1, self.n_shards, time.perf_counter() - t0)
        info = {"n": self.n, "shard_size": self.shard_size, "seq_len": int(sequences.shape[1]),
                "seconds": round(time.perf_counter() - t0, 1), **(meta or {})}
        tmp = self.dir / f".meta.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(info, indent=1))
        os.replace(tmp, self.dir / "meta.json")
        return len(todo)

    def load(self) -> dict[str, torch.Tensor]:
        shards = [torch.load(self.shard_path(i), weights_only=True) for i in range(self.n_shards)]
        return {k: torch.cat([s[k] for s in shards]) for k in shards[0]}
