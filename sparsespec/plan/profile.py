"""A device profile: what the cost model's bytes and FLOPs take in time on one device.

    python -m sparsespec.plan.profile --from-results --out results/profiles/cpu.json   # from the committed microbenchmarks
    python -m sparsespec.plan.profile --measure --out my_cpu.json                      # run them here first
    python -m sparsespec.plan.profile --probe outputs/gpu_check/probe.json --out gpu.json  # the GPU check's probe
    python -m sparsespec.plan.profile --datasheet h100 --out h100.json                 # published figures
    python -m sparsespec.plan.profile --datasheet h100 --step-overhead-ms 0.1 --round-overhead-ms 0.05 \
        --out results/profiles/h100_datasheet.json                                      # the map's H100

A profile holds the read bandwidth, the dense compute rate per dtype, and, where they were measured,
tables of the rate (GB/s of bytes read) a weight product, an attention pass and the recall index's
refresh reach with a given number of query rows: a measured table says what the roofline cannot (a
2-core CPU's products of a few rows are already compute-bound). Between measured row counts the time
per byte is interpolated linearly; beyond the last, extended along the last two points. Without a
table an op takes max(bytes / bandwidth, FLOPs / compute). Host time: `step_overhead_ms` per
forward pass, `round_overhead_ms` per round, `lookup_ns_per_token` for prompt lookup's scan.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparsespec.plan.cost import Op, kv_bytes, weight_bytes
from sparsespec.plan.shapes import from_config

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "results" / "profiles"
PROBE = ROOT / "outputs" / "gpu_check" / "probe.json"
KINDS = ("linear", "attention", "index")

# Published figures (SXM parts): HBM bandwidth and dense tensor-core throughput without sparsity.
# What a kernel reaches is below both; a probe run replaces these.
DATASHEETS: dict[str, dict[str, Any]] = {
    "h100": dict(name="NVIDIA H100 SXM5 80GB", bandwidth_gbs=3350.0,
                 compute_tflops={"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
    "h200": dict(name="NVIDIA H200 SXM 141GB", bandwidth_gbs=4800.0,
                 compute_tflops={"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
    "a100": dict(name="NVIDIA A100 SXM4 80GB", bandwidth_gbs=2039.0,
                 compute_tflops={"bfloat16": 312.0, "float16": 312.0, "float32": 19.5}),
    "a40": dict(name="NVIDIA A40 48GB", bandwidth_gbs=696.0,
                compute_tflops={"bfloat16": 149.7, "float16": 149.7, "float32": 37.4}),
}


class ProfileError(ValueError):
    """A profile that cannot be read or lacks a figure; the message names `profile=` and the fix."""


@dataclass
class DeviceProfile:
    name: str
    source: str  # measured | probe | datasheet
    bandwidth_gbs: float  # a plain read of a large buffer
    device: str = "cuda"  # cpu | cuda: which draft weight layouts the engine uses there
    compute_tflops: dict[str, float] = field(default_factory=dict)  # dense products, by dtype
    linear: dict[int, float] = field(default_factory=dict)  # rows -> GB/s of weights read by a product
    attention: dict[int, float] = field(default_factory=dict)  # rows -> GB/s of one sequence's K/V
    index: dict[int, float] = field(default_factory=dict)  # rows -> GB/s of keys, recall refresh
    step_overhead_ms: float = 0.0
    round_overhead_ms: float = 0.0
    lookup_ns_per_token: dict[int, float] = field(default_factory=dict)  # context -> ns a token of the scan
    # weight format -> {rows: its product's rate per byte as a share of the float32 product's}: a
    # block-quantized product on a CPU is slower per byte than its bytes say (it dequantizes as it reads)
    format_share: dict[str, dict[int, float]] = field(default_factory=dict)
    # K/V format -> a draft's attention rate per byte over float32 K/V's (int8 views are dequantized as read)
    kv_share: dict[str, float] = field(default_factory=dict)
    notes: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind in (*KINDS, "lookup_ns_per_token"):
            setattr(self, kind, {int(r): float(v) for r, v in getattr(self, kind).items()})
        self.format_share = {f: {int(r): float(v) for r, v in t.items()} for f, t in self.format_share.items()}

    def share(self, fmt: str | None, rows: int) -> float:
        """A weight format's product rate per byte over float32's at `rows` (1 where not measured):
        linear in rows between the measured counts, flat past them."""
        table = self.format_share.get(fmt or "")
        return _interpolate(table, rows) if table else 1.0

    def compute(self, dtype: str = "float32") -> float | None:
        """FLOP/s of dense products in `dtype` (int formats compute in bfloat16), or None."""
        key = "bfloat16" if dtype in ("int8", "int4") else dtype
        tf = self.compute_tflops.get(key) or self.compute_tflops.get("float32")
        return tf * 1e12 if tf else None

    def op_seconds(self, op: Op, dtype: str = "float32") -> float:
        """Seconds `op` takes, all its runs (count) together."""
        if op.kind == "lookup":
            tokens = op.bytes / 8
            return op.count * tokens * _interpolate(self.lookup_ns_per_token, tokens, log=True) * 1e-9
        read = op.bytes / (self.bandwidth_gbs * 1e9)
        table = getattr(self, op.kind, None) if op.kind in KINDS else None
        if table:
            one = op.bytes * _per_byte(table, op.rows) / (
                self.share(op.fmt, op.rows) if op.kind == "linear" else
                self.kv_share.get(op.fmt or "", 1.0) if op.kind == "attention" else 1.0)
        else:
            peak = self.compute(dtype)
            one = max(read, op.flops / peak) if peak and op.flops else read
        return op.count * one

    def read_seconds(self, op: Op) -> float:
        """What `op` would take at the plain read bandwidth: the part of its time its bytes set."""
        return 0.0 if op.kind == "lookup" else op.count * op.bytes / (self.bandwidth_gbs * 1e9)

    def to_json(self) -> str:
        d = asdict(self)
        for kind in (*KINDS, "lookup_ns_per_token"):
            d[kind] = {str(r): round(v, 3) for r, v in sorted(d[kind].items())}
        d["format_share"] = {f: {str(r): round(v, 3) for r, v in sorted(t.items())} for f, t in d["format_share"].items()}
        return json.dumps(d, indent=1)


def _interpolate(table: dict[int, float], x: float, log: bool = False) -> float:
    """A value measured at some points, linear between them (in log(x) with `log`), flat past the
    ends (0: none)."""
    if not table:
        return 0.0
    pts = sorted(table.items())
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, v0), (x1, v1) in zip(pts, pts[1:], strict=False):
        if x <= x1:
            if log:
                return v0 + math.log(x / x0) / math.log(x1 / x0) * (v1 - v0)
            return v0 + (v1 - v0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def _per_byte(table: dict[int, float], rows: float) -> float:
    """Seconds per byte at `rows` from a table of GB/s by rows (see the module's docstring)."""
    # taken as measured, dips included: F.linear's 2-3 rows take a slower path than its 4-5
    pts = sorted((r, 1 / (g * 1e9)) for r, g in table.items())
    if rows <= pts[0][0] or len(pts) == 1:
        return pts[0][1]
    for (r0, s0), (r1, s1) in zip(pts, pts[1:], strict=False):
        if rows <= r1:
            return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
    (r0, s0), (r1, s1) = pts[-2], pts[-1]
    return s1 + max(0.0, (s1 - s0) / (r1 - r0)) * (rows - r1)


def _need(d: dict, key: str, where: str, fix: str) -> Any:
    if d.get(key) is None:
        raise ProfileError(f"profile={where}: no {key}; {fix}")
    return d[key]


def from_dict(d: dict[str, Any], where: str = "<dict>") -> DeviceProfile:
    """A profile from its JSON form; a probe.json is converted (`from_probe`)."""
    if "ceilings" in d and "contexts" in d:
        return from_probe(d, where)
    _need(d, "bandwidth_gbs", where, "add the read bandwidth in GB/s, or measure a profile with "
          "`python -m sparsespec.plan.profile --measure --out FILE`")
    if not d.get("compute_tflops") and not any(d.get(k) for k in KINDS):
        raise ProfileError(f"profile={where}: no compute_tflops and no measured tables ({', '.join(KINDS)}); add "
                           "compute_tflops ({\"bfloat16\": TFLOP/s}) or measure the tables with --measure")
    known = set(DeviceProfile.__dataclass_fields__)
    try:
        return DeviceProfile(**{k: v for k, v in d.items() if k in known})
    except (TypeError, ValueError) as e:
        raise ProfileError(f"profile={where}: {e}") from None


def datasheet(name: str, step_overhead_ms: float = 0.0, round_overhead_ms: float = 0.0) -> DeviceProfile:
    """Published figures; prompt lookup's host scan is priced as on this project's CPU (the shipped
    cpu profile), since no datasheet gives it. Host time per forward and per round is no datasheet
    figure: 0 unless given, and the notes say which was assumed."""
    d = DATASHEETS[name]
    cpu = PROFILES / "cpu.json"
    lookup = json.loads(cpu.read_text()).get("lookup_ns_per_token", {}) if cpu.is_file() else {}
    host = (f"per-step host overhead is not on a datasheet: {step_overhead_ms:g} ms a forward and "
            f"{round_overhead_ms:g} ms a round are assumed here (a graph-captured forward's launch and sampling, "
            "the engine's Python loop around it)" if step_overhead_ms or round_overhead_ms else
            "per-step host overhead is not on a datasheet (0 here)")
    return DeviceProfile(name=d["name"], source="datasheet", bandwidth_gbs=d["bandwidth_gbs"],
                         compute_tflops=dict(d["compute_tflops"]), lookup_ns_per_token=lookup,
                         step_overhead_ms=step_overhead_ms, round_overhead_ms=round_overhead_ms,
                         notes=f"published peak figures (HBM bandwidth, dense tensor-core rate); kernels reach less, "
                               f"and {host}: a probe run gives both. Prompt lookup's scan: this project's CPU's figures")


def load_profile(spec: str | Path | DeviceProfile) -> DeviceProfile:
    """A profile from a JSON file (a profile or the GPU check's probe.json), a file name under
    results/profiles/ without `.json`, or a GPU name (h100, h200, a100): its probe where the GPU
    check ran on that GPU, else its datasheet figures (source: datasheet)."""
    if isinstance(spec, DeviceProfile):
        return spec
    key = str(spec)
    if key.lower() in DATASHEETS:
        if PROBE.is_file():
            probe = json.loads(PROBE.read_text())
            if key.lower() in str(probe.get("gpu") or "").lower():
                return from_probe(probe, str(PROBE))
        return datasheet(key.lower())
    path = Path(key)
    if not path.is_file() and (PROFILES / f"{key}.json").is_file():
        path = PROFILES / f"{key}.json"
    if not path.is_file():
        shipped = {p.stem for p in PROFILES.glob("*.json")} if PROFILES.is_dir() else set()
        raise ProfileError(f"profile={spec}: no such file; pass a profile JSON, one of {', '.join(sorted(shipped | set(DATASHEETS)))}, "
                           "or make one with `python -m sparsespec.plan.profile --measure --out FILE`")
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"profile={spec}: not readable JSON ({e})") from None
    if not isinstance(d, dict):
        raise ProfileError(f"profile={spec}: holds no JSON object")
    return from_dict(d, str(spec))


# -- building profiles ---------------------------------------------------------------------------

def format_shares(reports: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """From the weight-format microbenchmark's reports (the weight_formats study, one per row count):
    the project's kernel's int8 / int4 block products' GB/s over the float32 product's."""
    out: dict[str, dict[int, float]] = {}
    for rep in reports:
        rates = {f["format"]: f["gbs"] for f in rep.get("formats", [])}
        if "fp" not in rates:
            continue
        for fmt in ("int8", "int4"):
            if fmt in rates:
                out.setdefault(fmt, {})[int(rep.get("rows", 1))] = rates[fmt] / rates["fp"]
    return out


def from_results(skinny: dict[str, Any], attention: dict[str, Any], linear_path: str = "ours",
                 attention_path: str = "native", round_overhead_ms: float = 0.0,
                 lookup_ns_per_token: dict[int, float] | None = None, name: str | None = None,
                 formats: list[dict[str, Any]] | None = None, kv_formats: dict[str, Any] | None = None
                 ) -> DeviceProfile:
    """A CPU profile from the microbenchmarks' reports (the skinny and attention_kernel studies of
    sparsespec.experiments): the weight products of `linear_path` ("ours": the project's few-rows kernel,
    "linear": F.linear) and the attention and index refresh of `attention_path` ("native", "avx2",
    "pytorch"), each as GB/s by rows (median over contexts)."""
    wb = skinny["weight_bytes"]
    rows = skinny["rows"]
    linear = {r["rows"]: wb / (r[f"{linear_path}_ms"] / 1e3) / 1e9 for r in rows}
    bandwidth = statistics.median(wb / (r["read_ms"] / 1e3) / 1e9 for r in rows)
    tables: dict[str, dict[int, list[float]]] = {"attention": {}, "index refresh": {}}
    for r in attention["rows"]:
        t = r["paths"][attention_path]["ms"] / 1e3
        tables[r["op"]].setdefault(r["rows"], []).append(r["bytes"] / t / 1e9)
    med = {op: {n: statistics.median(v) for n, v in t.items()} for op, t in tables.items()}
    prov = skinny.get("provenance", {})
    cpu = f"{prov.get('cpu', 'CPU')}, {prov.get('threads', '?')} threads"
    return DeviceProfile(
        name=name or f"{cpu} (products: {linear_path}, attention: {attention_path})", source="measured", device="cpu",
        bandwidth_gbs=bandwidth, linear=linear, attention=med["attention"], index=med["index refresh"],
        round_overhead_ms=round_overhead_ms, lookup_ns_per_token=lookup_ns_per_token or {},
        format_share=format_shares(formats or []),
        kv_share={"int8": statistics.median(r["int8_share"] for r in kv_formats["rows"])} if kv_formats else {},
        notes="tables from the committed microbenchmarks (their commands in provenance); the products' and "
              "attention's per-call host time is inside their timings, so step_overhead_ms is 0",
        provenance={"skinny": skinny.get("command"), "attention": attention.get("command"),
                    "weight_formats": [f.get("command") for f in formats or []],
                    "kv_formats": (kv_formats or {}).get("command"),
                    "skinny_date": prov.get("date"), "attention_date": attention.get("provenance", {}).get("date"),
                    "cpu": prov.get("cpu"), "threads": prov.get("threads")})


def from_probe(probe: dict[str, Any], where: str = "probe.json") -> DeviceProfile:
    """A profile from the GPU check's probe: the bf16 GEMV's read rate as the weights' bandwidth; the
    attention rate at 1, 5 and 21 rows and the index refresh's from how the ar step, the
    verification passes and the recall update grow between the probe's two contexts (Llama-3.1-8B's
    shape in bfloat16); the ar step's remainder as host overhead per step. Compute from the GPU's
    datasheet where it is one of DATASHEETS."""
    ceil = probe.get("ceilings") or {}
    gemv = (ceil.get("gemv_bf16") or {}).get("gb_s")
    if not gemv:
        raise ProfileError(f"profile={where}: the probe has no ceilings.gemv_bf16.gb_s (its ceilings step failed); "
                           "rerun python -m sparsespec.experiments device_probe")
    ctxs = [c for c in probe.get("contexts", []) if not c.get("failed")]
    if len(ctxs) < 2:
        raise ProfileError(f"profile={where}: the probe has fewer than two contexts that ran; rerun python -m sparsespec.experiments device_probe")
    shape = from_config(probe["shape"], "probe")
    dtype = probe.get("dtype", "bfloat16")
    a, b = ctxs[0], ctxs[-1]
    dkv = kv_bytes(shape, b["ctx"], dtype) - kv_bytes(shape, a["ctx"], dtype)

    def rate(key: str, share: float = 1.0) -> float | None:
        dt = (b[key]["device_ms"] - a[key]["device_ms"]) / 1e3
        return dkv * share / dt / 1e9 if dt > 0 else None

    attention = {n: rate(k) for n, k in ((1, "ar_step"), (5, "verify_5"), (21, "verify_21"))}
    index = {5: rate("recall_update", 0.5)}
    w = weight_bytes(shape, dtype)
    overhead = a["ar_step"]["wall_ms"] - 1e3 * (w / (gemv * 1e9) + kv_bytes(shape, a["ctx"], dtype) / (attention[1] * 1e9)) \
        if attention[1] else 0.0
    gpu = str(probe.get("gpu") or probe.get("device"))
    sheet = next((d for k, d in DATASHEETS.items() if k in gpu.lower()), None)
    return DeviceProfile(
        name=f"{gpu} (probe)", source="probe", bandwidth_gbs=float(gemv),
        compute_tflops=dict(sheet["compute_tflops"]) if sheet else {},
        attention={n: v for n, v in attention.items() if v}, index={n: v for n, v in index.items() if v},
        step_overhead_ms=max(0.0, overhead),
        notes="bandwidth, attention and index rates and host overhead from the probe; compute from the datasheet"
              if sheet else "from the probe; no datasheet compute for this GPU (products are priced at the bandwidth)",
        provenance={"probe": where, "torch": probe.get("torch")})


def measure_lookup_ns(ctx: int = 65536, repeats: int = 5) -> float:
    """ns per context token of one prompt lookup (PromptLookup.lookup over a random history: the
    token list turned into a tensor and scanned for the last bigram)."""
    import random
    import time

    from sparsespec.decoding.drafters import PromptLookup

    rng = random.Random(0)
    tokens = [rng.randrange(50000) for _ in range(ctx)]
    lk = PromptLookup(2)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        lk.lookup(tokens, 8)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / ctx * 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sparsespec.plan.profile", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-results", action="store_true",
                     help="from results/skinny_products.json and results/attention_kernel.json (no timing)")
    src.add_argument("--measure", action="store_true", help="run the microbenchmarks here (minutes), then build")
    src.add_argument("--probe", type=Path, help="a probe.json from python -m sparsespec.experiments device_probe")
    src.add_argument("--datasheet", choices=sorted(DATASHEETS))
    p.add_argument("--skinny", type=Path, default=ROOT / "results" / "skinny_products.json")
    p.add_argument("--attention", type=Path, default=ROOT / "results" / "attention_kernel.json")
    p.add_argument("--weight-formats", type=Path, nargs="*",
                   default=[ROOT / "results" / "weight_formats.json", ROOT / "results" / "weight_formats_5rows.json"],
                   help="the weight-format microbenchmark's reports (int8 / int4 block products' rates by rows)")
    p.add_argument("--kv-formats", type=Path, default=ROOT / "results" / "plan_kv_formats.json",
                   help="int8 K/V attention against float32's (python -m sparsespec.plan.kv_formats)")
    p.add_argument("--linear-path", default="ours", choices=("ours", "linear"),
                   help="weight products: the project's few-rows kernel (ours) or F.linear (linear)")
    p.add_argument("--attention-path", default="native", choices=("native", "avx2", "pytorch"))
    p.add_argument("--round-overhead-ms", type=float, default=0.0, help="host time a round adds (bookkeeping)")
    p.add_argument("--step-overhead-ms", type=float, default=0.0,
                   help="--datasheet: host time a forward adds (an assumption the profile's notes state)")
    p.add_argument("--lookup-ns", default=None,
                   help="prompt lookup's scan, ns per context token by context (CTX=NS,...; default: timed here "
                        "at each --ctx, about a second)")
    p.add_argument("--ctx", default="4k,16k,32k,64k", help="--measure: contexts of the attention benchmark")
    p.add_argument("--repeats", type=int, default=5, help="--measure: timed calls per point")
    p.add_argument("--name", default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        if args.datasheet:
            prof = datasheet(args.datasheet, args.step_overhead_ms, args.round_overhead_ms)
            prof.provenance = {"command": "python -m sparsespec.plan.profile " + " ".join(
                str(a) for a in (argv if argv is not None else sys.argv[1:]))}
        elif args.probe:
            if not args.probe.is_file():
                raise ProfileError(f"--probe {args.probe}: no such file; run python -m sparsespec.experiments device_probe --out DIR/probe.json first")
            prof = from_probe(json.loads(args.probe.read_text()), str(args.probe))
        else:
            if args.measure:
                from sparsespec.config import parse_ctx
                from sparsespec.experiments.attention_kernel import bench_attention
                from sparsespec.experiments.skinny import bench_skinny
                from sparsespec.provenance import Provenance

                prov = Provenance.begin()
                skinny = bench_skinny(args.repeats, print)
                skinny["provenance"] = prov.end()
                attention = bench_attention([parse_ctx(c) for c in args.ctx.split(",")], args.repeats, print)
                attention["provenance"] = prov.end()
            else:
                for f in (args.skinny, args.attention):
                    if not f.is_file():
                        raise ProfileError(f"{f}: no such file; run `python -m sparsespec.experiments skinny --out FILE` "
                                           "(and `attention_kernel --out FILE`) or use --measure")
                skinny, attention = json.loads(args.skinny.read_text()), json.loads(args.attention.read_text())
            from sparsespec.config import parse_ctx

            if args.lookup_ns is not None:
                lookup = {parse_ctx(c): float(v) for c, v in (kv.split("=") for kv in args.lookup_ns.split(","))}
            else:
                lookup = {parse_ctx(c): measure_lookup_ns(parse_ctx(c)) for c in args.ctx.split(",")}
            formats = [json.loads(f.read_text()) for f in args.weight_formats if f.is_file()]
            kv = json.loads(args.kv_formats.read_text()) if args.kv_formats and args.kv_formats.is_file() else None
            prof = from_results(skinny, attention, args.linear_path, args.attention_path, args.round_overhead_ms,
                                lookup, args.name, formats, kv)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.name:
        prof.name = args.name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(prof.to_json() + "\n")
    print(f"wrote {args.out}: {prof.name} ({prof.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
