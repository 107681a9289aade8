"""Hugging Face's own generate() (plain, assisted by a drafter, prompt lookup), timed on the same
prompts as our engine so that the bench study can put the two side by side.

Plain generate() is given our prefilled cache as a DynamicCache (it runs the prompt's tail itself);
assisted generation and prompt lookup keep their own state and prefill it. Either way the decode
rate is (N - 1) / (t(N) - t(1)): the first token, which the prefill produces, is left out.
"""

from __future__ import annotations

import time

import torch

from sparsespec.kv.cache import KVCache
from sparsespec.models.loading import cache_kwargs


def load_for_generate(model_path: str | None, dtype: str, positions: int, drafter_path=None):
    """(target, tokenizer, drafter or None) as evaluate.py loads them for `positions` (RoPE scaling
    only past the trained positions, so short contexts run the unmodified model), told to decode
    exactly the tokens asked for, as our engine does."""
    from sparsespec.models.loading import check_same_tokenizer, load_model

    loaded = load_model(model_path, dtype, ctx=positions)
    loaded.model.generation_config.eos_token_id = None  # decode exactly N tokens, as our engine does
    loaded.model.generation_config.pad_token_id = loaded.tokenizer.pad_token_id or 0
    drafter = None
    if drafter_path is not None:
        drafter = load_model(str(drafter_path), dtype, ctx=positions)
        check_same_tokenizer(loaded.tokenizer, drafter.tokenizer, what=f"--drafter-path={drafter_path}")
        drafter.model.generation_config.eos_token_id = None
    return loaded.model, loaded.tokenizer, drafter.model if drafter else None


def to_dynamic_cache(cache: KVCache, length: int, config):
    """The first `length` positions of our cache, copied into the DynamicCache generate() takes."""
    from transformers import DynamicCache

    dc = DynamicCache(config=config)
    for i in range(cache.n_layers):
        dc.update(cache.k[i][None, :, :length].clone(), cache.v[i][None, :, :length].clone(), i)
    return dc


def hf_generate(hf, prompt: list[int], n: int, cache=None, **kw) -> tuple[list[int], float]:
    """n greedy tokens from generate() and the seconds the call took."""
    ids = torch.tensor([prompt])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                          **(cache_kwargs(hf, cache) if cache is not None else {}), **kw)
    return out[0, len(prompt):].tolist(), time.perf_counter() - t0


def run_hf(kind: str, hf, drafter_hf, prompt: list[int], n: int, shared: KVCache, config) -> dict:
    """One timed run of `kind` (hf, hf_assisted or hf_lookup): its output and decode rate."""
    kw = {"assistant_model": drafter_hf} if kind == "hf_assisted" else (
        {"prompt_lookup_num_tokens": 10} if kind == "hf_lookup" else {})
    reuse = kind == "hf"

    def call(m):
        cache = to_dynamic_cache(shared, shared.length, config) if reuse else None
        return hf_generate(hf, prompt, m, cache=cache, **kw)

    _, t1 = call(1)
    out, tn = call(n)
    return {"output_ids": out, "decode_s": tn - t1, "decode_tok_s": (n - 1) / (tn - t1)}


def prefill_seconds(hf, ids: list[int]) -> float:
    """Seconds Hugging Face's forward takes to prefill `ids` (beside our chunked prefill's)."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        hf(torch.tensor([ids]), use_cache=True)
    return time.perf_counter() - t0
