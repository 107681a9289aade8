"""Side-by-side decoding benchmark: Hugging Face generate / assisted / prompt lookup vs this
project's methods, in one process, on the same prompts.

    python scripts/bench.py --ctx 4k,8k,16k,32k --new-tokens 128 --repeats 3 --write docs/benchmarks.md

Protocol (docs/benchmarks.md repeats it next to the numbers):
- prompts: windows of `--ctx` tokens from PG-19 books (the six shipped with the package by default);
- our methods: the target cache is prefilled once per prompt (all but the last 64 tokens) and
  reused, so a run times its decoding only: decode tok/s = (new_tokens - 1) / wall_s;
- HF `generate()`: given the same prefilled cache as a DynamicCache (it runs the last 64 prompt
  tokens itself), decode tok/s =
  (N - 1) / (t(N) - t(1)) — the first token, produced by the prefill, is excluded on both sides;
- HF assisted / prompt lookup (which re-prefill their own state): (N - 1) / (t(N) - t(1)) with a
  full prefill in both calls, only at ctx <= --hf-full-max (their prefills dominate the run);
- bandwidth floor: (weight bytes + KV bytes read per token) / the read bandwidth measured here;
- peak memory: the process' peak RSS so far (monotone over the run).
- each method on each prompt: --warmup untimed runs of --warmup-tokens, then --repeats timed runs;
- each finished prompt is checkpointed beside --json; `--resume` picks a stopped run up there.
Every speculative method's greedy output is compared with our ar and with HF generate.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparsespec.config import load_method, parse_ctx  # noqa: E402
from sparsespec.eval.tables import HF_METHODS, bench_markdown, bench_plot  # noqa: E402

log = logging.getLogger("bench")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4k,8k,16k,32k", help="comma-separated context lengths")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each method before its repeats, each "
                   "decoding --warmup-tokens (threads, allocator and kernels warm up; the tokens are not needed)")
    p.add_argument("--warmup-tokens", type=int, default=32)
    p.add_argument("--samples", type=int, default=1, help="books (prompts) per ctx")
    p.add_argument("--methods", default="hf,hf_assisted,hf_lookup,ar,sd,magicdec,sparsespec_l,budgetdraft",
                   help="comma-separated; a method may carry overrides: sparsespec_l:controller=fixed:k=8")
    p.add_argument("--model-path", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--drafter-path", default=None,
                   help="drafter for sd / budgetdraft / hf_assisted (default: latest train.py export)")
    p.add_argument("--data", default=None, help="PG-19-schema file, directory or hub id (default: the shipped books)")
    p.add_argument("--split", default="test", choices=("test", "train", "eval"),
                   help="PG-19 books: test = all, eval = the 2 held out from drafter training (use it when a "
                        "trained drafter runs: its training windows start where these prompts do)")
    p.add_argument("--hf-full-max", default="8k", help="largest ctx for HF assisted / prompt lookup")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="write raw results here; each finished sample is also kept in "
                   "JSON.partial.jsonl until the run ends")
    p.add_argument("--resume", action="store_true", help="reuse the finished samples in JSON.partial.jsonl")
    p.add_argument("--render", default=None, metavar="JSON", help="run nothing: re-render a saved --json report "
                   "(with --write/--name/--plot)")
    p.add_argument("--write", default=None, help="markdown file to put the table in (a section per --name)")
    p.add_argument("--name", default="decode", help="section name in the markdown file")
    p.add_argument("--plot", default=None, help="PNG of decode tok/s vs ctx per method")
    return p.parse_args(argv)


# -- methods -------------------------------------------------------------------------------------


def our_method(spec: str):
    """'sparsespec_l:controller=fixed:k=8' -> conf/method/sparsespec_l.yaml with the fixed controller at
    k = 8; other `key=value` parts set the drafter's KV policy (`method.drafter.policy.ratio`, ...)."""
    name, *over = spec.split(":")
    overrides = []
    for o in over:
        key, _, value = o.partition("=")
        overrides.append({"controller": f"method/controller={value}", "k": f"method.controller.k={value}"}.get(
            key, f"method.drafter.policy.{o}"))
    method = load_method(name, overrides)
    method.name = spec
    return method


def to_dynamic_cache(cache, length: int, config):
    from transformers import DynamicCache

    dc = DynamicCache(config=config)
    for i in range(cache.n_layers):
        dc.update(cache.k[i][None, :, :length].clone(), cache.v[i][None, :, :length].clone(), i)
    return dc


def hf_generate(hf, prompt: list[int], n: int, cache=None, **kw) -> tuple[list[int], float]:
    ids = torch.tensor([prompt])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                          cache=cache, **kw)
    return out[0, len(prompt):].tolist(), time.perf_counter() - t0


def run_hf(kind: str, hf, drafter_hf, prompt, n, shared, config) -> dict:
    kw = {"assistant_model": drafter_hf} if kind == "hf_assisted" else (
        {"prompt_lookup_num_tokens": 10} if kind == "hf_lookup" else {})
    reuse = kind == "hf"

    def call(m):
        cache = to_dynamic_cache(shared, shared.length, config) if reuse else None
        return hf_generate(hf, prompt, m, cache=cache, **kw)

    _, t1 = call(1)
    out, tn = call(n)
    return {"output_ids": out, "decode_s": tn - t1, "decode_tok_s": (n - 1) / (tn - t1)}


def prefill_once(target, sample, new_tokens: int):
    """The harness' shared prefill (all but the prompt's tail), reused by every run on this prompt."""
    from tqdm.auto import tqdm

    from sparsespec.eval.harness import SharedPrefill

    with tqdm(total=sample.prompt_tokens, desc=f"prefill {sample.sample_id}", unit="tok", leave=False,
              mininterval=10) as bar:
        cache, seconds = SharedPrefill(target, chunk=1024).get(sample, new_tokens, bar)
    if cache is None:
        raise SystemExit(f"--ctx must exceed {2 * SharedPrefill.TAIL} tokens (prompt {sample.sample_id})")
    return cache, seconds


def run_ours(method, target, drafter, prompt, n, shared) -> dict:
    engine = method.build(target, drafter)
    head = shared.length
    res = engine.generate(prompt, n, cache=shared)
    shared.crop(head)
    row = {"output_ids": res.output_ids, "decode_s": res.wall_s, "decode_tok_s": (n - 1) / res.wall_s,
           "acceptance": res.acceptance_rate, "tau": res.mean_accepted_tokens,
           "acceptance_quarters": res.acceptance_by_part(4)}
    if res.draft_steps and res.verify_steps:
        row["gamma"] = res.gamma
        row["k_mean"] = res.drafted / max(len(res.rounds), 1)
        row["index_share"] = res.extra.get("index_update_s", 0.0) / res.wall_s
        # where a round's time goes (the index update runs after the verify pass, in the overhead)
        row["draft_ms"] = 1000 * res.draft_s / len(res.rounds)
        row["verify_ms"] = 1000 * res.verify_s / res.verify_steps
        row["index_ms"] = 1000 * res.extra.get("index_update_s", 0.0) / res.verify_steps
        row["other_ms"] = 1000 * (res.overhead_s - res.extra.get("index_update_s", 0.0)) / res.verify_steps
    return row


# -- machine -------------------------------------------------------------------------------------


def read_bandwidth_gbs(gb: float = 1.0) -> float:
    """Bytes per second a reduction over a large fp32 tensor reads (best of 5)."""
    x = torch.ones(int(gb * 2**30 / 4))
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# -- main ----------------------------------------------------------------------------------------


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.render:
        return render(Path(args.render), args)
    from sparsespec.data import load_samples
    from sparsespec.models.loading import check_same_tokenizer, load_model
    from sparsespec.models.runner import CausalLM

    torch.set_num_threads(args.threads or torch.get_num_threads())
    ctxs = [parse_ctx(c) for c in args.ctx.split(",")]
    specs = [s for s in args.methods.split(",") if s]
    hf_full_max = parse_ctx(args.hf_full_max)
    ours = {s: our_method(s) for s in specs if s not in HF_METHODS}
    drafter_path = None
    if any(m.drafter == "model" for m in ours.values()) or "hf_assisted" in specs:
        drafter_path = args.drafter_path
        if drafter_path is None:
            from sparsespec.models.exports import latest_drafter_path

            drafter_path = latest_drafter_path()
            if drafter_path is None:
                raise SystemExit("no drafter: pass --drafter-path DIR or run `python train.py budget=multi` first")

    def models_for(ctx: int):
        """Target (and drafter) as evaluate.py loads them for this ctx: RoPE scaling only past the
        trained positions, so short contexts run the unmodified model."""
        loaded = load_model(args.model_path, args.dtype, ctx=ctx + args.new_tokens)
        loaded.model.generation_config.eos_token_id = None  # decode exactly N tokens, as our engine does
        loaded.model.generation_config.pad_token_id = loaded.tokenizer.pad_token_id or 0
        d = None
        if drafter_path is not None:
            d = load_model(str(drafter_path), args.dtype, ctx=ctx + args.new_tokens)
            check_same_tokenizer(loaded.tokenizer, d.tokenizer, what=f"--drafter-path={drafter_path}")
            d.model.generation_config.eos_token_id = None
        return loaded.model, loaded.tokenizer, d.model if d else None

    hf, tok, _ = models_for(min(ctxs))
    target = CausalLM(hf)
    bw = read_bandwidth_gbs()
    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())
    kv_per_token = 2 * target.n_layers * target.n_kv_heads * target.head_dim * torch.finfo(target.dtype).bits // 8
    log.info("read bandwidth %.1f GB/s; weights %.0f MB; KV %.1f KB/token", bw, weight_bytes / 1e6,
             kv_per_token / 1e3)

    checkpoint = Checkpoint.open(args)
    rows = []
    for ctx in ctxs:
        hf, tok, drafter_hf = models_for(ctx)
        target, drafter = CausalLM(hf), CausalLM(drafter_hf) if drafter_hf is not None else None
        samples = load_samples("pg19", tok, ctx, path=args.data, limit=args.samples, split=args.split)
        # HF's assisted / prompt-lookup generation re-prefill their own state: short contexts only
        here = [s for s in specs if not (s in ("hf_assisted", "hf_lookup") and ctx > hf_full_max)]
        for sample in samples:
            done = checkpoint.rows(ctx, sample.sample_id, here)
            if done:
                log.info("ctx %d %s: resumed from %s", ctx, sample.sample_id, checkpoint.path)
                rows += done
                continue
            sample_rows = []
            prompt = sample.prompt_ids
            shared, prefill_s = prefill_once(target, sample, args.new_tokens)
            hf_prefill_s = None
            if ctx <= hf_full_max:
                t0 = time.perf_counter()
                with torch.inference_mode():
                    hf(torch.tensor([prompt[: shared.length]]), use_cache=True)
                hf_prefill_s = time.perf_counter() - t0
            log.info("ctx %d %s: prefill ours %.1f s, HF %s", ctx, sample.sample_id, prefill_s,
                     f"{hf_prefill_s:.1f} s" if hf_prefill_s else "-")
            floor = bw * 1e9 / (weight_bytes + kv_per_token * (len(prompt) + args.new_tokens // 2))
            for spec in here:
                runs = []
                for rep in range(args.warmup + args.repeats):  # warm-up runs are dropped
                    n = args.new_tokens if rep >= args.warmup else min(args.new_tokens, args.warmup_tokens)
                    if spec in HF_METHODS:
                        r = run_hf(spec, hf, drafter_hf, prompt, n, shared, hf.config)
                    else:
                        r = run_ours(ours[spec], target, drafter, prompt, n, shared)
                    if rep >= args.warmup:
                        runs.append(r)
                rates = [r["decode_tok_s"] for r in runs]
                row = {"ctx": ctx, "sample": sample.sample_id, "method": spec, "prompt_tokens": len(prompt),
                       "tok_s": statistics.fmean(rates), "tok_s_std": statistics.stdev(rates) if len(rates) > 1 else 0.0,
                       "output_ids": runs[0]["output_ids"], "floor_tok_s": floor, "prefill_s": prefill_s,
                       "hf_prefill_s": hf_prefill_s, "peak_rss_gb": peak_rss_gb()}
                for key in ("acceptance", "tau", "gamma", "k_mean", "index_share", "draft_ms", "verify_ms",
                            "index_ms", "other_ms"):
                    vals = [r[key] for r in runs if r.get(key) is not None]
                    row[key] = statistics.fmean(vals) if vals else None
                row["acceptance_quarters"] = runs[0].get("acceptance_quarters")
                sample_rows.append(row)
                log.info("ctx %d %-28s %6.2f ± %.2f tok/s  α=%s", ctx, spec, row["tok_s"], row["tok_s_std"],
                         f"{row['acceptance']:.2f}" if row["acceptance"] is not None else "-")
            checkpoint.add(sample_rows)
            rows += sample_rows
            del shared
    _compare(rows)
    report = {"args": vars(args), "bandwidth_gbs": bw, "weight_bytes": weight_bytes, "rows": rows,
              "command": "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    publish(report, args)
    checkpoint.close()
    return report


def publish(report: dict, args) -> None:
    """The report's markdown on stdout, and in --write's section and --plot's PNG when asked."""
    table = bench_markdown(report)
    print(table)
    if args.write:
        write_section(Path(args.write), args.name, table)
    if args.plot:
        bench_plot(report, Path(args.plot))


def render(path: Path, args) -> dict:
    """A saved report's markdown again (after the table format changed), without rerunning it."""
    if not path.is_file():
        raise SystemExit(f"--render: {path} is not a file (a report written by --json)")
    report = json.loads(path.read_text())
    publish(report, args)
    return report


class Checkpoint:
    """Finished samples, one JSON line each, beside --json: an hour-long 64k run that stops (or is
    stopped) keeps what it finished, and `--resume` skips those samples, prefill included. The first
    line records the settings a resumed run must share."""

    KEYS = ("new_tokens", "model_path", "dtype", "drafter_path", "data", "split", "repeats", "warmup", "warmup_tokens")

    def __init__(self, path: Path | None, done: list[dict]):
        self.path, self.done = path, done

    @classmethod
    def open(cls, args) -> Checkpoint:
        if not args.json:
            if args.resume:
                raise SystemExit("--resume needs --json (the checkpoint is JSON.partial.jsonl)")
            return cls(None, [])
        path = Path(args.json).with_suffix(".partial.jsonl")
        header = {k: getattr(args, k) for k in cls.KEYS}
        done = []
        if args.resume and path.exists():
            head, *lines = path.read_text().splitlines()
            if json.loads(head) != header:
                raise SystemExit(f"--resume: {path} was written with other settings ({head}); rerun with "
                                 "those, or without --resume to start over")
            done = [row for line in lines for row in json.loads(line)]
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(header) + "\n")
        return cls(path, done)

    def rows(self, ctx: int, sample_id: str, specs: list[str]) -> list[dict]:
        """This sample's rows if every method finished it, else [] (it runs again)."""
        rows = {r["method"]: r for r in self.done if r["ctx"] == ctx and r["sample"] == sample_id}
        return [rows[s] for s in specs if s in rows] if all(s in rows for s in specs) else []

    def add(self, sample_rows: list[dict]) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(sample_rows) + "\n")

    def close(self) -> None:
        """The run finished and --json holds everything: the checkpoint has done its job."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _compare(rows: list[dict]) -> None:
    """Ratios against HF generate and our ar, and greedy identity, per (ctx, sample)."""
    for row in rows:
        peers = {r["method"]: r for r in rows if r["ctx"] == row["ctx"] and r["sample"] == row["sample"]}
        for ref, key in (("hf", "vs_hf"), ("ar", "vs_ar")):
            row[key] = row["tok_s"] / peers[ref]["tok_s"] if ref in peers else None
            row[f"identical_{ref}"] = row["output_ids"] == peers[ref]["output_ids"] if ref in peers else None


def write_section(path: Path, name: str, body: str) -> None:
    """Replace (or append) the section between <!-- bench:name --> markers, atomically."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


if __name__ == "__main__":
    main()
