"""Acceptance by draft position: the chance a draft token at position i is accepted given that the
i - 1 before it were, per method and context, from measured runs. It depends on the model, the data
and the method's view, not on the device, so curves measured once serve every device profile.

    python -m sparsespec.plan.acceptance --runs OUT_DIR [OUT_DIR ...] --out my_acceptance.json

reads the rows of `evaluate.py` runs (their results*.jsonl: `accepted_per_round` and
`drafted_per_round` give the per-position counts) and benchmark files with only α, τ and k
(results/decode.json: a constant acceptance fitted to the mean accepted tokens a round); the
committed curves of the embedded model are results/plan_acceptance.json, made by
`python -m sparsespec.plan.acceptance --committed`.

Caveat: a controller that stops a draft where it expects a rejection (SparseSpec-L's entropy
controller) drafts the later positions only in rounds it trusted, so their measured acceptance is
conditional on that choice too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results" / "plan_acceptance.json"
MIN_ROUNDS = 5  # a position reached by fewer rounds is pooled into the tail
DRAFT_KEYS = ("weights=", "head_weights=", "kv=", "policy.", "controller.")  # variants that change the drafts
# the embedded model's committed runs and benchmark files (--committed): per-round counts first; a
# benchmark file adds (method, context) pairs no earlier source has
COMMITTED_RUNS = ("tasks", "demo", "sampling", "verification_guided_4k")
COMMITTED_BENCH = ("decode.json", "quantized_drafts.json")


class AcceptanceError(ValueError):
    """No acceptance data for what was asked; the message says how to measure it."""


@dataclass
class Curve:
    """Conditional acceptance at draft positions 1..len(p) of `method` at `ctx` on `data`.
    `n[i]`: rounds that reached position i + 1 (0 where fitted from α and τ). `draft_share`: rounds
    that had a draft at all (prompt lookup finds none where the last tokens never occurred)."""

    method: str
    ctx: int
    p: list[float]
    n: list[int] = field(default_factory=list)
    source: str = "rounds"  # rounds | alpha-tau
    data: str = "pg19"
    temperature: float = 0.0
    draft_share: float = 1.0
    rows: int = 0

    @property
    def max_k(self) -> int:
        return len(self.p)

    def accepted(self, k: int) -> float:
        """Expected accepted tokens of a draft of k: sum over i <= k of p_1 ... p_i (positions past
        the measured ones take the last)."""
        total, run = 0.0, 1.0
        for i in range(k):
            run *= self.p[min(i, len(self.p) - 1)]
            total += run
        return total

    @classmethod
    def constant(cls, method: str, ctx: int, mean_accepted: float, k: int, **kw: Any) -> Curve:
        """The constant p whose draft of k accepts `mean_accepted` tokens on average."""
        target = min(max(mean_accepted, 0.0), k - 1e-9)
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sum(mid ** i for i in range(1, k + 1)) < target else (lo, mid)
        return cls(method, ctx, [lo] * k, [0] * k, "alpha-tau", **kw)


def curves_from_rows(rows: list[dict]) -> list[Curve]:
    """Per (method, ctx, dataset, temperature) curves from evaluate.py rows with per-round counts."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("accepted_per_round") and r.get("drafted_per_round"):
            groups[(r["method"], r.get("ctx") or r.get("prompt_tokens"), r.get("dataset") or "?",
                    float(r.get("temperature") or 0.0))].append(r)
    out = []
    for (method, ctx, data, temp), rs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        reached, accepted = defaultdict(int), defaultdict(int)
        rounds = drafted_rounds = 0
        for r in rs:
            for k, a in zip(r["drafted_per_round"], r["accepted_per_round"], strict=True):
                rounds += 1
                drafted_rounds += k > 0
                for i in range(1, min(k, a + 1) + 1):  # positions 1..a accepted, a + 1 rejected
                    reached[i] += 1
                    accepted[i] += i <= a
        p, n = [], []
        for i in sorted(reached):
            if reached[i] < MIN_ROUNDS:  # the sparse tail pooled into one estimate
                tail = [j for j in reached if j >= i]
                p.append(sum(accepted[j] for j in tail) / sum(reached[j] for j in tail))
                n.append(sum(reached[j] for j in tail))
                break
            p.append(accepted[i] / reached[i])
            n.append(reached[i])
        if p:
            out.append(Curve(method, int(ctx), p, n, "rounds", data, temp, drafted_rounds / rounds, len(rs)))
    return out


def curves_from_bench(report: dict[str, Any], data: str = "pg19") -> list[Curve]:
    """Constant-p curves from a benchmark file's rows (results/decode.json): τ - 1 accepted tokens a
    round of k = (τ - 1) / α drafts; a method's `:variant` runs with the same drafts (another
    attention path) are merged, those with other drafts (`:weights=int8`: another draft format than
    the method's own) left out."""
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in report.get("rows", []):
        variant = r["method"].partition(":")[2]
        if any(key in variant for key in DRAFT_KEYS):
            continue
        if r.get("acceptance") is not None and r.get("tau") is not None:
            groups[(r["method"].split(":")[0], r["ctx"])].append(r)
    out = []
    for (method, ctx), rs in sorted(groups.items()):
        alpha = sum(r["acceptance"] for r in rs) / len(rs)
        acc = sum(r["tau"] - 1 for r in rs) / len(rs)
        k = max(1, round(acc / alpha)) if alpha > 0 else 4
        out.append(Curve.constant(method, ctx, acc, k, data=data, rows=len(rs)))
    return out


@dataclass
class Acceptance:
    """Curves by method; `curve(method, ctx)` interpolates between measured contexts."""

    curves: list[Curve]
    model: str = "smollm2-135m"
    sources: list[str] = field(default_factory=list)

    def methods(self) -> list[str]:
        return sorted({c.method for c in self.curves})

    def curve(self, method: str, ctx: int, data: str | None = None, temperature: float = 0.0) -> Curve:
        """The curve of `method` at `ctx`: a measured one, else interpolated position by position in
        log(ctx) between the nearest measured contexts, else the nearest (flat past the ends). A
        per-round curve wins over an α-τ fit at the same context."""
        cs = [c for c in self.curves if c.method == method and c.temperature == temperature
              and (data is None or c.data == data)]
        if not cs:
            raise AcceptanceError(f"no acceptance data for method {method} (model {self.model}); measure it: "
                                  f"`python evaluate.py method={method} ctx=... out_dir=DIR`, then "
                                  "`python -m sparsespec.plan.acceptance --runs DIR --out FILE` and pass acceptance=FILE")
        by_ctx: dict[int, Curve] = {}
        for c in sorted(cs, key=lambda c: (c.source != "rounds", -c.rows)):
            by_ctx.setdefault(c.ctx, c)
        if ctx in by_ctx:
            return by_ctx[ctx]
        lo = max((x for x in by_ctx if x < ctx), default=None)
        hi = min((x for x in by_ctx if x > ctx), default=None)
        if lo is None or hi is None:
            near = by_ctx[hi if lo is None else lo]
            return Curve(method, ctx, near.p, near.n, f"{near.source}, flat from {near.ctx}", near.data,
                         temperature, near.draft_share, near.rows)
        a, b = by_ctx[lo], by_ctx[hi]
        w = (math.log(ctx) - math.log(lo)) / (math.log(hi) - math.log(lo))
        k = min(a.max_k, b.max_k)
        p = [(1 - w) * a.p[i] + w * b.p[i] for i in range(k)]
        return Curve(method, ctx, p, [0] * k, f"interpolated {lo}-{hi}", a.data, temperature,
                     (1 - w) * a.draft_share + w * b.draft_share, 0)

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "sources": self.sources,
                           "curves": [asdict(c) for c in self.curves]}, indent=1)


def load_acceptance(path: str | Path | None = None) -> Acceptance:
    """Curves from a file written by this module (None: the committed ones of the embedded model)."""
    p = Path(path) if path is not None else COMMITTED
    if not p.is_file():
        raise AcceptanceError(f"acceptance={path}: no such file; make one with "
                              "`python -m sparsespec.plan.acceptance --runs OUT_DIR --out FILE`")
    try:
        d = json.loads(p.read_text())
        return Acceptance([Curve(**c) for c in d["curves"]], d.get("model", "?"), d.get("sources", []))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AcceptanceError(f"acceptance={path}: not an acceptance file ({e!r}); make one with "
                              "`python -m sparsespec.plan.acceptance --runs OUT_DIR --out FILE`") from None


def read_runs(dirs: list[Path]) -> list[dict]:
    """Every row of the evaluate.py runs under `dirs` (results*.jsonl, any depth)."""
    rows = []
    for d in dirs:
        files = [d] if d.is_file() else sorted(d.rglob("results*.jsonl"))
        for f in files:
            rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def build(runs: list[Path], bench: list[Path], model: str) -> Acceptance:
    curves = curves_from_rows(read_runs(runs))
    for b in bench:  # in order: a later file fills only the (method, context) pairs still missing
        fitted = curves_from_bench(json.loads(b.read_text()))
        have = {(c.method, c.ctx, c.data) for c in curves}
        curves += [c for c in fitted if (c.method, c.ctx, c.data) not in have]
    rel = lambda p: str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p)  # noqa: E731
    return Acceptance(curves, model, [rel(p) for p in runs + bench])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sparsespec.plan.acceptance", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, nargs="*", default=[], help="evaluate.py out_dirs (or results.jsonl files)")
    p.add_argument("--bench", type=Path, nargs="*", default=[], help="benchmark files with α, τ, k (decode.json)")
    p.add_argument("--committed", action="store_true",
                   help="the embedded model's committed runs and benchmarks: results/{tasks,demo,sampling,"
                        "verification_guided_4k}, results/decode.json and quantized_drafts.json")
    p.add_argument("--model", default="smollm2-135m", help="a label for the model the runs decoded")
    p.add_argument("--out", type=Path, default=None, help="where to write (default with --committed: "
                   "results/plan_acceptance.json)")
    args = p.parse_args(argv)
    runs, bench = list(args.runs), list(args.bench)
    if args.committed:
        runs += [ROOT / "results" / r for r in COMMITTED_RUNS]
        bench += [ROOT / "results" / b for b in COMMITTED_BENCH]
    missing = [str(x) for x in runs + bench if not x.exists()]
    if missing or not (runs or bench):
        print(f"error: --runs/--bench: {', '.join(missing) or 'nothing given'}: pass evaluate.py out_dirs "
              "(python evaluate.py method=... out_dir=DIR) or --committed", file=sys.stderr)
        return 2
    acc = build(runs, bench, args.model)
    if not acc.curves:
        print("error: --runs: no speculative rows with accepted_per_round in those runs", file=sys.stderr)
        return 2
    out = args.out or (COMMITTED if args.committed else None)
    if out is None:
        print(acc.to_json())
        return 0
    out.write_text(acc.to_json() + "\n")
    print(f"wrote {out}: {len(acc.curves)} curves ({', '.join(acc.methods())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
