"""Which product reads a draft's weights fastest: every linear layer of the embedded SmolLM2 (the
fused q/k/v, o, fused gate/up and down of all 30 layers, then the lm_head) applied to one row, in
the order a decode step reads them, so each weight comes from memory cold. Each draft weight format
of models/quantized.py against the float32 product the target's own step takes (runner.linear).
`weight_formats_table` renders a saved report (no torch needed)."""

from __future__ import annotations

from sparsespec.reports import Say


def bench_weight_formats(repeats: int, say: Say, rows: int = 1, torchao: bool = False) -> dict:
    """{model, threads, rows, repeats, formats}: per format the step's time, bytes and read rate.
    torchao: also time torchao's weight-only int8 / int4 configs where the package imports."""
    import torch

    from sparsespec.models.loading import load_model
    from sparsespec.models.quantized import WEIGHT_FORMATS, draft_model, format_problem, linear_bytes
    from sparsespec.models.runner import CausalLM
    from sparsespec.reports.kernels import median_ms

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

    out = []
    for fmt in WEIGHT_FORMATS:
        if format_problem(fmt, "cpu") is not None:
            say(f"{fmt}: {format_problem(fmt, 'cpu')}")
            continue
        model = draft_model(target, fmt, group=32)
        nbytes = linear_bytes(target, fmt, fmt, 32)
        ms = median_ms(step(model), repeats)
        out.append({"format": fmt, "op": _OPS[fmt], "ms": ms, "bytes": nbytes, "gbs": nbytes / ms / 1e6})
        say(f"{fmt:5s} {_OPS[fmt]:40s} {ms:6.1f} ms  {nbytes / 1e6:6.0f} MB  {nbytes / ms / 1e6:5.1f} GB/s")
    if torchao:
        out += _torchao_rows(target, x, mid, repeats, say)
    base = next(r["ms"] for r in out if r["format"] == "fp")
    for r in out:
        r["vs_fp"] = base / r["ms"]
    return {"model": "SmolLM2-135M-Instruct (embedded)", "threads": torch.get_num_threads(), "rows": rows,
            "repeats": repeats, "formats": out}


_OPS = {"fp": "runner.linear, float32 (the target's own)", "bf16": "F.linear, bfloat16",
        "int8": "aten._weight_int8pack_mm, bf16 activations",
        "int4": "aten._weight_int4pack_mm_for_cpu, group 32, bf16 activations"}


def _torchao_rows(target, x, mid, repeats: int, say: Say) -> list[dict]:
    """torchao's weight-only configs on copies of the same layers (nn.Linear modules)."""
    import torch
    from torch import nn

    from sparsespec.reports.kernels import median_ms

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


def weight_formats_table(report: dict) -> str:
    """The saved benchmark as markdown."""
    lines = ["| format | product | ms per step | MB read | GB/s | × float32 |", "|---|---|---|---|---|---|"]
    for r in report["formats"]:
        mb = f"{r['bytes'] / 1e6:.0f}" if r.get("bytes") else "—"
        gbs = f"{r['gbs']:.1f}" if r.get("gbs") else "—"
        lines.append(f"| {r['format']} | {r['op']} | {r['ms']:.1f} | {mb} | {gbs} | {r['vs_fp']:.2f}× |")
    return "\n".join(lines) + "\n"
