"""Figure-1 reproduction at CPU scale: draft acceptance vs context length and KV budget.

For each held-out PG-19 book (pg19_split's eval side, never trained on) and each ctx, a window of
ctx tokens is run through the target (float32, full attention) to get its greedy next tokens at
the last `--positions` positions. Each drafter then reads the same window through the inference
path (CausalLM.prefill with the StreamingView mask, chunked, then one forward over the scored
positions under view.mask) and we report, teacher-forced on the real text:

  acc   share of positions where the drafter's argmax equals the target's greedy token
  tau   mean accepted drafts per greedy round of k (runs of agreement, capped at k)

Drafters are given as LABEL=DIR (HF dirs, e.g. exports of budget=multi/single/full); the label
`untrained` builds the truncated N-layer drafter from the target (the naive sd_sparse starting
point). `--engine` also runs the real SpeculativeEngine (greedy, exact) at the first ctx for each
drafter and B, reporting acceptance_rate, mean accepted tokens and speedup over AR.

  .venv/bin/python scripts/budgetdraft_results.py untrained multi=outputs/train/multi_s0/drafter \
      full=outputs/train/full_s0/drafter --ctx 4096 8192 --budgets 256 512 1024 2048 --out results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsespec.data.pg19 import load_books, pg19_split  # noqa: E402
from sparsespec.kv.views import FullView, StreamingView  # noqa: E402
from sparsespec.models.loading import load_model  # noqa: E402
from sparsespec.models.runner import CausalLM  # noqa: E402
from sparsespec.training.drafters import truncated  # noqa: E402
from sparsespec.training.module import accepted_run  # noqa: E402


def held_out_windows(tokenizer, ctx: int, n_books: int, offset: float = 0.02) -> list[tuple[str, list[int]]]:
    rows = load_books(None)
    _, held = pg19_split([str(r["short_book_title"]) for r in rows])
    out = []
    for r in rows:
        if str(r["short_book_title"]) in held and len(out) < n_books:
            text = r["text"][int(len(r["text"]) * offset):]
            ids = tokenizer(text[: ctx * 6], add_special_tokens=False)["input_ids"][:ctx]
            if len(ids) == ctx:
                out.append((str(r["short_book_title"]), ids))
    return out


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


def engine_rows(target, drafters, ids, budgets, k, new_tokens):
    from sparsespec.decoding.controllers import FixedK
    from sparsespec.decoding.drafters import ModelDrafter
    from sparsespec.decoding.engine import SpeculativeEngine

    tlm = CausalLM(target)
    ar = SpeculativeEngine(tlm).generate(ids, new_tokens)
    rows = []
    for label, model in drafters.items():
        for b in budgets:
            view = FullView() if b is None else StreamingView(budget=b, k_sink=16)
            res = SpeculativeEngine(tlm, ModelDrafter(CausalLM(model), view), FixedK(k)).generate(ids, new_tokens)
            assert res.output_ids == ar.output_ids, "speculative output differs from AR"
            rows.append({"drafter": label, "budget": b or "full", "acceptance_rate": res.acceptance_rate,
                         "mean_accepted_tokens": res.mean_accepted_tokens, "speedup": ar.wall_s / res.wall_s})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafters", nargs="+", help="LABEL=DIR, or `untrained` (truncated target layers)")
    ap.add_argument("--model", default=None, help="target model.path (default: embedded SmolLM2)")
    ap.add_argument("--ctx", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--positions", type=int, default=256, help="scored positions at the end of each window")
    ap.add_argument("--books", type=int, default=2, help="held-out books per ctx")
    ap.add_argument("--k", type=int, default=4, help="draft length for tau")
    ap.add_argument("--n-layers", type=int, default=2, help="layers of the `untrained` drafter")
    ap.add_argument("--engine", action="store_true", help="also run the real engine at the first ctx")
    ap.add_argument("--engine-budgets", type=int, nargs="+", default=[1024])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the results JSON here")
    args = ap.parse_args(argv)

    results: dict = {"args": vars(args), "rows": [], "engine": []}
    for ctx in args.ctx:
        t0 = time.perf_counter()
        tgt = load_model(args.model, ctx=ctx)
        target, tok = tgt.model, tgt.tokenizer
        drafters = {}
        for spec in args.drafters:
            if spec == "untrained":
                drafters["untrained"] = truncated(target, args.n_layers).eval()
            else:
                label, path = spec.split("=", 1)
                drafters[label] = load_model(path, ctx=ctx).model
        windows = held_out_windows(tok, ctx, args.books)
        per: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for title, ids in windows:
            gold = target_greedy(target, ids, args.positions)
            for label, model in drafters.items():
                for b in [None, *args.budgets]:
                    view = FullView() if b is None else StreamingView(budget=b, k_sink=16)
                    agree = drafter_greedy(model, ids, args.positions, view) == gold
                    per.setdefault((label, str(b or "full")), []).append(
                        (agree.float().mean().item(), accepted_run(agree, args.k).item()))
            print(f"ctx {ctx}: {title} done ({time.perf_counter() - t0:.0f} s)", flush=True)
        for (label, b), vals in per.items():
            accs, taus = [v[0] for v in vals], [v[1] for v in vals]
            row = {"ctx": ctx, "drafter": label, "budget": b, "acc": statistics.mean(accs),
                   "acc_std": statistics.pstdev(accs), "tau": statistics.mean(taus), "n_windows": len(vals)}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
        if args.engine and ctx == args.ctx[0] and windows:
            results["engine"] = engine_rows(target, drafters, windows[0][1], args.engine_budgets, args.k,
                                            args.new_tokens)
    print(markdown(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


def markdown(results: dict) -> str:
    rows = results["rows"]
    cols = sorted({(r["ctx"], r["budget"]) for r in rows}, key=lambda c: (c[0], c[1] != "full", int(c[1]) if c[1] != "full" else 0))
    labels = list(dict.fromkeys(r["drafter"] for r in rows))
    head = "| drafter | " + " | ".join(f"{c // 1024}k B={b}" for c, b in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]
    for lab in labels:
        cell = {(r["ctx"], r["budget"]): r for r in rows if r["drafter"] == lab}
        lines.append(f"| {lab} | " + " | ".join(
            f"{cell[c]['acc']:.3f} / {cell[c]['tau']:.2f}" if c in cell else "" for c in cols) + " |")
    return "\n".join(lines) + "\n(cells: teacher-forced acceptance / tau@k)"


if __name__ == "__main__":
    raise SystemExit(main())
