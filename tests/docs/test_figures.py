"""Figures from one source: what the docs build calls a measured figure, and the records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from docbuild import DOCS, REPO

sys.path.insert(0, str(DOCS / "_ext"))
import kvcore_figures as figures

sys.path.pop(0)


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("hits 63.1 % of prompt tokens", ["63.1 %"]),
        ("from 5.8 to 13.7%, or 5.8–13.7 %", ["5.8 to 13.7%", "5.8–13.7 %"]),
        ("2.3–3 times as fast", ["2.3–3 times"]),
        ("a ratio of 2.32× and 3.48x", ["2.32×", "3.48x"]),
        ("took 59.7 s, then 118 s; 24 µs and 928\nms", ["59.7 s", "118 s", "24 µs", "928\nms"]),
        ("15 to 25 minutes", ["15 to 25 minutes"]),
        ("46,329 per second, 50/s", ["46,329 per second", "50/s"]),
        ("172 bytes per block, 25 B/block", ["172 bytes per block", "25 B/block"]),
        ("the missing 23.5 points", ["23.5 points"]),
    ],
)
def test_measured_figures_are_flagged(text: str, flagged: list[str]):
    assert figures.figures_in(text) == flagged


@pytest.mark.parametrize(
    "text",
    [
        "80 GiB of memory, block 16, 2,000 requests, 12,031 lines",
        "vLLM 0.14 and kvcore 0.1.0.dev0, Python 3.11",
        "a 16 × 80 GiB fleet",  # a product of two config values, spaced
        "656 bytes per token",  # a page size, not a measurement of the pool
        "0x1f and 16x16",
    ],
)
def test_counts_sizes_versions_and_config_are_not(text: str):
    assert figures.figures_in(text) == []


def test_only_times_are_flagged_in_blocks_the_doc_tests_compare():
    text = "prefix hits 63.1 % ... manager 2.245 s in kvcore, 1.5x"
    assert figures.figures_in(text, times_only=True) == ["2.245 s"]


def test_keep_lines_marks_each_gap_once():
    text = "a 1\nb 2\nc 3\nd 4\na 5"
    assert figures.keep_lines(text, ["a", "d"]) == "a 1\n...\nd 4\na 5"


def test_every_record_has_its_provenance(tmp_path: Path):
    records = figures.load_records(REPO / "benchmarks" / "results")
    assert records, "no records in benchmarks/results"
    for name, record in records.items():
        for field in ("command", "date", "load", "commit"):
            assert record[field].strip(), (name, field)
        transcribed = (record.get("data") or {}).get("transcribed", False)
        expected = "kvcore " if transcribed else "python benchmarks/"
        assert record["command"].startswith(expected), name
        assert all(isinstance(v, str) for v in record["figures"].values()), name
    (tmp_path / "bad.json").write_text(json.dumps({"command": "x", "figures": {}}))
    with pytest.raises(figures.RecordError, match="needs 'date'"):
        figures.load_records(tmp_path)


def test_a_missing_figure_names_what_the_record_has():
    records = {"run": {"figures": {"a": "1 %", "b": "2 %"}}}
    with pytest.raises(figures.RecordError, match=r"no figure 'c' \(figures: a, b\)"):
        figures.lookup(records, "run", "figures", "c")
    with pytest.raises(figures.RecordError, match="no record 'other'"):
        figures.lookup(records, "other", "figures", "a")


def test_the_readme_states_no_measured_figure():
    # The README cannot render records: it points to the docs' pages instead.
    text = (REPO / "README.md").read_text()
    prose = "\n".join(part for index, part in enumerate(text.split("```")) if index % 2 == 0)
    assert figures.figures_in(prose) == []
