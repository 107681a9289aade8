"""python -m sparsespec.plan model=NAME|CONFIG ctx=64k batch=1 profile=cpu|h100|FILE [dtype=bfloat16] ...

Prints, for every method the planner knows, its predicted speedup over `ar` at that context and
batch, its best draft length, the ceiling 1/γ and what bounds the round. Arguments are key=value,
like evaluate.py's overrides; comma lists for ctx and batch print one table per pair. Plain argument
parsing rather than Hydra: the planner has no config groups, writes no run folder, and starts
without torch.

Keys: model, ctx, batch, profile, dtype (target weights), kv_dtype (default: dtype), draft_kv,
acceptance (a file from `python -m sparsespec.plan.acceptance`; default: the embedded model's
committed curves), data (the dataset whose curves to use: pg19, ruler, infinitebench), methods
(comma list), k_max, rope_scaling (auto | none), json (write the predictions there).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

KEYS = ("model", "ctx", "batch", "profile", "dtype", "kv_dtype", "draft_kv", "acceptance", "data", "methods",
        "k_max", "rope_scaling", "json")
DEFAULTS = {"model": "smollm2-135m", "ctx": "16k", "batch": "1", "profile": "cpu", "dtype": None, "kv_dtype": None,
            "draft_kv": None, "acceptance": None, "data": "pg19", "methods": None, "k_max": "16",
            "rope_scaling": "auto", "json": None}


class UsageError(ValueError):
    pass


def parse(argv: list[str]) -> dict[str, str | None]:
    args = dict(DEFAULTS)
    for a in argv:
        if a in ("-h", "--help"):
            raise SystemExit(print(__doc__) or 0)
        key, eq, value = a.lstrip("-").partition("=")
        if not eq:
            raise UsageError(f"{a}: arguments are key=value ({', '.join(KEYS)})")
        if key not in KEYS:
            raise UsageError(f"{key}: not a planner key; the keys: {', '.join(KEYS)}")
        args[key] = value
    return args


def table(preds: list, header: str) -> str:
    lines = [header, "", "| method | predicted × ar | best k | tokens / round | γ (draft / ar step) | ceiling 1/γ "
             "| verify (ar steps) | regime | acceptance |", "|---|---|---|---|---|---|---|---|---|"]
    for p in preds:
        ceiling = "∞" if math.isinf(p.ceiling) else f"{p.ceiling:.2f}"
        if p.method == "ar":
            lines.append(f"| ar | 1.00 ({p.ar_step_ms:.2f} ms a step) | — | 1 | — | — | 1.00 | {p.regime} | — |")
            continue
        lines.append(f"| {p.method} | {p.speedup:.2f} | {p.k} | {p.tokens_per_round:.2f} | {p.draft_cost:.3f} | "
                     f"{ceiling} | {p.verify_ar_steps:.2f} | {p.regime} | {p.acceptance} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from sparsespec.config import parse_ctx
    from sparsespec.plan.acceptance import AcceptanceError
    from sparsespec.plan.cost import Dtypes
    from sparsespec.plan.planner import PlanError, plan
    from sparsespec.plan.profile import ProfileError, load_profile
    from sparsespec.plan.shapes import ShapeError, load_shape

    try:
        a = parse(sys.argv[1:] if argv is None else argv)
        try:
            ctxs = [parse_ctx(c) for c in str(a["ctx"]).split(",")]
        except ValueError as e:
            raise UsageError(str(e)) from None
        try:
            batches = [int(b) for b in str(a["batch"]).split(",")]
            k_max = int(a["k_max"])
        except ValueError:
            raise UsageError(f"batch={a['batch']} / k_max={a['k_max']}: whole numbers (batch=1,8,32)") from None
        shape = load_shape(a["model"])
        prof = load_profile(a["profile"])
        weights = a["dtype"] or ("float32" if prof.source == "measured" else "bfloat16")
        try:
            dtypes = Dtypes(weights, a["kv_dtype"] or weights, draft_kv=a["draft_kv"])
        except ValueError as e:
            raise UsageError(str(e)) from None
        methods = a["methods"].split(",") if a["methods"] else None
        out, rows = [], []
        for ctx in ctxs:
            for b in batches:
                preds = plan(shape, ctx, b, prof, dtypes, a["acceptance"], methods, k_max, a["data"],
                             rope_scaling=a["rope_scaling"])
                text = table(preds, f"**{shape.name}, ctx {ctx}, batch {b}, {prof.name} ({prof.source}), "
                                    f"weights {dtypes.weights}, KV {dtypes.kv}**")
                if preds.missing:
                    text += (f"\n\nNot priced, no acceptance data: {', '.join(preds.missing)} (measure: `python evaluate.py "
                             "method=NAME ctx=... out_dir=DIR`, `python -m sparsespec.plan.acceptance --runs DIR --out "
                             "FILE`, then acceptance=FILE).")
                out.append(text)
                rows += [{"ctx": ctx, "batch": b, **p.as_row()} for p in preds]
    except (UsageError, ShapeError, ProfileError, AcceptanceError, PlanError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n\n".join(out))
    if a["json"]:
        Path(a["json"]).write_text(json.dumps({"model": shape.name, "profile": prof.name, "source": prof.source,
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
