"""Export a trained drafter as a Hugging Face model directory, and the stable `latest` pointer.

`<out_dir>/drafter/` holds config.json, model.safetensors and the tokenizer, so
`AutoModelForCausalLM.from_pretrained(dir)` (and `sparsespec.models.loading.load_model(dir)`)
loads it. `<cache_root>/drafters/LATEST` is a text file with the absolute path of the newest
export (sparsespec.models.exports); it is what `evaluate.py method=budgetdraft` uses by default.

With several processes the weights are gathered first (`full_state_dict`, a collective every rank
calls): under FSDP each rank holds only a shard of every parameter, so the drafter module itself
cannot be saved. Rank 0 alone then writes the directory from the gathered state dict.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from sparsespec.models.exports import latest_drafter_path, set_latest  # noqa: F401 (re-exported)


def full_state_dict(model: nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of `model`, on the CPU, on rank 0; `{}` on the other ranks.

    A collective when a process group with several ranks exists: every rank must call it. Works on
    a plain module, DDP, FSDP (FULL_SHARD, Lightning's FSDPStrategy: pass the wrapped root,
    `trainer.strategy.model`) and FSDP2 (`fully_shard`), through torch's
    `get_model_state_dict(full_state_dict=True, cpu_offload=True)`, which also strips the wrappers'
    name prefixes. `prefix` keeps the keys under it, without it ("drafter." for the
    LightningModule's drafter)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() != 0:
            return {}
    else:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    out = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not out:
        raise ValueError(f"no parameters under {prefix!r} in the gathered state dict (keys: {sorted(state)[:5]}...)")
    return out


def _plain_copy(model: PreTrainedModel, state: dict[str, torch.Tensor]) -> PreTrainedModel:
    """A fresh, unwrapped model of `model`'s config holding `state` (checked: every weight present,
    with its full shape, so a shard can never be exported as if it were the weight)."""
    plain = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), dtype=torch.float32)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        plain.generation_config = copy.deepcopy(gen)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(plain.config, "tie_word_embeddings", False) else set()
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"drafter export: the gathered state dict does not fit {type(plain).__name__} "
                         f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    return plain.eval()


def export_drafter(model: PreTrainedModel, tokenizer: Any, out_dir: str | Path, info: dict | None = None,
                   update_latest: bool = True, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write `out_dir/drafter/` (written to a temporary sibling, then renamed) and point LATEST at it.

    `state_dict`: the gathered full weights (`full_state_dict`); the directory is then written from
    a plain copy of `model`'s config holding them, since `model` may be sharded or wrapped. Without
    it `model`'s own weights are written. Call on one process only (rank 0)."""
    out = Path(out_dir).expanduser().resolve() / "drafter"
    tmp = out.with_name(f".drafter.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if state_dict is not None:
        _plain_copy(model, state_dict).save_pretrained(tmp)
    else:
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
