"""Numbers quoted in the prose of README.md and docs/, read from the tables their results files give,
so that a reading cannot go stale: `make docs` writes them, and `python -m sparsespec.experiments
docs --check` (which tests/test_docs.py runs) fails where one differs.

A doc names the tables it quotes once, each on a line of its own (the spec is a marked section's:
renderer, files, options):

    <!-- table speed = bench.speed results/decode.json -->

and marks each quoted number in place:

    our `ar` is <!-- n speed: 64k,ar @ × HF generate -->7.22<!-- /n -->× Hugging Face

The query `ROW @ COLUMN` reads one column of the rows whose cells include every comma-separated
value of ROW (exactly; `a+b` for either; `!a` for rows without it; `"a, b"` for a value with a
comma; an empty ROW for every row); COLUMN is a header (`a+b` for both; `name#2` for the second
column of that name), with `[i]` for the i-th
number of a cell that holds several ("0.96 ± 0.05 (0.81, 4.23)": [0] 0.96, [1] 0.81, [2] 4.23,
[*] all three) and `[±]` for the spread after its first. Several rows give a range "low–high" (one
value where they agree). `A ÷ B` divides
(row by row where both give several). A trailing `| .1f` sets the digits (default: the cells'
own, or 2 for a quotient), `| %` writes a percentage, `| max` (`| min`) keeps the largest
(smallest) value, and may be followed by one of those. `text @ D=200` reads the number after
"D=200" in the prose lines around the tables (a caption's "The target copies: D=200 0.94, ...").
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable

TABLE = re.compile(r"^<!-- table (?P<name>[\w.-]+) = (?P<spec>.+?) -->$", re.M)
NUMBER = re.compile(r"<!-- n (?P<name>[\w.-]+): (?P<query>.+?) -->(?P<text>.*?)<!-- /n -->", re.S)
_NUM = re.compile(r"(±\s*)?(-?\d+(?:\.\d+)?)")


class QuoteError(ValueError):
    """A quoted number whose query reads nothing (unknown table, row or column)."""


def parse_tables(markdown: str) -> list[list[list[str]]]:
    """Every markdown table in `markdown`: rows of cells, the header row first."""
    tables, current = [], []
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):  # not the |---| line
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def prose_tables(markdown: str) -> list[list[list[str]]]:
    """The `name=value number` pairs of each prose line ("The target copies: D=200 0.94, D=700 0.90")
    as a one-row table whose row is `text`: `text @ D=200` reads them."""
    out = []
    for line in markdown.splitlines():
        pairs = re.findall(r"(\S+=\S+) (-?\d+\.\d+)", line) if not line.startswith("|") else []
        if pairs:
            out.append([["text", *(k for k, _ in pairs)], ["text", *(v for _, v in pairs)]])
    return out


def _numbers(cell: str) -> tuple[list[str], list[str]]:
    """(values, spreads) of a cell, as printed: '0.96 ± 0.05 (0.81, 4.23)' -> (['0.96', '0.81', '4.23'], ['0.05'])."""
    values, spreads = [], []
    for m in _NUM.finditer(cell):
        (spreads if m[1] else values).append(m[2])
    return values, spreads


def _digits(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _has(cells: list[str], want: str) -> bool:
    """Whether a row's cells include `want` exactly (`a+b`: either; `!a`: not a)."""
    if want.startswith("!"):
        return not _has(cells, want[1:])
    return any(a in cells for a in want.split("+"))


def _column(header: list[str], name: str) -> int | None:
    """The index of column `name` ("GB/s#2": the second column of that name), or None."""
    m = re.fullmatch(r"(?P<name>.+)#(?P<n>\d+)", name)
    name, n = (m["name"], int(m["n"])) if m and name not in header else (name, 1)
    hits = [j for j, h in enumerate(header) if h == name]
    return hits[n - 1] if len(hits) >= n else None


def read_term(tables: list[list[list[str]]], term: str) -> list[tuple[float, int]]:
    """(value, printed digits) of every row a `ROW @ COLUMN[i]` term selects, in table order."""
    if "@" not in term:
        raise QuoteError(f"{term!r}: expected 'ROW @ COLUMN'")
    row, col = (s.strip() for s in term.split("@", 1))
    m = re.fullmatch(r"(?P<col>.+?)(?:\[(?P<i>±|\*|\d+)\])?", col)
    col, index = m["col"], m["i"] or "0"
    want = [v.strip() for v in next(csv.reader([row], skipinitialspace=True), []) if v.strip()]  # "a, b": one value
    out, seen_col = [], False
    for table in tables:
        header, *rows = table
        found = [j for c in ([col] if _column(header, col) is not None else col.split("+"))  # a+b: both
                 if (j := _column(header, c)) is not None]
        if not found:
            continue
        seen_col = True
        for cells, j in ((cells, j) for cells in rows for j in found):
            if all(_has(cells, w) for w in want) and j < len(cells):
                values, spreads = _numbers(cells[j])
                picked = (spreads[:1] if index == "±" else values if index == "*"
                          else values[int(index):int(index) + 1])
                out += [(float(v), _digits(v)) for v in picked]  # a '—' cell has none: the row is passed over
    if not seen_col:
        raise QuoteError(f"{term!r}: no table has a column {col!r}")
    if not out:
        raise QuoteError(f"{term!r}: no row has every one of {want} and a number there")
    return out


def evaluate(tables: list[list[list[str]]], query: str) -> str:
    """The text a quoted number's `query` gives against `tables`."""
    query, _, fmt = query.partition(" | ")
    parts = [p.strip() for p in query.split(" ÷ ")]
    if len(parts) > 2:
        raise QuoteError(f"{query!r}: one ÷ at most")
    values = read_term(tables, parts[0])
    digits = max(d for _, d in values)
    if len(parts) == 2:
        below = read_term(tables, parts[1])
        if len(below) == 1:
            below = below * len(values)
        if len(below) != len(values):
            raise QuoteError(f"{query!r}: {len(values)} values over {len(below)}")
        values = [(a / b, 2) for (a, _), (b, _) in zip(values, below, strict=True)]
        digits = 2
    fmt = fmt.strip()
    if fmt.split(" ")[0] in ("max", "min"):  # the largest (smallest) value alone
        pick, _, fmt = fmt.partition(" ")
        values = [(max if pick == "max" else min)(values)]
    percent = fmt == "%"
    if percent:
        values, digits = [(v * 100, 0) for v, _ in values], 0
    elif fmt:
        if not re.fullmatch(r"\.\d+f", fmt):
            raise QuoteError(f"{query!r}: format {fmt!r} is not '.Nf', '%', 'max' or 'min'")
        digits = int(fmt[1:-1])
    texts = [f"{v:.{digits}f}" for v, _ in values]
    lo = min(values)[0]
    hi = max(values)[0]
    lo_t, hi_t = f"{lo:.{digits}f}", f"{hi:.{digits}f}"
    text = lo_t if lo_t == hi_t or len(texts) == 1 else f"{lo_t}–{hi_t}"
    return text + ("%" if percent else "")


def fill(text: str, render: Callable[[str], str], doc: str) -> str:
    """`text` with every quoted number written from its table; `render(spec)` gives a table spec's
    markdown (a marked section's body)."""
    specs = {m["name"]: m["spec"] for m in TABLE.finditer(text)}
    cache: dict[str, list] = {}

    def sub(m: re.Match) -> str:
        name = m["name"]
        if name not in specs:
            raise QuoteError(f"{doc}: quoted number '{m['query']}' names table {name!r}, which no "
                             f"'<!-- table {name} = ... -->' line defines")
        if name not in cache:
            md = render(specs[name])
            cache[name] = parse_tables(md) + prose_tables(md)
        try:
            value = evaluate(cache[name], m["query"])
        except QuoteError as e:
            raise QuoteError(f"{doc}: table {name}: {e}") from None
        return f"<!-- n {name}: {m['query']} -->{value}<!-- /n -->"

    return NUMBER.sub(sub, text)
