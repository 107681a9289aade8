"""Which product reads a draft's weights fastest: every linear layer of the embedded SmolLM2 (the
fused q/k/v, o, fused gate/up and down of all 30 layers, then the lm_head) applied to one row, in
the order a decode step reads them, so each weight comes from memory cold. Each draft weight format
of models/quantized.py against the float32 product the target's own step takes (runner.linear).

    python -m sparsespec.experiments weight_formats --threads 2 --out results/weight_formats.json
    python -m sparsespec.experiments weight_formats --threads 2 --rows 5 --out results/weight_formats_5rows.json
    python -m sparsespec.experiments weight_formats --torchao      # also torchao's configs, where it imports
"""

from __future__ import annotations

import statistics

from sparsespec.experiments import Say

OPTIONS = {"repeats": 9}


def arguments(p) -> None:
    p.add_argument("--rows", type=int, default=1, help="rows a product takes: 1 for a draft step, k + 1 for "
                   "verification")
    p.add_argument("--torchao", action="store_true", help="also time torchao's weight-only int8 / int4 configs")


def measure(args, checkpoint) -> dict:
    """bench_weight_formats with the command line's settings."""
    return bench_weight_formats(args.repeats, print, rows=args.rows, torchao=args.torchao)


def bench_weight_formats(repeats: int, say: Say, rows: int = 1, torchao: bool = False) -> dict:
    """{model, threads, rows, repeats, formats}: per format the step's time, bytes and read rate;
    int8 and int4 both as the float32 target's draft holds them on the CPU (GGUF blocks in the
    project's kernel, float32 rows) and through torch's packed ops (bf16 rows), in turns.
    torchao: also time torchao's weight-only int8 / int4 configs where the package imports."""
    import torch

    from sparsespec.kernels.cpu_attention import median_ms
    from sparsespec.models import quantized
    from sparsespec.models.loading import load_model
    from sparsespec.models.quantized import WEIGHT_FORMATS, DraftLM, draft_model, format_problem, linear_bytes
    from sparsespec.models.runner import CausalLM

    target = CausalLM(load_model(None, "float32").model)
    hidden = target.config.hidden_size
    x = torch.randn(rows, hidden)
    mid = torch.randn(rows, target.layers[0].mlp.down_proj.in_features)

    def step(model: CausalLM):
        def run():
            for i in range(model.n_layers):
                model._linear("qkv", i, x)
                model._linear("o", i, x)
                model._linear("gate_up", i, x)
                model._linear("down", i, mid)
            model._logits(x)
        return run

    cases = []  # (format label, product, model, bytes)
    for fmt in WEIGHT_FORMATS:
        if format_problem(fmt, "cpu") is not None:
            say(f"{fmt}: {format_problem(fmt, 'cpu')}")
            continue
        model = draft_model(target, fmt, group=32)
        blocks = quantized.block_format(fmt, 32, "cpu", torch.float32, hidden)
        cases.append((fmt, _BLOCK_OPS[blocks] if blocks else _OPS[fmt], model, linear_bytes(target, fmt, fmt, 32)))
        if blocks:  # the same format through torch's packed op, bf16 rows
            block_format = quantized.block_format
            quantized.block_format = lambda *a: None
            try:
                torch_model = DraftLM(target, fmt, fmt, 32)
                cases.append((f"{fmt} (torch)", _OPS[fmt], torch_model, linear_bytes(target, fmt, fmt, 32)))
            finally:
                quantized.block_format = block_format
    times: dict[str, list[float]] = {label: [] for label, *_ in cases}
    for _ in range(repeats):  # in turns, so a change in the machine's load reaches every case alike
        for label, _op, model, _nbytes in cases:
            times[label].append(median_ms(step(model), 1))
    out = []
    for label, op, _model, nbytes in cases:
        ms = statistics.median(times[label])
        out.append({"format": label, "op": op, "ms": ms, "ms_range": [min(times[label]), max(times[label])],
                    "bytes": nbytes, "gbs": nbytes / ms / 1e6})
        say(f"{label:12s} {op:50s} {ms:6.1f} ms  {nbytes / 1e6:6.0f} MB  {nbytes / ms / 1e6:5.1f} GB/s")
    if torchao:
        out += _torchao_rows(target, x, mid, repeats, say)
    base = next(r["ms"] for r in out if r["format"] == "fp")
    for r in out:
        r["vs_fp"] = base / r["ms"]
    return {"model": "SmolLM2-135M-Instruct (embedded)", "threads": torch.get_num_threads(), "rows": rows,
            "repeats": repeats, "formats": out}


_BLOCK_OPS = {"q4_1": "Q4_1 blocks, project's kernel, float32 rows", "q8_0": "Q8_0 blocks, project's kernel, float32 rows"}
_OPS = {"fp": "runner.linear, float32 (the target's own)", "bf16": "F.linear, bfloat16",
        "int8": "aten._weight_int8pack_mm, bf16 activations",
        "int4": "aten._weight_int4pack_mm_for_cpu, group 32, bf16 activations"}


def _torchao_rows(target, x, mid, repeats: int, say: Say) -> list[dict]:
    """torchao's weight-only configs on copies of the same layers (nn.Linear modules)."""
    import torch
    from torch import nn

    from sparsespec.kernels.cpu_attention import median_ms

    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except Exception as e:  # not installed, or built for another torch
        say(f"torchao: does not import here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
        return []

    def linears() -> list[nn.Linear]:
        mods = []
        for i, layer in enumerate(target.layers):
            for w in (target._qkv[i][0], layer.self_attn.o_proj.weight, target._gate_up[i], layer.mlp.down_proj.weight):
                m = nn.Linear(w.shape[1], w.shape[0], bias=False)
                m.weight = nn.Parameter(w.detach().to(torch.bfloat16).clone(), requires_grad=False)
                mods.append(m)
        head = nn.Linear(target.lm_head.in_features, target.lm_head.out_features, bias=False)
        head.weight = nn.Parameter(target.lm_head.weight.detach().to(torch.bfloat16).clone(), requires_grad=False)
        return [*mods, head]

    rows = []
    for name, config in (("torchao int8", lambda: Int8WeightOnlyConfig()),
                         ("torchao int4", lambda: Int4WeightOnlyConfig(group_size=32, int4_packing_format="opaque"))):
        try:
            mods = nn.Sequential(*linears())
            quantize_(mods, config())
            xb, mb = x.to(torch.bfloat16), mid.to(torch.bfloat16)
            ins = [mb if m.in_features == mb.shape[1] and m.in_features != xb.shape[1] else xb for m in mods]
            with torch.inference_mode():
                ms = median_ms(lambda mods=mods, ins=ins: [m(a) for m, a in zip(mods, ins, strict=True)], repeats)
        except Exception as e:
            say(f"{name}: fails on the CPU ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            continue
        rows.append({"format": name, "op": "torchao.quantization.quantize_", "ms": ms, "bytes": None, "gbs": None})
        say(f"{name:12s} {ms:6.1f} ms")
    return rows


def markdown(report: dict) -> str:
    """The saved benchmark as markdown."""
    lines = [f"| format | product | ms per step ({report['rows']} row{'s' if report['rows'] > 1 else ''}) "
             "| range | MB read | GB/s | × float32 |", "|---|---|---|---|---|---|---|"]
    for r in report["formats"]:
        mb = f"{r['bytes'] / 1e6:.0f}" if r.get("bytes") else "—"
        gbs = f"{r['gbs']:.1f}" if r.get("gbs") else "—"
        spread = f"{r['ms_range'][0]:.1f}–{r['ms_range'][1]:.1f}" if r.get("ms_range") else "—"
        lines.append(f"| {r['format']} | {r['op']} | {r['ms']:.1f} | {spread} | {mb} | {gbs} | {r['vs_fp']:.2f}× |")
    return "\n".join(lines) + "\n"
