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

Several processes may fill one cache (the ranks of a job, each computing its share of the missing
shards, see training.data; or separate jobs on a shared cache_dir): see TeacherCache for why that
is safe. `TargetTeacher` is the factory train() uses: it holds the target only until released.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import io
import json
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: per-shard sha256 sidecars
# Logits held at once, in positions x vocabulary entries: the head runs over chunks of positions.
# Whole [batch, L, V] logits with a float32 copy and a log-softmax would be ~50 GB for a Llama-3
# vocabulary at L = 2048 and a batch of 16; a chunk is 2^25 entries (128 MiB in float32) each.
CHUNK_ELEMENTS = 1 << 25


def model_fingerprint(model: torch.nn.Module) -> str:
    """Content hash of a model: its config plus a slice of every parameter (cheap, and any retrained
    or different checkpoint changes it)."""
    h = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for name, p in model.state_dict().items():
        h.update(name.encode())
        # the slice is copied to the host first: parameters may live on a GPU
        h.update(p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
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
        out = self._continue(ids) if self.on_policy_tokens else self._head_targets(self.model.model(input_ids=ids)
                                                                                   .last_hidden_state)
        return {k: v.cpu() for k, v in out.items()}  # cached on disk, batched by the CPU data loader

    def _head_targets(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """`_targets` of the head's logits for hidden states [b, L, H], the head run over chunks of
        positions so that no more than CHUNK_ELEMENTS logits (and their float32 copies) exist at once."""
        head = self.model.get_output_embeddings()
        b, n = hidden.shape[:2]
        flat = hidden.reshape(b * n, hidden.shape[-1])
        rows = max(1, CHUNK_ELEMENTS // head.out_features)
        parts = [self._targets(head(flat[i : i + rows])) for i in range(0, b * n, rows)]
        return {k: torch.cat([p[k] for p in parts]).reshape(b, n, *parts[0][k].shape[1:]) for k in parts[0]}

    def _continue(self, prompts: torch.Tensor) -> dict[str, torch.Tensor]:
        """Greedy continuation of a batch of equal-length prompts (so no padding), with the targets of
        every position. Not `generate()`: it would not return the prompt positions' logits, and a
        second pass over the whole sequence would double the cost. The head runs over chunks of
        positions (`_head_targets`), so a batch never holds [b, L, vocab] logits."""
        from transformers import DynamicCache

        from sparsespec.models.loading import cache_kwargs

        cache = DynamicCache()
        with_cache = cache_kwargs(self.model, cache)  # the base model and the LM take the same keyword
        hidden = self.model.model(input_ids=prompts, **with_cache).last_hidden_state
        parts = [self._head_targets(hidden)]
        tokens = [prompts, parts[0]["targets"][:, -1:].long()]
        for step in range(self.on_policy_tokens):
            logits = self.model(input_ids=tokens[-1], **with_cache).logits
            parts.append(self._targets(logits))
            if step + 1 < self.on_policy_tokens:  # the last target is kept, its token is not appended
                tokens.append(parts[-1]["targets"].long())
        out = {k: torch.cat([p[k] for p in parts], dim=1) for k in parts[0]}
        out["ids"] = torch.cat(tokens, dim=1).to(torch.int32)
        return out


class TargetTeacher:
    """The Teacher factory train() hands the data module: it holds the loaded target until
    `release()`, so the target is kept only while a teacher shard may still need it.

    `device`: where the teacher pass runs (set by train() to this rank's device once the Trainer
    exists); None keeps the target where it was loaded. `load` reloads the target should a shard be
    needed after the release (a shard damaged between the completeness check and the read)."""

    def __init__(self, target: torch.nn.Module | None, dtype: str = "bfloat16", topk: int = 8, batch_size: int = 1,
                 on_policy_tokens: int = 0, load: Callable[[], torch.nn.Module] | None = None):
        self.target, self.load = target, load
        self.dtype, self.topk, self.batch_size, self.on_policy_tokens = dtype, topk, batch_size, on_policy_tokens
        self.device: torch.device | None = None
        self.made = 0  # Teachers built (tests: a complete cache builds none)

    def __call__(self) -> Teacher:
        if self.target is None:
            if self.load is None:
                raise RuntimeError("the teacher needs the target, which was released after the teacher cache was "
                                   "found complete; rerun to recompute the missing shard")
            log.info("teacher cache changed since it was found complete: reloading the target")
            self.target = self.load()
        if self.device is not None and next(self.target.parameters()).device != self.device:
            self.target = self.target.to(self.device)  # this rank's GPU, not the one every rank loaded onto
        self.made += 1
        return Teacher(self.target, self.dtype, self.topk, self.batch_size, self.on_policy_tokens)

    def release(self) -> None:
        """Drop the target (the caller drops its Teachers); memory returns once nothing else holds it."""
        self.target = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if sys.platform.startswith("linux"):
            # glibc keeps freed heap memory for reuse; after the teacher pass that is the bf16 copy of
            # the target, which would otherwise stay resident for the rest of training
            try:
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except (OSError, AttributeError):  # not glibc: the memory is reused by this process instead
                pass


class TeacherCacheError(RuntimeError):
    """A cached shard that fails its checksum or shape check."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tmp_path(path: Path) -> Path:
    # unique per writer: two jobs on two hosts sharing cache_dir can have the same pid, and a shared
    # temporary name would let one truncate the file the other is writing
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = _tmp_path(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic on POSIX (a shared filesystem included): readers see old or new, never half
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode())


def shard_bytes(obj: dict[str, torch.Tensor]) -> bytes:
    """torch.save into memory. A file's bytes would depend on its name (torch.save names the zip's
    records after the file), so two writers of the same tensors under different temporary names
    would disagree with each other's checksum; these bytes depend on the tensors alone."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _atomic_save(obj: dict[str, torch.Tensor], path: Path) -> str:
    """Write `obj` to a temporary name, rename into place; returns the file's sha256."""
    data = shard_bytes(obj)
    _atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


class TeacherCache:
    """Sharded on-disk teacher targets for a fixed [N, L] tensor of token ids.

    Safe to share between processes (ranks of one job, or separate jobs on a shared `cache_dir`):
    every file is written under a writer-unique temporary name and renamed into place, and a shard's
    bytes are a function of its tensors, so two processes computing the same shard write identical
    files and checksums and the later rename changes nothing. A process that finds a shard written
    meanwhile skips it. Nothing is ever deleted (a damaged shard is overwritten by its recomputation),
    so no process removes a shard another has just written. The worst a race can do (two writers
    whose tensors differ, e.g. two GPU types) is a checksum mismatch, which is detected and
    recomputed like any damaged shard: a torn or mismatched shard is never read.
    """

    def __init__(self, root: str | Path, key: str, n: int, shard_size: int = 16):
        self.dir = Path(root) / key
        self.n, self.shard_size = n, max(1, int(shard_size))
        # shards this process verified or wrote: (inode, size, mtime) -> digest. Only the checks
        # that decide what to compute use it; load() hashes the very bytes it reads
        self._verified: dict[int, tuple[tuple[int, int, int], str]] = {}

    @property
    def n_shards(self) -> int:
        return (self.n + self.shard_size - 1) // self.shard_size

    def shard_path(self, i: int) -> Path:
        return self.dir / f"shard_{i:05d}.pt"

    def checksum_path(self, i: int) -> Path:
        return self.dir / f"shard_{i:05d}.sha256"

    def rows(self, i: int) -> int:
        return min(self.shard_size, self.n - i * self.shard_size)

    def forget(self) -> None:
        """Drop the memo of verified shards (the next checks hash every shard again)."""
        self._verified.clear()

    def verify(self, i: int) -> str | None:
        """None if shard i is present and matches its checksum, else what is wrong with it."""
        path, sums = self.shard_path(i), self.checksum_path(i)
        try:
            st = path.stat()
        except FileNotFoundError:
            return "missing"
        if not sums.is_file():
            return "no checksum (written by an interrupted run or an older version)"
        want = sums.read_text().strip()
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._verified.get(i) == (stamp, want):
            return None
        if _sha256(path) != want:
            return "checksum mismatch (truncated or damaged)"
        self._verified[i] = (stamp, want)
        return None

    def missing(self) -> list[int]:
        """The shards to (re)compute: missing, without a checksum, or damaged (logged)."""
        todo = []
        for i in range(self.n_shards):
            problem = self.verify(i)
            if problem is None:
                continue
            if problem != "missing":
                log.warning("teacher shard %s: %s; recomputing it", self.shard_path(i), problem)
            todo.append(i)
        return todo

    def complete(self) -> bool:
        return (self.dir / "meta.json").is_file() and all(self.verify(i) is None for i in range(self.n_shards))

    def compute(self, sequences: torch.Tensor, teacher: Callable[[], Teacher], shards: list[int]) -> int:
        """Compute and write `shards` (each with its checksum); returns how many this call computed.
        A shard that became valid since the caller listed it (another rank or job wrote it) is
        skipped; `teacher` is only called if one is left to compute."""
        self.dir.mkdir(parents=True, exist_ok=True)
        t, done, t0 = None, 0, time.perf_counter()
        for i in shards:
            if self.verify(i) is None:
                log.info("teacher shard %s: written by another process meanwhile; skipping it", self.shard_path(i))
                continue
            if t is None:
                t = teacher()
            rows = sequences[i * self.shard_size : (i + 1) * self.shard_size]
            parts: list[dict[str, torch.Tensor]] = []
            for j in range(0, rows.shape[0], t.batch_size):
                parts.append(t(rows[j : j + t.batch_size].long()))
            shard = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            digest = _atomic_save(shard, self.shard_path(i))
            _atomic_write_text(self.checksum_path(i), digest + "\n")
            st = self.shard_path(i).stat()  # another writer's rename since changes the inode: no false memo
            self._verified[i] = ((st.st_ino, st.st_size, st.st_mtime_ns), digest)
            done += 1
            log.info("teacher shard %d/%d done (%.0f s)", i + 1, self.n_shards, time.perf_counter() - t0)
        return done

    def write_meta(self, sequences: torch.Tensor, meta: dict | None = None, seconds: float = 0.0) -> None:
        info = {"n": self.n, "shard_size": self.shard_size, "seq_len": int(sequences.shape[1]),
                "seconds": round(seconds, 1), **(meta or {})}
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(self.dir / "meta.json", json.dumps(info, indent=1))

    def build(self, sequences: torch.Tensor, teacher: Callable[[], Teacher], meta: dict | None = None) -> int:
        """Compute the missing shards, then write meta.json; `teacher` is a factory so a complete cache
        never even builds (or casts) the teacher. Returns the number of shards computed."""
        if self.complete():
            return 0
        todo = self.missing()
        log.info("teacher targets: %d/%d shards to compute in %s", len(todo), self.n_shards, self.dir)
        t0 = time.perf_counter()
        done = self.compute(sequences, teacher, todo)
        self.write_meta(sequences, meta, time.perf_counter() - t0)
        return done

    def load(self, seq_len: int | None = None) -> dict[str, torch.Tensor]:
        """All shards, each verified against its checksum and shape; TeacherCacheError otherwise.
        The checksum is taken of the bytes that are then parsed (read once), so a shard replaced or
        damaged between a check and the read can never be used."""
        shards = []
        for i in range(self.n_shards):
            path, sums = self.shard_path(i), self.checksum_path(i)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise TeacherCacheError(f"teacher cache shard {path}: missing") from None
            if not sums.is_file():
                raise TeacherCacheError(f"teacher cache shard {path}: no checksum (written by an interrupted run "
                                        "or an older version)")
            if hashlib.sha256(data).hexdigest() != sums.read_text().strip():
                raise TeacherCacheError(f"teacher cache shard {path}: checksum mismatch (truncated or damaged)")
            try:
                shard = torch.load(io.BytesIO(data), weights_only=True)
            except Exception as e:  # a damaged zip that still matches a (damaged) checksum file
                raise TeacherCacheError(f"teacher cache shard {path}: unreadable ({e})") from e
            t = shard.get("targets") if isinstance(shard, dict) else None
            if t is None or t.shape[0] != self.rows(i) or (seq_len is not None and t.shape[1] != seq_len):
                raise TeacherCacheError(f"teacher cache shard {path}: unexpected contents "
                                        f"(want {self.rows(i)} rows of {seq_len} targets)")
            shards.append(shard)
        return {k: torch.cat([s[k] for s in shards]) for k in shards[0]}
