"""Every results table and plot in README.md and docs/ is rebuilt from committed files in results/,
and rebuilding reproduces the committed markdown exactly (`make docs` leaves git status clean); a
section's renderer is found by its name (sparsespec.experiments.common.rebuild)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from sparsespec.experiments.common import rebuild as docs

ROOT = Path(__file__).resolve().parents[1]


def test_committed_docs_are_what_their_results_files_give():
    """The numbers in README.md and docs/ are the committed results, rendered: no table was edited
    by hand, none lacks its file, every plot exists."""
    assert docs.main(["--check"]) == 0
    found = docs.sections(ROOT)
    readme = found["README.md"]
    assert any(s.startswith("plot.") for s in readme) and any(not s.startswith("plot.") for s in readme)
    assert sum(len(v) for v in found.values()) >= 10
    for specs in found.values():
        for spec in specs:  # every section cites files inside results/
            assert all(p.startswith("results/") for p in shlex.split(spec)[1:] if "=" not in p), spec
    for doc in docs.docs_files(ROOT):  # and says where its numbers came from, under its table
        for m in docs.MARKER.finditer(doc.read_text(encoding="utf-8")):
            assert "<sub>Provenance" in m["body"], f"{doc.name}: {m['spec']}"


def _report(tok_s: float) -> dict:
    row = {"ctx": 4096, "sample": "pg19/a", "method": "ar", "tok_s": tok_s, "tok_s_std": 0.0, "vs_hf": None,
           "vs_ar": 1.0, "floor_tok_s": 40.0, "acceptance": None, "tau": None, "gamma": None, "k_mean": None,
           "identical_ar": True, "identical_hf": None, "prefill_s": 1.0, "hf_prefill_s": None, "peak_rss_gb": 1.0}
    spec = {**row, "method": "magicdec", "tok_s": 2 * tok_s, "vs_ar": 2.0, "acceptance": 0.8, "tau": 4.0,
            "gamma": 0.3, "k_mean": 4.0, "draft_ms": 10.0, "verify_ms": 5.0, "index_ms": 0.0, "other_ms": 0.1}
    return {"command": "python -m sparsespec.experiments bench --ctx 4k", "args": {"repeats": 1}, "bandwidth_gbs": 30.0,
            "weight_bytes": 5e8, "rows": [row, spec]}


def test_sections_are_rebuilt_from_their_files_and_stale_ones_are_found(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "results" / "speed.json").write_text(json.dumps(_report(10.0)))
    run = tmp_path / "results" / "run"
    run.mkdir()
    rows = [{"sample_id": "s", "dataset": "ruler", "task": "niah_single", "ctx": 4096, "method": m, "new_tokens": 8,
             "wall_s": w, "prompt_tokens": 4096, "output_ids": [1] * 8, "tokens_per_s": 8 / w, "score": 1.0,
             "speedup": None if m == "ar" else 2.0, "exact_match_ar": True,
             "acceptance_rate": None if m == "ar" else 0.5, "mean_accepted_tokens": None if m == "ar" else 2.0}
            for m, w in (("ar", 1.0), ("magicdec", 0.5))]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "command.txt").write_text("python evaluate.py dataset=ruler\n")
    doc = tmp_path / "docs" / "b.md"
    doc.write_text("# B\n\nintro\n\n<!-- results: bench.pivot results/speed.json -->\nold\n<!-- /results -->\n\n"
                   "<!-- results: plot.bench results/speed.json img=docs/img/s.png -->\n<!-- /results -->\n\n"
                   "<!-- results: evaluate.tasks results/run -->\n<!-- /results -->\nend\n")
    (tmp_path / "README.md").write_text("# R\n")
    assert docs.main(["--check"], root=tmp_path) == 2  # the plot does not exist yet: an error, not a pass
    assert docs.main([], root=tmp_path) == 0
    text = doc.read_text()
    assert "intro" in text and text.endswith("<!-- /results -->\nend\n") and "old" not in text
    assert "| magicdec | 2.00× | yes |" in text and "| ar | 10.0 tok/s | yes |" in text
    assert "Made by `python -m sparsespec.experiments bench --ctx 4k`. Data: [`results/speed.json`](../results/speed.json)." in text
    assert "![s](img/s.png)" in text and (tmp_path / "docs" / "img" / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert "| niah_single | 4k | 1 | 1.00 | 8.00 | 2.00 (0.50, 2.00) | yes |" in text
    assert "Made by `python evaluate.py dataset=ruler`." in text
    assert text.count("<sub>Provenance unknown.</sub>") == 3  # none of these files recorded it
    png = (tmp_path / "docs" / "img" / "s.png").read_bytes()
    assert docs.main(["--check"], root=tmp_path) == 0 and docs.main([], root=tmp_path) == 0
    assert (tmp_path / "docs" / "img" / "s.png").read_bytes() == png  # same numbers, same bytes
    # a number edited by hand, or a results file that changed, is stale
    doc.write_text(text.replace("10.0 tok/s", "11.0 tok/s"))
    assert docs.main(["--check"], root=tmp_path) == 1
    docs.main([], root=tmp_path)
    (tmp_path / "results" / "speed.json").write_text(json.dumps(_report(12.0)))
    assert docs.main(["--check"], root=tmp_path) == 1


def test_a_quoted_number_is_read_from_its_table_and_a_stale_one_fails(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "speed.json").write_text(json.dumps(_report(10.0)))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- table s = bench.speed results/speed.json -->\n"
                      "ar: <!-- n s: 4k,ar @ decode tok/s -->1<!-- /n --> tok/s, magicdec "
                      "<!-- n s: magicdec @ × our ar -->9<!-- /n -->× (<!-- n s: magicdec @ decode tok/s ÷ ar @ "
                      "decode tok/s | .1f -->0<!-- /n -->×), α <!-- n s: @ α | % -->?<!-- /n -->.\n")
    assert docs.main(["--check"], root=tmp_path) == 1
    assert docs.main([], root=tmp_path) == 0
    text = readme.read_text()
    assert ("ar: <!-- n s: 4k,ar @ decode tok/s -->10.00<!-- /n --> tok/s, magicdec <!-- n s: magicdec @ × our ar -->"
            "2.00<!-- /n -->×") in text and "ar @ decode tok/s | .1f -->2.0<!-- /n -->×)" in text
    assert "α <!-- n s: @ α | % -->80%<!-- /n -->." in text  # ar's row has no α: the one value
    assert docs.main(["--check"], root=tmp_path) == 0
    (tmp_path / "results" / "speed.json").write_text(json.dumps(_report(12.0)))  # the file changed: stale
    assert docs.main(["--check"], root=tmp_path) == 1
    readme.write_text(text.replace("@ decode tok/s -->", "@ tokens -->", 1))
    assert docs.main(["--check"], root=tmp_path) == 2
    assert "no table has a column 'tokens'" in capsys.readouterr().err


TABLE = """| ctx | method, kind | tok/s | cells |
|---|---|---|---|
| 4k | ar | 10.0 ± 0.5 | 0.95 vs 0.68 / 0.92 vs 0.48 |
| 4k | spec | 12.50 ± 0.25 | — |
| 16k | ar | 5.0 ± 0.1 | 0.10 vs 0.20 / 0.30 vs 0.40 |
| 16k | spec | 7.25 ± 1.00 | — |

The target copies: D=200 0.94, D=700 0.90.
"""


@pytest.mark.parametrize("query, value", [
    ("4k,ar @ tok/s", "10.0"), ("spec @ tok/s", "7.25–12.50"), ("!ar @ tok/s | max", "12.50"),
    ("16k+4k,spec @ tok/s[±] | min", "0.25"), ("4k,ar @ cells[3]", "0.48"), ("ar @ cells[*]", "0.10–0.95"),
    ("spec @ tok/s ÷ ar @ tok/s", "1.25–1.45"), ("4k,spec @ tok/s ÷ 4k,ar @ tok/s | %", "125%"),
    ("16k @ tok/s+cells[0] | .1f", "0.1–7.2"), ("4k @ tok/s | min .0f", "10"), ("text @ D=200+D=700", "0.90–0.94")])
def test_a_quoted_number_query_reads_rows_columns_and_ranges(query, value):
    quoted = docs.quoted
    assert quoted.evaluate(quoted.parse_tables(TABLE) + quoted.prose_tables(TABLE), query) == value


@pytest.mark.parametrize("query, message", [("4k,nope @ tok/s", "no row has every one of"),
                                            ("4k @ speed", "no table has a column"), ("4k tok/s", "expected 'ROW @")])
def test_a_query_that_reads_nothing_is_an_error(query, message):
    with pytest.raises(ValueError, match=message):
        docs.quoted.evaluate(docs.quoted.parse_tables(TABLE), query)


def test_editing_one_quoted_number_of_the_readme_fails_the_check(tmp_path):
    """The README's readings quote its results files; a number changed by hand no longer passes."""
    (tmp_path / "results").symlink_to(ROOT / "results")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "img").symlink_to(ROOT / "docs" / "img")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "-->1.48<!-- /n -->× at 16k" in text
    (tmp_path / "README.md").write_text(text, encoding="utf-8")
    assert docs.main(["--check"], root=tmp_path) == 0
    (tmp_path / "README.md").write_text(text.replace("-->1.48<!-- /n -->× at 16k", "-->1.5<!-- /n -->× at 16k"),
                                        encoding="utf-8")
    assert docs.main(["--check"], root=tmp_path) == 1


@pytest.mark.parametrize("spec, message", [("bench.nope results/speed.json", "unknown renderer"),
                                           ("nostudy results/speed.json", "unknown renderer"),
                                           ("plot.train results/speed.json img=docs/x.png", "unknown renderer"),
                                           ("bench.pivot results/missing.json", "names no existing results file")])
def test_a_bad_section_is_an_error_naming_it(tmp_path, capsys, spec, message):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "speed.json").write_text(json.dumps(_report(10.0)))
    (tmp_path / "README.md").write_text(f"<!-- results: {spec} -->\n<!-- /results -->\n")
    assert docs.main([], root=tmp_path) == 2
    assert message in capsys.readouterr().err


def test_figure1_training_table_gives_each_recipe_its_final_validation():
    from sparsespec.experiments.figure1 import training_table

    report = {"training": {"multi": [{"final": {"val/acc_B64": 0.30, "val/acc_full": 0.32, "val/loss": 1.0}},
                                     {"final": {"val/acc_B64": 0.32, "val/acc_full": 0.34}}],
                           "full": [{"final": {"val/acc_B64": 0.25, "val/acc_full": 0.33}}], "none": [{"steps": 0}]}}
    assert training_table(report).splitlines() == [
        "| recipe | seeds | `val/acc_B64` | `val/acc_full` |", "|---|---|---|---|",
        "| multi | 2 | 0.310 | 0.330 |", "| full | 1 | 0.250 | 0.330 |"]
