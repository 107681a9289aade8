"""The weight_formats study's table: every case's time, spread, bytes and ratio to float32."""
from sparsespec.experiments.weight_formats import markdown as weight_formats_table


def test_the_table_shows_each_case_with_its_spread_and_ratio():
    report = {"rows": 5, "formats": [
        {"format": "fp", "op": "runner.linear", "ms": 20.0, "ms_range": [19.5, 21.0], "bytes": 538e6, "gbs": 26.9,
         "vs_fp": 1.0},
        {"format": "int4 (torch)", "op": "aten op", "ms": 10.0, "ms_range": [9.0, 12.0], "bytes": 95e6, "gbs": 9.5,
         "vs_fp": 2.0}]}
    table = weight_formats_table(report).splitlines()
    assert "(5 rows)" in table[0] and "range" in table[0]
    assert table[3] == "| int4 (torch) | aten op | 10.0 | 9.0–12.0 | 95 | 9.5 | 2.00× |"
