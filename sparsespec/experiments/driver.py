"""The one command line of the studies: `python -m sparsespec.experiments NAME [options]`.

The options studies share are declared once here (SHARED); a study names those it takes, with its
defaults, in its OPTIONS, and adds its own in `arguments`. The driver parses them, lets the study
check them before anything loads, opens the checkpoint a resumed run continues (--out, --resume),
measures, and saves the report with the arguments, the command that made it and its provenance;
then prints its markdown and draws its plot (--plot). `--render REPORT` does the last two for a
saved report without measuring anything.

Two commands are not studies: `docs` rebuilds every table and plot in README.md and docs/ from the
committed results files (`docs --check` changes nothing and fails where a section is stale), and
`report RUN... --out DIR` rebuilds evaluate.py's report from results files or run directories.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path
from types import ModuleType

from sparsespec import experiments
from sparsespec.experiments import ExperimentError

ENTRY = ["python", "-m", "sparsespec.experiments"]


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"at least 1, got {n}")
    return n


# the options several studies take: name -> argparse keywords (a study's OPTIONS gives the default)
SHARED: dict[str, dict] = {
    "ctx": dict(nargs="+", help="context lengths, comma-separated or several (4k,16k or 4096 16384)"),
    "model": dict(help="the target: a model directory, .gguf or hub id (default: the embedded SmolLM2-135M-Instruct)"),
    "data": dict(help="PG-19-schema file, directory or hub id (default: the books shipped with the package)"),
    "books": dict(type=_positive, help="held-out books (a window of each) per context"),
    "new_tokens": dict(type=_positive, help="tokens each run decodes"),
    "repeats": dict(type=_positive, help="timed runs of each setting"),
    "dtype": dict(choices=["float32", "bfloat16", "float16"], help="the target's dtype"),
}


def parser(name: str, module: ModuleType) -> argparse.ArgumentParser:
    """The study's command line: the shared options it takes, its own, and the driver's."""
    doc = (module.__doc__ or name).strip()
    p = argparse.ArgumentParser(prog=f"python -m sparsespec.experiments {name}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for key, default in getattr(module, "OPTIONS", {}).items():
        if key not in SHARED:
            raise ExperimentError(f"{name}.OPTIONS: {key!r} is not a shared option ({', '.join(SHARED)})")
        p.add_argument("--" + key.replace("_", "-"), default=default, **SHARED[key])
    if hasattr(module, "arguments"):
        module.arguments(p)
    p.add_argument("--threads", type=_positive, default=None, help="torch's intra-op threads (default: torch's)")
    p.add_argument("--out", default=None, help="save the report (JSON) here")
    p.add_argument("--markdown", default=None, metavar="FILE", help="also write the report's tables here")
    if hasattr(module, "RESUME"):
        p.add_argument("--resume", action="store_true",
                       help="reuse what a stopped run with the same settings finished (kept in OUT.partial.jsonl)")
    if hasattr(module, "plot"):
        p.add_argument("--plot", default=None, help="draw the report's plot here (PNG)")
    p.add_argument("--render", default=None, metavar="REPORT",
                   help="measure nothing: print a saved report's tables (and draw --plot)")
    return p


def contexts(values: list[str] | str) -> list[int]:
    """--ctx's values (each comma-separated, labels or tokens) as token counts."""
    from sparsespec.config import parse_ctx

    items = [v for value in ([values] if isinstance(values, str) else values) for v in str(value).split(",") if v]
    try:
        return [parse_ctx(v) for v in items]
    except ValueError as e:
        raise ExperimentError(f"--ctx: {e}") from None


def show(module: ModuleType, report: dict, args: argparse.Namespace) -> None:
    """The report's tables (and its provenance) on stdout and in --markdown, and its plot in --plot."""
    from sparsespec.provenance import provenance_line

    text = module.markdown(report)
    print(text.rstrip("\n") if "Provenance" in text else f"{text.rstrip()}\n\n{provenance_line(report)}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text, encoding="utf-8")
    if getattr(args, "plot", None):
        module.plot(report, Path(args.plot))


def run(name: str, argv: list[str]) -> dict:
    """Study `name` run with these options: its report (also saved to --out)."""
    module = experiments.study(name)
    args = parser(name, module).parse_args(argv)
    if args.render:
        if not hasattr(module, "markdown"):
            raise ExperimentError(f"{name} renders only the doc sections named {name}.PART; it has no markdown")
        if not Path(args.render).is_file():
            raise ExperimentError(f"--render: {args.render} is not a file (a report saved by --out)")
        report = json.loads(Path(args.render).read_text(encoding="utf-8"))
        show(module, report, args)
        return report
    if not hasattr(module, "measure"):
        raise ExperimentError(f"{name} renders reports that another program measures; it has nothing to run")
    if getattr(args, "ctx", None) is not None:
        args.ctx = contexts(args.ctx)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if hasattr(module, "check"):
        module.check(args)
    from sparsespec.experiments.common.checkpoint import Checkpoint
    from sparsespec.provenance import Provenance

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    prov = Provenance.begin()
    settings = {key: getattr(args, key) for key in getattr(module, "RESUME", ())}
    checkpoint = Checkpoint.open(args.out, settings, getattr(args, "resume", False))
    measured = module.measure(args, checkpoint)
    # the options as the study used them (its check may have parsed them); `_name`: the study's own state
    report = {"args": {k: v for k, v in vars(args).items() if k != "render" and not k.startswith("_")}, **measured,
              "command": shlex.join([*ENTRY, name, *argv])}
    report["provenance"] = checkpoint.provenance(prov)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    checkpoint.close()
    show(module, report, args)
    return report


def report_command(argv: list[str]) -> int:
    """`report RUN... --out DIR`: evaluate.py's summary and plots rebuilt from results files."""
    from sparsespec.eval.summary import build_report, to_markdown

    p = argparse.ArgumentParser(prog="python -m sparsespec.experiments report",
                                description="Rebuild evaluate.py's report (summary.json, summary.md and the plots) "
                                            "from one or more results files or run directories (a run directory: "
                                            "every results file of it, shards included; a row in two files counts once).")
    p.add_argument("results", nargs="+", help="results files or run directories (all their results*.jsonl)")
    p.add_argument("--out", required=True, help="directory for summary.json, summary.md and the plots")
    args = p.parse_args(argv)
    try:
        report = build_report(args.results, args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(to_markdown(report["summary"]))
    for path in report["plots"]:
        print(f"plot: {path}")
    print(f"summary: {Path(args.out) / 'summary.md'}")
    return 0


def usage() -> str:
    lines = ["usage: python -m sparsespec.experiments NAME [options]   (NAME --help: its options)", "",
             "  docs [--check]        rebuild every table and plot in README.md and docs/ from results/",
             "  report RUN... --out DIR   rebuild evaluate.py's report from results files", ""]
    for name in experiments.names():
        module = experiments.study(name)
        first = (module.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        kind = "" if hasattr(module, "measure") else " (renders only)"
        lines.append(f"  {name:<20} {first[:100]}{'…' if len(first) > 100 else ''}{kind}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "docs":
        from sparsespec.experiments.common import rebuild

        return rebuild.main(rest)
    if name == "report":
        return report_command(rest)
    try:
        report = run(name, rest)
    except ExperimentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1 if report.get("ok") is False else 0  # a study that checks something says whether it passed
