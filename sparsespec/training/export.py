"""Export a trained drafter as a Hugging Face model directory, and the stable `latest` pointer.

`<out_dir>/drafter/` holds config.json, model.safetensors and the tokenizer, so
`AutoModelForCausalLM.from_pretrained(dir)` (and `sparsespec.models.loading.load_model(dir)`)
loads it. `<cache_root>/drafters/LATEST` is a text file with the absolute path of the newest
export; `latest_drafter_path()` is what `evaluate.py method=budgetdraft` uses by default.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from sparsespec.models.embedded import cache_root

LATEST = "LATEST"


def drafters_root() -> Path:
    return cache_root() / "drafters"


def latest_drafter_path() -> Path | None:
    """The newest exported drafter directory, or None if nothing was exported (or it was deleted)."""
    pointer = drafters_root() / LATEST
    try:
        path = Path(pointer.read_text().strip())
    except OSError:
        return None
    return path if (path / "config.json").is_file() else None


def set_latest(path: Path) -> None:
    root = drafters_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{LATEST}.{os.getpid()}.tmp"
    tmp.write_text(str(Path(path).resolve()) + "\n")
    os.replace(tmp, root / LATEST)


def export_drafter(model: PreTrainedModel, tokenizer: Any, out_dir: str | Path, info: dict | None = None,
                   update_latest: bool = True) -> Path:
    """Write `out_dir/drafter/` (written to a temporary sibling, then renamed) and point LATEST at it."""
    out = Path(out_dir).expanduser().resolve() / "drafter"
    tmp = out.with_name(f".drafter.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    was_training = model.training
    model.eval()
    model.save_pretrained(tmp)
    model.train(was_training)
    tokenizer.save_pretrained(tmp)
    (tmp / "budgetdraft.json").write_text(json.dumps(info or {}, indent=1, default=str))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    if update_latest:
        set_latest(out)
    return out
