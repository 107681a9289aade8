"""results.jsonl: one JSON object a line per (sample, method), appended atomically; shards; the lock.

A line is written with one write() and fsync'd, so a killed run leaves whole lines only (a torn
final line, should the OS cut one, is dropped on reading). A rerun with the same out_dir skips
the (sample_id, method) pairs already there.

Several processes on one out_dir (a SLURM array, torchrun ranks, `shard=i/n` by hand) each write
their own file: `results.jsonl` unsharded, `results.shard-<i>-of-<n>.jsonl` for shard i of n (see
`resolve_shard`); `results_files` lists them, and a run directory stands for all of them. A
process holds an exclusive `flock` on `<its results file>.lock` for its whole run (`RunLock`), so
a second process on the same file stops at once instead of writing every row again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The output contract other tools read (docs/architecture.md); extra keys may follow, these never change.
CONTRACT_FIELDS = (
    "sample_id", "dataset", "method", "ctx", "prompt_tokens", "new_tokens", "output_ids", "prefill_s",
    "wall_s", "tokens_per_s", "acceptance_rate", "mean_accepted_tokens", "draft_steps", "verify_steps",
    "speedup",
)


def read_rows(path: str | Path) -> list[dict]:
    """The rows of one results file (see `results_files` for every file of a run directory)."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    with open(p, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line from a killed run: that pair simply runs again
    return rows


class ResultsFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows = read_rows(self.path)
        if self.path.exists():
            self._rewrite_clean()

    def _rewrite_clean(self) -> None:
        """Drop a torn trailing line so new lines never glue onto it."""
        text = self.path.read_text(encoding="utf-8")
        clean = "".join(json.dumps(r) + "\n" for r in self.rows)
        if text != clean:
            write_atomic(self.path, clean)

    def done(self, sample_id: str, method: str) -> dict | None:
        for r in self.rows:
            if r["sample_id"] == sample_id and r["method"] == method:
                return r
        return None

    def append(self, row: dict) -> None:
        missing = [k for k in CONTRACT_FIELDS if k not in row]
        if missing:
            raise KeyError(f"result row lacks contract fields {missing}")
        line = json.dumps(row) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        self.rows.append(row)


def write_atomic(path: str | Path, text: str) -> None:
    """Write-then-rename: readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# shards: which samples a process runs, and the file its rows go to
# ---------------------------------------------------------------------------------------------

RESULTS = "results.jsonl"  # the rows of an unsharded run
SHARD_FORM = "i/n with 0 <= i < n (shard=0/2 and shard=1/2 split the samples in two), or null for every sample"
_SHARD_VALUE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_SHARD_FILE = re.compile(r"^results\.shard-(\d+)-of-(\d+)\.jsonl$")


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: samples index, index + count, index + 2 count, ... of the sample list,
    so the shards of one split are disjoint and together are the unsharded run; a sample's methods
    (its paired `ar` too) always land in the same shard."""

    index: int
    count: int
    source: str = ""  # where the split came from (`shard=1/4`, `SLURM_ARRAY_TASK_ID=1 ...`), for the log

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def file_name(self) -> str:
        return f"results.shard-{self.index}-of-{self.count}.jsonl"

    def select(self, items: list) -> list:
        return items[self.index::self.count]


def parse_shard(value: Any) -> tuple[int, int]:
    """`"i/n"` -> (i, n); ValueError saying what is wrong with it otherwise (the caller names the key)."""
    m = _SHARD_VALUE.match(str(value)) if isinstance(value, str) else None
    if m is None:
        raise ValueError("is not of the form i/n")
    i, n = int(m.group(1)), int(m.group(2))
    if not 0 <= i < n:
        raise ValueError("is out of range")
    return i, n


def _env_int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None and default is not None:
        return default
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not an integer; fix the launcher's environment or pass shard=i/n") from None


def resolve_shard(value: Any, environ: Mapping[str, str] | None = None) -> Shard | None:
    """The split this process runs: `shard=i/n` when given; else the launcher's, from the environment
    (torchrun and similar: RANK and WORLD_SIZE; a SLURM job array: SLURM_ARRAY_TASK_ID among
    SLURM_ARRAY_TASK_COUNT tasks, counted from SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP,
    so `--array=1-8` gives shards 0..7 of 8); None for every sample (a split into one counts as none,
    so its rows stay in results.jsonl). ValueError naming the variable when one cannot be used."""
    if value is not None:
        try:
            i, n = parse_shard(value)
        except ValueError as e:
            raise ValueError(f"shard={value!r} {e}: expected {SHARD_FORM}") from None
        return Shard(i, n, f"shard={i}/{n}") if n > 1 else None
    env = os.environ if environ is None else environ
    found: list[Shard] = []
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
        if not 0 <= rank < world:
            raise ValueError(f"RANK={rank} with WORLD_SIZE={world} is not a shard (0 <= RANK < WORLD_SIZE); "
                             "fix the launcher's environment or pass shard=i/n")
        if world > 1:
            found.append(Shard(rank, world, f"RANK={rank} WORLD_SIZE={world}"))
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        task, count = _env_int(env, "SLURM_ARRAY_TASK_ID"), _env_int(env, "SLURM_ARRAY_TASK_COUNT")
        first, step = _env_int(env, "SLURM_ARRAY_TASK_MIN", 0), _env_int(env, "SLURM_ARRAY_TASK_STEP", 1)
        index, off = divmod(task - first, max(step, 1))
        if off or not 0 <= index < count:
            raise ValueError(
                f"SLURM_ARRAY_TASK_ID={task} (SLURM_ARRAY_TASK_MIN={first}, SLURM_ARRAY_TASK_STEP={step}, "
                f"SLURM_ARRAY_TASK_COUNT={count}) is not one of {count} evenly spaced tasks (an --array list "
                "with gaps?); use --array=0-N or pass shard=${SLURM_ARRAY_TASK_ID}/N yourself")
        if count > 1:
            found.append(Shard(index, count, f"SLURM_ARRAY_TASK_ID={task} of SLURM_ARRAY_TASK_COUNT={count}"))
    if len(found) > 1:
        raise ValueError(f"both {found[0].source} and {found[1].source} split the samples: pass shard=i/n to "
                         "say which split this process runs")
    return found[0] if found else None


def results_name(shard: Shard | None) -> str:
    """The file this process's rows go to."""
    return shard.file_name if shard is not None else RESULTS


def split_of(path: str | Path) -> tuple[int, int] | None:
    """(i, n) of a results file's name: (0, 1) for results.jsonl, None for a file of another name."""
    name = Path(path).name
    if name == RESULTS:
        return (0, 1)
    m = _SHARD_FILE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def results_files(run_dir: str | Path) -> list[Path]:
    """Every results file of a run directory: results.jsonl, then the shard files by split and index."""
    d = Path(run_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir() if p.is_file() and split_of(p) is not None]
    return sorted(found, key=lambda p: (split_of(p)[1], split_of(p)[0]))


# ---------------------------------------------------------------------------------------------
# the lock: one process per results file
# ---------------------------------------------------------------------------------------------


class LockedError(RuntimeError):
    """Another process holds the lock; `holder` is "pid N on HOST" when it recorded itself."""

    def __init__(self, path: Path, holder: str | None) -> None:
        super().__init__(f"{path} is locked" + (f" by {holder}" if holder else ""))
        self.path, self.holder = path, holder


class RunLock:
    """An exclusive, non-blocking (or, with blocking=True, waiting) `flock` on `path`, held until
    `release()`. The OS drops it when the process dies, however it dies, so a lock is never stale;
    the file only records who holds it ("PID HOST"), for the message the next process prints.

    `release()` deletes the file while still holding it (a process that opened it meanwhile finds, after
    its own flock, that the path is gone or is another file, and starts over: `acquire` locks only
    the file that is on disk), and removes the directories `acquire` had to create if they are empty
    again: a run that stops before writing anything leaves no out_dir behind.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.fd: int | None = None
        self._made: list[Path] = []

    def _mkdirs(self) -> None:
        missing, d = [], self.path.parent
        while not d.exists():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            try:
                d.mkdir()
                self._made.append(d)
            except FileExistsError:
                pass

    def acquire(self, blocking: bool = False) -> RunLock:
        for _ in range(100):  # each retry follows a holder that let go and deleted the file meanwhile
            self._mkdirs()
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the directory went with a process that gave up its start
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError as e:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip()
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise LockedError(self.path, _holder(holder)) from None
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # a filesystem without locks
                    log.warning("%s: this filesystem cannot lock files (%s); nothing stops a second process "
                                "from writing here", self.path, e.strerror)
                    return self
                raise
            try:
                st, disk = os.fstat(fd), os.stat(self.path)
                same = (st.st_dev, st.st_ino) == (disk.st_dev, disk.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
                self.fd = fd
                return self
            os.close(fd)
        raise OSError(f"{self.path}: could not take the lock (the file kept changing)")

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None
        for d in reversed(self._made):
            try:
                d.rmdir()  # only when empty: a run that wrote nothing
            except OSError:
                break
        self._made = []

    def __enter__(self) -> RunLock:
        return self.acquire(blocking=True)

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(text: str) -> str | None:
    pid, _, host = text.partition(" ")
    if not pid.isdigit():
        return None
    return f"pid {pid}" + (f" on {host}" if host else "")
