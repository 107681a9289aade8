"""BudgetDraft's Figure 1 where a budget effect can show: drafters trained by each recipe
(`budget=multi|single|full`, several seeds each), scored at several context lengths and streaming
KV budgets, on held-out book text and on the same text whose last stretch is copied from D tokens
back (the positive control's texts, common.far_copy).

    python -m sparsespec.experiments figure1 untrained multi='outputs/figure1/multi_s*/drafter' \\
        single='outputs/figure1/single_s*/drafter' full='outputs/figure1/full_s*/drafter' \\
        --ctx 4k,8k,16k --out results/figure1.json

Train the drafters first (conf/experiment/figure1.yaml gives the commands). Each finished window is
kept beside --out; `--resume` picks a stopped run up there.

Each window is scored as the control scores it (control.score_window: teacher-forced, the drafter's
own KV computed under the budget's streaming view, agreement with the target's greedy token at the
span's positions after the first `warmup`). A cell pools a seed's scored positions over the windows,
then takes the mean over seeds; its spread joins the seed spread and the sampling error of the
scored positions (binomial), so a difference inside it is not a result.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from sparsespec.experiments import ExperimentError, int_list
from sparsespec.experiments.common import far_copy
from sparsespec.experiments.common.far_copy import PLAIN, labels
from sparsespec.experiments.common.figures import pyplot, save_png

OPTIONS = {"ctx": "4k,8k,16k", "books": 2, "model": None, "data": None}
RESUME = ("ctx", "groups", "budgets", "distances", "span", "warmup", "offsets", "data", "model")


def arguments(p) -> None:
    p.add_argument("drafters", nargs="+", help="LABEL=DIR[,DIR...] (globs allowed; one dir per seed) or `untrained`")
    p.add_argument("--budgets", default="64,256,1024,2048,full", help="streaming KV budgets (tokens, or full)")
    far_copy.arguments(p, offsets="0.02")
    p.add_argument("--n-layers", type=int, default=2, help="layers of the `untrained` drafter")


def check(args) -> None:
    from sparsespec.experiments.common.agreement import parse_groups

    far_copy.check(args)
    args.budgets = int_list("budgets", args.budgets, full=True)
    args.groups = parse_groups(args.drafters)


def training_summary(dirs: list[str]) -> list[dict]:
    """Steps, seconds and final validation metrics of each drafter's training run (the metrics.json
    beside its export), where there is one."""
    out = []
    for d in dirs:
        metrics = Path(d).parent / "metrics.json"
        if not metrics.is_file():
            out.append({"dir": d})
            continue
        m = json.loads(metrics.read_text())
        out.append({"dir": d, "steps": m.get("global_step"), "seconds": m.get("seconds"), "final": m.get("final"),
                    "command": m.get("command")})
    return out


def measure(args, checkpoint) -> dict:
    """{settings..., windows: [{ctx, sample, texts}]}: every window's counts, each drafter seed keyed
    `LABEL#i`; the target and the drafters loaded for each ctx (YaRN past the trained positions)."""
    import logging

    from sparsespec.experiments.common.agreement import load_models

    ctxs, groups, budgets, distances, span = args.ctx, args.groups, args.budgets, args.distances, args.span

    windows: list[dict] = []
    for ctx in ctxs:
        if max(distances) > ctx - span:
            raise ExperimentError(f"--distances: {max(distances)} does not fit a {ctx}-token window whose last "
                              f"{span} are copied (at most {ctx - span})")
        tgt, models = load_models(args.model, args.n_layers, groups, ctx)
        drafters = {f"{label}#{i}": m for label, seeds in models.items() for i, m in enumerate(seeds)}
        windows += far_copy.score_windows(tgt.model, tgt.tokenizer, drafters, ctx, method="figure1",
                                          distances=distances, span=span, warmup=args.warmup, budgets=budgets,
                                          offsets=args.offsets, books=args.books, data=args.data,
                                          checkpoint=checkpoint, say=logging.getLogger(__name__).info)
        del tgt, models, drafters
    return {"ctxs": ctxs, "groups": groups, "budgets": [b or "full" for b in budgets], "distances": distances,
            "span": span, "warmup": args.warmup, "windows": windows,
            "training": {label: training_summary(dirs) for label, dirs in groups.items() if label != "untrained"}}


def _pooled(windows: list[dict], text: str, key: str | None) -> tuple[int, int]:
    """(hits, scored positions) over windows; key None = the target's copies."""
    per = [w["texts"][text] for w in windows]
    hits = sum(c["target_copies"] if key is None else c["agree"][key] for c in per)
    return hits, sum(c["n"] for c in per)


def cells(report: dict) -> dict[tuple, dict]:
    """(ctx, label, text, budget) -> {acc (mean over seeds of the pooled rate), seed_std, se (binomial,
    of one seed's pooled positions), spread = sqrt(seed_std² + se²), n (positions per seed)}; and
    (ctx, "target", text, "copies") -> the target's copy rate."""
    out = {}
    for ctx in report["ctxs"]:
        wins = [w for w in report["windows"] if w["ctx"] == ctx]
        if not wins:
            continue
        for text in labels(report["distances"]):
            hits, n = _pooled(wins, text, None)
            out[(ctx, "target", text, "copies")] = {"acc": hits / n, "n": n}
            for label, dirs in report["groups"].items():
                for b in report["budgets"]:
                    rates = [_pooled(wins, text, f"{label}#{i}/{b}") for i in range(len(dirs))]
                    ps = [h / m for h, m in rates]
                    p = statistics.mean(ps)
                    std = statistics.stdev(ps) if len(ps) > 1 else 0.0
                    se = math.sqrt(p * (1 - p) / rates[0][1])
                    out[(ctx, label, text, str(b))] = {"acc": p, "seed_std": std, "se": se,
                                                       "spread": math.hypot(std, se), "n": rates[0][1],
                                                       "seeds": len(ps)}
    return out


def _k(ctx: int) -> str:
    return f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)


def training_table(report: dict) -> str:
    """The training runs' final validation agreement (teacher-forced, `val/acc_*`) per recipe and
    budget, mean over the recipe's seeds."""
    runs = {label: [r["final"] for r in rs if r.get("final")] for label, rs in report.get("training", {}).items()}
    runs = {label: finals for label, finals in runs.items() if finals}
    if not runs:
        raise ExperimentError("this report keeps no training runs' validation")
    keys = sorted({k for finals in runs.values() for f in finals for k in f if k.startswith("val/acc_")},
                  key=lambda k: (k == "val/acc_full", int(k.split("_B")[-1]) if "_B" in k else 0))
    lines = ["| recipe | seeds | " + " | ".join(f"`{k}`" for k in keys) + " |", "|---|---|" + "---|" * len(keys)]
    for label, finals in runs.items():
        cells = [f"{statistics.fmean(f[k] for f in finals if k in f):.3f}" if any(k in f for f in finals) else "—"
                 for k in keys]
        lines.append(f"| {label} | {len(finals)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(report: dict, ctx: int | None = None) -> str:
    """The agreement tables, one per scored context (`ctx`: that one alone), and the training runs."""
    only = ctx
    c = cells(report)
    texts = labels(report["distances"])
    seeds = {label: len(d) for label, d in report["groups"].items()}
    lines = ["Agreement with the target's greedy token, teacher-forced, by recipe and streaming KV budget: mean over "
             "training seeds (" + ", ".join(f"{label} {n}" for label, n in seeds.items()) + ") ± the seed spread "
             "and the positions' sampling error joined (sqrt(std² + se²)). Texts: the held-out window as it is "
             f"(plain), and with its last {report['span']} tokens copied from D back; the first "
             f"{report['warmup']} of them are not scored."]
    for ctx in report["ctxs"]:
        if (ctx, "target", PLAIN, "copies") not in c or only not in (None, ctx):
            continue
        n_win = len([w for w in report["windows"] if w["ctx"] == ctx])
        first = next(iter(report["groups"]))
        lines += ["", f"**{_k(ctx)}** ({n_win} held-out windows, {c[(ctx, first, PLAIN, str(report['budgets'][0]))]['n']} "
                  "scored positions per text). The target copies: "
                  + ", ".join(f"{t} {c[(ctx, 'target', t, 'copies')]['acc']:.2f}" for t in texts[1:]) + ".", "",
                  "| recipe | budget | " + " | ".join(texts) + " |", "|---|---|" + "---|" * len(texts)]
        for label in report["groups"]:
            for b in report["budgets"]:
                lines.append(f"| {label} | {b} | " + " | ".join(
                    f"{c[(ctx, label, t, str(b))]['acc']:.3f} ± {c[(ctx, label, t, str(b))]['spread']:.3f}"
                    for t in texts) + " |")
    runs = [r for rs in report.get("training", {}).values() for r in rs if r.get("steps")]
    if runs:
        lines += ["", f"Training: {len(runs)} runs of {min(r['steps'] for r in runs)}–{max(r['steps'] for r in runs)} "
                  f"steps, {min(r['seconds'] for r in runs) / 60:.1f}–{max(r['seconds'] for r in runs) / 60:.1f} min "
                  "each (the longest include the teacher pass that fills the cache the other runs share)."]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """A panel per (text, ctx): plain text on top, the far copies (pooled over D) below; agreement
    against the budget, a line per recipe with its spread."""
    plt = pyplot()
    c = cells(report)
    ctxs = [x for x in report["ctxs"] if (x, "target", PLAIN, "copies") in c]
    if not ctxs:
        raise ExperimentError("no context has finished windows to plot")
    copies = labels(report["distances"])[1:]
    budgets = [str(b) for b in report["budgets"]]
    x = list(range(len(budgets)))
    fig, axes = plt.subplots(2, len(ctxs), figsize=(3.3 * len(ctxs), 5.6), sharey="row", squeeze=False)
    for col, ctx in enumerate(ctxs):
        for row, (name, group) in enumerate([("plain text", [PLAIN]), ("far copies (mean over D)", copies)]):
            ax = axes[row][col]
            for label in report["groups"]:
                cell = [[c[(ctx, label, t, b)] for t in group] for b in budgets]
                acc = [statistics.mean(v["acc"] for v in cs) for cs in cell]
                err = [statistics.mean(v["spread"] for v in cs) for cs in cell]
                ax.errorbar(x, acc, yerr=err, marker="o", ms=3, capsize=2, label=label)
            ax.set_title(f"{_k(ctx)}, {name}", fontsize=9)
            ax.set_xticks(x, budgets, fontsize=7)
            ax.grid(alpha=0.3)
            if row == 1:
                ax.set_xlabel("KV budget (tokens)", fontsize=8)
        axes[0][col].set_ylim(bottom=0)
    for row in (0, 1):
        axes[row][0].set_ylabel("agreement with the target")
    axes[0][-1].legend(fontsize=7)
    save_png(fig, path)
