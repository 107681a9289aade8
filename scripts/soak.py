"""Long-run soak: SparseSpec-L decoding 512 tokens at 64k and 128k context, watching acceptance and
memory over time. Not a test: hours on a 2-core CPU at 128k.

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
import json
import logging
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsespec.config import parse_ctx  # noqa: E402
from sparsespec.provenance import Provenance  # noqa: E402
from sparsespec.reports import exit_on_error  # noqa: E402
from sparsespec.reports.soak import markdown, plot, summary  # noqa: E402

__all__ = ["main", "markdown"]  # markdown: the tables of a saved soak.json
log = logging.getLogger("soak")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
    if args.new_tokens <= 0:
        p.error("--new-tokens must be positive")
    return args


@exit_on_error
def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import torch

    from sparsespec.reports.soak_run import SoakPlan, soak_one, source_text

    if args.threads:
        torch.set_num_threads(args.threads)
    plan = SoakPlan(method=args.method, overrides=args.set, compare=args.compare, new_tokens=args.new_tokens,
                    model_path=args.model_path, dtype=args.dtype, temperature=args.temperature, top_p=args.top_p,
                    seed=args.seed, prefill_chunk=args.prefill_chunk, interval=args.interval,
                    memory_guard=args.memory_guard)
    ctxs = [parse_ctx(c) for c in args.ctx]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = source_text(args.text)
    t0 = time.perf_counter()
    prov = Provenance.begin()
    runs = []
    report = {"args": vars(args), "runs": runs,
              "command": shlex.join(["python", "scripts/soak.py", *(sys.argv[1:] if argv is None else argv)])}
    for ctx in ctxs:
        r = soak_one(plan, ctx, text, t0, log.info, log.info if args.verbose else lambda line: None)
        runs.append(r)
        log.info("ctx %d: %d tokens in %.1f s after a %.1f s prefill, acceptance %s, decode RSS growth %.1f MiB "
                 "(%s)", ctx, r["new_tokens"], r["wall_s"], r["prefill_s"], r["acceptance_rate"],
                 r["decode_growth_mib"], "bounded" if r["bounded"] else "GROWING")
        report["provenance"] = prov.end()  # so far: a crash keeps the rest, with where it came from
        (out / "soak.json").write_text(json.dumps(report, indent=1))  # after every ctx: a crash keeps the rest
    plot(runs, out / "soak.png")
    print(json.dumps(summary(runs), indent=1))
    print(f"wrote {out / 'soak.json'} and {out / 'soak.png'}")
    if not all(r["bounded"] for r in runs):
        log.warning("RSS grew during decoding in some run: see decode_growth_mib")
    return report


if __name__ == "__main__":
    main()
