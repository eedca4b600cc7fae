"""Result files: upserts replace rows by key (empty cells included) and writes are atomic."""
from __future__ import annotations

import pytest

from lab.files import read_csv, upsert_csv, write_text_atomic

COLUMNS = ["entry", "row", "opset", "p50_ms"]
KEY = ["entry", "row", "opset"]


def test_upsert_replaces_rows_with_the_same_key_including_empty_cells(tmp_path):
    path = tmp_path / "bench.csv"
    upsert_csv(path, [{"entry": "cpu", "row": "torch_composite", "opset": None, "p50_ms": 1.0},
                      {"entry": "cpu", "row": "ort_custom", "opset": 18, "p50_ms": 0.9}], COLUMNS, KEY)
    upsert_csv(path, [{"entry": "cpu", "row": "torch_composite", "opset": None, "p50_ms": 2.0}], COLUMNS, KEY)
    rows = read_csv(path)
    assert sorted((r["row"], r["p50_ms"]) for r in rows) == [("ort_custom", "0.9"), ("torch_composite", "2.0")]


def test_interrupted_write_leaves_the_old_file_and_no_debris(tmp_path):
    path = tmp_path / "summary.md"
    write_text_atomic(path, "old\n")

    with pytest.raises(TypeError):
        write_text_atomic(path, 42)  # fails while writing
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.md"]
