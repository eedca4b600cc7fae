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


def test_atomic_writes_get_the_mode_of_any_new_file(tmp_path):
    import os

    path = tmp_path / "lock.txt"
    write_text_atomic(path, "x\n")
    (tmp_path / "plain.txt").write_text("x\n")
    assert os.stat(path).st_mode == os.stat(tmp_path / "plain.txt").st_mode


def test_interrupted_write_leaves_the_old_file_and_no_debris(tmp_path):
    path = tmp_path / "summary.md"
    write_text_atomic(path, "old\n")

    with pytest.raises(TypeError):
        write_text_atomic(path, 42)  # fails while writing
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.md"]


def test_report_lays_out_torch_only_gpu_rows_per_dtype(tmp_path):
    """bench.gpu_check writes PyTorch rows without opsets: the report splits them by dtype instead."""
    from bench.report import main as report
    from bench.run import COLUMNS as BENCH_COLUMNS
    from lab.files import write_csv_atomic

    common = {"entry": "cuda13.0", "workload": "swish_large", "shape": "64x2048x768", "beta": "1.0",
              "execution_provider": "torch-cuda", "warmup": 10, "runs": 100, "memory_method": "max_memory_allocated",
              "torch": "2.14.1", "cuda": "13.0", "driver": "580", "device": "GPU", "git_sha": "0" * 40,
              "git_dirty": "False", "timestamp": "t"}
    timings = {"torch_copy": 1.0, "torch_composite": 3.0, "torch_extension": 1.1, "torch_composite_backward": 6.0,
               "torch_extension_backward": 1.5}
    rows = [{**common, "row": row, "dtype": dtype, "p20_ms": ms, "p50_ms": ms * scale, "p80_ms": ms, "peak_mb": 1.0,
             "gb_per_s": 100.0, "fraction_of_copy": 0.9}
            for dtype, scale in (("float32", 1.0), ("float16", 0.5)) for row, ms in timings.items()]
    write_csv_atomic(tmp_path / "cuda13.0" / "bench.csv", rows, BENCH_COLUMNS)
    assert report(["--results", str(tmp_path)]) == 0
    text = (tmp_path / "cuda13.0" / "summary.md").read_text()
    assert "## activation alone, large tensor, 64x2048x768, float32" in text and ", float16, beta" in text
    assert "| PyTorch custom C++ extension | 1.100 " in text and "| 0.37x |" in text  # vs the composite
    assert "| PyTorch custom C++ extension, backward | 1.500 " in text and "| 0.25x |" in text  # vs its autograd
    assert "CUDA events" in text
    assert (tmp_path / "cuda13.0" / "latency.png").stat().st_size > 0


def test_report_puts_the_infer_images_gpu_rows_beside_gpu_check_rows(tmp_path):
    """On a GPU host: gpu_check's torch rows (per dtype) plus the infer image's ORT rows (CUDA EP, one opset)."""
    from bench.report import main as report
    from infer.rows import COLUMNS
    from lab.files import write_csv_atomic

    common = {"entry": "cuda13.0", "workload": "swish", "shape": "8x512x768", "beta": "1.0", "warmup": 10, "runs": 100,
              "driver": "580", "device": "GPU", "git_sha": "0" * 40, "git_dirty": "False", "timestamp": "t",
              "p20_ms": 0.01, "p80_ms": 0.03, "gb_per_s": 1000.0}
    torch_rows = [{**common, "row": row, "dtype": dtype, "execution_provider": "torch-cuda", "p50_ms": ms,
                   "peak_mb": 12.0, "memory_method": "max_memory_allocated", "torch": "2.14.1", "cuda": "13.0"}
                  for dtype in ("float32", "float16") for row, ms in (("torch_composite", 0.06), ("torch_extension", 0.02),
                                                                        ("torch_copy", 0.02))]
    ort_rows = [{**common, "row": row, "ort_opt_level": level, "dtype": "float32", "opset": 25, "exporter": "dynamo",
                 "execution_provider": "CUDAExecutionProvider", "ort_graph_nodes": graph, "p50_ms": ms, "peak_mb": None,
                 "memory_method": "unavailable: no NVML", "onnxruntime": "1.21.0", "fraction_of_copy": 0.8}
                for row, level, graph, ms in (("ort_composite", "all", "com.microsoft::QuickGelu", 0.05),
                                              ("ort_custom", "all", "myops::Swish", 0.03), ("ort_copy", "all", "Identity", 0.025))]
    write_csv_atomic(tmp_path / "cuda13.0" / "bench.csv", ort_rows + torch_rows, COLUMNS)
    assert report(["--results", str(tmp_path)]) == 0
    text = (tmp_path / "cuda13.0" / "summary.md").read_text()
    float32, float16 = text.split(", float32, beta")[1].split(", float16, beta")
    assert "| ONNX Runtime, custom op | 0.030 " in float32 and "| n/a |" in float32 and "myops::Swish" in float32
    assert "ONNX Runtime" not in float16  # the ORT rows are float32 only
    assert "onnxruntime 1.21.0, opset 25, CUDA EP" in text and "unavailable: no NVML" in text
    assert (tmp_path / "cuda13.0" / "memory.png").stat().st_size > 0


def _isa_row(row, isa="", threads="2", stamp="2026-12-02T08:00:00+00:00", level="", opset=""):
    return dict(entry="cpu", workload="swish", row=row, dtype="float32", shape="8x512x768", beta="1.0", threads=threads,
                isa=isa, timestamp=stamp, ort_opt_level=level, opset=opset, exporter="dynamo" if opset else "",
                execution_provider="torch-cpu")


def test_cpu_paths_table_uses_the_newest_isa_run_and_its_peers():
    from bench.cpu_summary import _key, isa_lines

    old, new = "2026-12-01T08:00:00+00:00", "2026-12-02T08:00:00+00:00"
    rows = [_isa_row("torch_silu", threads="1", stamp=old), _isa_row("torch_silu", stamp=new),
            _isa_row("ort_composite", stamp=new, level="all", opset="25"),
            _isa_row("ort_composite", stamp=new, level="basic", opset="25")]
    capped = [_isa_row("torch_extension", "avx2", stamp=new), _isa_row("ort_custom", "avx2", stamp=new, level="all",
                                                                       opset="25"),
              _isa_row("torch_extension", "baseline", stamp=old)]  # a path left by an earlier --isa run
    ms = {"torch_silu": 1.0, "ort_composite": 2.0, "torch_extension": 4.0, "ort_custom": 8.0}
    groups = {_key(r): [[ms[r["row"]] * 1e-3] * 5] * 3 for r in rows + capped}
    groups[_key(rows[0])] = [[9e-3] * 5] * 3  # the 1-thread F.silu must not be the reference
    groups[_key(rows[3])] = [[9e-3] * 5] * 3  # nor the BASIC level
    text = "\n".join(isa_lines(capped, rows, groups))
    assert "| AVX2 + FMA | 4.000 [4.000-4.000] | 4.00x | 8.000 [8.000-8.000] | 4.00x |" in text, text
    assert "baseline" not in text and "same interleaved rounds" in text
    # The --isa run older than the rows beside it: the table says the ratios mix two runs.
    later = [dict(r, timestamp="2026-12-03T08:00:00+00:00") for r in rows]
    groups.update({_key(r): groups[_key(o)] for r, o in zip(later, rows)})
    assert "mix two runs" in "\n".join(isa_lines(capped[:2], later, groups))
    # Capped rows without an ORT row (no opset anywhere) still give a table.
    assert "| AVX2 + FMA | 4.000" in "\n".join(isa_lines(capped[:1], rows, groups))
