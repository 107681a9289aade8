"""Summaries of results files (results.jsonl, and each shard's own file): per method x dataset x ctx,
mean ± std, as JSON, Markdown and plots.

A group is (dataset, task, ctx, method, variant). The variant names the method settings that differ
between rows of the same method name, which only happens when a report joins runs of one method at
several settings (`python -m sparsespec.experiments report RUN1/results.jsonl RUN2/results.jsonl`,
e.g. a budget sweep); within one run every method has one setting and the variant is empty.

Plots (PNG, written next to the summary):

* speedup_vs_ctx.png: paired speedup over `ar` (mean ± std over samples) against ctx, per method;
* acceptance_vs_ctx.png: acceptance rate α against ctx, per method;
* acceptance_vs_budget.png: α against the drafter's KV budget in tokens (sparse views only);
* accepted_hist.png: how many drafted tokens each verification round kept, per method.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections import defaultdict
from pathlib import Path

from sparsespec.eval.results import read_rows, results_files, split_of, write_atomic

log = logging.getLogger(__name__)

METRICS = ("tokens_per_s", "speedup", "acceptance_rate", "mean_accepted_tokens", "gamma", "k_mean",
           "predicted_speedup", "planned_speedup", "prefill_s", "wall_s", "score", "exact_match_ar", "budget_tokens", "prompt_tokens",
           "new_tokens", "aggregate_tokens_per_s", "aggregate_speedup", "draft_step_bytes")
PLOTS = ("speedup_vs_ctx.png", "acceptance_vs_ctx.png", "acceptance_vs_budget.png", "accepted_hist.png")
_NOT_VARIANT = ("name", "_target_")


def _stats(values: list) -> dict | None:
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "n": len(vals)}


def _short(v) -> str:
    return json.dumps(v, separators=(",", ":")) if isinstance(v, list | dict) else str(v)


def distinct_by_part(ids: list[int], parts: int) -> list[float | None]:
    """Distinct tokens / tokens in each of `parts` equal stretches of an output (low: a greedy loop,
    which any drafter predicts, so acceptance measured there says little about real text)."""
    size = max(len(ids) // parts, 1)
    chunks = [ids[i * size: (i + 1) * size if i < parts - 1 else len(ids)] for i in range(parts)]
    return [len(set(c)) / len(c) if c else None for c in chunks]


def variants(rows: list[dict]) -> list[str]:
    """Per row, the method settings that differ from other rows of the same method ("" if none)."""
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_method[r["method"]].append(r.get("method_config") or {})
    varying: dict[str, list[str]] = {}
    for method, confs in by_method.items():
        keys = sorted({k for c in confs for k in c} - set(_NOT_VARIANT))
        varying[method] = [k for k in keys if len({_short(c.get(k)) for c in confs}) > 1]
    return [" ".join(f"{k}={_short((r.get('method_config') or {}).get(k))}" for k in varying[r["method"]])
            for r in rows]


def ctx_label(ctx) -> str:
    """4096 -> '4k' (k = 1024 tokens, as in the ctx labels); other numbers as they are."""
    if isinstance(ctx, int) and ctx >= 1024 and ctx % 1024 == 0:
        return f"{ctx // 1024}k"
    return str(ctx)


def method_label(entry: dict) -> str:
    return f"{entry['method']} ({entry['variant']})" if entry.get("variant") else entry["method"]


def dataset_label(entry: dict) -> str:
    return f"{entry['dataset']}/{entry['task']}" if entry.get("task") else str(entry["dataset"])


def batch_size(row: dict) -> int:
    """Sequences decoded together in the row's run (rows written before batching: 1)."""
    return int(row.get("batch_size") or 1)


def summarize(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r, variant in zip(rows, variants(rows), strict=True):
        groups[(str(r["dataset"]), str(r.get("task") or ""), r["ctx"], batch_size(r), r["method"] != "ar",
                r["method"], variant)].append(r)
    out = []
    for (dataset, task, ctx, b, _, method, variant), rs in sorted(groups.items(), key=lambda kv: kv[0]):
        entry = {"method": method, "variant": variant, "dataset": dataset, "task": task or None, "ctx": ctx,
                 "batch_size": b, "n": len(rs)}
        for m in METRICS:
            entry[m] = _stats([r.get(m) for r in rs])
        entry["draft_reads"] = draft_reads(rs, entry["draft_step_bytes"])
        out.append(entry)
    return out


def draft_reads(rows: list[dict], step_bytes: dict | None) -> str | None:
    """What a draft step read, in words: its weights' and its K/V's formats and their bytes
    ("int4-g32 weights, fp32 K/V: 96 MB"); None for rows with no self-draft (or written before
    rows said it)."""
    weights = next((r["draft_weights"] for r in rows if r.get("draft_weights")), None)
    if weights is None:
        return None
    kv = next((r["draft_kv"] for r in rows if r.get("draft_kv")), "?")
    size = f": {step_bytes['mean'] / 1e6:.0f} MB" if step_bytes else ""
    return f"{weights} weights, {kv} K/V{size}"


def _fmt(s: dict | None, digits: int = 2) -> str:
    if s is None:
        return "—"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}" if s["n"] > 1 else f"{s['mean']:.{digits}f}"


def to_markdown(summary: list[dict]) -> str:
    """The summary table; with batched rows, the batch size and the batch's aggregate throughput
    against batched ar's at the same batch size as well."""
    batched = any(e.get("batch_size", 1) > 1 for e in summary)
    reads = any(e.get("draft_reads") for e in summary)  # a draft in a low-bit format says what it read
    planned = any(e.get("planned_speedup") for e in summary)  # rows written before the planner have none
    extra = ("| B | aggregate tokens/s | aggregate vs ar ", "|---|---|---") if batched else ("", "")
    head = (f"| method | dataset | ctx {extra[0]}| n | tokens/s | speedup vs ar | α (acceptance) | τ (tokens/round) "
            f"| γ | k | predicted S |{' planned S |' if planned else ''} identical to ar | score |"
            f"{' draft step read |' if reads else ''}\n"
            f"|---|---|---{extra[1]}|---|---|---|---|---|---|---|---|{'---|' if planned else ''}---|---|"
            f"{'---|' if reads else ''}\n")
    lines = []
    for e in summary:
        cols = (f"| {e.get('batch_size', 1)} | {_fmt(e.get('aggregate_tokens_per_s'))} | "
                f"{_fmt(e.get('aggregate_speedup'))} ") if batched else ""
        lines.append(
            f"| {method_label(e)} | {dataset_label(e)} | {ctx_label(e['ctx'])} {cols}| {e['n']} "
            f"| {_fmt(e['tokens_per_s'])} "
            f"| {_fmt(e['speedup'])} | {_fmt(e['acceptance_rate'])} | {_fmt(e['mean_accepted_tokens'])} "
            f"| {_fmt(e['gamma'], 3)} | {_fmt(e['k_mean'], 1)} | {_fmt(e['predicted_speedup'])} "
            + (f"| {_fmt(e.get('planned_speedup'))} " if planned else "")
            + f"| {_fmt(e['exact_match_ar'])} | {_fmt(e['score'])} |"
            + (f" {e.get('draft_reads') or '—'} |" if reads else "")
        )
    return head + "\n".join(lines) + "\n"


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _round_ms(rs: list[dict]) -> dict[str, float]:
    """Mean ms per verification round: drafting, verifying, the recall index's update, the rest."""
    rounds = sum(r.get("verify_steps") or 0 for r in rs) or 1
    index = sum(r.get("engine_index_update_s") or 0.0 for r in rs)
    return {"draft": 1000 * sum(r.get("draft_s") or 0.0 for r in rs) / rounds,
            "verify": 1000 * sum(r.get("verify_s") or 0.0 for r in rs) / rounds,
            "index": 1000 * index / rounds,
            "other": 1000 * max(sum(r.get("overhead_s") or 0.0 for r in rs) - index, 0.0) / rounds}


def _ms(x: float) -> str:
    """Milliseconds with two significant figures below 10 ms (a tiny model's rounds take fractions)."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _verdict(speedups: list[float]) -> str:
    """Faster or slower than ar only as far as the samples can tell: beyond one std over samples, or,
    with one sample (no spread), beyond 5%."""
    mean = statistics.fmean(speedups)
    if len(speedups) == 1:
        return ("faster than ar on this one sample" if mean > 1.05 else "slower than ar on this one sample"
                if mean < 0.95 else "within 5% of ar, which one sample cannot tell from noise")
    sd = statistics.stdev(speedups)
    return ("faster than ar" if mean - sd > 1 else "slower than ar" if mean + sd < 1
            else f"as fast as ar within the spread over samples (± {sd:.2f})")


def headline(rows: list[dict]) -> list[str]:
    """Plain sentences, generated from the rows, on how each method did against its paired ar:
    how much faster or slower, why (the round's time split against ar's time per token), and
    whether its output was ar's own. One paragraph per method and (dataset, task, ctx)."""
    out = []
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(str(r["dataset"]), str(r.get("task") or ""), r["ctx"], batch_size(r))].append(r)
    for (dataset, task, ctx, b), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        ar = {r["sample_id"]: r for r in rs if r["method"] == "ar"}
        where = f"{dataset}{'/' + task if task else ''} at {ctx_label(ctx)} context" + (
            f" in batches of {b}" if b > 1 else "")
        for method in dict.fromkeys(r["method"] for r in rs if r["method"] != "ar"):
            mine = [r for r in rs if r["method"] == method and r["sample_id"] in ar and r.get("speedup")]
            if not mine:
                continue
            paired = [ar[r["sample_id"]] for r in mine]
            speedup = statistics.fmean(r["speedup"] for r in mine)
            tok_s, ar_tok_s = (sum(r["new_tokens"] for r in x) / sum(r["wall_s"] for r in x) for x in (mine, paired))
            ms_token = 1000 * sum(r["wall_s"] for r in mine) / sum(r["new_tokens"] for r in mine)
            ar_ms_token = 1000 / ar_tok_s
            n = len(mine)
            text = (f"On {where} ({n} sample{'s' if n > 1 else ''}), {method} decoded "
                    f"{tok_s:.1f} tokens/s against ar's {ar_tok_s:.1f}: {speedup:.2f}× ar, "
                    f"{_verdict([r['speedup'] for r in mine])}.")
            agg = _mean(r.get("aggregate_speedup") for r in mine)
            if b > 1 and agg is not None:
                text += (f" The batch as a whole decoded {_mean(r['aggregate_tokens_per_s'] for r in mine):.1f} tokens/s "
                         f"against batched ar's {_mean(r['aggregate_tokens_per_s'] for r in paired):.1f}: {agg:.2f}× ar.")
            k, alpha, tau = (_mean(r.get(key) for r in mine) for key in ("k_mean", "acceptance_rate",
                                                                         "mean_accepted_tokens"))
            if k is not None and tau is not None:
                ms = _round_ms(mine)
                parts = [f"{_ms(ms['draft'])} ms drafting", f"{_ms(ms['verify'])} ms verifying with the full cache"]
                if ms["index"] > 0:  # only methods with a recall index spend time on one
                    parts.append(f"{_ms(ms['index'])} ms updating its recall index")
                budget = _mean(r.get("budget_tokens") for r in mine)
                view = (f" from a sparse view of {budget:.0f} of {_mean(r['prompt_tokens'] for r in mine):.0f} "
                        "cached tokens" if budget else "")
                text += (f" Each round drafted {k:.1f} tokens{view} and kept {alpha:.0%} of them, {tau:.2f} tokens "
                         f"a round with the verifier's own; a round took {', '.join(parts[:-1])} and {parts[-1]}, "
                         f"so a token cost {_ms(ms_token)} ms against ar's {_ms(ar_ms_token)} ms.")
            same = [r.get("exact_match_ar") for r in mine]
            if all(v is True for v in same):
                text += " Its output was token-identical to ar's" + (" on every sample." if n > 1 else ".")
            elif any(v is False for v in same):
                text += (f" Its output differed from ar's on {sum(v is False for v in same)} of {n} samples: "
                         "under greedy decoding in float32 that is a bug.")
            else:
                text += " (Sampled: outputs differ from ar's draw by design; the distribution is the target's.)"
            out.append(text)
    return out


def calibration_table(rows: list[dict]) -> str:
    """The entropy controller's own check of its acceptance model, per method and ctx: predicted vs
    observed acceptance of its labelled draft tokens, and of the first m drafts of a round all being
    accepted (the product of per-token estimates assumes independence). "" when no row has one."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if (r.get("engine_calibration") or {}).get("n"):
            groups[(dataset_label({"dataset": r["dataset"], "task": r.get("task")}), r["ctx"], r["method"])].append(r)
    if not groups:
        return ""
    lines = ["| method | dataset | ctx | tokens | predicted α | observed α | P(first 1 / 2 / 4 / 8 accepted): "
             "observed vs predicted |", "|---|---|---|---|---|---|---|"]
    for (dataset, ctx, method), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        n = sum(r["engine_calibration"]["n"] for r in rs)

        def weighted(key: str, rs=rs, n=n) -> float:
            return sum(r["engine_calibration"][key] * r["engine_calibration"]["n"] for r in rs) / n

        chain = []
        for m in ("1", "2", "4", "8"):
            # JSON turns the int keys of a fresh row into strings
            cells = [(r.get("engine_prefix_acceptance") or {}).get(m) or (r.get("engine_prefix_acceptance") or {}).get(
                int(m)) for r in rs]
            cells = [c for c in cells if c]
            if cells:
                total = sum(c["n"] for c in cells)
                obs = sum(c["observed"] * c["n"] for c in cells) / total
                pred = sum(c["predicted"] * c["n"] for c in cells) / total
                chain.append(f"{obs:.2f} vs {pred:.2f}")
            else:
                chain.append("—")
        lines.append(f"| {method} | {dataset} | {ctx_label(ctx)} | {n} | {weighted('predicted'):.2f} | "
                     f"{weighted('observed'):.2f} | {' / '.join(chain)} |")
    return "\n".join(lines) + "\n"


def report_markdown(rows: list[dict], summary: list[dict]) -> str:
    """summary.md: the table, the sentences on what it shows, and the controller's calibration."""
    note = ("mean ± std over samples; speedup: paired ar wall_s / method wall_s (decoding after prefill); "
            "α: accepted / drafted; τ: tokens per verification round; γ: draft step / verify step time; "
            "identical to ar: share of greedy outputs token-identical to ar\n\n")
    text = note + to_markdown(summary)
    sentences = headline(rows)
    if sentences:
        text += "\n" + "\n\n".join(sentences) + "\n"
    calibration = calibration_table(rows)
    if calibration:
        text += ("\nThe entropy controller's acceptance model against what verification found (labelled draft "
                 "tokens: up to and including a round's first rejection):\n\n" + calibration)
    return text


def write_reports(rows: list[dict], out_dir: str | Path) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2))
    md = report_markdown(rows, summary)
    prov = out_dir / "provenance.json"  # an evaluate.py run's: where each process that wrote rows ran
    if prov.is_file():
        from sparsespec.provenance import provenance_text

        texts = list(dict.fromkeys(provenance_text(p) for p in json.loads(prov.read_text(encoding="utf-8"))))
        md = md.rstrip("\n") + "\n\n" + "".join(f"<sub>Provenance: {t}.</sub>\n" for t in texts)
    write_atomic(out_dir / "summary.md", md)
    plot_paths = write_plots(rows, summary, out_dir)
    return {"summary": summary, "plots": plot_paths}


# ---------------------------------------------------------------------------------------------
# rebuilding a report from several results files (python -m sparsespec.experiments report)
# ---------------------------------------------------------------------------------------------


def _row_key(r: dict) -> str:
    return json.dumps([r.get("sample_id"), r.get("dataset"), r.get("task"), r.get("ctx"), r.get("method"),
                       r.get("method_config"), r.get("temperature"), r.get("seed"), r.get("new_tokens")],
                      sort_keys=True, default=str)


def load_results(paths: list[str | Path]) -> list[dict]:
    """Rows of one or more results files; a directory means every results file in it (results.jsonl
    and the results.shard-<i>-of-<n>.jsonl of a sharded run, see results.results_files).

    A row found in two files (same sample, method, settings) counts once: the later file wins,
    so passing a run twice, or a run and its copy, does not inflate n.
    """
    rows: dict[str, dict] = {}
    for p in _expand(paths):
        got = read_rows(p)
        bad = [r for r in got if not isinstance(r, dict) or "method" not in r or "sample_id" not in r or "ctx" not in r]
        if bad:
            raise ValueError(f"{p}: {len(bad)} line(s) are not result rows (no sample_id/method/ctx)")
        dup = 0
        for r in got:
            key = _row_key(r)
            dup += key in rows
            rows[key] = r
        if dup:
            log.warning("%s: %d row(s) repeat rows of an earlier file; the later ones are kept", p, dup)
    return list(rows.values())


def _expand(paths: list[str | Path]) -> list[Path]:
    """The results files that `paths` name (a run directory stands for all of its own)."""
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files = results_files(p)
            if not files:
                raise FileNotFoundError(f"{p}: no results file (results.jsonl or results.shard-<i>-of-<n>.jsonl); "
                                        "pass RUN/results.jsonl or the run directory")
            _warn_missing_shards(p, files)
            out += files
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such results file (pass RUN/results.jsonl or the run directory)")
    return out


def _warn_missing_shards(run_dir: Path, files: list[Path]) -> None:
    """A split with a shard's file missing: that shard is still running, failed, or had no sample."""
    by_count: dict[int, set[int]] = defaultdict(set)
    for f in files:
        i, n = split_of(f)
        by_count[n].add(i)
    for n, have in sorted(by_count.items()):
        missing = sorted(set(range(n)) - have)
        if n > 1 and missing:
            log.warning("%s: no results file for shard(s) %s of %d (still running, failed, or given no sample); "
                        "the report covers shard(s) %s",
                        run_dir, ", ".join(map(str, missing)), n, ", ".join(map(str, sorted(have))))


def build_report(paths: list[str | Path], out_dir: str | Path) -> dict:
    rows = load_results(paths)
    if not rows:
        raise ValueError(f"no result rows in {', '.join(map(str, paths))}")
    return write_reports(rows, out_dir)


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------


def _series(summary: list[dict], metric: str) -> dict[str, list[dict]]:
    """method label -> entries with `metric`, sorted by ctx (one line per method and dataset)."""
    datasets = {dataset_label(e) for e in summary}
    out: dict[str, list[dict]] = defaultdict(list)
    for e in summary:
        if e["method"] == "ar" or e[metric] is None:
            continue
        label = method_label(e) + (f" · {dataset_label(e)}" if len(datasets) > 1 else "")
        out[label].append(e)
    return {k: sorted(v, key=lambda e: e["ctx"]) for k, v in sorted(out.items())}


def _line_plot(plt, series: dict[str, list[dict]], x, metric: str, xlabel: str, ylabel: str, path: Path,
               hline: float | None = None) -> str:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, es in series.items():
        ax.errorbar([x(e) for e in es], [e[metric]["mean"] for e in es], yerr=[e[metric]["std"] for e in es],
                    marker="o", capsize=3, label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", lw=0.8, ls="--")
    xs = sorted({x(e) for es in series.values() for e in es})
    if len(xs) > 1 and xs[0] > 0 and xs[-1] / xs[0] >= 4:
        ax.set_xscale("log", base=2)
    if all(float(v).is_integer() and v >= 1024 and v % 1024 == 0 for v in xs):
        ax.set_xticks(xs, [ctx_label(int(v)) for v in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def write_plots(rows: list[dict], summary: list[dict], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    speed = _series(summary, "speedup")
    if speed:
        paths.append(_line_plot(plt, speed, lambda e: e["ctx"], "speedup", "context (tokens)", "speedup vs ar",
                                out_dir / "speedup_vs_ctx.png", hline=1.0))
    accept = _series(summary, "acceptance_rate")
    if accept:
        paths.append(_line_plot(plt, accept, lambda e: e["ctx"], "acceptance_rate", "context (tokens)",
                                "acceptance rate α", out_dir / "acceptance_vs_ctx.png"))
    # α against the drafter's KV budget: one point per (method, variant, dataset, ctx) group, so a
    # budget sweep draws a curve per ctx and ratio-based views trace budget = ratio x ctx.
    by_budget = {k: sorted((e for e in es if e["budget_tokens"] is not None), key=lambda e: e["budget_tokens"]["mean"])
                 for k, es in _series(summary, "acceptance_rate").items()}
    by_budget = {k: v for k, v in by_budget.items() if v}
    if by_budget:
        ctxs = {e["ctx"] for es in by_budget.values() for e in es}
        if len(ctxs) > 1:  # one curve per method and ctx
            split: dict[str, list[dict]] = defaultdict(list)
            for k, es in by_budget.items():
                for e in es:
                    split[f"{k} @ {ctx_label(e['ctx'])}"].append(e)
            by_budget = dict(sorted(split.items()))
        paths.append(_line_plot(plt, by_budget, lambda e: e["budget_tokens"]["mean"], "acceptance_rate",
                                "drafter KV budget (tokens)", "acceptance rate α", out_dir / "acceptance_vs_budget.png"))
    spec_rows = [(r, v) for r, v in zip(rows, variants(rows), strict=True) if r.get("accepted_per_round")]
    if spec_rows:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        labels = sorted({method_label({"method": r["method"], "variant": v}) for r, v in spec_rows})
        top = max(a for r, _ in spec_rows for a in r["accepted_per_round"])
        for label in labels:
            vals = [a for r, v in spec_rows if method_label({"method": r["method"], "variant": v}) == label
                    for a in r["accepted_per_round"]]
            ax.hist(vals, bins=range(0, top + 2), alpha=0.5, label=label, align="left", density=True)
        ax.set_xlabel("draft tokens accepted per round")
        ax.set_ylabel("share of rounds")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(_save(fig, out_dir / "accepted_hist.png"))
        plt.close(fig)
    return paths


def _save(fig, path: Path) -> str:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    return str(path)
