"""scripts/budgetdraft_results.py's report as tables and the paper's Figure 1: teacher-forced
acceptance per drafter group, budget and ctx (mean ± std over seeds), τ@k, agreement with the
target's own output, and the real greedy loop per draft length."""

from __future__ import annotations

from pathlib import Path

from sparsespec.eval.summary import ctx_label
from sparsespec.reports.figures import pyplot, save_png


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
    """The report's tables, from the saved results alone (scripts/docs.py rebuilds them)."""
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
