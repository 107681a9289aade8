"""BudgetDraft's results at CPU scale: the paper's Figure 1 over training seeds, and the draft length.

Figure 1 (teacher-forced, cheap, every drafter and seed). For each held-out PG-19 book
(pg19_split's eval side, never trained on) and each ctx, a window of ctx tokens goes through the
target (float32, full attention) for its greedy next token at the last `--positions` positions.
Each drafter reads the same window through the inference path (CausalLM.prefill under the
StreamingKV mask, chunked, then one forward over the scored positions under view.mask), and we
report, on the real text:

  acc     share of positions where the drafter's argmax equals the target's greedy token
  tau@k   mean accepted drafts of a greedy round of k starting at each position (runs of
          agreement capped at k), for every k in --ks: the draft-length sensitivity

A drafter group is LABEL=PATTERN[,PATTERN...]; each pattern is a directory or a glob (one directory
per training seed, e.g. `multi=outputs/fig1/multi_s*/drafter`). Cells are mean +- std over a group's
seeds of the mean over books. The label `untrained` builds the truncated N-layer drafter from the
target: the naive starting point.

Draft length in the real loop (--engine-ctx, timed: run it on a quiet machine). At each such ctx
each of the first --engine-books held-out prompts is prefilled once (shared, as the harness does);
AR and the budgetdraft method (conf/method/budgetdraft.yaml through the method builder, greedy,
exact: asserted token-identical to AR) run on it with the first seed of each --engine-drafters
group as its drafter, at budget --engine-budget and every k in --engine-ks,
--engine-repeats times: α, τ, γ and decode speedup over AR (each prompt against its own AR), mean
+- std over prompts and repeats, and how repetitive AR's own output is (a greedy loop makes every
drafter look alike).

On the target's own output (--own-ctx, teacher-forced, untimed). The drafter drafts the target's
greedy continuation, not book text. For each held-out prompt of --own-ctx tokens, the target
decodes --own-tokens greedy tokens. Each drafter (every seed, full cache and --engine-budget) and
prompt lookup (--lookup-ngrams: the token that followed the latest earlier occurrence of the last n
tokens) then predict each of them. The table gives the share of matches, overall and by quarter of
the output, next to AR's distinct-token share per quarter.

  python scripts/budgetdraft_results.py untrained full='outputs/fig1/full_s*/drafter' \
      single='outputs/fig1/single_s*/drafter' multi='outputs/fig1/multi_s*/drafter' \
      --ctx 4096 8192 16384 --engine-ctx 4096 16384 --out outputs/fig1/results.json \
      --write docs/benchmarks.md --plot docs/img/fig1.png
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsespec.provenance import Provenance  # noqa: E402
from sparsespec.reports import ReportError, exit_on_error  # noqa: E402
from sparsespec.reports.budgetdraft import markdown, plot  # noqa: E402
from sparsespec.reports.sections import write_section  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafters", nargs="+", help="LABEL=DIR[,DIR...] (globs allowed; one dir per seed) or `untrained`")
    ap.add_argument("--model", default=None, help="target model.path (default: embedded SmolLM2)")
    ap.add_argument("--data", default=None, help="PG-19-schema jsonl (default: the shipped books)")
    ap.add_argument("--ctx", type=int, nargs="*", default=[4096, 8192, 16384], help="Figure-1 ctx (none: engine only)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--positions", type=int, default=256, help="scored positions at the end of each window")
    ap.add_argument("--books", type=int, default=2, help="held-out books per ctx")
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8], help="draft lengths for tau@k")
    ap.add_argument("--n-layers", type=int, default=2, help="layers of the `untrained` drafter")
    ap.add_argument("--engine-ctx", type=int, nargs="*", default=[], help="ctx at which to time the real engine")
    ap.add_argument("--engine-drafters", nargs="+", default=["multi", "full"])
    ap.add_argument("--engine-budget", type=int, default=1024)
    ap.add_argument("--engine-ks", type=int, nargs="+", default=[2, 4, 6, 8])
    ap.add_argument("--engine-repeats", type=int, default=2)
    ap.add_argument("--engine-books", type=int, default=2, help="held-out prompts for the real loop")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--own-ctx", type=int, default=None, help="prompt length for the own-output table (none: skip)")
    ap.add_argument("--own-tokens", type=int, default=512, help="greedy tokens the target decodes for it")
    ap.add_argument("--lookup-ngrams", type=int, nargs="*", default=[1, 2, 3], help="prompt-lookup n-gram sizes")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="write the results JSON here")
    ap.add_argument("--write", default=None, help="replace the --section section of this markdown file")
    ap.add_argument("--section", default="fig1", help="the section name for --write (<!-- bench:NAME -->)")
    ap.add_argument("--plot", default=None, help="write the Figure-1 plot here (PNG)")
    return ap.parse_args(argv)


def say(line: str) -> None:
    print(line, flush=True)


@exit_on_error
def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch

    from sparsespec.reports.agreement import figure1_rows, load_models, own_output_rows, parse_groups
    from sparsespec.reports.draft_length import engine_rows

    if args.threads:
        torch.set_num_threads(args.threads)
    groups = parse_groups(args.drafters)
    if args.engine_ctx:
        args.engine_drafters = [d for d in args.engine_drafters if d in groups]
    if args.own_ctx is not None and args.own_tokens % 4:
        raise ReportError(f"--own-tokens {args.own_tokens}: must be a multiple of 4 (the table has quarters)")
    prov = Provenance.begin()
    results: dict = {"command": shlex.join(["python", "scripts/budgetdraft_results.py", *(argv or sys.argv[1:])]),
                     "args": vars(args), "groups": groups, "rows": [], "engine": [], "own": []}
    if args.own_ctx is not None:
        tgt, models = load_models(args.model, args.n_layers, groups, args.own_ctx + args.own_tokens + 64)
        results["own"] = own_output_rows(tgt.model, tgt.tokenizer, models, ctx=args.own_ctx, new_tokens=args.own_tokens,
                                         books=args.books, budget=args.engine_budget,
                                         lookup_ngrams=args.lookup_ngrams, data=args.data, say=say)
        del models, tgt
    for ctx in sorted(set(args.ctx) | set(args.engine_ctx)):
        need = ctx + (args.new_tokens + 64 if ctx in args.engine_ctx else 0)
        tgt, models = load_models(args.model, args.n_layers, groups, need)
        if ctx in args.ctx:
            results["rows"] += figure1_rows(tgt.model, tgt.tokenizer, models, ctx, books=args.books,
                                            positions=args.positions, budgets=args.budgets, ks=args.ks,
                                            data=args.data, say=say)
        if ctx in args.engine_ctx:
            results["engine"] += engine_rows(tgt.model, tgt.tokenizer, models, ctx, drafters=args.engine_drafters,
                                             ks=args.engine_ks, budget=args.engine_budget, books=args.engine_books,
                                             repeats=args.engine_repeats, new_tokens=args.new_tokens,
                                             data=args.data, say=say)
        del models, tgt
    results["provenance"] = prov.end()
    results["markdown"] = markdown(results)
    print(results["markdown"])
    if args.plot:
        plot(results, Path(args.plot))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.write:
        write_section(Path(args.write), args.section, results["markdown"])
    return results


if __name__ == "__main__":
    main()
