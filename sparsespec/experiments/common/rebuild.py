"""Rebuilding the marked sections of README.md and docs/ from the committed files in results/, so
that every number in the docs is a saved result rendered, never a table edited by hand.

    python -m sparsespec.experiments docs            # rewrite the marked sections and the plots (make docs)
    python -m sparsespec.experiments docs --check    # change nothing; exit 1 listing the sections that differ

A marked section is everything between

    <!-- results: RENDERER PATH [PATH ...] [key=value ...] -->
    <!-- /results -->

RENDERER names a module of sparsespec.experiments and what of it renders the section: `NAME` its
`markdown`, `NAME.PART` its `PART_table`, `plot.NAME` its `plot` (which writes the PNG named by
`img=`); key=value options go to that function. PATH is a results file (a `.json` report) or an
evaluate.py run directory (every results file of the run, shards included, and its command.txt),
relative to the repository root; globs are expanded. A renderer takes one report: the .json
report, or {"rows": every row} of the run directories or files named. Each section ends with the
command that made its numbers, a link to them and where they came from (the "provenance" of a
report, an evaluate.py run's provenance.json: commit, machine, load; sparsespec.provenance).

A number quoted in prose is read from a table the same way, so it cannot go stale either:

    <!-- table speed = bench.speed results/decode.json -->           (once per file, on its own line)
    ... is <!-- n speed: 64k,ar @ × HF generate -->7.22<!-- /n -->× Hugging Face ...

(common.quoted: rows by their cells, a column by its header, ranges, one ÷, digits).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from sparsespec.config import parse_ctx
from sparsespec.eval.summary import load_results
from sparsespec.experiments import ExperimentError, names, study
from sparsespec.experiments.common import quoted
from sparsespec.experiments.common.commands import current_command
from sparsespec.provenance import provenance_text

PROVENANCE_FILE = "provenance.json"  # an evaluate.py run's provenance: one per process that wrote rows
MARKER = re.compile(r"^<!-- results: (?P<spec>.+?) -->\n(?P<body>.*?)^<!-- /results -->$", re.M | re.S)
DOCS = ("README.md", "docs/*.md")


class DocsError(ExperimentError):
    """A marked section that cannot be rendered (unknown renderer, missing file)."""


def load_source(path: Path, root: Path) -> dict:
    """A results file or run directory as {"label", "commands", and "report" or "rows"}."""
    label = str(path.relative_to(root))
    if path.is_dir():
        try:
            rows = load_results([path])
        except FileNotFoundError:
            raise DocsError(f"{label}: no results file (an evaluate.py out_dir is expected)") from None
        cmd = path / "command.txt"
        prov = path / PROVENANCE_FILE
        provs = json.loads(prov.read_text(encoding="utf-8")) if prov.is_file() else []
        return {"label": label, "rows": rows, "provenance": provs if isinstance(provs, list) else [provs],
                "commands": cmd.read_text(encoding="utf-8").splitlines() if cmd.is_file() else []}
    if path.suffix == ".json":
        report = json.loads(path.read_text(encoding="utf-8"))
        return {"label": label, "report": report, "rows": report.get("rows", []),
                "provenance": [report["provenance"]] if report.get("provenance") else [],
                "commands": [report["command"]] if report.get("command") else []}
    raise DocsError(f"{label}: not a .json report or an evaluate.py run directory")


def _sources(spec: str, doc: Path, root: Path) -> tuple[str, dict, list[dict]]:
    """(renderer name, options, loaded sources) of a section spec."""
    name, *args = shlex.split(spec)  # alt="..." may hold spaces
    options = dict(a.split("=", 1) for a in args if "=" in a)
    patterns = [a for a in args if "=" not in a]
    paths = [Path(p) for pat in patterns for p in sorted(glob.glob(str(root / pat)))]
    if not paths:
        raise DocsError(f"{doc.name}: section '{spec}' names no existing results file ({', '.join(patterns)})")
    return name, options, [load_source(p, root) for p in paths]


def renderer(name: str, doc: Path) -> tuple[Callable, bool]:
    """(the function a section's RENDERER names, whether it is a plot)."""
    is_plot = name.startswith("plot.")
    module_name, _, part = name.removeprefix("plot.").partition(".")
    attr = "plot" if is_plot else f"{part}_table" if part else "markdown"
    if module_name not in names() or (is_plot and part):
        raise DocsError(f"{doc.name}: unknown renderer {name!r}: NAME, NAME.PART or plot.NAME, NAME one of "
                        f"{', '.join(names())}")
    fn = getattr(study(module_name), attr, None)
    if fn is None:
        raise DocsError(f"{doc.name}: unknown renderer {name!r}: sparsespec.experiments.{module_name} has no {attr}")
    return fn, is_plot


def one_report(sources: list[dict]) -> dict:
    """What a renderer takes: the one .json report named, or the rows of every file or run named."""
    if len(sources) == 1 and "report" in sources[0]:
        return sources[0]["report"]
    return {"rows": [r for s in sources for r in s["rows"]]}


def render_table(spec: str, doc: Path, root: Path) -> str:
    """The markdown a (non-plot) section spec renders, without its footer: what quoted numbers read."""
    name, options, sources = _sources(spec, doc, root)
    fn, is_plot = renderer(name, doc)
    if is_plot:
        raise DocsError(f"{doc.name}: quoted numbers need a table renderer, not {name!r}")
    if "ctx" in options:
        options["ctx"] = parse_ctx(options["ctx"])
    return fn(one_report(sources), **options)


def render_section(spec: str, doc: Path, root: Path, write_plots: bool) -> str:
    """The generated body of one marked section of `doc`."""
    name, options, sources = _sources(spec, doc, root)
    fn, is_plot = renderer(name, doc)
    if is_plot:
        img = root / options.pop("img")
        if write_plots:
            fn(one_report(sources), img)
        elif not img.is_file():
            raise DocsError(f"{doc.name}: {img.relative_to(root)} is missing; run `make docs`")
        alt = options.pop("alt", img.stem.replace("_", " "))
        body = f"![{alt}]({_rel(img, doc)})"
    else:
        if "ctx" in options:
            options["ctx"] = parse_ctx(options["ctx"])
        body = fn(one_report(sources), **options)
    commands = list(dict.fromkeys(current_command(c) for s in sources for c in s["commands"]))
    files = ", ".join(f"[`{s['label']}`]({_rel(root / s['label'], doc)})" for s in sources)
    made = "; ".join(f"`{c}`" for c in commands) or "not recorded"
    footer = f"<sub>Made by {made}. Data: {files}.</sub>\n"
    if "Provenance" not in body:  # a renderer may print it itself
        footer += f"\n{provenance_footer(sources)}\n"
    return f"{body.rstrip()}\n\n{footer}"


def provenance_footer(sources: list[dict]) -> str:
    """The provenance line under a section: one phrase if every source shares it, else each phrase
    after the files it belongs to."""
    texts: dict[str, list[str]] = {}
    for s in sources:
        for prov in s.get("provenance") or [None]:
            labels = texts.setdefault(provenance_text(prov), [])
            if s["label"] not in labels:
                labels.append(s["label"])
    if len(texts) == 1:
        text = next(iter(texts))
        return "<sub>Provenance unknown.</sub>" if text == "provenance unknown" else f"<sub>Provenance: {text}.</sub>"
    return "<sub>Provenance: " + "; ".join(f"{', '.join(f'`{x}`' for x in labels)}: {text}"
                                           for text, labels in texts.items()) + ".</sub>"


def _rel(target: Path, doc: Path) -> str:
    return os.path.relpath(target, doc.parent)


def rebuild(doc: Path, root: Path, write_plots: bool) -> str:
    """`doc`'s text with every marked section generated anew."""
    text = doc.read_text(encoding="utf-8")

    def sub(m: re.Match) -> str:
        return f"<!-- results: {m['spec']} -->\n{render_section(m['spec'], doc, root, write_plots)}<!-- /results -->"

    text = MARKER.sub(sub, text)
    return quoted.fill(text, lambda spec: render_table(spec, doc, root), doc.name)


def docs_files(root: Path) -> list[Path]:
    """README.md and docs/*.md under `root`: the files that may hold marked sections."""
    return [Path(p) for pat in DOCS for p in sorted(glob.glob(str(root / pat)))]


def sections(root: Path) -> dict[str, list[str]]:
    """doc -> the specs of its marked sections."""
    return {str(d.relative_to(root)): [m["spec"] for m in MARKER.finditer(d.read_text(encoding="utf-8"))]
            for d in docs_files(root)}


def stale_docs(root: Path, write: bool) -> list[str]:
    """The docs whose marked sections differ from their rebuild; with `write`, rewritten (and their
    plots redrawn), else left untouched (plots are then only checked to exist)."""
    stale = []
    for doc in docs_files(root):
        new = rebuild(doc, root, write_plots=write)
        if new != doc.read_text(encoding="utf-8"):
            stale.append(str(doc.relative_to(root)))
            if write:
                doc.write_text(new, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None, root: Path | None = None) -> int:
    """`docs [--check]`: rewrite the stale sections and every plot, or (--check) list the stale ones."""
    ap = argparse.ArgumentParser(prog="python -m sparsespec.experiments docs",
                                 description="Rebuild every results table and plot in README.md and docs/ from the "
                                             "committed files in results/.")
    ap.add_argument("--check", action="store_true", help="write nothing; fail if a section is out of date")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[3] if root is None else root
    try:
        stale = stale_docs(root, write=not args.check)
    except (OSError, KeyError, ValueError) as e:  # a DocsError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check and stale:
        print("out of date (run `make docs`): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "every results section is up to date")
    return 0
