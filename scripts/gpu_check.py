"""The speed half of the GPU check: HF generate() (static cache) against our ar, magicdec and
sparsespec_l on the embedded SmolLM2 and a random Llama-3.1-8B-shaped model; writes speed.json and
speed.md into --out. scripts/gpu_check.sh runs the CUDA tests first, then this.

    python scripts/gpu_check.py [--cpu] [--out DIR] [--models LIST] [--new-tokens N] [--no-hydra] [--hf-compile]

Exit status 1 when a row failed or a float32 method's output differed from ar's.
"""

from __future__ import annotations

import argparse
import importlib.abc
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class _NoHydra(importlib.abc.MetaPathFinder):
    """Makes Hydra and OmegaConf unimportable, so --no-hydra runs exactly what a machine without
    them would (also where they are installed, as in the tests)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hydra", "omegaconf"):
            raise ImportError(f"{name} is blocked by --no-hydra")
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the tiny CPU plan (tiny random models, a few hundred "
                   "tokens of context) instead of the GPU plan")
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu_check", help="folder for speed.json/.md")
    p.add_argument("--no-hydra", action="store_true", help="build the methods from the parts' classes, as on a "
                   "machine without Hydra/OmegaConf")
    p.add_argument("--models", default=None, help="comma-separated rows to measure, of: embedded, llama8b_shape "
                   "(default: the plan's all)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens decoded per run (default: the plan's, "
                   "128 on a GPU, 16 on the CPU)")
    p.add_argument("--hf-compile", action="store_true", help="let generate() compile its static-cache decode "
                   "step (a compile per context length, untimed in the warm-up; minutes on an 8B model)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_hydra:
        sys.meta_path.insert(0, _NoHydra())
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        handlers=[logging.StreamHandler(), logging.FileHandler(args.out / "speed.log", mode="w")])
    import dataclasses

    import torch

    from sparsespec.reports import gpu_speed

    plan = gpu_speed.CPU_PLAN if args.cpu else gpu_speed.GPU_PLAN
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check.py: no CUDA device here; use --cpu for the CPU plan", file=sys.stderr)
        return 2
    if args.cpu:  # tiny models gain nothing from threads, and threads spinning on a busy machine slow them 10x
        torch.set_num_threads(1)
    try:
        plan = gpu_speed.select(plan, args.models, args.new_tokens)
    except ValueError as e:
        print(f"gpu_check.py: {e}", file=sys.stderr)
        return 2
    plan = dataclasses.replace(plan, hf_compile=args.hf_compile)
    use_hydra = not args.no_hydra and gpu_speed.hydra_available()
    say = logging.getLogger("gpu_check").info
    from sparsespec.provenance import Provenance

    prov = Provenance.begin()
    report = gpu_speed.measure(plan, use_hydra, say)
    report["provenance"] = prov.end()  # the commit, versions, CPU and GPU, load and wall time
    js, md = gpu_speed.write(report, args.out)
    print(md.read_text())
    say(f"wrote {js} and {md}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
