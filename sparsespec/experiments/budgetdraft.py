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

  python -m sparsespec.experiments budgetdraft untrained full='outputs/fig1/full_s*/drafter' \\
      single='outputs/fig1/single_s*/drafter' multi='outputs/fig1/multi_s*/drafter' \\
      --ctx 4096 8192 16384 --engine-ctx 4096 16384 --out outputs/fig1/results.json --plot docs/img/fig1.png
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from sparsespec.eval.summary import ctx_label, distinct_by_part
from sparsespec.experiments import ExperimentError, Say, silent
from sparsespec.experiments.common.cells import mean_and_std
from sparsespec.experiments.common.figures import pyplot, save_png

OPTIONS = {"ctx": "4096,8192,16384", "books": 2, "new_tokens": 64, "model": None, "data": None}


def arguments(p) -> None:
    p.add_argument("drafters", nargs="+", help="LABEL=DIR[,DIR...] (globs allowed; one dir per seed) or `untrained`")
    p.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--positions", type=int, default=256, help="scored positions at the end of each window")
    p.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8], help="draft lengths for tau@k")
    p.add_argument("--n-layers", type=int, default=2, help="layers of the `untrained` drafter")
    p.add_argument("--engine-ctx", nargs="*", default=[], help="ctx at which to time the real engine")
    p.add_argument("--engine-drafters", nargs="+", default=["multi", "full"])
    p.add_argument("--engine-budget", type=int, default=1024)
    p.add_argument("--engine-ks", type=int, nargs="+", default=[2, 4, 6, 8])
    p.add_argument("--engine-repeats", type=int, default=2)
    p.add_argument("--engine-books", type=int, default=2, help="held-out prompts for the real loop")
    p.add_argument("--own-ctx", type=int, default=None, help="prompt length for the own-output table (none: skip)")
    p.add_argument("--own-tokens", type=int, default=512, help="greedy tokens the target decodes for it")
    p.add_argument("--lookup-ngrams", type=int, nargs="*", default=[1, 2, 3], help="prompt-lookup n-gram sizes")


def check(args) -> None:
    from sparsespec.experiments.common.agreement import parse_groups
    from sparsespec.experiments.driver import contexts

    args.engine_ctx = contexts(args.engine_ctx) if args.engine_ctx else []
    args.groups = parse_groups(args.drafters)
    if args.engine_ctx:
        args.engine_drafters = [d for d in args.engine_drafters if d in args.groups]
    if args.own_ctx is not None and args.own_tokens % 4:
        raise ExperimentError(f"--own-tokens {args.own_tokens}: must be a multiple of 4 (the table has quarters)")


def measure(args, checkpoint) -> dict:
    """{groups, rows (Figure 1), engine (the real loop), own (on the target's own output)}."""
    import torch

    with torch.inference_mode():
        return _measure(args)


def _measure(args) -> dict:
    from sparsespec.experiments.common.agreement import load_models

    say = print
    results: dict = {"groups": args.groups, "rows": [], "engine": [], "own": []}
    if args.own_ctx is not None:
        tgt, models = load_models(args.model, args.n_layers, args.groups, args.own_ctx + args.own_tokens + 64)
        results["own"] = own_output_rows(tgt.model, tgt.tokenizer, models, ctx=args.own_ctx,
                                         new_tokens=args.own_tokens, books=args.books, budget=args.engine_budget,
                                         lookup_ngrams=args.lookup_ngrams, data=args.data, say=say)
        del models, tgt
    for ctx in sorted(set(args.ctx) | set(args.engine_ctx)):
        need = ctx + (args.new_tokens + 64 if ctx in args.engine_ctx else 0)
        tgt, models = load_models(args.model, args.n_layers, args.groups, need)
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
    return results


def figure1_rows(target, tok, models: dict[str, list], ctx: int, *, books: int, positions: int, budgets: list[int],
                 ks: list[int], data: str | None = None, say: Say = silent) -> list[dict]:
    """Teacher-forced acc and tau@k per (group, budget) on the last `positions` positions of each
    held-out book's window, mean +- std over the group's seeds of the mean over books."""

    from sparsespec.experiments.common.agreement import (
        drafter_greedy,
        held_out_windows,
        target_greedy,
        view_for,
    )
    from sparsespec.training.module import accepted_run

    windows = held_out_windows(tok, ctx, books, data)
    # per (label, budget, seed index): lists over books of acc and of tau@k
    per: dict[tuple[str, str, int], list[dict]] = {}
    t0 = time.perf_counter()
    for title, ids in windows:
        gold = target_greedy(target, ids, positions)
        for label, seeds in models.items():
            for si, model in enumerate(seeds):
                for b in [None, *budgets]:
                    agree = drafter_greedy(model, ids, positions, view_for(b)) == gold
                    per.setdefault((label, str(b or "full"), si), []).append(
                        {"acc": agree.float().mean().item(), **{f"tau{k}": accepted_run(agree, k).item() for k in ks}})
        say(f"ctx {ctx}: {title} done ({time.perf_counter() - t0:.0f} s)")
    rows = []
    for label in models:
        for b in ["full", *map(str, budgets)]:
            seeds = [per[(label, b, si)] for si in range(len(models[label]))]
            seed_means = {key: [statistics.mean(book[key] for book in books) for books in seeds]
                          for key in ["acc", *[f"tau{k}" for k in ks]]}
            row = {"ctx": ctx, "drafter": label, "budget": b, "n_seeds": len(seeds), "n_books": len(windows)}
            for key, vals in seed_means.items():
                row[key], row[key + "_std"] = mean_and_std(vals)
            rows.append(row)
            say(json.dumps(row))
    return rows


def own_output_rows(target, tok, models: dict[str, list], *, ctx: int, new_tokens: int, books: int, budget: int,
                    lookup_ngrams: list[int], data: str | None = None, say: Say = silent) -> list[dict]:
    """Agreement with the target's own greedy continuation: the target decodes `new_tokens` after each
    held-out prompt of `ctx` tokens, then every drafter (each seed, full cache and `budget`) and prompt
    lookup of each n-gram size predict each of those tokens; overall and by quarter of the output."""
    import torch

    from sparsespec.config import load_method
    from sparsespec.decoding.drafters import PromptLookup
    from sparsespec.experiments.common.agreement import drafter_greedy, held_out_windows, view_for
    from sparsespec.models.runner import CausalLM

    tlm, ar = CausalLM(target), load_method("ar")
    per: dict[tuple[str, str], list[list[torch.Tensor]]] = {}  # (label, view) -> per seed: per book
    distinct = []
    for title, ids in held_out_windows(tok, ctx, books, data):
        out = ar.build(tlm).generate(ids, new_tokens).output_ids
        seq, gold = ids + out, torch.tensor(out)
        distinct.append(distinct_by_part(out, 4))
        for label, seeds in models.items():
            for b in (None, budget):
                per_seed = per.setdefault((label, str(b or "full")), [[] for _ in seeds])
                for si, model in enumerate(seeds):  # the drafter at position ctx-1+j predicts out[j]
                    pred = drafter_greedy(model, seq[:-1], new_tokens, view_for(b))
                    per_seed[si].append((pred == gold).float())
        for g in lookup_ngrams:
            d = PromptLookup(g)
            hit = torch.tensor([float(d.lookup(seq[: ctx + j], 1) == [out[j]]) for j in range(new_tokens)])
            per.setdefault((f"lookup n={g}", "-"), [[]])[0].append(hit)
        say(f"own output at ctx {ctx}: {title} done")
    ar_quarters = [statistics.mean(q) for q in zip(*distinct, strict=True)]
    rows = []
    for (label, view), seeds in per.items():
        by_seed = [torch.stack(per_book).mean(0) for per_book in seeds]  # [n] agreement per output position
        overall = [float(x.mean()) for x in by_seed]
        quarters = torch.stack([x.reshape(4, -1).mean(1) for x in by_seed]).mean(0).tolist()
        acc, acc_std = mean_and_std(overall)
        row = {"ctx": ctx, "new_tokens": new_tokens, "drafter": label, "view": view, "n_seeds": len(seeds),
               "n_books": len(seeds[0]), "acc": acc, "acc_std": acc_std, "quarters": quarters,
               "ar_distinct_quarters": ar_quarters}
        rows.append(row)
        say(json.dumps(row))
    return rows


def engine_rows(target, tok, models: dict[str, list], ctx: int, *, drafters: list[str], ks: list[int], budget: int,
                books: int, repeats: int, new_tokens: int, data: str | None = None, say: Say = silent) -> list[dict]:
    """AR, then the first seed of each group in `drafters` at each k (budgetdraft's view at `budget`),
    `repeats` runs each. Rows aggregate over prompts and repeats, each run against AR on its own
    prompt; `ar_distinct` (distinct tokens / tokens of AR's output, mean over prompts) flags
    degenerate loops, where every drafter scores alike."""
    for label in drafters:
        if label not in models:
            raise ExperimentError(f"--engine-drafters {label}: not among the drafter groups {list(models)}")
    from sparsespec.config import load_method
    from sparsespec.experiments.common.agreement import book_title, held_out_samples
    from sparsespec.experiments.common.runner import decode, our_method, prefill_once
    from sparsespec.models.runner import CausalLM

    tlm = CausalLM(target)
    ar_method = load_method("ar")
    methods = {k: our_method(f"budgetdraft:k={k}:budget={budget}") for k in ks}
    runs: dict[tuple[str, int], list] = {}
    distinct, titles = [], []
    for sample in held_out_samples(tok, ctx, books, data):
        title, ids = book_title(sample), sample.prompt_ids
        cache, _ = prefill_once(tlm, sample, new_tokens, progress=False)  # every run decodes from it

        def run(engine, ids=ids, cache=cache):
            return decode(engine, ids, new_tokens, cache)

        ar = [run(ar_method.build(tlm)) for _ in range(repeats)]
        ar_tps = statistics.mean(r.tokens_per_s for r in ar)
        distinct.append(distinct_by_part(ar[0].output_ids, 1)[0])
        titles.append(title)
        runs.setdefault(("ar", 0), []).extend((r, ar_tps) for r in ar)
        for label in drafters:
            model = CausalLM(models[label][0])
            for k in ks:
                for _ in range(repeats):
                    r = run(methods[k].build(tlm, model))
                    if r.output_ids != ar[0].output_ids:
                        raise AssertionError(f"{label} k={k} at ctx {ctx} ({title}): speculative output differs from AR")
                    runs.setdefault((label, k), []).append((r, ar_tps))
        say(f"ctx {ctx}: engine on {title} done")
    rows = []
    for (label, k), rs in runs.items():
        tok_s, tok_s_std = mean_and_std([r.tokens_per_s for r, _ in rs])
        speedup, speedup_std = mean_and_std([r.tokens_per_s / a for r, a in rs])
        row = {"ctx": ctx, "drafter": label, "budget": "-" if label == "ar" else budget, "k": k,
               "tok_s": tok_s, "tok_s_std": tok_s_std, "speedup": speedup, "speedup_std": speedup_std,
               "n_prompts": len(titles), "books": titles, "ar_distinct": statistics.mean(distinct)}
        if label != "ar":
            row.update(alpha=statistics.mean(r.acceptance_rate or 0.0 for r, _ in rs),
                       tau=statistics.mean(r.mean_accepted_tokens for r, _ in rs),
                       gamma=statistics.mean(r.gamma for r, _ in rs),
                       same_as_ar=True)
        rows.append(row)
        say(json.dumps(row))
    return rows




def _pm(m: float, s: float, fmt: str = ".3f") -> str:
    return f"{m:{fmt}} ± {s:{fmt}}"


def _figure1(results: dict) -> list[str]:
    args, rows, labels = results["args"], results["rows"], list(results["groups"])
    seeds = ", ".join(f"{lab}: {len(d)}" for lab, d in results["groups"].items())
    out = ["", f"Seeds per drafter group: {seeds}. Cells: mean ± std over seeds of the mean over {args['books']} "
           f"held-out books; {args['positions']} scored positions per window.", ""]
    budgets = ["full", *map(str, args["budgets"])]
    ctxs = sorted({r["ctx"] for r in rows})
    cell = {(r["ctx"], r["drafter"], r["budget"]): r for r in rows}
    rb = str(args["engine_budget"])  # the budget whose share of the full-cache acceptance is reported
    out += ["Teacher-forced acceptance (share of positions where the drafter's greedy token is the target's):", "",
            "| ctx | drafter | " + " | ".join(f"B={b}" for b in budgets) + f" | B={rb} / full |",
            "|---|---|" + "---|" * (len(budgets) + 1)]
    for c in ctxs:
        for lab in labels:
            vals = [cell.get((c, lab, b)) for b in budgets]
            ratio = (cell[(c, lab, rb)]["acc"] / cell[(c, lab, "full")]["acc"]
                     if (c, lab, rb) in cell and cell[(c, lab, "full")]["acc"] > 0 else float("nan"))
            out.append(f"| {ctx_label(c)} | {lab} | " + " | ".join(
                _pm(v["acc"], v["acc_std"]) if v else "" for v in vals) + f" | {ratio:.3f} |")
    ks = args["ks"]
    out += ["", f"Draft-length sensitivity, teacher-forced τ@k (mean accepted drafts per round of k) at "
            f"B={args['engine_budget']}:", "",
            "| ctx | drafter | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
    for c in ctxs:
        for lab in labels:
            r = cell.get((c, lab, rb))
            if r:
                out.append(f"| {ctx_label(c)} | {lab} | " + " | ".join(
                    _pm(r[f"tau{k}"], r[f"tau{k}_std"], ".2f") for k in ks) + " |")
    return out


def _own(own: list[dict]) -> list[str]:
    q = own[0]["ar_distinct_quarters"]
    out = ["", f"On the target's own output: {own[0]['new_tokens']} greedy tokens after each of {own[0]['n_books']} "
           f"held-out prompts of {ctx_label(own[0]['ctx'])} tokens; share of those tokens each drafter predicts "
           "(teacher-forced on the target's output; mean ± std over seeds). AR's distinct-token share by "
           f"quarter: {' / '.join(f'{x:.2f}' for x in q)}.", "",
           "| drafter | view | agreement | by quarter |", "|---|---|---|---|"]
    for r in own:
        out.append(f"| {r['drafter']} | {r['view']} | {_pm(r['acc'], r['acc_std'])} | "
                   + " / ".join(f"{x:.3f}" for x in r["quarters"]) + " |")
    return out


def _engine(args: dict, engine: list[dict]) -> list[str]:
    out = ["", f"Real greedy decoding ({args['new_tokens']} new tokens, first seed of each group, "
           f"B={args['engine_budget']}, {args['engine_repeats']} run(s) per prompt; ± over prompts and repeats; every "
           "run token-identical to AR; AR distinct = distinct tokens / tokens in AR's output, low in a degenerate "
           "loop):", "",
           "| ctx | prompts | AR distinct | drafter | k | α | τ (tokens / round) | γ | tok/s | × AR |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in engine:
        head = f"| {ctx_label(r['ctx'])} | {', '.join(r['books'])} | {r['ar_distinct']:.2f} |"
        if r["drafter"] == "ar":
            out.append(f"{head} ar | — | — | — | — | {_pm(r['tok_s'], r['tok_s_std'], '.2f')} | 1.00 |")
        else:
            out.append(f"{head} {r['drafter']} | {r['k']} | {r['alpha']:.2f} | {r['tau']:.2f} | "
                       f"{r['gamma']:.3f} | {_pm(r['tok_s'], r['tok_s_std'], '.2f')} | "
                       f"{_pm(r['speedup'], r['speedup_std'], '.2f')} |")
    return out


def markdown(results: dict) -> str:
    """The report's tables, from the saved results alone."""
    out = [f"Command: `{results['command']}`"]
    if results["rows"]:
        out += _figure1(results)
    if results.get("own"):
        out += _own(results["own"])
    if results["engine"]:
        out += _engine(results["args"], results["engine"])
    return "\n".join(out)


def plot(results: dict, path: Path) -> None:
    """Figure 1: teacher-forced acceptance against ctx, a panel per KV budget, a line per drafter group."""
    plt = pyplot()
    rows = results["rows"]
    budgets = [*map(str, results["args"]["budgets"]), "full"]
    fig, axes = plt.subplots(1, len(budgets), figsize=(3.2 * len(budgets), 3.2), sharey=True)
    for ax, b in zip(axes, budgets, strict=True):
        for lab in results["groups"]:
            pts = sorted((r["ctx"], r["acc"], r["acc_std"]) for r in rows if r["drafter"] == lab and r["budget"] == b)
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                            marker="o", capsize=3, label=lab)
        ax.set_title(f"B = {b}" if b != "full" else "full cache")
        ax.set_xlabel("context (tokens)")
        ax.set_xscale("log", base=2)
        ctxs = sorted({r["ctx"] for r in rows})
        ax.set_xticks(ctxs, [ctx_label(c) for c in ctxs])
        ax.minorticks_off()
    axes[0].set_ylabel("teacher-forced acceptance")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Drafter acceptance vs context and KV budget (held-out PG-19, mean ± std over seeds)")
    save_png(fig, path)
