"""matrix.yaml: the committed file is valid, and each kind of mistake is one error naming entry and field."""
from __future__ import annotations

import copy

import pytest
import yaml

from lab import matrix

REQUIRED_IDS = {"cpu", "cuda11.8", "cuda12.1", "cuda12.4", "cuda12.8", "cuda13.0"}


def test_committed_matrix_is_valid_and_complete():
    entries = matrix.load()["entries"]
    assert REQUIRED_IDS <= set(entries)
    assert entries["cpu"]["device"] == "cpu" and not entries["cpu"]["torch_cuda_arch_list"]
    for name, entry in entries.items():
        if entry["device"] == "cuda":
            assert "9.0" in " ".join(entry["torch_cuda_arch_list"]), name


def _write(tmp_path, mutate):
    data = yaml.safe_load(matrix.MATRIX.read_text())
    broken = copy.deepcopy(data)
    mutate(broken["entries"])
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(broken))
    return path


@pytest.mark.parametrize("mutate,expected", [
    (lambda e: e["cpu"].update(torch_version="2.13.0"), "entry 'cpu', field '(the entry itself)': Additional properties"),
    (lambda e: e["cuda12.1"].pop("onnxruntime"), "entry 'cuda12.1', field '(the entry itself)': 'onnxruntime' is a required"),
    (lambda e: e["cuda12.4"].update(opsets=[17, 99]), "entry 'cuda12.4', field 'opsets.1'"),
    (lambda e: e["cuda12.8"].update(torch_cuda_arch_list=["sm90"]), "entry 'cuda12.8', field 'torch_cuda_arch_list.0'"),
    (lambda e: e["cpu"]["onnxruntime"].update(package="onnxruntime-gpu"), "entry 'cpu', field 'onnxruntime.package'"),
    (lambda e: e["cuda11.8"]["ort_headers"].update(version="1.21.0"), "entry 'cuda11.8', field 'ort_headers.version'"),
    (lambda e: e["cuda11.8"]["onnxruntime"].update(version="1.12.0"), "opset 17 needs onnxruntime >= 1.13"),
])
def test_mistakes_name_the_entry_and_field(tmp_path, mutate, expected):
    with pytest.raises(matrix.MatrixError) as info:
        matrix.load(_write(tmp_path, mutate))
    assert expected in str(info.value), str(info.value)


def test_broken_yaml_and_unknown_entry(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text("entries: [unclosed\n")
    with pytest.raises(matrix.MatrixError, match="not valid YAML"):
        matrix.load(path)
    with pytest.raises(matrix.MatrixError, match="no entry 'cuda99' in matrix.yaml; entries: cpu, cuda11.8"):
        matrix.entry("cuda99")
