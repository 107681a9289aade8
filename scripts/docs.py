"""Rebuild every results table and plot in README.md and docs/ from the committed files in results/.

    python scripts/docs.py            # rewrite the marked sections and the plots (make docs)
    python scripts/docs.py --check    # change nothing; exit 1 listing the sections that differ

A section of a markdown file is marked, and everything between the two lines is generated:

    <!-- results: RENDERER PATH [PATH ...] [key=value ...] -->
    <!-- /results -->

PATH is a results file (`.json`, a scripts/bench.py or budgetdraft_results.py report) or an
evaluate.py run directory (its results.jsonl and command.txt), relative to the repository root;
globs are expanded. Each section ends with the command that made its numbers and a link to them.
RENDERERS lists the renderers; a `plot.*` renderer also writes the PNG named by `img=`.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from sparsespec.eval import tables  # noqa: E402
from sparsespec.eval.results import read_rows  # noqa: E402
from sparsespec.eval.summary import calibration_table, headline, summarize, to_markdown  # noqa: E402

MARKER = re.compile(r"^<!-- results: (?P<spec>.+?) -->\n(?P<body>.*?)^<!-- /results -->$", re.M | re.S)
DOCS = ("README.md", "docs/*.md")


class DocsError(ValueError):
    pass


def _one_report(fn: Callable) -> Callable:
    """A renderer of one .json report."""
    return lambda sources, **kw: fn(_one_json(sources), **kw)


def _rows(fn: Callable) -> Callable:
    """A renderer of the rows of every named file or run."""
    return lambda sources, **kw: fn([r for s in sources for r in s["rows"]], **kw)


def _one_json(sources: list[dict]) -> dict:
    if len(sources) != 1 or "report" not in sources[0]:
        raise DocsError("this renderer takes one .json report")
    return sources[0]["report"]


def _run_report(rows: list[dict]) -> str:
    """evaluate.py's own summary table and the sentences it prints under it."""
    return to_markdown(summarize(rows)).rstrip("\n") + "\n\n" + "\n\n".join(headline(rows))


def _budgetdraft(sources: list[dict]) -> str:
    import budgetdraft_results

    return budgetdraft_results.markdown(_one_json(sources))


def _soak(sources: list[dict]) -> str:
    import soak

    return soak.markdown(_one_json(sources))


RENDERERS: dict[str, Callable[..., str]] = {
    "bench": _one_report(tables.bench_markdown),
    "bench.speed": _one_report(tables.bench_speed),
    "bench.machine": _one_report(tables.bench_machine),
    "bench.split": _one_report(tables.bench_split),
    "bench.spread": _one_report(tables.bench_spread),
    "bench.quarters": _one_report(tables.bench_quarters),
    "bench.pivot": _one_report(tables.bench_pivot),
    "eval.report": _rows(_run_report),
    "eval.tasks": _rows(tables.task_table),
    "eval.calibration": _rows(lambda rows: calibration_table(rows).rstrip("\n")),
    "eval.sampling": _rows(tables.sampling_table),
    "budgetdraft": _budgetdraft,
    "soak": _soak,
    "train.metrics": _one_report(tables.train_metrics),
}
PLOTS: dict[str, Callable[[list[dict], Path], None]] = {
    "plot.bench": lambda sources, path: tables.bench_plot(_one_json(sources), path),
    "plot.fig1": lambda sources, path: __import__("budgetdraft_results").plot(_one_json(sources), path),
    "plot.soak": lambda sources, path: __import__("soak").plot(_one_json(sources)["runs"], path),
}


def load_source(path: Path, root: Path) -> dict:
    """A results file or run directory as {"label", "commands", and "report" or "rows"}."""
    label = str(path.relative_to(root))
    if path.is_dir():
        results = path / "results.jsonl"
        if not results.is_file():
            raise DocsError(f"{label}: no results.jsonl (an evaluate.py out_dir is expected)")
        cmd = path / "command.txt"
        return {"label": label, "rows": read_rows(results),
                "commands": cmd.read_text(encoding="utf-8").splitlines() if cmd.is_file() else []}
    if path.suffix == ".json":
        report = json.loads(path.read_text(encoding="utf-8"))
        return {"label": label, "report": report, "rows": report.get("rows", []),
                "commands": [report["command"]] if report.get("command") else []}
    raise DocsError(f"{label}: not a .json report or an evaluate.py run directory")


def render_section(spec: str, doc: Path, root: Path, write_plots: bool) -> str:
    """The generated body of one marked section of `doc`."""
    name, *args = shlex.split(spec)  # alt="..." may hold spaces
    options = dict(a.split("=", 1) for a in args if "=" in a)
    patterns = [a for a in args if "=" not in a]
    paths = [Path(p) for pat in patterns for p in sorted(glob.glob(str(root / pat)))]
    if not paths:
        raise DocsError(f"{doc.name}: section '{spec}' names no existing results file ({', '.join(patterns)})")
    sources = [load_source(p, root) for p in paths]
    if name in PLOTS:
        img = root / options.pop("img")
        if write_plots:
            PLOTS[name](sources, img)
        elif not img.is_file():
            raise DocsError(f"{doc.name}: {img.relative_to(root)} is missing; run `make docs`")
        alt = options.pop("alt", img.stem.replace("_", " "))
        body = f"![{alt}]({_rel(img, doc)})"
    elif name in RENDERERS:
        if "ctx" in options:
            from sparsespec.config import parse_ctx

            options["ctx"] = parse_ctx(options["ctx"])
        body = RENDERERS[name](sources, **options)
    else:
        raise DocsError(f"{doc.name}: unknown renderer {name!r}; known: {', '.join([*RENDERERS, *PLOTS])}")
    commands = list(dict.fromkeys(c for s in sources for c in s["commands"]))
    files = ", ".join(f"[`{s['label']}`]({_rel(root / s['label'], doc)})" for s in sources)
    made = "; ".join(f"`{c}`" for c in commands) or "not recorded"
    return f"{body.rstrip()}\n\n<sub>Made by {made}. Data: {files}.</sub>\n"


def _rel(target: Path, doc: Path) -> str:
    import os

    return os.path.relpath(target, doc.parent)


def rebuild(doc: Path, root: Path, write_plots: bool) -> str:
    """`doc`'s text with every marked section generated anew."""
    text = doc.read_text(encoding="utf-8")

    def sub(m: re.Match) -> str:
        return f"<!-- results: {m['spec']} -->\n{render_section(m['spec'], doc, root, write_plots)}<!-- /results -->"

    return MARKER.sub(sub, text)


def sections(root: Path = ROOT) -> dict[str, list[str]]:
    """doc -> the specs of its marked sections."""
    return {str(d.relative_to(root)): [m["spec"] for m in MARKER.finditer(d.read_text(encoding="utf-8"))]
            for d in docs_files(root)}


def docs_files(root: Path) -> list[Path]:
    return [Path(p) for pat in DOCS for p in sorted(glob.glob(str(root / pat)))]


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; fail if a section is out of date")
    args = ap.parse_args(argv)
    stale = []
    try:
        for doc in docs_files(root):
            new = rebuild(doc, root, write_plots=not args.check)
            if new != doc.read_text(encoding="utf-8"):
                stale.append(str(doc.relative_to(root)))
                if not args.check:
                    doc.write_text(new, encoding="utf-8")
    except (DocsError, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check and stale:
        print("out of date (run `make docs`): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "every results section is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
