"""A named section of a markdown file that a script's rerun replaces (`--write FILE`)."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, body: str) -> None:
    """Replace (or append) the section between <!-- bench:name --> markers, atomically."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
