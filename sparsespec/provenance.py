"""Where a measurement came from: the code, the machine and how busy it was, saved with its numbers.

Every script that writes a results file records it the same way, under the key "provenance":

    prov = Provenance.begin()          # load average and start time, before the measurement
    ...                                # measure
    report["provenance"] = prov.end()  # code version, machine, load after, wall time

and every rendered table ends with `provenance_line(report)`, so a reader can tell which engine made
a number and whether another job shared the cores. A field that was not recorded (a file made before
this was kept) is None or the string "unknown", and the line says so rather than guessing.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the instruction-set extensions that decide how fast the CPU paths run (matmul, the attention kernel)
FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
         "asimd", "neon", "sve")
FIELDS = ("commit", "dirty", "torch", "transformers", "python", "cpu", "cpu_flags", "cores", "threads", "gpu",
          "load_before", "load_after", "wall_s", "date")
UNKNOWN = "unknown"


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # not on this platform
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_version() -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it); (None, None) outside a git checkout."""
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return head.strip(), (None if status is None else bool(status.strip()))


def cpu_info() -> tuple[str | None, str | None]:
    """(CPU model name, the FLAGS it has, space-separated) from /proc/cpuinfo, else what platform says."""
    name, flags = None, None
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if name is None and key in ("model name", "cpu model", "hardware"):
            name = value.strip() or None
        elif flags is None and key in ("flags", "features"):
            have = set(value.split())
            flags = " ".join(f for f in FLAGS if f in have)
    return name or platform.processor() or platform.machine() or None, flags


def _cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _versions() -> tuple[str | None, str | None, int | None, str | None]:
    """(torch, transformers, torch's intra-op threads, GPU name or None)."""
    try:
        import torch
    except ImportError:
        return None, None, None, None
    try:
        import transformers

        tf = transformers.__version__
    except ImportError:
        tf = None
    gpu = None
    try:
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    except RuntimeError:
        gpu = None
    return torch.__version__, tf, torch.get_num_threads(), gpu


@dataclass
class Provenance:
    """A measurement's provenance: `begin()` before it, `end()` after it gives the dict to save."""

    load_before: float | None
    start: float
    commit: str | None = None
    dirty: bool | None = None

    @classmethod
    def begin(cls) -> Provenance:
        """Record the code version (the code a long run imported is the code at its start, whatever
        is committed while it runs), the load average and the start time."""
        commit, dirty = code_version()
        return cls(load_before=_load(), start=time.perf_counter(), commit=commit, dirty=dirty)

    def end(self) -> dict:
        """The provenance dict of a measurement that began at `begin()` and ends now."""
        commit, dirty = self.commit, self.dirty
        cpu, flags = cpu_info()
        torch_v, tf_v, threads, gpu = _versions()
        return {"commit": commit, "dirty": dirty, "torch": torch_v, "transformers": tf_v,
                "python": platform.python_version() or sys.version.split()[0], "cpu": cpu, "cpu_flags": flags,
                "cores": _cores(), "threads": threads, "gpu": gpu, "load_before": self.load_before,
                "load_after": _load(), "wall_s": round(time.perf_counter() - self.start, 1),
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _known(v: object) -> bool:
    return v is not None and v != UNKNOWN


def provenance_text(prov: dict | None) -> str:
    """One provenance as a short phrase: commit, machine, load, date; each unrecorded field named
    "unknown"; "provenance unknown" for none at all. A file labelled after the fact carries
    "committed_in" (the commit that added it: its code is that one or older) and may carry "engine"."""
    if not prov:
        return "provenance unknown"
    get = prov.get
    if _known(get("commit")):
        dirty = {True: " (dirty)", False: ""}.get(get("dirty"), " (dirty: unknown)")
        parts = [f"commit {str(get('commit'))[:7]}{dirty}"]
    elif get("committed_in"):
        on = f" on {get('committed_date')}" if get("committed_date") else ""
        parts = [f"commit unknown (file committed in {str(get('committed_in'))[:7]}{on})"]
    else:
        parts = ["commit unknown"]
    machine = [k for k in ("cpu", "cores", "threads", "load_before", "load_after") if _known(get(k))]
    if not machine:
        parts.append("machine and load unknown")
    else:
        parts.append(str(get("cpu")) if _known(get("cpu")) else "CPU unknown")
        cores = f"{get('cores')} cores" if _known(get("cores")) else "cores unknown"
        threads = f"{get('threads')} threads" if _known(get("threads")) else "threads unknown"
        parts.append(f"{cores} / {threads}")
        if _known(get("load_before")) or _known(get("load_after")):
            before = get("load_before") if _known(get("load_before")) else "?"
            after = get("load_after") if _known(get("load_after")) else "?"
            parts.append(f"load {before} → {after}")
        else:
            parts.append("load unknown")
    if _known(get("gpu")):
        parts.append(str(get("gpu")))
    elif get("gpu") == UNKNOWN and machine:  # an unknown machine already says it
        parts.append("GPU unknown")
    if _known(get("torch")):
        parts.append(f"torch {get('torch')}")
    parts.append(str(get("date"))[:10] if _known(get("date")) else "date unknown")
    if get("engine"):
        parts.append(f"engine: {get('engine')}")
    if get("note"):
        parts.append(str(get("note")))
    return ", ".join(parts)


def provenance_line(report: dict) -> str:
    """The line a renderer prints under a table of `report` (a results file with a "provenance" key,
    or a provenance dict itself): "<sub>commit abc1234 (dirty), AMD EPYC, 2 cores / 2 threads,
    load 0.3 → 0.5, torch 2.13.0, 2026-12-07</sub>"."""
    prov = report.get("provenance") if "provenance" in report else (report if "commit" in report else None)
    text = provenance_text(prov)
    return "<sub>Provenance unknown.</sub>" if text == "provenance unknown" else f"<sub>Provenance: {text}.</sub>"
