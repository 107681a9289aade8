"""Turn a `model.path` setting into an eval-mode Hugging Face model and its tokenizer.

One entry point, `load_model`, so every script resolves models the same way:

* `None`, `"smollm2_135m"` or `"embedded"`: the embedded SmolLM2-135M-Instruct (built into the
  sparsespec cache on first use, see `sparsespec.models.embedded`); works offline.
* an existing directory: a Hugging Face checkpoint (config.json + weights + tokenizer files).
* an existing `*.gguf` file: dequantized once to float32 and cached under
  `<cache_root>/gguf/<sha256 of the file>`, so later loads take seconds, not a re-dequantization.
* anything else that does not look like a local path: a hub id (`org/name`), for online users.

It also owns the RoPE policy for contexts beyond the trained positions (see `_rope_parameters`):
running a model past `max_position_embeddings` with unscaled RoPE puts its attention out of
distribution, and comparisons at those lengths would measure that breakage rather than the method,
so by default YaRN is applied and logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from sparsespec.models import embedded
from sparsespec.models.device import resolve_device, resolve_dtype
from sparsespec.models.runner import applied_sliding_window, sliding_window_message

log = logging.getLogger(__name__)

EMBEDDED_ALIASES = (embedded.EMBEDDED_NAME, "embedded")
#: Files any one of which means "this directory carries a tokenizer".
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer_config.json")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_FIX_HINT = ("pass a model directory, a .gguf file, a hub id like org/name, "
             "or leave it unset for the embedded SmolLM2")


def _fix_hint(key: str) -> str:
    """What to pass instead; only model.path falls back to the embedded model when unset."""
    return _FIX_HINT if key == "model.path" else "pass a model directory, a .gguf file or a hub id like org/name"


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded; the message names the path and how to fix it."""


@dataclass
class LoadedModel:
    """A model ready for inference, with what is needed to interpret it."""

    model: PreTrainedModel  # eval mode, requires_grad False
    tokenizer: PreTrainedTokenizerBase
    source: str  # what was loaded: a resolved local directory or a hub id
    max_positions: int  # trained positions: config.max_position_embeddings as shipped, before our scaling


# ---------------------------------------------------------------------------------------------
# path resolution


def _looks_local(spec: str) -> bool:
    """Strings that are clearly meant as filesystem paths; a missing one is a typo, not a hub id, and
    sending it to the hub would only produce a confusing network error."""
    return spec.startswith(("/", ".", "~")) or spec.endswith(".gguf") or spec.count("/") > 1 or "\\" in spec


def resolve_source(path: str | os.PathLike[str] | None, key: str = "model.path") -> tuple[str, bool]:
    """Map a `model.path` value to `(source, is_local)`: a local model directory (building the
    embedded model or converting a GGUF on the way, as needed) or a hub id. Raises ModelLoadError
    naming `key`, the setting the path came from."""
    if path is None or (isinstance(path, str) and path.strip() in EMBEDDED_ALIASES + ("",)):
        try:
            return str(embedded.ensure_embedded_model()), True
        except embedded.EmbeddedModelError as e:
            raise ModelLoadError(f"{key}=null (embedded SmolLM2): {e}") from e
    spec = os.fspath(path).strip()
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            ggufs = sorted(p.glob("*.gguf"))
            hint = (f"; it holds {ggufs[0].name}: pass that file, e.g. {key}={ggufs[0]}" if ggufs
                    else "; a Hugging Face model directory needs config.json, weights and tokenizer files")
            raise ModelLoadError(f"{key}={spec} is a directory without config.json{hint}")
        return str(p.resolve()), True
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{key}={spec} is a file but not a .gguf; pass its directory "
                                 f"({p.parent}) if it belongs to a Hugging Face checkpoint, or {_fix_hint(key)}")
        return str(_converted_gguf(p, key)), True
    if _looks_local(spec):
        raise ModelLoadError(f"{key}={spec} does not exist; {_fix_hint(key)}")
    if not _HUB_ID.fullmatch(spec):
        raise ModelLoadError(f"{key}={spec} is neither an existing path nor a valid hub id; {_fix_hint(key)}")
    return spec, False


def _gguf_sha(p: Path) -> str:
    """sha256 of a GGUF, memoised in `<cache_root>/gguf/index.json` by (path, size, mtime): hashing a
    multi-GB file costs seconds, and this runs on every load."""
    st = p.stat()
    key = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    index_file = embedded.cache_root() / "gguf" / "index.json"
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError):
        index = {}
    if key in index:
        return index[key]
    sha = embedded.sha256_file(p)
    index[key] = sha
    try:
        index_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_file.with_name(f".index.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index, indent=1))
        os.replace(tmp, index_file)
    except OSError:  # a read-only cache only loses the memo
        pass
    return sha


def _converted_gguf(p: Path, key: str = "model.path") -> Path:
    """The cached float32 conversion of GGUF file `p`, built on first use. Keyed by content hash, so a
    renamed copy reuses it and a changed file gets a fresh one."""
    try:
        sha = _gguf_sha(p)
    except OSError as e:
        raise ModelLoadError(f"{key}={p}: cannot read the file ({e})") from e
    target = embedded.cache_root() / "gguf" / sha
    if embedded.is_built(target):
        return target
    with embedded._build_lock(target):
        if embedded.is_built(target):
            return target
        try:
            return embedded.convert_gguf(p, target)
        except embedded.GGUFError as e:
            raise ModelLoadError(
                f"{key}={p}: {str(e).rstrip('.')}. The file looks truncated or corrupt, or its architecture is not "
                "supported by transformers' GGUF reader; re-download it, or pass a Hugging Face model directory"
            ) from e


# ---------------------------------------------------------------------------------------------
# tokenizer


def _has_tokenizer(d: Path) -> bool:
    return any((d / f).is_file() for f in TOKENIZER_FILES)


def _load_tokenizer_from(source: str, is_local: bool, what: str) -> PreTrainedTokenizerBase:
    if is_local and not _has_tokenizer(Path(source)):
        raise ModelLoadError(
            f"{what}={source} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); copy the "
            "tokenizer of the model into that directory (tokenizer.save_pretrained) or pass tokenizer_path="
        )
    try:
        return AutoTokenizer.from_pretrained(source)
    except OSError as e:
        if is_local:
            raise ModelLoadError(f"{what}={source}: could not load its tokenizer ({e})") from e
        raise ModelLoadError(_hub_message(source, e, what)) from e
    except (ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{what}={source}: could not load its tokenizer ({type(e).__name__}: {e})") from e


def load_tokenizer(path: str | os.PathLike[str] | None) -> PreTrainedTokenizerBase:
    """The tokenizer for a `model.path` value, resolved exactly like `load_model` (so a drafter's or a
    dataset's tokenizer can be had without loading weights)."""
    source, is_local = resolve_source(path)
    return _load_tokenizer_from(source, is_local, "model.path")


def check_same_tokenizer(a: Any, b: Any, what: str = "drafter") -> None:
    """Raise ValueError unless `a` and `b` map the same strings to the same ids.

    Speculative decoding hands token ids from one model to the other, so a drafter with a different
    vocabulary would be verified against garbage; that must fail loudly, before any decoding. Special
    token *roles* (eos, bos) may differ - a base drafter for an instruct target is fine. Accepts
    tokenizers or `LoadedModel`s.
    """
    ta = a.tokenizer if isinstance(a, LoadedModel) else a
    tb = b.tokenizer if isinstance(b, LoadedModel) else b
    va, vb = ta.get_vocab(), tb.get_vocab()
    if va == vb:
        return
    only_a = sorted(set(va) - set(vb), key=va.get)
    only_b = sorted(set(vb) - set(va), key=vb.get)
    moved = sorted((t for t in set(va) & set(vb) if va[t] != vb[t]), key=va.get)
    parts = [f"vocab sizes {len(va)} (target) vs {len(vb)} ({what})"]
    if moved:
        ex = ", ".join(f"{t!r}: {va[t]} vs {vb[t]}" for t in moved[:3])
        parts.append(f"{len(moved)} tokens have different ids (e.g. {ex})")
    if only_a:
        parts.append(f"{len(only_a)} target tokens missing from the {what} (e.g. {', '.join(map(repr, only_a[:3]))})")
    if only_b:
        parts.append(f"{len(only_b)} {what} tokens unknown to the target (e.g. {', '.join(map(repr, only_b[:3]))})")
    raise ValueError(
        f"{what} tokenizer differs from the target's: {'; '.join(parts)}. Speculative decoding needs the "
        f"same token ids on both sides; use a {what} from the target's model family (same tokenizer)."
    )


# ---------------------------------------------------------------------------------------------
# RoPE scaling


def _rope_parameters(config: Any, ctx: int | None, rope_scaling: Any) -> tuple[dict | None, str | None]:
    """Decide the RoPE parameters for running `config`'s model at context `ctx`.

    Returns `(new_rope_parameters or None for "leave as is", warning message or None)`.
    Policy: "auto" applies YaRN only when ctx exceeds the trained positions and the model does not
    already scale its RoPE; YaRN because it is static (the same frequencies for prefill and every
    decode step, so cached keys stay consistent) and keeps short-range frequencies intact. The factor
    is the smallest integer covering ctx, at least 2.
    """
    max_pos = int(config.max_position_embeddings)
    current = dict(getattr(config, "rope_parameters", None) or {})
    if current and all(isinstance(v, Mapping) for v in current.values()):  # per-layer-type RoPE
        wants_change = isinstance(rope_scaling, Mapping) or (
            rope_scaling not in (None, False, "none") and (rope_scaling != "auto" or (ctx or 0) > max_pos))
        if not wants_change:
            return None, None
        raise ValueError(f"rope_scaling={rope_scaling!r}: per-layer-type rope_parameters ({list(current)}) "
                         "cannot be rescaled here; set rope_scaling=none")
    theta = current.get("rope_theta", getattr(config, "rope_theta", None))
    base = {"rope_theta": theta} if theta is not None else {}
    if "partial_rotary_factor" in current:
        base["partial_rotary_factor"] = current["partial_rotary_factor"]
    factor = float(max(2, math.ceil((ctx or max_pos) / max_pos)))

    if isinstance(rope_scaling, Mapping):
        params = {**base, **{k: v for k, v in rope_scaling.items()}}
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params.pop("type")
        if "rope_type" not in params:
            raise ValueError(f"rope_scaling={dict(rope_scaling)} needs a rope_type (e.g. yarn, dynamic, linear)")
        if params["rope_type"] in ("yarn", "llama3", "longrope"):
            params.setdefault("original_max_position_embeddings", max_pos)
        return params, f"using rope_scaling={params} (model trained on {max_pos} positions)"

    mode = "none" if rope_scaling in (None, False) else str(rope_scaling).lower()
    if mode == "none":
        if ctx is not None and ctx > max_pos:
            return None, (f"ctx={ctx} exceeds the model's {max_pos} trained positions and rope_scaling=none: "
                          "positions past the trained range are out of distribution")
        return None, None
    if mode == "auto":
        if ctx is None or ctx <= max_pos:
            return None, None
        if current.get("rope_type", "default") != "default":
            return None, (f"ctx={ctx} exceeds the model's {max_pos} positions; it already uses rope_type="
                          f"{current['rope_type']}, which is kept as is")
        mode = "yarn"
        msg = f"ctx={ctx} exceeds the model's {max_pos} trained positions; applying YaRN factor {factor:g}"
    else:
        msg = f"rope_scaling={mode}: factor {factor:g} over the model's {max_pos} trained positions (ctx={ctx})"
    if mode == "yarn":
        return {**base, "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": max_pos}, msg
    if mode in ("dynamic", "linear"):
        return {**base, "rope_type": mode, "factor": factor}, msg
    raise ValueError(f"rope_scaling={rope_scaling!r}: expected auto, none, yarn, dynamic, linear or a dict")


def _apply_rope(config: Any, ctx: int | None, rope_scaling: Any) -> None:
    """Edit `config` in place (before the model is built, so the rotary embedding sees it)."""
    params, msg = _rope_parameters(config, ctx, rope_scaling)
    if msg:
        log.warning(msg)
    if params is None:
        return
    max_pos = int(config.max_position_embeddings)
    config.rope_parameters = params
    if params["rope_type"] != "dynamic":
        # YaRN checks max_position_embeddings / original == factor. Dynamic NTK, by contrast, reads
        # max_position_embeddings as the *original* length and scales beyond it, so it stays put.
        factor = params.get("factor") or 1.0
        original = params.get("original_max_position_embeddings", max_pos)
        config.max_position_embeddings = max(max_pos, int(math.ceil(factor * original)), ctx or 0)
    if hasattr(config, "validate_rope"):
        config.validate_rope()


# ---------------------------------------------------------------------------------------------
# models


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword a Hugging Face forward takes its KV cache by: `cache` in transformers >= 5.x's
    newer releases, `past_key_values` before (deprecated since, removed in 5.40)."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache, "use_cache": True}


def _hub_message(hub_id: str, e: Exception, key: str = "model.path") -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    unset = ", or leave model.path unset for the embedded SmolLM2" if key == "model.path" else ""
    return (f"{key}={hub_id} was taken as a Hugging Face hub id, but it could not be loaded: the hub "
            f"could not be reached or has no such model ({first}). Offline, pass a local model directory "
            f"or .gguf file instead{unset}")


def _own_weights(model: torch.nn.Module, directory: Path) -> int:
    """Give the parameters that are views of the memory-mapped checkpoint their own memory, read
    from the file without the map; returns how many were replaced.

    Why: on the CPU transformers leaves each parameter a view into the mapped safetensors file. The
    runner then fuses q/k/v and gate/up into new tensors, reading those views, so the file's pages
    stay resident beside the fused copies for as long as any parameter (the embeddings) still holds
    the mapping: about 1.6x the weights for SmolLM2. Read with `pread` into owned memory instead,
    the file's pages are never mapped, and the projections the runner fuses are read side by side
    into one tensor per layer (FUSED_PROJECTIONS), so fusing them copies nothing.
    """
    try:
        from safetensors import safe_open
    except ImportError:  # transformers needs it for .safetensors, so only .bin checkpoints get here
        return 0
    params = dict(model.named_parameters(remove_duplicate=False))
    groups = _fused_groups(model, params)
    with contextlib.ExitStack() as opened:
        files = {}
        for file in sorted(directory.glob("*.safetensors")):
            try:
                f = opened.enter_context(safe_open(str(file), framework="pt", backend="pread"))
            except TypeError:  # a safetensors without the pread backend: keep the mapped views
                return 0
            files.update({name: f for name in f.keys()})
        return _read_owned(params, groups, files)


def _read_owned(params: dict[str, torch.nn.Parameter], groups: list[list[str]], files: dict[str, Any]) -> int:
    """`_own_weights` with the checkpoint's files open: `files` maps a tensor name to its file."""

    def readable(name: str) -> bool:
        p, f = params.get(name), files.get(name)
        if p is None or f is None or p.device.type != "cpu":
            return False
        sl = f.get_slice(name)  # another dtype was converted on load: already its own memory
        return tuple(sl.get_shape()) == tuple(p.shape) and str(p.dtype) == f"torch.{_ST_DTYPES.get(sl.get_dtype())}"

    done = set()
    for names in groups:  # one tensor for the group, each parameter a view of its rows
        if not all(readable(n) for n in names):
            continue
        ps = [params[n] for n in names]
        fused = torch.empty(sum(p.shape[0] for p in ps), *ps[0].shape[1:], dtype=ps[0].dtype)
        at = 0
        for n, p in zip(names, ps, strict=True):
            fused[at : at + p.shape[0]] = files[n].get_tensor(n)
            p.data = fused[at : at + p.shape[0]]
            at += p.shape[0]
            done.add(n)
    for name in params:
        if name not in done and readable(name):
            params[name].data = files[name].get_tensor(name)
            done.add(name)
    return len(done)


def _fused_groups(model: torch.nn.Module, params: dict[str, torch.nn.Parameter]) -> list[list[str]]:
    """Parameter names of each group of projections the runner fuses, in its order."""
    from sparsespec.models.runner import FUSED_PROJECTIONS

    groups = []
    for name, _ in model.named_modules():
        for part, linears in FUSED_PROJECTIONS:
            if name.endswith(f".{part}") or name == part:
                names = [f"{name}.{lin}.weight" for lin in linears]
                if all(n in params for n in names):
                    groups.append(names)
    return groups


# safetensors' dtype names -> torch's
_ST_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def load_model(
    path: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype = "auto",
    ctx: int | None = None,
    rope_scaling: str | Mapping[str, Any] | None = "auto",
    device: str | torch.device = "auto",
    tokenizer_path: str | os.PathLike[str] | None = None,
    key: str = "model.path",
) -> LoadedModel:
    """Load a causal LM and its tokenizer for inference.

    `ctx` is the longest sequence (prompt + generation) the caller will run; with the default
    `rope_scaling="auto"` it triggers YaRN when it exceeds the trained positions, and a model whose
    sliding attention window is shorter than it is refused (ModelLoadError naming sliding_window). `tokenizer_path`
    loads the tokenizer from elsewhere (for weight-only directories). `device`/`dtype`: see
    `sparsespec.models.device` (auto: CUDA in bfloat16 when available, else the CPU in float32).
    Raises ModelLoadError for anything about the path, ValueError (ConfigError) for a bad device,
    dtype or rope_scaling. `key`: the setting `path` came from (drafter.path for a drafter), named
    in every message about the path.
    """
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    t0 = time.perf_counter()
    source, is_local = resolve_source(path, key)
    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as e:
        if is_local:
            raise ModelLoadError(f"{key}={source}: unreadable config.json ({e})") from e
        raise ModelLoadError(_hub_message(source, e, key)) from e
    except ValueError as e:  # unknown model_type, invalid hub id, ...
        raise ModelLoadError(f"{key}={source}: {e}") from e
    window = applied_sliding_window(config)
    if window is not None and ctx is not None and ctx > window:  # refuse before loading any weights
        raise ModelLoadError(f"{key}={source}: {sliding_window_message(window, ctx)}")
    max_positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    if max_positions:
        _apply_rope(config, ctx, rope_scaling)
    elif ctx is not None:
        log.warning("%s=%s declares no max_position_embeddings; rope_scaling is not applied", key, source)

    if tokenizer_path is not None:
        tok_source, tok_local = resolve_source(tokenizer_path)
        tokenizer = _load_tokenizer_from(tok_source, tok_local, "tokenizer_path")
    else:
        tokenizer = _load_tokenizer_from(source, is_local, key)

    kwargs: dict[str, Any] = {"config": config, "dtype": torch_dtype, "attn_implementation": "sdpa"}
    if device.type != "cpu":  # straight onto the device, never a full copy in host memory
        kwargs["device_map"] = str(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except OSError as e:
        if is_local:
            raise ModelLoadError(f"{key}={source}: could not load the weights ({e}); the directory needs "
                                 "model.safetensors (or pytorch_model.bin / sharded equivalents)") from e
        raise ModelLoadError(_hub_message(source, e, key)) from e
    if device.type == "cpu" and is_local:
        _own_weights(model, Path(source))
    model.eval()
    model.requires_grad_(False)
    log.info("loaded %s (%s, %s, %s) in %.1f s", source, type(model).__name__, torch_dtype, device, time.perf_counter() - t0)
    return LoadedModel(model=model, tokenizer=tokenizer, source=source, max_positions=max_positions)
