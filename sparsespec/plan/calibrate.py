"""The planner's predictions against every committed speed measurement on this CPU.

    python -m sparsespec.plan.calibrate            # writes results/plan_calibration.json, prints the table

For each speculative row of results/decode.json (batch 1, 4k-64k), results/batching.json (batches
of 1-8), results/quantized_drafts.json (int4 / int8 drafts, 4k-64k) and results/sensitivity.json
(SparseSpec-L's view ratio and window), the planner prices the
row's own round (its draft length, its acceptance: a constant p fitted to its mean accepted tokens a
round) on a profile of the engine that row ran on, built from the committed microbenchmarks: weight
products through F.linear for the runs that predate the few-rows linear kernel, through the kernel
for the quantized-draft runs, and attention through the CPU attention kernel, or PyTorch's where the
row says so. Acceptance is the row's own, so the
comparison tests the cost model, as the speedup identity beside it is tested on the same α, k.
It also checks the best method of each (context, batch) cell against the measured best.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from sparsespec.plan.acceptance import Acceptance, Curve, load_acceptance
from sparsespec.plan.cost import Dtypes
from sparsespec.plan.planner import METHODS, predict
from sparsespec.plan.profile import ROOT, DeviceProfile, from_results
from sparsespec.plan.shapes import load_shape

OUT = ROOT / "results" / "plan_calibration.json"
COMMAND = "python -m sparsespec.plan.calibrate"


def _profiles(results: Path, round_overhead_ms: float, lookup: dict[int, float]) -> dict[str, DeviceProfile]:
    """The engines the rows ran on: F.linear's products with the CPU attention kernel ("native") or
    PyTorch's ("pytorch"); the few-rows linear kernel with the attention kernel ("kernels")."""
    skinny = json.loads((results / "skinny_products.json").read_text())
    attention = json.loads((results / "attention_kernel.json").read_text())
    formats = [json.loads((results / f).read_text()) for f in ("weight_formats.json", "weight_formats_5rows.json")]
    profs = {path: from_results(skinny, attention, "linear", path, round_overhead_ms, lookup)
             for path in ("native", "pytorch")}
    kv = json.loads((results / "plan_kv_formats.json").read_text())
    profs["kernels"] = from_results(skinny, attention, "ours", "native", round_overhead_ms, lookup, formats=formats,
                                    kv_formats=kv)
    return profs


def _row(source: str, method: str, ctx: int, batch: int, k: float, accepted: float, measured: float,
         identity: float | None, profile: DeviceProfile, spec_kw: dict[str, Any] | None = None,
         curves: Acceptance | None = None, sample: str = "") -> dict:
    from dataclasses import replace

    base = method.split(":")[0]
    spec = replace(METHODS[base], **(spec_kw or {}))
    kk = max(1, round(k))
    shape = load_shape("smollm2-135m")
    p = predict(spec, shape, ctx, batch, profile, Dtypes(), kk, Curve.constant(base, ctx, accepted, kk))
    # the same round with the committed curves' acceptance instead of the row's own (end to end)
    c = predict(spec, shape, ctx, batch, profile, Dtypes(), kk, curves.curve(base, ctx, "pg19")).speedup \
        if curves is not None else None
    return {"source": source, "sample": sample, "method": method, "ctx": ctx, "batch": batch, "k": round(k, 2),
            "accepted_per_round": round(accepted, 3), "measured": round(measured, 4),
            "predicted": round(p.speedup, 4), "predicted_from_curves": None if c is None else round(c, 4),
            "measured_over_curves": None if c is None else round(measured / c, 4),
            "identity": None if identity is None else round(identity, 4),
            "measured_over_predicted": round(measured / p.speedup, 4),
            "measured_over_identity": None if not identity else round(measured / identity, 4),
            "verify_ar_steps": round(p.verify_ar_steps, 3), "draft_cost": round(p.draft_cost, 4),
            "ar_step_ms": round(p.ar_step_ms, 2), "parts_ms": p.as_row()["parts_ms"]}


def rows_from(results: Path) -> list[dict]:
    decode = json.loads((results / "decode.json").read_text())
    other = [r["other_ms"] for r in decode["rows"] if r.get("other_ms") is not None]
    cpu = json.loads((results / "profiles" / "cpu.json").read_text())
    profs = _profiles(results, statistics.median(other), cpu.get("lookup_ns_per_token", {}))
    curves = load_acceptance(results / "plan_acceptance.json")
    out = []
    ar = {(r["ctx"], r["method"]): r["tok_s"] for r in decode["rows"] if r["method"].startswith("ar")}
    for r in decode["rows"]:
        if r.get("acceptance") is None or r["method"].startswith(("ar", "hf")):
            continue
        path = "pytorch" if "attention=pytorch" in r["method"] else "native"
        # against ar on the same engine (the file's vs_ar divides every row by the kernel's ar)
        base = ar[(r["ctx"], "ar:attention=pytorch" if path == "pytorch" else "ar")]
        acc = r["tau"] - 1
        k = r["k_mean"] if r.get("k_mean") else acc / r["acceptance"]
        ident = (r["acceptance"] * k + 1) / (k * r["gamma"] + 1) if r.get("gamma") else None
        out.append(_row("decode", r["method"], r["ctx"], 1, k, acc, r["tok_s"] / base, ident, profs[path],
                        curves=curves, sample=r["sample"]))
    older = json.loads((results / "decode_pytorch_attention.json").read_text())
    for r in older["rows"]:  # PyTorch's attention throughout; budgetdraft's drafter shape is not in the file
        if r.get("acceptance") is None or r["method"].split(":")[0] not in METHODS:
            continue
        acc = r["tau"] - 1
        k = r["k_mean"] if r.get("k_mean") else acc / r["acceptance"]
        ident = (r["acceptance"] * k + 1) / (k * r["gamma"] + 1) if r.get("gamma") else None
        out.append(_row("decode_pytorch_attention", r["method"], r["ctx"], 1, k, acc, r["vs_ar"], ident,
                        profs["pytorch"], curves=curves, sample=r["sample"]))
    batching = json.loads((results / "batching.json").read_text())
    for r in batching["rows"]:
        if r["method"] == "ar":
            continue
        acc = r["acceptance"] * r["k_mean"]
        out.append(_row("batching", r["method"], r["ctx"], r["batch"], r["k_mean"], acc, r["vs_ar"], r.get("identity"),
                        profs["pytorch"], curves=curves))
    quantized = json.loads((results / "quantized_drafts.json").read_text())
    for r in quantized["rows"]:  # run with both kernels; `:weights=int8` is the same method with int8 layers
        if r.get("acceptance") is None or r["method"].startswith("ar"):
            continue
        variant = dict(kv.split("=", 1) for kv in r["method"].partition(":")[2].split(",") if "=" in kv)
        kw = {"draft_weights": variant["weights"]} if "weights" in variant else None
        acc = r["tau"] - 1
        k = r["k_mean"] if r.get("k_mean") else acc / r["acceptance"]
        ident = (r["acceptance"] * k + 1) / (k * r["gamma"] + 1) if r.get("gamma") else None
        out.append(_row("quantized", r["method"], r["ctx"], 1, k, acc, r["vs_ar"], ident, profs["kernels"], kw,
                        curves=curves, sample=r["sample"]))
    sens = json.loads((results / "sensitivity.json").read_text())
    for r in sens["rows"]:
        out.append(_row("sensitivity", r["method"], r["ctx"], 1, r["k"], r["alpha"] * r["k"], r["speedup"],
                        r["predicted"], profs["native"], {"ratio": r["ratio"], "window": r["window"]}))
    return out


def _spread(values: list[float]) -> dict[str, float]:
    errs = [abs(v - 1) for v in values]
    return {"median_ratio": round(statistics.median(values), 3), "min_ratio": round(min(values), 3),
            "max_ratio": round(max(values), 3), "median_abs_error": round(statistics.median(errs), 3),
            "max_abs_error": round(max(errs), 3), "within_10pct": sum(e <= 0.10 for e in errs),
            "within_20pct": sum(e <= 0.20 for e in errs), "rows": len(values)}


def picks(rows: list[dict]) -> list[dict]:
    """Per (source, sample, ctx, batch) cell of the decode and batching files: the measured and the
    predicted best of ar and the methods measured there (one engine per cell: the attention=pytorch
    rows of decode form their own cells)."""
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["source"] == "sensitivity":
            continue
        engine = "kernels" if r["source"] == "quantized" else \
            "native" if r["source"] == "decode" and "attention=pytorch" not in r["method"] else "pytorch"
        cells[(r["source"], engine, r["sample"], r["ctx"], r["batch"])].append(r)
    out = []
    for (source, engine, sample, ctx, batch), rs in sorted(cells.items()):
        measured = max([("ar", 1.0)] + [(r["method"], r["measured"]) for r in rs], key=lambda x: x[1])
        predicted = max([("ar", 1.0)] + [(r["method"], r["predicted"]) for r in rs], key=lambda x: x[1])
        from_curves = max([("ar", 1.0)] + [(r["method"], r["predicted_from_curves"]) for r in rs],
                          key=lambda x: x[1])
        out.append({"source": source, "engine": engine, "sample": sample, "ctx": ctx, "batch": batch,
                    "measured_best": measured[0],
                    "predicted_best": predicted[0], "right": measured[0] == predicted[0],
                    "predicted_best_from_curves": from_curves[0], "right_from_curves": measured[0] == from_curves[0]})
    return out


def report(results: Path = ROOT / "results") -> dict:
    rows = rows_from(results)
    summary = {"all": _spread([r["measured_over_predicted"] for r in rows]),
               "identity": _spread([r["measured_over_identity"] for r in rows if r["measured_over_identity"]])}
    summary["from_curves"] = _spread([r["measured_over_curves"] for r in rows if r["measured_over_curves"]])
    for source in ("decode", "decode_pytorch_attention", "batching", "quantized", "sensitivity"):
        summary[source] = _spread([r["measured_over_predicted"] for r in rows if r["source"] == source])
    summary["self_speculation"] = _spread([r["measured_over_predicted"] for r in rows
                                           if not r["method"].startswith("lookup")])
    summary["lookup"] = _spread([r["measured_over_predicted"] for r in rows if r["method"].startswith("lookup")])
    cells = picks(rows)
    summary["best_method"] = {"cells": len(cells), "right": sum(c["right"] for c in cells),
                              "right_from_curves": sum(c["right_from_curves"] for c in cells)}
    from sparsespec.provenance import Provenance

    return {"rows": rows, "cells": cells, "summary": summary, "command": COMMAND,
            "provenance": Provenance.begin().end()}


def markdown(rep: dict) -> str:
    """The table: every row's measured and predicted speedup and the identity's, and the summary."""
    lines = ["| source | method | ctx | batch | k | measured × ar | predicted | measured / predicted | from curves "
             "| identity | measured / identity | verify (ar steps) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    dash = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    for r in rep["rows"]:
        lines.append(f"| {r['source']} | {r['method']} | {r['ctx'] // 1024}k | {r['batch']} | {r['k']:.1f} | "
                     f"{r['measured']:.2f} | {r['predicted']:.2f} | {r['measured_over_predicted']:.2f} | "
                     f"{dash(r['predicted_from_curves'])} | {dash(r['identity'])} | {dash(r['measured_over_identity'])} "
                     f"| {r['verify_ar_steps']:.2f} |")
    lines += ["", summary_markdown(rep)]
    return "\n".join(lines)


SUMMARY_LABELS = {"all": "every row", "identity": "the speedup identity, same rows", "from_curves":
                  "every row, from the committed curves", "decode": "decode (batch 1, 4k-64k)",
                  "decode_pytorch_attention": "older decode (PyTorch's attention)", "batching": "batching (1-8)",
                  "quantized": "quantized drafts (int4 / int8, 4k-64k)", "sensitivity": "sensitivity (ratio, window)",
                  "self_speculation": "self-speculation", "lookup": "prompt lookup"}


def summary_markdown(rep: dict) -> str:
    """The summary of the comparison (docs/planning.md): error by group and the best-method picks."""
    lines = ["| rows | n | median measured / predicted | range | median abs. error | largest | within 10% | "
             "within 20% |", "|---|---|---|---|---|---|---|---|"]
    for key, s in rep["summary"].items():
        if key == "best_method":
            continue
        lines.append(f"| {SUMMARY_LABELS.get(key, key)} | {s['rows']} | {s['median_ratio']:.2f} | "
                     f"{s['min_ratio']:.2f}–{s['max_ratio']:.2f} | {s['median_abs_error']:.1%} | "
                     f"{s['max_abs_error']:.0%} | {s['within_10pct']} | {s['within_20pct']} |")
    b = rep["summary"]["best_method"]
    misses = [c for c in rep["cells"] if not c["right"]]
    lines += ["", f"Best method of a (context, batch) cell picked right: {b['right']} of {b['cells']} with each row's "
              f"acceptance, {b['right_from_curves']} with the committed curves'."
              + ("" if not misses else " Missed: " + "; ".join(
                  f"{c['source']} {c['ctx'] // 1024}k batch {c['batch']} (measured {c['measured_best']}, "
                  f"predicted {c['predicted_best']})" for c in misses) + ".")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m sparsespec.plan.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    rep = report()
    args.out.write_text(json.dumps(rep, indent=1) + "\n")
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
