"""Long-run soak: SparseSpec-L decoding 512 tokens at 64k and 128k context, watching acceptance and
memory over time (issue 9). Not a test: hours on a 2-core CPU at 128k.

For each ctx: load the target (YaRN past its trained positions, as evaluate.py does), build a
ctx-token prompt from running text (the shipped PG-19 books, or --text), check the memory guard,
then decode --new-tokens with the method, and with each --compare method (default ar and magicdec)
on the same prefilled cache, for the speedup and the first law (same tokens as ar). Recorded:

  rounds  per verification round: time, tokens drafted / accepted, tokens emitted so far, RSS
  memory  RSS sampled every --interval seconds by a thread, tagged load / prefill / decode

Writes OUT/soak.json and OUT/soak.png (acceptance per round with a running mean; RSS over time).
"Nothing grows without bound" is judged on the decode phase: the KV cache is preallocated for
prompt + new tokens and the recall index is sized at prefill, so RSS should stay flat while
decoding; `decode_growth_mib` and `bounded` (growth <= max(64 MiB, 5% of the decode-start RSS))
say whether it did.

  .venv/bin/python scripts/soak.py                          # 64k and 128k, 512 tokens, embedded model
  .venv/bin/python scripts/soak.py --ctx 2048 --new-tokens 32 --out outputs/soak_smoke
  .venv/bin/python scripts/soak.py --ctx 64k --set method.drafter.policy.ratio=0.05 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparsespec.config import load_method, parse_ctx  # noqa: E402
from sparsespec.data.continuation import window  # noqa: E402
from sparsespec.decoding.sampling import Sampling  # noqa: E402
from sparsespec.eval.harness import SharedPrefill  # noqa: E402
from sparsespec.eval.summary import ctx_label, distinct_by_part  # noqa: E402
from sparsespec.eval.tables import save_png  # noqa: E402
from sparsespec.models.loading import load_model  # noqa: E402
from sparsespec.models.runner import CausalLM  # noqa: E402

log = logging.getLogger("soak")
MiB = 1024**2


class RssSampler(threading.Thread):
    """Samples this process's RSS every `interval` seconds, tagged with the current phase."""

    def __init__(self, interval: float, t0: float):
        super().__init__(daemon=True)
        self.interval, self.t0 = interval, t0
        self.phase = "load"
        self.samples: list[dict] = []
        self._halt = threading.Event()
        self._proc = psutil.Process()

    def rss_mib(self) -> float:
        return self._proc.memory_info().rss / MiB

    def mark(self) -> None:
        self.samples.append({"t": round(time.perf_counter() - self.t0, 3), "phase": self.phase,
                             "rss_mib": round(self.rss_mib(), 1)})

    def run(self) -> None:
        while not self._halt.is_set():
            self.mark()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.mark()


def source_text(path: str | None) -> str:
    if path:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    from sparsespec.data.pg19 import load_books

    books = load_books(None)
    # each book after its Gutenberg front matter (2% of its characters), one after another
    return "\n\n".join(b["text"][int(len(b["text"]) * 0.02) :] for b in books)


def prompt_ids(tokenizer, text: str, ctx: int) -> list[int]:
    """The first `ctx` tokens of the text, cut as evaluate.py cuts a continuation window."""
    ids = window(tokenizer, text, ctx, 0).ids
    if ids is None:
        raise SystemExit(f"the source text has fewer than ctx={ctx} tokens: pass a longer --text")
    return ids


def soak_one(args, ctx: int, text: str, t0: float) -> dict:
    sampler = RssSampler(args.interval, t0)
    sampler.start()
    method = load_method(args.method, args.set)
    loaded = load_model(args.model_path, args.dtype, ctx=ctx + args.new_tokens)
    target = CausalLM(loaded.model)
    prompt = prompt_ids(loaded.tokenizer, text, ctx)
    if args.memory_guard:
        from sparsespec.eval.memory import check_memory

        est = check_memory(target, ctx + args.new_tokens, [method], None, args.prefill_chunk, SystemExit)
        log.info("memory estimate %.2f GiB beyond the weights", est["total"] / 1024**3)
    engine = method.build(target, None, args.prefill_chunk)
    rounds: list[dict] = []
    emitted = [1]  # the first token comes from prefill
    observe = engine.controller.observe

    def observe_and_record(stats) -> None:
        sampler.phase = "decode"
        emitted[0] += stats.accepted + 1
        rounds.append({"t": round(time.perf_counter() - t0, 3), "drafted": stats.drafted, "accepted": stats.accepted,
                       "tokens": min(emitted[0], args.new_tokens), "rss_mib": round(sampler.rss_mib(), 1)})
        if args.verbose and len(rounds) % 10 == 0:
            log.info("ctx %d: round %d, %d tokens, RSS %.0f MiB", ctx, len(rounds), rounds[-1]["tokens"],
                     rounds[-1]["rss_mib"])
        observe(stats)

    engine.controller.observe = observe_and_record
    sampler.phase = "prefill"
    log.info("ctx %d: prefill of %d tokens", ctx, len(prompt))
    # one prefill for the soaked method and every --compare method (the harness' SharedPrefill)
    shared = SharedPrefill(target, args.prefill_chunk)
    sample = SimpleNamespace(sample_id=f"soak-{ctx}", prompt_tokens=len(prompt), prompt_ids=prompt)
    cache, shared_s = shared.get(sample, args.new_tokens)
    head = cache.length if cache is not None else 0
    sampling = Sampling(args.temperature, args.top_p)
    res = engine.generate(prompt, args.new_tokens, sampling, seed=args.seed, cache=cache)
    if cache is not None:
        cache.crop(head)
        res.prefill_s += shared_s
    sampler.phase = "compare"
    compare = []
    for name in args.compare:
        other = load_method(name, [])
        log.info("ctx %d: %s on the same prefill", ctx, name)
        r = other.build(target, None, args.prefill_chunk).generate(prompt, args.new_tokens, sampling,
                                                                    seed=args.seed, cache=cache)
        if cache is not None:
            cache.crop(head)
        compare.append({"method": other.name, "new_tokens": r.new_tokens, "tokens_per_s": round(r.tokens_per_s, 3),
                        "acceptance_rate": r.acceptance_rate, "mean_accepted_tokens": r.mean_accepted_tokens,
                        "acceptance_by_quarter": r.acceptance_by_part(4),
                        "distinct_by_quarter": distinct_by_part(r.output_ids, 4), "output_ids": r.output_ids,
                        # greedy: the first law says identical; sampling: the same distribution, not the same draw
                        "same_output": r.output_ids == res.output_ids if args.temperature == 0 else None})
    sampler.stop()
    decode = [r["rss_mib"] for r in rounds]
    start = decode[0] if decode else sampler.samples[-1]["rss_mib"]
    end = decode[-1] if decode else start
    growth = end - start
    run = {
        "ctx": ctx, "method": method.name, "prompt_tokens": res.prompt_tokens, "new_tokens": res.new_tokens,
        "prefill_s": round(res.prefill_s, 2), "wall_s": round(res.wall_s, 2),
        "tokens_per_s": round(res.tokens_per_s, 3), "acceptance_rate": res.acceptance_rate,
        "mean_accepted_tokens": res.mean_accepted_tokens, "verify_steps": res.verify_steps,
        "acceptance_by_quarter": res.acceptance_by_part(4),
        "distinct_by_quarter": distinct_by_part(res.output_ids, 4), "output_ids": res.output_ids,
        "rss_peak_mib": max(s["rss_mib"] for s in sampler.samples + rounds) if rounds else None,
        "rss_decode_start_mib": start, "rss_decode_end_mib": end, "decode_growth_mib": round(growth, 1),
        "bounded": growth <= max(64.0, 0.05 * start),
        "compare": compare,
        "speedup_vs_ar": next((round(res.tokens_per_s / c["tokens_per_s"], 3) for c in compare
                               if c["method"] == "ar"), None),
        "rounds": rounds, "memory": sampler.samples,
        "engine": {k: v for k, v in res.extra.items() if isinstance(v, int | float | str)},
    }
    del engine, target, loaded, cache, shared
    gc.collect()
    return run


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7))
    for run in runs:
        label = f"ctx {run['ctx']}"
        rs = run["rounds"]
        if rs:
            x = [r["tokens"] for r in rs]
            acc = [r["accepted"] / r["drafted"] if r["drafted"] else float("nan") for r in rs]
            ax1.plot(x, acc, ".", alpha=0.35)
            mean, num, den = [], 0, 0
            for r in rs:
                num, den = num + r["accepted"], den + r["drafted"]
                mean.append(num / den if den else float("nan"))
            ax1.plot(x, mean, "-", label=f"{label} (running mean)", color=ax1.lines[-1].get_color())
        mem = run["memory"]
        ax2.plot([m["t"] for m in mem], [m["rss_mib"] for m in mem], "-", label=label)
        dec = [m["t"] for m in mem if m["phase"] == "decode"]
        if dec:
            ax2.axvspan(min(dec), max(dec), alpha=0.08, color=ax2.lines[-1].get_color())
    ax1.set(xlabel="tokens generated", ylabel="accepted / drafted per round", ylim=(-0.05, 1.05),
            title=f"{runs[0]['method']}: acceptance per verification round")
    ax2.set(xlabel="seconds since start", ylabel="RSS (MiB)", title="memory (shaded: decoding)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def markdown(report: dict) -> str:
    """One row per ctx and method: speed against ar on the same prefill, acceptance overall and by
    quarter, ar's distinct-token share by quarter, and the memory the run held (from soak.json)."""
    q = lambda xs: " / ".join("—" if x is None else f"{x:.2f}" for x in xs) if xs else "—"  # noqa: E731
    lines = ["| ctx | method | tok/s | × ar | α | α by quarter | distinct-token share by quarter | same as ar |",
             "|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        entries = sorted([run, *run["compare"]], key=lambda e: e["method"] != "ar")
        ar = entries[0] if entries[0]["method"] == "ar" else None
        greedy = report["args"].get("temperature", 0.0) == 0
        for e in entries:
            ratio = "—" if ar is None else f"{e['tokens_per_s'] / ar['tokens_per_s']:.2f}"
            alpha = "—" if e.get("acceptance_rate") is None else f"{e['acceptance_rate']:.2f}"
            same = "—" if ar is None or e is ar or not greedy else "yes" if e["output_ids"] == ar["output_ids"] else "NO"
            lines.append(f"| {ctx_label(run['ctx'])} | {e['method']} | {e['tokens_per_s']:.2f} | {ratio} | {alpha} | "
                         f"{q(e.get('acceptance_by_quarter'))} | {q(e.get('distinct_by_quarter'))} | {same} |")
    lines += ["", "| ctx | prefill s | peak RSS GiB | RSS at decode start → end (MiB) | bounded |", "|---|---|---|---|---|"]
    for run in report["runs"]:
        lines.append(f"| {ctx_label(run['ctx'])} | {run['prefill_s']:.0f} | {run['rss_peak_mib'] / 1024:.2f} | "
                     f"{run['rss_decode_start_mib']:.0f} → {run['rss_decode_end_mib']:.0f} "
                     f"({run['decode_growth_mib']:+.0f}) | {'yes' if run['bounded'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ctx", nargs="+", default=["64k", "128k"], help="context lengths (labels or tokens)")
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--method", default="sparsespec_l", help="a conf/method name")
    p.add_argument("--compare", default="ar,magicdec", type=lambda v: [m for m in v.split(",") if m],
                   help="methods decoded after it on the same prefill, for speed and identity (\"\" for none)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra evaluate-config overrides, e.g. method.drafter.policy.ratio=0.05")
    p.add_argument("--model-path", default=None, help="model dir / .gguf / hub id (default: the embedded model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--text", default=None, help="prompt source text file (default: the shipped PG-19 books)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefill-chunk", type=int, default=1024)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-memory-guard", dest="memory_guard", action="store_false")
    p.add_argument("--out", default=f"outputs/soak/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.new_tokens <= 0:
        p.error("--new-tokens must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    ctxs = [parse_ctx(c) for c in args.ctx]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = source_text(args.text)
    t0 = time.perf_counter()
    runs = []
    report = {"args": vars(args), "runs": runs,
              "command": shlex.join(["python", "scripts/soak.py", *(sys.argv[1:] if argv is None else argv)])}
    for ctx in ctxs:
        runs.append(soak_one(args, ctx, text, t0))
        r = runs[-1]
        log.info("ctx %d: %d tokens in %.1f s after a %.1f s prefill, acceptance %s, decode RSS growth %.1f MiB "
                 "(%s)", ctx, r["new_tokens"], r["wall_s"], r["prefill_s"], r["acceptance_rate"],
                 r["decode_growth_mib"], "bounded" if r["bounded"] else "GROWING")
        (out / "soak.json").write_text(json.dumps(report, indent=1))  # after every ctx: a crash keeps the rest
    plot(runs, out / "soak.png")
    summary = [{k: r[k] for k in ("ctx", "new_tokens", "acceptance_rate", "mean_accepted_tokens", "tokens_per_s",
                                  "speedup_vs_ar", "acceptance_by_quarter", "distinct_by_quarter", "rss_peak_mib",
                                  "decode_growth_mib", "bounded")}
               | {f"{c['method']}_tok_s": c["tokens_per_s"] for c in r["compare"]}
               | {f"same_as_{c['method']}": c["same_output"] for c in r["compare"]} for r in runs]
    print(json.dumps(summary, indent=1))
    print(f"wrote {out / 'soak.json'} and {out / 'soak.png'}")
    if statistics.fmean(1.0 if r["bounded"] else 0.0 for r in runs) < 1:
        log.warning("RSS grew during decoding in some run: see decode_growth_mib")
    return report


if __name__ == "__main__":
    main()
