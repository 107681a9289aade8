"""The Python API: the same method objects evaluate.py builds from the same config, without Hydra's
command line.

    import sparsespec
    pipe = sparsespec.pipeline("sparsespec_l", model=None, drafter__policy__ratio=0.05)   # None: the embedded SmolLM2
    out = pipe.generate("Once upon a time", max_new_tokens=64, on_token=print)
    out.text, out.output_ids, out.acceptance_rate, out.tokens_per_s
    outs = pipe.generate(["Once upon a time", "The river"], max_new_tokens=64)   # a batch: one Output each
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsespec.config import load_method
from sparsespec.decoding.engine import GenerationResult
from sparsespec.decoding.sampling import Sampling
from sparsespec.eval.methods import Method, MethodConfigError
from sparsespec.models.loading import LoadedModel, load_model
from sparsespec.models.runner import CausalLM


@dataclass
class Output:
    text: str
    output_ids: list[int]
    acceptance_rate: float | None  # accepted / drafted (None for ar)
    tokens_per_s: float  # decoding after the prefill
    result: GenerationResult  # every measurement of the run (rounds, time split, part reports)


@dataclass
class Pipeline:
    method: Method
    loaded: LoadedModel
    target: CausalLM
    drafter_model: CausalLM | None = None

    def generate(self, prompt: str | list[int] | list[str] | list[list[int]], max_new_tokens: int = 64,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 on_token: Callable[..., Any] | None = None, chat: bool = False,
                 stop_at_eos: bool = True) -> Output | list[Output]:
        """Decode after `prompt` (a string, tokenized as it is unless chat=True applies the model's
        chat template; or token ids). `on_token` gets each token id as soon as it is verified.

        A list of prompts (strings, or lists of token ids) is decoded as one batch, each prompt
        exactly as alone with the same seed; the result is a list of Outputs, and `on_token` gets
        (prompt index, token id)."""
        batch = isinstance(prompt, list | tuple) and bool(prompt) and not isinstance(prompt[0], int)
        prompts = list(prompt) if batch else [prompt]
        tok = self.loaded.tokenizer
        ids = [self._ids(p, chat) for p in prompts]
        eos = (tok.eos_token_id,) if stop_at_eos and tok.eos_token_id is not None else ()
        engine = self.method.build(self.target, self.drafter_model)
        stream = on_token if batch or on_token is None else (lambda _, t: on_token(t))
        results = engine.generate_batch(ids, max_new_tokens, Sampling(temperature, top_p), seed=seed,
                                        eos_token_ids=eos, on_token=stream)
        outs = [Output(tok.decode(r.output_ids, skip_special_tokens=True), r.output_ids, r.acceptance_rate,
                       r.tokens_per_s, r) for r in results]
        return outs if batch else outs[0]

    def _ids(self, prompt: str | list[int], chat: bool) -> list[int]:
        tok = self.loaded.tokenizer
        if isinstance(prompt, str):
            if chat:
                return tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            return tok(prompt, add_special_tokens=False)["input_ids"]
        return [int(t) for t in prompt]


def _override(key: str, value: Any) -> str:
    key = key.replace("__", ".")
    if key == "controller" and isinstance(value, str):
        return f"method/controller={value}"
    if isinstance(value, list | tuple):
        value = "[" + ",".join(str(v) for v in value) + "]"
    elif value is None:
        value = "null"
    return f"method.{key}={value}"


def pipeline(method: str, model: str | Path | None = None, drafter: str | Path | None = None,
             ctx: int | None = None, device: str = "auto", dtype: str = "auto", config_dir: str | Path | None = None,
             **overrides: Any) -> Pipeline:
    """A ready method on a loaded model.

    method: a name in conf/method (or in `config_dir`/method for your own methods); model: a local
    directory, a .gguf file, a hub id, or None for the embedded SmolLM2; drafter: the drafter model
    for small-model methods (default for budgetdraft: the latest export); ctx: the longest prompt +
    output you will run (YaRN is applied past the model's trained positions, as in evaluate.py);
    device: auto (CUDA when available), cpu, cuda or cuda:N; dtype: auto (bfloat16 on CUDA, float32
    on the CPU), float32, bfloat16 or float16 (float32 for outputs token-identical to ar).
    overrides: the method's keys with `__` for a dot: `drafter__policy__ratio=0.05`
    (= `method.drafter.policy.ratio=0.05`), `controller="fixed"` (= `method/controller=fixed`),
    `controller__k=8`, `lookup=2`. Raises ConfigError / ModelLoadError with the key or path to fix.
    """
    m = load_method(method, [_override(k, v) for k, v in overrides.items()], search_path=config_dir)
    loaded = load_model(model, dtype=dtype, ctx=ctx, device=device)
    drafter_model = None
    if m.needs_drafter_model:
        if drafter is None and m.needs_trained_drafter:
            from sparsespec.models.exports import latest_drafter_path

            drafter = latest_drafter_path()
        if drafter is None:
            raise MethodConfigError(f"method {m.name} decodes with a drafter model: pass drafter=DIR")
        drafter_model = CausalLM(load_model(drafter, dtype=dtype, ctx=ctx, device=device).model)
    return Pipeline(m, loaded, CausalLM(loaded.model), drafter_model)
