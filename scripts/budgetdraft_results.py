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
AR and the real SpeculativeEngine (greedy, exact: asserted token-identical to AR) run on it for the
first seed of each --engine-drafters group, at budget --engine-budget and every k in --engine-ks,
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
import functools
import glob
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import write_section  # noqa: E402

from sparsespec.config import load_method  # noqa: E402
from sparsespec.data import load_samples  # noqa: E402
from sparsespec.decoding.controllers import FixedK  # noqa: E402
from sparsespec.decoding.drafters import ModelDrafter, PromptLookup  # noqa: E402
from sparsespec.decoding.engine import SpeculativeEngine  # noqa: E402
from sparsespec.eval.summary import distinct_by_part  # noqa: E402
from sparsespec.kv.policies import FullKV  # noqa: E402
from sparsespec.models.loading import load_model  # noqa: E402
from sparsespec.models.runner import CausalLM  # noqa: E402
from sparsespec.training.drafters import truncated  # noqa: E402
from sparsespec.training.module import accepted_run  # noqa: E402


@functools.cache
def view_for(budget: int | None):
    """The budgetdraft method's own policy (conf/method/budgetdraft.yaml) at another budget."""
    if budget is None:
        return FullKV()
    return load_method("budgetdraft", [f"method.drafter.policy.budget={budget}"]).policy()


def parse_groups(specs: list[str]) -> dict[str, list[str]]:
    """LABEL=PATTERN[,PATTERN...] (or `untrained`) -> {label: [dirs]}, globs expanded and sorted."""
    groups: dict[str, list[str]] = {}
    for spec in specs:
        if spec == "untrained":
            groups["untrained"] = ["untrained"]
            continue
        if "=" not in spec:
            raise SystemExit(f"drafter group {spec!r}: use LABEL=DIR[,DIR...] (globs allowed) or `untrained`")
        label, patterns = spec.split("=", 1)
        dirs: list[str] = []
        for pat in patterns.split(","):
            hits = sorted(glob.glob(pat)) if any(c in pat for c in "*?[") else [pat]
            dirs += [h for h in hits if Path(h).is_dir()]
        if not dirs:
            raise SystemExit(f"drafter group {label!r}: no directory matches {patterns!r}")
        groups[label] = dirs
    return groups


def held_out_windows(tokenizer, ctx: int, n_books: int, data: str | None, offset: float = 0.02):
    """(title, ids) of `ctx`-token windows of the books held out from drafter training, as evaluate.py
    cuts them (dataset=pg19 dataset.split=eval)."""
    samples = load_samples("pg19", tokenizer, ctx, path=data, limit=n_books, split="eval", offset=offset)
    if not samples:
        raise SystemExit(f"no held-out book has {ctx} tokens after the {offset:.0%} offset")
    return [(s.sample_id.split("/", 1)[-1], s.prompt_ids) for s in samples]


@torch.inference_mode()
def target_greedy(target, ids: list[int], positions: int) -> torch.Tensor:
    """The target's greedy token at each of the last `positions` positions (full attention)."""
    lm = CausalLM(target)
    cache = lm.new_cache(len(ids))
    lm.prefill(torch.tensor(ids[:-positions]), cache, chunk=1024)
    return lm.forward(torch.tensor(ids[-positions:]), cache).argmax(-1)


@torch.inference_mode()
def drafter_greedy(model, ids: list[int], positions: int, view) -> torch.Tensor:
    """The drafter's argmax at the last `positions` positions, its KV computed under `view` (the
    ModelDrafter path: chunked prefill with mask_fn=view.mask, then the scored block)."""
    lm = CausalLM(model)
    cache = lm.new_cache(len(ids))
    lm.prefill(torch.tensor(ids[:-positions]), cache, chunk=1024, mask_fn=view.mask)
    start = cache.length
    return lm.forward(torch.tensor(ids[-positions:]), cache, mask=view.mask(start, positions, len(ids))).argmax(-1)


def mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def figure1_rows(target, tok, groups, models, args, ctx: int) -> list[dict]:
    """Teacher-forced acc and tau@k per (group, budget), mean +- std over the group's seeds."""
    windows = held_out_windows(tok, ctx, args.books, args.data)
    # per (label, budget, seed index): lists over books of acc and of tau@k
    per: dict[tuple[str, str, int], list[dict]] = {}
    t0 = time.perf_counter()
    for title, ids in windows:
        gold = target_greedy(target, ids, args.positions)
        for label, seeds in models.items():
            for si, model in enumerate(seeds):
                for b in [None, *args.budgets]:
                    agree = drafter_greedy(model, ids, args.positions, view_for(b)) == gold
                    per.setdefault((label, str(b or "full"), si), []).append(
                        {"acc": agree.float().mean().item(),
                         **{f"tau{k}": accepted_run(agree, k).item() for k in args.ks}})
        print(f"ctx {ctx}: {title} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = []
    for label in groups:
        for b in ["full", *map(str, args.budgets)]:
            seeds = [per[(label, b, si)] for si in range(len(models[label]))]
            seed_means = {key: [statistics.mean(book[key] for book in books) for books in seeds]
                          for key in ["acc", *[f"tau{k}" for k in args.ks]]}
            row = {"ctx": ctx, "drafter": label, "budget": b, "n_seeds": len(seeds), "n_books": len(windows)}
            for key, vals in seed_means.items():
                row[key], row[key + "_std"] = mean_std(vals)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


@torch.inference_mode()
def engine_rows(target, tok, models, args, ctx: int) -> list[dict]:
    """Real greedy decoding on --engine-books held-out prompts: AR, then each group's first seed at
    each k. Rows aggregate over prompts and repeats; `ar_distinct` (distinct tokens / tokens of AR's
    output, mean over prompts) flags degenerate loops, where every drafter scores alike."""
    tlm = CausalLM(target)
    runs: dict[tuple[str, int], list] = {}
    distinct, titles = [], []
    for title, ids in held_out_windows(tok, ctx, args.engine_books, args.data):
        head = ids[:-64]
        cache = tlm.new_cache(len(ids) + args.new_tokens + 64)
        tlm.prefill(torch.tensor(head), cache, chunk=1024)  # shared by every run, cropped back after each

        def run(drafter=None, k: int = 0, ids=ids, cache=cache, head=head):
            engine = SpeculativeEngine(tlm) if drafter is None else SpeculativeEngine(tlm, drafter, FixedK(k))
            res = engine.generate(ids, args.new_tokens, cache=cache)
            cache.crop(len(head))
            return res

        ar = [run() for _ in range(args.engine_repeats)]
        ar_tps = statistics.mean(r.tokens_per_s for r in ar)
        distinct.append(distinct_by_part(ar[0].output_ids, 1)[0])
        titles.append(title)
        runs.setdefault(("ar", 0), []).extend((r, ar_tps) for r in ar)
        for label in args.engine_drafters:
            if label not in models:
                raise SystemExit(f"--engine-drafters {label}: not among the drafter groups {list(models)}")
            model = CausalLM(models[label][0])
            for k in args.engine_ks:
                for _ in range(args.engine_repeats):
                    r = run(ModelDrafter(model, view_for(args.engine_budget)), k)
                    if r.output_ids != ar[0].output_ids:
                        raise AssertionError(f"{label} k={k} at ctx {ctx} ({title}): speculative output differs from AR")
                    runs.setdefault((label, k), []).append((r, ar_tps))
        print(f"ctx {ctx}: engine on {title} done", flush=True)
    rows = []
    for (label, k), rs in runs.items():
        tps = [r.tokens_per_s for r, _ in rs]
        speed = [r.tokens_per_s / a for r, a in rs]
        row = {"ctx": ctx, "drafter": label, "budget": "-" if label == "ar" else args.engine_budget, "k": k,
               "tok_s": mean_std(tps)[0], "tok_s_std": mean_std(tps)[1],
               "speedup": mean_std(speed)[0], "speedup_std": mean_std(speed)[1],
               "n_prompts": len(titles), "books": titles, "ar_distinct": statistics.mean(distinct)}
        if label != "ar":
            row.update(alpha=statistics.mean(r.acceptance_rate or 0.0 for r, _ in rs),
                       tau=statistics.mean(r.mean_accepted_tokens for r, _ in rs),
                       gamma=statistics.mean(r.gamma for r, _ in rs),
                       same_as_ar=True)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


@torch.inference_mode()
def own_output_rows(target, tok, models, args) -> list[dict]:
    """Agreement with the target's own greedy continuation (see the module docstring)."""
    ctx, n = args.own_ctx, args.own_tokens
    tlm = CausalLM(target)
    per: dict[tuple[str, str], list[list[torch.Tensor]]] = {}  # (label, view) -> per seed: per book
    distinct = []
    for title, ids in held_out_windows(tok, ctx, args.books, args.data):
        out = SpeculativeEngine(tlm).generate(ids, n).output_ids
        seq, gold = ids + out, torch.tensor(out)
        distinct.append(distinct_by_part(out, 4))
        for label, seeds in models.items():
            for b in (None, args.engine_budget):
                books = per.setdefault((label, str(b or "full")), [[] for _ in seeds])
                for si, model in enumerate(seeds):  # the drafter at position ctx-1+j predicts out[j]
                    pred = drafter_greedy(model, seq[:-1], n, view_for(b))
                    books[si].append((pred == gold).float())
        for g in args.lookup_ngrams:
            d = PromptLookup(g)
            hit = torch.tensor([float(d.lookup(seq[: ctx + j], 1) == [out[j]]) for j in range(n)])
            per.setdefault((f"lookup n={g}", "-"), [[]])[0].append(hit)
        print(f"own output at ctx {ctx}: {title} done", flush=True)
    ar_quarters = [statistics.mean(q) for q in zip(*distinct, strict=True)]
    rows = []
    for (label, view), seeds in per.items():
        by_seed = [torch.stack(books).mean(0) for books in seeds]  # [n] agreement per output position
        overall = [float(x.mean()) for x in by_seed]
        quarters = torch.stack([x.reshape(4, -1).mean(1) for x in by_seed]).mean(0).tolist()
        row = {"ctx": ctx, "new_tokens": n, "drafter": label, "view": view, "n_seeds": len(seeds),
               "n_books": len(seeds[0]), "acc": mean_std(overall)[0], "acc_std": mean_std(overall)[1],
               "quarters": quarters, "ar_distinct_quarters": ar_quarters}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def load_models(args, groups: dict[str, list[str]], ctx: int):
    """The target and every group's drafters, loaded for `ctx` positions (YaRN past 8k)."""
    tgt = load_model(args.model, ctx=ctx)
    models = {label: [truncated(tgt.model, args.n_layers).eval() if d == "untrained" else load_model(d, ctx=ctx).model
                      for d in dirs] for label, dirs in groups.items()}
    return tgt, models


def main(argv: list[str] | None = None) -> dict:
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
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    groups = parse_groups(args.drafters)
    if args.engine_ctx:
        args.engine_drafters = [d for d in args.engine_drafters if d in groups]

    results: dict = {"command": shlex.join(["python", "scripts/budgetdraft_results.py", *(argv or sys.argv[1:])]),
                     "args": vars(args), "groups": groups, "rows": [], "engine": [], "own": []}
    if args.own_ctx is not None and args.own_tokens % 4:
        raise SystemExit(f"--own-tokens {args.own_tokens}: must be a multiple of 4 (the table has quarters)")
    if args.own_ctx is not None:
        tgt, models = load_models(args, groups, args.own_ctx + args.own_tokens + 64)
        results["own"] = own_output_rows(tgt.model, tgt.tokenizer, models, args)
        del models, tgt
    for ctx in sorted(set(args.ctx) | set(args.engine_ctx)):
        need = ctx + (args.new_tokens + 64 if ctx in args.engine_ctx else 0)
        tgt, models = load_models(args, groups, need)
        if ctx in args.ctx:
            results["rows"] += figure1_rows(tgt.model, tgt.tokenizer, groups, models, args, ctx)
        if ctx in args.engine_ctx:
            results["engine"] += engine_rows(tgt.model, tgt.tokenizer, models, args, ctx)
        del models, tgt
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


def _ctx(c: int) -> str:
    return f"{c // 1024}k" if c % 1024 == 0 else str(c)


def _pm(m: float, s: float, fmt: str = ".3f") -> str:
    return f"{m:{fmt}} ± {s:{fmt}}"


def markdown(results: dict) -> str:
    """The report's tables, from the saved results alone (scripts/docs.py rebuilds them)."""
    args = argparse.Namespace(**results["args"])
    rows = results["rows"]
    labels = list(results["groups"])
    seeds = ", ".join(f"{lab}: {len(d)}" for lab, d in results["groups"].items())
    out = [f"Command: `{results['command']}`"]
    if rows:
        out += ["", f"Seeds per drafter group: {seeds}. Cells: mean ± std over seeds of the mean over {args.books} "
                f"held-out books; {args.positions} scored positions per window.", ""]
        budgets = ["full", *map(str, args.budgets)]
        ctxs = sorted({r["ctx"] for r in rows})
        cell = {(r["ctx"], r["drafter"], r["budget"]): r for r in rows}
        rb = str(args.engine_budget)  # the budget whose share of the full-cache acceptance is reported
        out += ["Teacher-forced acceptance (share of positions where the drafter's greedy token is the target's):", "",
                "| ctx | drafter | " + " | ".join(f"B={b}" for b in budgets) + f" | B={rb} / full |",
                "|---|---|" + "---|" * (len(budgets) + 1)]
        for c in ctxs:
            for lab in labels:
                vals = [cell.get((c, lab, b)) for b in budgets]
                ratio = (cell[(c, lab, rb)]["acc"] / cell[(c, lab, "full")]["acc"]
                         if (c, lab, rb) in cell and cell[(c, lab, "full")]["acc"] > 0 else float("nan"))
                out.append(f"| {_ctx(c)} | {lab} | " + " | ".join(
                    _pm(v["acc"], v["acc_std"]) if v else "" for v in vals) + f" | {ratio:.3f} |")
        out += ["", f"Draft-length sensitivity, teacher-forced τ@k (mean accepted drafts per round of k) at "
                f"B={args.engine_budget}:", "",
                "| ctx | drafter | " + " | ".join(f"k={k}" for k in args.ks) + " |", "|---|---|" + "---|" * len(args.ks)]
        for c in ctxs:
            for lab in labels:
                r = cell.get((c, lab, str(args.engine_budget)))
                if r:
                    out.append(f"| {_ctx(c)} | {lab} | " + " | ".join(
                        _pm(r[f"tau{k}"], r[f"tau{k}_std"], ".2f") for k in args.ks) + " |")
    if results.get("own"):
        own = results["own"]
        q = own[0]["ar_distinct_quarters"]
        out += ["", f"On the target's own output: {own[0]['new_tokens']} greedy tokens after each of {own[0]['n_books']} "
                f"held-out prompts of {_ctx(own[0]['ctx'])} tokens; share of those tokens each drafter predicts "
                "(teacher-forced on the target's output; mean ± std over seeds). AR's distinct-token share by "
                f"quarter: {' / '.join(f'{x:.2f}' for x in q)}.", "",
                "| drafter | view | agreement | by quarter |", "|---|---|---|---|"]
        for r in own:
            out.append(f"| {r['drafter']} | {r['view']} | {_pm(r['acc'], r['acc_std'])} | "
                       + " / ".join(f"{x:.3f}" for x in r["quarters"]) + " |")
    if results["engine"]:
        out += ["", f"Real greedy decoding ({args.new_tokens} new tokens, first seed of each group, B={args.engine_budget}, "
                f"{args.engine_repeats} run(s) per prompt; ± over prompts and repeats; every run token-identical to AR; "
                "AR distinct = distinct tokens / tokens in AR's output, low in a degenerate loop):", "",
                "| ctx | prompts | AR distinct | drafter | k | α | τ (tokens / round) | γ | tok/s | × AR |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["engine"]:
            head = f"| {_ctx(r['ctx'])} | {', '.join(r['books'])} | {r['ar_distinct']:.2f} |"
            if r["drafter"] == "ar":
                out.append(f"{head} ar | — | — | — | — | {_pm(r['tok_s'], r['tok_s_std'], '.2f')} | 1.00 |")
            else:
                out.append(f"{head} {r['drafter']} | {r['k']} | {r['alpha']:.2f} | {r['tau']:.2f} | "
                           f"{r['gamma']:.3f} | {_pm(r['tok_s'], r['tok_s_std'], '.2f')} | "
                           f"{_pm(r['speedup'], r['speedup_std'], '.2f')} |")
    return "\n".join(out)


def plot(results: dict, path: Path) -> None:
    from sparsespec.eval.tables import save_png

    args = argparse.Namespace(**results["args"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    budgets = [*map(str, args.budgets), "full"]
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
        ax.set_xticks(ctxs, [_ctx(c) for c in ctxs])
        ax.minorticks_off()
    axes[0].set_ylabel("teacher-forced acceptance")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Drafter acceptance vs context and KV budget (held-out PG-19, mean ± std over seeds)")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


if __name__ == "__main__":
    main()
