"""Teacher targets: the target model, attending to its full cache (plain causal attention over the
whole sequence), gives its greedy next token and optionally its top-k log-probabilities at every
position of every training sequence.

They are cached on disk so epochs, resumed runs and sweeps never rerun the target:
`<root>/<key>/shard_NNNNN.pt` (one shard per `shard_size` sequences) plus `meta.json`, where the
key hashes the model fingerprint, the token ids of all sequences and the teacher settings. Every
file is written to a temporary name and renamed into place, so a killed run leaves only whole
shards behind and the next run resumes from the first missing one.

Each shard also has a `shard_NNNNN.sha256` sidecar, written after the shard is in place. A shard
is only used when its bytes match it (and its tensors have the expected shape): a shard truncated
or damaged after the fact (a full disk, a partial copy, a shard renamed in without its checksum)
is detected, logged and recomputed by the next build, never read.
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

FORMAT_VERSION = 2  # 2: per-shard sha256 sidecars


def model_fingerprint(model: torch.nn.Module) -> str:
    """Content hash of a model: its config plus a slice of every parameter (cheap, and any retrained
    or different checkpoint changes it)."""
    h = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().flatten()[:4096].float().numpy().tobytes())
    return h.hexdigest()[:16]


def cache_key(fingerprint: str, sequences: torch.Tensor, dtype: str, topk: int, on_policy_tokens: int = 0) -> str:
    # on_policy_tokens=0 keeps the key of caches written before the option existed
    extra = f"|gen{on_policy_tokens}" if on_policy_tokens else ""
    h = hashlib.sha256(f"v{FORMAT_VERSION}|{fingerprint}|{dtype}|{topk}|{tuple(sequences.shape)}{extra}".encode())
    h.update(sequences.to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:20]


class Teacher:
    """The target in its teacher dtype. `calls` counts forwards (tests prove cache reuse with it).

    With `on_policy_tokens=N` the rows it is given are prompts: it continues each one greedily by N
    tokens and returns the whole sequence as `ids` with the targets at every position, so the drafter
    trains on the text it will actually draft at inference (the target's own greedy output) and not
    only on book text. The continuation and its targets come from the same forward passes, so the
    target at a continuation position is, by construction, the next continuation token.
    """

    def __init__(self, model: torch.nn.Module, dtype: str = "bfloat16", topk: int = 8, batch_size: int = 1,
                 on_policy_tokens: int = 0):
        from sparsespec.models.device import resolve_dtype

        self.dtype = str(dtype)
        self.device = next(model.parameters()).device  # the target's: the teacher pass runs where it was loaded
        self.model = model.to(resolve_dtype(dtype, self.device, key="teacher.dtype")).eval()
        self.topk, self.batch_size = int(topk), int(batch_size)
        self.on_policy_tokens = int(on_policy_tokens)
        self.calls = 0

    def _targets(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = logits.float()
        out = {"targets": logits.argmax(-1).to(torch.int32)}
        if self.topk:
            logp = torch.log_softmax(logits, dim=-1)
            top = logp.topk(self.topk, dim=-1)
            out["topk_idx"] = top.indices.to(torch.int32)
            out["topk_logp"] = top.values
        return out

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        ids = ids.to(self.device)
        out = self._continue(ids) if self.on_policy_tokens else self._targets(self.model(ids).logits)
        return {k: v.cpu() for k, v in out.items()}  # cached on disk, batched by the CPU data loader

    def _continue(self, prompts: torch.Tensor) -> dict[str, torch.Tensor]:
        """Greedy continuation of a batch of equal-length prompts (so no padding), with the targets of
        every position. Not `generate()`: it would not return the prompt positions' logits, and a
        second pass over the whole sequence would double the cost. The head runs one row at a time so
        a batch never holds [b, L, vocab] logits."""
        from transformers import DynamicCache

        from sparsespec.models.loading import cache_kwargs

        cache = DynamicCache()
        with_cache = cache_kwargs(self.model, cache)  # the base model and the LM take the same keyword
        hidden = self.model.model(input_ids=prompts, **with_cache).last_hidden_state
        head = self.model.get_output_embeddings()
        rows = [self._targets(head(hidden[i : i + 1])) for i in range(prompts.shape[0])]
        parts = [{k: torch.cat([r[k] for r in rows]) for k in rows[0]}]
        tokens = [prompts, parts[0]["targets"][:, -1:].long()]
        for step in range(self.on_policy_tokens):
            logits = self.model(input_ids=tokens[-1], **with_cache).logits
            parts.append(self._targets(logits))
            if step + 1 < self.on_policy_tokens:  # the last target is kept, its token is not appended
                tokens.append(parts[-1]["targets"].long())
        out = {k: torch.cat([p[k] for p in parts], dim=1) for k in parts[0]}
        out["ids"] = torch.cat(tokens, dim=1).to(torch.int32)
        return out


class TeacherCacheError(RuntimeError):
    """A cached shard that fails its checksum or shape check."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _atomic_save(obj, path: Path) -> str:
    """torch.save to a temporary name, rename into place; returns the file's sha256."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    digest = _sha256(tmp)
    os.replace(tmp, path)
    return digest


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

    def checksum_path(self, i: int) -> Path:
        return self.dir / f"shard_{i:05d}.sha256"

    def rows(self, i: int) -> int:
        return min(self.shard_size, self.n - i * self.shard_size)

    def verify(self, i: int) -> str | None:
        """None if shard i is present and matches its checksum, else what is wrong with it."""
        path, sums = self.shard_path(i), self.checksum_path(i)
        if not path.is_file():
            return "missing"
        if not sums.is_file():
            return "no checksum (written by an interrupted run or an older version)"
        if _sha256(path) != sums.read_text().strip():
            return "checksum mismatch (truncated or damaged)"
        return None

    def complete(self) -> bool:
        return (self.dir / "meta.json").is_file() and all(self.verify(i) is None for i in range(self.n_shards))

    def build(self, sequences: torch.Tensor, teacher: Callable[[], Teacher], meta: dict | None = None) -> int:
        """Compute the missing shards; `teacher` is a factory so a complete cache never even builds
        (or casts) the teacher. Returns the number of shards computed."""
        if self.complete():
            return 0
        self.dir.mkdir(parents=True, exist_ok=True)
        todo = []
        for i in range(self.n_shards):
            problem = self.verify(i)
            if problem is None:
                continue
            if problem != "missing":
                log.warning("teacher shard %s: %s; recomputing it", self.shard_path(i), problem)
                self.shard_path(i).unlink(missing_ok=True)
                self.checksum_path(i).unlink(missing_ok=True)
            todo.append(i)
        log.info("teacher targets: %d/%d shards to compute in %s", len(todo), self.n_shards, self.dir)
        t = teacher()
        t0 = time.perf_counter()
        for i in todo:
            rows = sequences[i * self.shard_size : (i + 1) * self.shard_size]
            parts: list[dict[str, torch.Tensor]] = []
            for j in range(0, rows.shape[0], t.batch_size):
                parts.append(t(rows[j : j + t.batch_size].long()))
            shard = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            digest = _atomic_save(shard, self.shard_path(i))
            _atomic_write_text(self.checksum_path(i), digest + "\n")
            log.info("teacher shard %d/%d done (%.0f s)", i + 1, self.n_shards, time.perf_counter() - t0)
        info = {"n": self.n, "shard_size": self.shard_size, "seq_len": int(sequences.shape[1]),
                "seconds": round(time.perf_counter() - t0, 1), **(meta or {})}
        _atomic_write_text(self.dir / "meta.json", json.dumps(info, indent=1))
        return len(todo)

    def load(self, seq_len: int | None = None) -> dict[str, torch.Tensor]:
        """All shards, each verified against its checksum and shape; TeacherCacheError otherwise."""
        shards = []
        for i in range(self.n_shards):
            problem = self.verify(i)
            if problem is not None:
                raise TeacherCacheError(f"teacher cache shard {self.shard_path(i)}: {problem}")
            try:
                shard = torch.load(self.shard_path(i), weights_only=True)
            except Exception as e:  # a damaged zip that still matches a (damaged) checksum file
                raise TeacherCacheError(f"teacher cache shard {self.shard_path(i)}: unreadable ({e})") from e
            t = shard.get("targets") if isinstance(shard, dict) else None
            if t is None or t.shape[0] != self.rows(i) or (seq_len is not None and t.shape[1] != seq_len):
                raise TeacherCacheError(f"teacher cache shard {self.shard_path(i)}: unexpected contents "
                                        f"(want {self.rows(i)} rows of {seq_len} targets)")
            shards.append(shard)
        return {k: torch.cat([s[k] for s in shards]) for k in shards[0]}
