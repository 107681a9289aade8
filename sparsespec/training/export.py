"""Export a trained drafter as a Hugging Face model directory, and the stable `latest` pointer.

`<out_dir>/drafter/` holds config.json, model.safetensors and the tokenizer, so
`AutoModelForCausalLM.from_pretrained(dir)` (and `sparsespec.models.loading.load_model(dir)`)
loads it. `<cache_root>/drafters/LATEST` is a text file with the absolute path of the newest
export (sparsespec.models.exports); it is what `evaluate.py method=budgetdraft` uses by default.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from sparsespec.models.exports import latest_drafter_path, set_latest  # noqa: F401 (re-exported)


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
