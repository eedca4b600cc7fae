"""Alignment layer 3 with real daemons: two dockerd as two machines, plus the local virtualenv."""
from __future__ import annotations

import csv
import hashlib
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bench import cross_machine_diff as xdiff

pytestmark = pytest.mark.docker



def _rows(results: Path) -> list[dict]:
    with open(results / "cross_machine_diff.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_two_daemons_agree(artifacts, infer_on_second_daemon, tmp_path):
    log = []
    assert xdiff.run(["docker", infer_on_second_daemon], artifacts=artifacts, results=tmp_path, log=log.append) == 0, log
    rows = _rows(tmp_path)
    assert len(rows) == 6 and all(r["ok"] == "True" for r in rows), rows  # swish, ffn, rms_norm x 2 lowerings
    assert (tmp_path / "cross_machine_diff.md").read_text().count("| yes |") == 6


def test_default_pair_docker_vs_local(artifacts, cpu_images, plugin_path, tmp_path):
    log = []
    assert xdiff.run(["docker", "local"], artifacts=artifacts, results=tmp_path, log=log.append,
                     plugins={"local": str(plugin_path)}) == 0, log
    # Every record names the model and both plugins by sha256.
    manifest = json.loads((artifacts / "manifest.json").read_text())
    local_plugin = hashlib.sha256(Path(plugin_path).read_bytes()).hexdigest()
    for row in _rows(tmp_path):
        assert row["model_sha256"] == manifest["files"][row["model"]]
        assert row["target_plugin_sha256"] == local_plugin and len(row["reference_plugin_sha256"]) == 64


@pytest.fixture(scope="module")
def perturbed_plugin(tmp_path_factory):
    """A plugin built from a deliberately wrong kernel (beta scaled by 1.001): a planted difference."""
    from lab.ort_headers import resolve

    repo = Path(__file__).resolve().parent.parent
    work = tmp_path_factory.mktemp("perturbed")
    shutil.copytree(repo / "kernels", work / "kernels")
    shutil.copytree(repo / "ort_plugin", work / "ort_plugin", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "opspec", work / "opspec", ignore=shutil.ignore_patterns("__pycache__"))
    # In the plugin's CPU kernel of elementwise ops rather than in the math: every ISA path of kernels/swish.h
    # sees beta a little off (the Copy floor, with no attribute, is untouched).
    kernels = work / "ort_plugin" / "src" / "cpu" / "declared_ops.h"
    source = kernels.read_text()
    exact = "typename Decl::Forward{}(in, out, count, values);"
    assert source.count(exact) == 1, "the elementwise kind's call of an op's loops"
    kernels.write_text(source.replace(exact, "auto off = values; for (auto& v : off) v *= 1.001f; "
                                             "typename Decl::Forward{}(in, out, count, off);"))
    include = resolve(log=lambda m: None).include_dir
    subprocess.run(["cmake", "-S", str(work / "ort_plugin"), "-B", str(work / "build"), f"-DORT_INCLUDE_DIR={include}",
                    "-DMYOPS_CUDA=OFF"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(work / "build")], check=True, capture_output=True)
    return str(work / "build" / "libmyops_ort.so")


def test_planted_difference_is_caught_with_the_worst_element(artifacts, plugin_path, perturbed_plugin, tmp_path):
    log = []
    status = xdiff.run(["local", "local@cpu"], artifacts=artifacts, results=tmp_path, log=log.append,
                       plugins={"local": str(plugin_path), "local@cpu": perturbed_plugin})
    assert status == 1
    bad = [r for r in _rows(tmp_path) if r["ok"] == "False"]
    # Only the custom lowering runs the plugin; the decomposed graphs agree.
    assert sorted(r["model"] for r in bad) == ["ffn-custom-dynamo-opset18.onnx", "swish-custom-dynamo-opset18.onnx"], bad
    assert all(r["worst_index"] and float(r["max_abs"]) > 1e-5 for r in bad)
    lines = [line for line in log if line.startswith("FAIL")]
    assert len(lines) == 2 and all("worst element" in line and "local@cpu" in line for line in lines), lines


def test_corrupted_onnx_is_refused_by_its_hash(artifacts, cpu_images, tmp_path):
    damaged = tmp_path / "artifacts"
    shutil.copytree(artifacts, damaged)
    onnx_file = damaged / "swish-custom-dynamo-opset18.onnx"
    data = bytearray(onnx_file.read_bytes())
    data[len(data) // 2] ^= 0x40
    onnx_file.write_bytes(data)
    log = []
    assert xdiff.run(["docker", "local"], artifacts=damaged, results=tmp_path, log=log.append) == 1
    assert any("does not match the manifest" in line for line in log), log
    # The target checks for itself too: a damaged copy arriving there is refused there.
    with pytest.raises(xdiff.TargetFailed, match="does not match the manifest"):
        xdiff.run_target(xdiff.parse_target("docker"), damaged, tmp_path / "out")


def test_unreachable_target_fails_cleanly_and_quickly(artifacts, tmp_path):
    log = []
    started = time.monotonic()
    assert xdiff.run(["local", "tcp://127.0.0.1:1"], artifacts=artifacts, results=tmp_path, log=log.append, timeout=60) == 1
    assert time.monotonic() - started < 60
    assert any("tcp://127.0.0.1:1" in line and "no Docker daemon answers" in line for line in log), log


def test_silent_target_is_bounded_in_time(artifacts, tmp_path):
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        log = []
        started = time.monotonic()
        status = xdiff.run(["local", f"tcp://127.0.0.1:{port}"], artifacts=artifacts, results=tmp_path,
                           log=log.append, timeout=10)
        assert status == 1 and time.monotonic() - started < 45
        assert any(f"tcp://127.0.0.1:{port}" in line for line in log if line.startswith("FAIL")), log


def test_target_syntax_errors_are_named():
    with pytest.raises(ValueError, match="none of: local, docker"):
        xdiff.parse_target("gpu-box")
    target = xdiff.parse_target("ssh://me@gpu-box@cuda12.1")
    assert (target.kind, target.host, target.entry) == ("docker", "ssh://me@gpu-box", "cuda12.1")
    target = xdiff.parse_target("ssh://me@gpu-box")
    assert (target.kind, target.host, target.entry) == ("docker", "ssh://me@gpu-box", "cpu")
    assert xdiff.parse_target("local").kind == "local"
