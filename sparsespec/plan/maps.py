"""Which method for my setting: the planner's predicted map, the ceilings' arithmetic and the
published claims held against their ceilings, written to one results file and rendered into
docs/planning.md.

    python -m sparsespec.plan.maps            # writes results/plan_map.json (seconds, no torch, no GPU)

The map prices Llama-3.1-8B and Qwen2.5-7B in bfloat16 on an H100 and an H200 from datasheet
profiles (results/profiles/h100_datasheet.json, h200_datasheet.json: published bandwidth and
compute, a host overhead per forward and per round assumed and stated in the file) at 8k-128k and
batch 1-32, with the acceptance curves measured on the embedded model (the only model measured):
every cell is a prediction until a GPU run of that setting exists. Only methods whose acceptance
was measured across the contexts (4k-64k) are candidates; past 64k their curves are held flat.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparsespec.plan import cost
from sparsespec.plan.acceptance import Curve, load_acceptance
from sparsespec.plan.cost import Dtypes
from sparsespec.plan.planner import METHODS, MethodSpec, plan, predict
from sparsespec.plan.profile import PROFILES, ROOT, datasheet, load_profile
from sparsespec.plan.shapes import load_shape

OUT = ROOT / "results" / "plan_map.json"
COMMAND = "python -m sparsespec.plan.maps"
MODELS = ("llama-3.1-8b", "qwen2.5-7b")
DEVICES = ("h100_datasheet", "h200_datasheet")
CONTEXTS = (8192, 16384, 32768, 65536, 131072)
BATCHES = (1, 4, 8, 16, 32)
# measured at 4k-64k on the embedded model; pillarattn and vegas (4k only) and snapkv_self (a stand-in) are not
CANDIDATES = ("ar", "magicdec", "magicdec_q", "sparsespec_l", "sparsespec_l_q", "quantspec", "lookup")
BF16 = Dtypes("bfloat16", "bfloat16")
# the draft formats whose ceilings the arithmetic compares at batch 1
CEILINGS = {
    "bf16 draft over a 10% view (magicdec)": METHODS["magicdec"],
    "int4 draft over a 10% view (magicdec_q)": METHODS["magicdec_q"],
    "int4 draft over the whole cache in int8 (quantspec)": METHODS["quantspec"],
    "int4 draft over the whole cache in int4 (QuantSpec's)":
        replace(METHODS["quantspec"], name="quantspec_int4kv", draft_head=None, draft_kv="int4"),
}


def _gamma(spec: MethodSpec, model: str, ctx: int, batch: int, profile: Any) -> float:
    """One draft step over one ar step (acceptance does not enter it)."""
    return predict(spec, load_shape(model), ctx, batch, profile, BF16, 1, Curve(spec.name, ctx, [0.5])).draft_cost


def _cell(model: str, ctx: int, batch: int, profile: Any, acc: Any) -> dict:
    preds = plan(model, ctx, batch, profile, BF16, acc, list(CANDIDATES), stand_ins=False)
    best = preds[0]
    return {"model": model, "ctx": ctx, "batch": batch, "best": best.method, "speedup": round(best.speedup, 3),
            "k": best.k, "regime": best.regime,
            "ceiling": None if best.ceiling == float("inf") else round(best.ceiling, 3),
            "acceptance": best.acceptance, "status": "predicted",
            "speedups": {p.method: round(p.speedup, 3) for p in preds}}


def claims() -> list[dict]:
    """Each paper's headline next to the planner's ceiling 1/γ of its own draft in its most
    favourable setting, on its GPU's datasheet with no host overhead (the most lenient bound): the
    baseline's fraction of the bandwidth below which the headline could hold."""
    out = []

    def ceiling(spec: MethodSpec, model: str, ctx: int, batch: int, device: str) -> float:
        return 1 / _gamma(spec, model, ctx, batch, datasheet(device))

    sparse = {m: ceiling(METHODS["sparsespec_l"], m, 65536, 1, "a40") for m in ("llama-3.2-3b", "llama-3.1-8b",
                                                                                 "qwen2.5-14b")}
    out.append({"paper": "SparseSpec-L", "arxiv": "2607.27735", "headline": 2.79,
                "claim": "up to 2.79× over autoregressive decoding, 3B–14B models, contexts ≤ 64k, batch 1, one A40",
                "draft": "the target in bf16 over a 10% recallable sparse view",
                "setting": "64k (the longest in range), batch 1, A40 datasheet; 3B / 8B / 14B: "
                           + " / ".join(f"{v:.2f}" for v in sparse.values()),
                "ceiling": round(max(sparse.values()), 3)})
    out.append({"paper": "MagicDec", "arxiv": "2408.11049", "headline": 2.51,
                "claim": "up to 2.51× for Llama-3.1-8B at batch 32–256 (1.84× on 8 A100s in an earlier version)",
                "draft": "the target in bf16 over a StreamingLLM view of 512 tokens",
                "setting": "Llama-3.1-8B, 32k, batch 32, A100 datasheet (tensor parallelism divides both steps alike)",
                "ceiling": round(ceiling(replace(METHODS["magicdec"], budget=512), "llama-3.1-8b", 32768, 32, "a100"),
                                 3)})
    out.append({"paper": "QuantSpec", "arxiv": "2502.10424", "headline": 2.5,
                "claim": "up to ~2.5× end to end, acceptance > 90%, long contexts, batch 1",
                "draft": "the target with 4-bit weights over a 4-bit (hierarchical) copy of the whole cache",
                "setting": "Llama-3.1-8B, 128k, batch 1, A100 datasheet; with an int8 cache (this project's "
                           f"quantspec): {ceiling(METHODS['quantspec'], 'llama-3.1-8b', 131072, 1, 'a100'):.2f}",
                "ceiling": round(ceiling(CEILINGS["int4 draft over the whole cache in int4 (QuantSpec's)"],
                                         "llama-3.1-8b", 131072, 1, "a100"), 3)})
    out.append({"paper": "TriForce", "arxiv": "2404.11912", "headline": 2.31,
                "claim": "2.31× for Llama2-7B-128K on one A100, 128k, batch 1",
                "draft": "the target in bf16 over a 4k-token retrieval cache (itself drafted for by a 68M model)",
                "setting": "Llama-2-7B-128K, 128k, batch 1, A100 datasheet; the middle level's bound (the small "
                           "model's drafts, verified by it several at a time, can pass it)",
                "ceiling": round(ceiling(replace(METHODS["sparsespec_l"], budget=4096), "llama-2-7b-128k", 131072, 1,
                                         "a100"), 3)})
    for c in out:
        c["holds_under_ceiling"] = c["headline"] <= c["ceiling"]
        # S <= (1/γ) / f when the baseline read at a fraction f of the bandwidth the draft steps reached
        c["baseline_bandwidth_share_at_most"] = None if c["holds_under_ceiling"] else round(
            c["ceiling"] / c["headline"], 3)
    return out


def build() -> dict:
    acc = load_acceptance()
    devices = {name: load_profile(PROFILES / f"{name}.json") for name in DEVICES}
    cells, ceilings, sizes = [], [], []
    for dev, prof in devices.items():
        for model in MODELS:
            for ctx in CONTEXTS:
                for batch in BATCHES:
                    cells.append({"device": dev, **_cell(model, ctx, batch, prof, acc)})
                ceilings.append({"device": dev, "model": model, "ctx": ctx, **{
                    label: round(1 / _gamma(spec, model, ctx, 1, prof), 3) for label, spec in CEILINGS.items()}})
    for model in MODELS:
        shape = load_shape(model)
        for ctx in CONTEXTS:
            sizes.append({"model": model, "ctx": ctx, "weights_gb": round(cost.weight_bytes(shape, "bfloat16") / 1e9, 2),
                          "weights_int4_gb": round(cost.weight_bytes(shape, "int4", "int8", norms="bfloat16") / 1e9, 2),
                          "kv_gb": round(cost.kv_bytes(shape, ctx, "bfloat16") / 1e9, 2),
                          "view_kv_gb": round(cost.kv_bytes(shape, cost.view_budget(ctx), "bfloat16") / 1e9, 2)})
    from sparsespec.provenance import Provenance

    return {"cells": cells, "ceilings": ceilings, "sizes": sizes, "claims": claims(),
            "profiles": {name: {"name": p.name, "source": p.source, "bandwidth_gbs": p.bandwidth_gbs,
                                "bf16_tflops": p.compute_tflops.get("bfloat16"), "step_overhead_ms": p.step_overhead_ms,
                                "round_overhead_ms": p.round_overhead_ms, "notes": p.notes}
                         for name, p in devices.items()},
            "candidates": list(CANDIDATES), "acceptance": acc.model, "status": "predicted",
            "command": COMMAND, "provenance": Provenance.begin().end()}


# -- rendering (docs/planning.md's marked sections, through sparsespec.experiments.plan) ---------------

def _k(ctx: int) -> str:
    return f"{ctx // 1024}k"


def map_table(rep: dict, device: str, model: str) -> str:
    """Contexts by batch: the predicted best method, its speedup over ar and what bounds its round."""
    cells = {(c["ctx"], c["batch"]): c for c in rep["cells"] if c["device"] == device and c["model"] == model}
    lines = ["| context | " + " | ".join(f"batch {b}" for b in BATCHES) + " |", "|---|" + "---|" * len(BATCHES)]
    for ctx in CONTEXTS:
        row = [f"{cells[(ctx, b)]['best']} {cells[(ctx, b)]['speedup']:.2f}× ({cells[(ctx, b)]['regime']})"
               for b in BATCHES]
        lines.append(f"| {_k(ctx)} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def maps_markdown(rep: dict) -> str:
    out = []
    for device in DEVICES:
        p = rep["profiles"][device]
        for model in MODELS:
            out.append(f"**{model} on the {p['name']}** ({p['source']}: {p['bandwidth_gbs']:g} GB/s, "
                       f"{p['bf16_tflops']:g} bf16 TFLOP/s, {p['step_overhead_ms']:g} ms host time a forward and "
                       f"{p['round_overhead_ms']:g} ms a round assumed), predicted:\n\n" + map_table(rep, device, model))
    return "\n\n".join(out)


def ceilings_markdown(rep: dict) -> str:
    """Batch 1: the ceiling 1/γ of each draft format by context, and the bytes behind it."""
    labels = list(CEILINGS)
    lines = ["| device | model | context | weights (bf16 / int4) GB | K/V GB (10% view) | "
             + " | ".join(labels) + " |", "|---|---|---|---|---|" + "---|" * len(labels)]
    sizes = {(s["model"], s["ctx"]): s for s in rep["sizes"]}
    for c in rep["ceilings"]:
        s = sizes[(c["model"], c["ctx"])]
        lines.append(f"| {rep['profiles'][c['device']]['name'].split(' ')[1]} | {c['model']} | {_k(c['ctx'])} | "
                     f"{s['weights_gb']:.1f} / {s['weights_int4_gb']:.1f} | {s['kv_gb']:.1f} ({s['view_kv_gb']:.2f}) | "
                     + " | ".join(f"{c[label]:.2f}" for label in labels) + " |")
    return "\n".join(lines)


def claims_markdown(rep: dict) -> str:
    lines = ["| paper | headline | its draft | ceiling 1/γ (setting) | headline / ceiling | baseline bandwidth "
             "share needed (at most) |", "|---|---|---|---|---|---|"]
    for c in rep["claims"]:
        need = "— (within the ceiling)" if c["holds_under_ceiling"] else \
            f"{c['baseline_bandwidth_share_at_most']:.0%} of the bandwidth its draft steps reached"
        lines.append(f"| {c['paper']} (arXiv {c['arxiv']}) | {c['claim']} | {c['draft']} | {c['ceiling']:.2f} "
                     f"({c['setting']}) | {c['headline'] / c['ceiling']:.2f} | {need} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m sparsespec.plan.maps", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    rep = build()
    args.out.write_text(json.dumps(rep, indent=1, ensure_ascii=False) + "\n")
    print(maps_markdown(rep) + "\n\n" + ceilings_markdown(rep) + "\n\n" + claims_markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
