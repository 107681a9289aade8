"""Batched decoding measured: aggregate throughput of ar, magicdec and sparsespec_l at several
contexts and batch sizes, on windows of the held-out PG-19 books, on the embedded model in float32.

    python -m sparsespec.experiments batching --ctx 4k,16k,32k --batch 1,2,4,8 --max-batch-tokens 64k --out results/batching.json

Per context, every prompt is prefilled once (all but its tail, as the harness does) and each run
decodes a batch of the first B of them from those caches, cropping them back after. Per (ctx, B)
the methods run interleaved, `repeats` times. A row is one (ctx, B, method): the batch's aggregate
tokens/s (mean and spread over the repeats), the round's time split, α, k, γ, the paper's
identity S = (α k + 1) / (k γ + 1) and the bandwidth floor of a batched decode step, (weights + B
KV caches) / read bandwidth. Every sequence's greedy output is checked against its own B = 1 ar
output. Each finished (ctx, B) is kept beside --out; `--resume` picks a stopped run up there.
`markdown` renders a saved report; docs/benchmarks.md shows it.
"""

from __future__ import annotations

import logging
import statistics
import time

from sparsespec.experiments import ExperimentError

log = logging.getLogger(__name__)
METHODS = ("ar", "magicdec", "sparsespec_l")
OFFSETS = (0.02, 0.22, 0.42, 0.62)  # where windows start in each held-out book (fractions of its text)


OPTIONS = {"ctx": "4k,16k,32k", "new_tokens": 48, "repeats": 2, "data": None}
RESUME = ("ctx", "new_tokens", "repeats", "data")


def arguments(p) -> None:
    p.add_argument("--batch", default="1,2,4,8", help="comma-separated batch sizes")
    p.add_argument("--max-batch-tokens", default=None, help="leave out a (ctx, batch) whose prompts hold more "
                   "tokens than this together (e.g. 128k: B = 8 at 16k, B = 4 at 32k); default: none left out")


def check(args) -> None:
    from sparsespec.experiments.driver import contexts

    try:
        args.batch = sorted({int(b) for b in str(args.batch).split(",")})
    except ValueError:
        raise ExperimentError(f"--batch: comma-separated sizes, got {args.batch!r}") from None
    if args.max_batch_tokens is not None:
        args.max_batch_tokens = contexts(str(args.max_batch_tokens))[0]
    if not args.batch or min(args.batch) < 1 or args.new_tokens < 2:
        raise ExperimentError("--batch takes positive sizes, --new-tokens at least 2")


def windows(tokenizer, ctx: int, n: int, data: str | None) -> list:
    """n prompts of ctx tokens: windows of the held-out books at several offsets."""
    from sparsespec.data import load_samples

    out = []
    for offset in OFFSETS:
        for s in load_samples("pg19", tokenizer, ctx, path=data, split="eval", offset=offset):
            s.sample_id = f"{s.sample_id}@{offset}"
            out.append(s)
        if len(out) >= n:
            return out[:n]
    raise ExperimentError(f"only {len(out)} windows of {ctx} tokens in the held-out books; lower --batch or --ctx")


def _cell(method: str, b: int, ctx: int, results: list[list], floor, new_tokens: int) -> dict:
    """A row from `repeats` runs of one batch: each run is the batch's list of GenerationResults."""
    agg = [rs[0].aggregate_tokens_per_s for rs in results]
    rs = results[0]
    rounds = max(r.verify_steps for r in rs)
    row = {"ctx": ctx, "batch": b, "sample": f"B={b}", "method": method, "new_tokens": new_tokens,
           "aggregate_tok_s": statistics.fmean(agg), "aggregate_tok_s_runs": agg,
           "per_sequence_tok_s": statistics.fmean(r.tokens_per_s for r in rs),
           "rounds": rounds, "verify_ms": 1000 * rs[0].verify_s / max(rs[0].verify_steps, 1),
           # a batched step reads the weights once and every sequence's KV cache
           "floor_tok_s": b * floor.bandwidth_gbs * 1e9 / (floor.weight_bytes
                                                            + b * floor.kv_per_token * (ctx + new_tokens // 2)),
           "output_ids": [r.output_ids for r in rs]}
    drafted = sum(r.drafted for r in rs)
    if drafted:
        steps = sum(r.draft_steps for r in rs)
        draft_s, verify_s = statistics.fmean(r.draft_s for r in rs), statistics.fmean(r.verify_s for r in rs)
        n_rounds = statistics.fmean(len(r.rounds) for r in rs)
        alpha = sum(r.accepted for r in rs) / drafted
        k = drafted / sum(len(r.rounds) for r in rs)
        gamma = statistics.fmean(r.gamma for r in rs)
        row.update({"acceptance": alpha, "k_mean": k, "gamma": gamma, "identity": (alpha * k + 1) / (k * gamma + 1),
                    "draft_ms": 1000 * draft_s / n_rounds, "verify_ms": 1000 * verify_s / max(n_rounds, 1),
                    "draft_step_ms": 1000 * sum(r.draft_s for r in rs) / steps if steps else None,
                    "index_ms": 1000 * statistics.fmean(r.extra.get("index_update_s", 0.0) for r in rs) / n_rounds})
        row["other_ms"] = max(1000 * statistics.fmean(r.wall_s for r in rs) / n_rounds - row["draft_ms"]
                              - row["verify_ms"] - row["index_ms"], 0.0)
    return row


def measure(args, checkpoint) -> dict:
    """{bandwidth_gbs, weight_bytes, kv_per_token, rows}; see the module docstring. A (ctx, B) whose
    B prompts hold more than max_batch_tokens tokens together is left out (its prefills take long)."""
    from sparsespec.experiments.common.probes import BandwidthFloor
    from sparsespec.experiments.common.runner import decode, decode_batch, our_method, prefill_once
    from sparsespec.models.loading import load_model
    from sparsespec.models.runner import CausalLM

    say, new_tokens, max_batch_tokens = log.info, args.new_tokens, args.max_batch_tokens
    methods = {m: our_method(m) for m in METHODS}
    rows = []
    floor = None
    for ctx in args.ctx:
        loaded = load_model(None, "float32", ctx=ctx + new_tokens, device="cpu")
        target = CausalLM(loaded.model)
        floor = floor or BandwidthFloor.measure(loaded.model, target)
        fits = [b for b in args.batch if max_batch_tokens is None or b * ctx <= max_batch_tokens]
        here = [b for b in fits if not checkpoint.rows(ctx, f"B={b}", list(METHODS))]
        rows += [r for b in fits for r in checkpoint.rows(ctx, f"B={b}", list(METHODS))]
        if not here:
            continue
        prompts = windows(loaded.tokenizer, ctx, max(here), args.data)
        t0 = time.perf_counter()
        caches = [prefill_once(target, p, new_tokens)[0] for p in prompts]  # every batch decodes from these
        say(f"ctx {ctx}: prefilled {len(prompts)} prompts in {time.perf_counter() - t0:.0f} s")
        reference = []  # each prompt's own B = 1 ar output
        for p, c in zip(prompts, caches, strict=True):
            reference.append(decode(methods["ar"].build(target), p.prompt_ids, new_tokens, c).output_ids)
        for b in here:
            runs: dict[str, list] = {m: [] for m in METHODS}
            for _ in range(args.repeats):
                for name, method in methods.items():  # interleaved: drift hits every method alike
                    runs[name].append(decode_batch(method.build(target), [p.prompt_ids for p in prompts[:b]],
                                                   new_tokens, caches[:b]))
            cell = []
            for name in METHODS:
                row = _cell(name, b, ctx, runs[name], floor, new_tokens)
                row["identical_to_b1_ar"] = row.pop("output_ids") == reference[:b]
                if not row["identical_to_b1_ar"]:
                    say(f"ctx {ctx} B={b} {name}: output differs from B=1 ar")
                cell.append(row)
                say(f"ctx {ctx} B={b} {name:<13} {row['aggregate_tok_s']:6.2f} tok/s aggregate"
                    + (f"  α={row['acceptance']:.2f} k={row['k_mean']:.1f} γ={row['gamma']:.2f}"
                       if "acceptance" in row else ""))
            ar = cell[0]["aggregate_tok_s"]
            for row in cell:
                row["vs_ar"] = row["aggregate_tok_s"] / ar
            checkpoint.add(cell)
            rows += cell
        del caches
    assert floor is not None
    return {"bandwidth_gbs": floor.bandwidth_gbs, "weight_bytes": floor.weight_bytes,
            "kv_per_token": floor.kv_per_token, "rows": sorted(rows, key=lambda r: (r["ctx"], r["batch"],
                                                                                  METHODS.index(r["method"])))}


def _spread(values: list[float]) -> str:
    return f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""


def markdown(report: dict) -> str:
    """Aggregate throughput by (ctx, B): ar against its floor and B = 1, the speculative methods
    against batched ar with the identity's prediction beside it, and the round's time split."""
    rows = report["rows"]
    b1 = {r["ctx"]: r["aggregate_tok_s"] for r in rows if r["method"] == "ar" and r["batch"] == 1}
    lines = ["| ctx | B | ar tokens/s (all B sequences) | ar vs B = 1 | ar / floor | method | tokens/s | vs batched ar "
             "| identity S | measured / identity | α | k | γ | verify / ar step | round: draft / verify / index / other ms "
             "| identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["method"] == "ar":
            ar = r
            continue
        ctx = f"{r['ctx'] // 1024}k" if r["ctx"] % 1024 == 0 else str(r["ctx"])
        vs_b1 = f"{ar['aggregate_tok_s'] / b1[r['ctx']]:.2f}×" if r["ctx"] in b1 else "—"
        split = " / ".join(f"{r.get(k) or 0:.0f}" for k in ("draft_ms", "verify_ms", "index_ms", "other_ms"))
        ident = r.get("identity")
        ar_step_ms = 1000 * r["batch"] / ar["aggregate_tok_s"]  # a batched ar step emits B tokens
        lines.append(
            f"| {ctx} | {r['batch']} | {ar['aggregate_tok_s']:.2f}{_spread(ar['aggregate_tok_s_runs'])} | {vs_b1} "
            f"| {ar['aggregate_tok_s'] / ar['floor_tok_s']:.2f} | {r['method']} "
            f"| {r['aggregate_tok_s']:.2f}{_spread(r['aggregate_tok_s_runs'])} | {r['vs_ar']:.2f}× "
            f"| {ident:.2f}× | {r['vs_ar'] / ident:.2f} | {r['acceptance']:.2f} | {r['k_mean']:.1f} "
            f"| {r['gamma']:.2f} | {r['verify_ms'] / ar_step_ms:.2f} | {split} "
            f"| {'yes' if r['identical_to_b1_ar'] and ar['identical_to_b1_ar'] else 'NO'} |"
            if ident else
            f"| {ctx} | {r['batch']} | {ar['aggregate_tok_s']:.2f} | {vs_b1} | — | {r['method']} | — | — | — | — | — "
            "| — | — | — | — | — |")
    return "\n".join(lines) + "\n"
