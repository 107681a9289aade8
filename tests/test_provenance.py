"""Every results file records where it came from, and its tables say it, unknown fields by name."""

from __future__ import annotations

from sparsespec.provenance import FIELDS, Provenance, provenance_line


def test_a_measurement_records_its_code_machine_and_load():
    prov = Provenance.begin().end()
    assert set(FIELDS) <= set(prov)
    assert len(prov["commit"]) == 40 and isinstance(prov["dirty"], bool)  # the tests run in the checkout
    assert prov["cores"] >= 1 and prov["threads"] >= 1 and prov["wall_s"] >= 0 and prov["torch"]
    line = provenance_line({"provenance": prov})
    assert line.startswith("<sub>Provenance: commit " + prov["commit"][:7]) and prov["date"][:10] in line


def test_the_line_names_what_is_unknown_and_never_guesses():
    line = provenance_line({"provenance": {"commit": "0123456789abcdef", "dirty": True, "cpu": "AMD EPYC",
                                           "cores": 2, "threads": 2, "gpu": None, "load_before": 0.3,
                                           "load_after": 0.5, "date": "2026-12-07T10:00:00Z"}})
    assert line == "<sub>Provenance: commit 0123456 (dirty), AMD EPYC, 2 cores / 2 threads, load 0.3 → 0.5, 2026-12-07.</sub>"
    partial = provenance_line({"provenance": {"commit": "0123456789", "cpu": "unknown", "threads": 2,
                                              "note": "machine not recorded"}})
    assert "commit 0123456 (dirty: unknown)" in partial and "CPU unknown" in partial and "load unknown" in partial
    assert "cores unknown / 2 threads" in partial and "date unknown" in partial
    assert partial.endswith("machine not recorded.</sub>")
    late = provenance_line({"provenance": {"commit": "unknown", "committed_in": "fedcba9876", "committed_date": "2026-12-04",
                                           "engine": "PyTorch's attention"}})
    assert late == ("<sub>Provenance: commit unknown (file committed in fedcba9 on 2026-12-04), machine and load unknown, "
                    "date unknown, engine: PyTorch's attention.</sub>")
    assert provenance_line({"rows": []}) == "<sub>Provenance unknown.</sub>"


def test_the_commit_is_the_one_the_measurement_started_on(monkeypatch):
    from sparsespec import provenance

    monkeypatch.setattr(provenance, "code_version", lambda: ("a" * 40, False))
    prov = provenance.Provenance.begin()
    monkeypatch.setattr(provenance, "code_version", lambda: ("b" * 40, True))  # committed while it ran
    saved = prov.end()
    assert (saved["commit"], saved["dirty"]) == ("a" * 40, False)
