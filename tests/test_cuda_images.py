"""The cuda12.1 entry's two images, built here from the committed locks (no registry, no GPU), and
their proof: every library resolves, the CUDA EP reaches the driver stub, the binaries hold exactly
the architectures built, torch's CUDA and cuDNN are the entry's. CI builds them before the tests
(`nox -s build -- cuda12.1`); here they are reused from the daemon's cache."""
from __future__ import annotations

import csv
import subprocess

import pytest

from lab import docker, matrix, proof

pytestmark = pytest.mark.docker

ENTRY = "cuda12.1"
INFER_CHECKS = {"no-torch", "plugin-needed", "verify-cpu", "ort-cuda-needed", "ort-cuda-session", "plugin-cuda-archs"}
TRAIN_CHECKS = {"torch-cuda", "extension-archs", "extension-loads", "plugin-cuda", "nvcc"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("proof") / "image_proofs.csv"  # the committed results/ stay as they are


@pytest.fixture(scope="module")
def proven(daemon, results):
    docker.build_images(ENTRY, log=lambda message: None)
    return proof.prove(ENTRY, results=results, log=lambda message: None)


def test_every_check_passes(proven):
    failed = [f"{r['kind']} {r['check']}: {r['detail']}" for r in proven if r["result"] != "pass"]
    assert not failed, "\n".join(failed)
    assert {r["check"] for r in proven if r["kind"] == "infer"} == INFER_CHECKS
    assert {r["check"] for r in proven if r["kind"] == "train"} == TRAIN_CHECKS


def test_the_checks_say_what_they_found(proven):
    by_check = {(r["kind"], r["check"]): r["detail"] for r in proven}
    entry = matrix.entry(ENTRY)
    assert f"torch.version.cuda {entry['cuda']}" in by_check[("train", "torch-cuda")]
    for soname in ("libcudart.so.12", "libcudnn.so.9", "libcublasLt.so.12"):
        assert soname in by_check[("infer", "ort-cuda-needed")], by_check[("infer", "ort-cuda-needed")]
    assert by_check[("infer", "ort-cuda-session")].startswith("reached the driver: CUDA failure")
    assert by_check[("infer", "plugin-cuda-archs")].startswith("compute_90, sm_80, sm_86, sm_89, sm_90")
    assert "release 12.4, V12.4.131" in by_check[("train", "nvcc")]


def test_proof_rows_are_recorded_with_the_image(proven, results):
    with open(results, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["entry"] == ENTRY]
    tags = docker.image_tags(matrix.entry(ENTRY))
    assert {r["image"] for r in rows} == set(tags.values())
    assert {r["image_id"] for r in rows} == {docker.image_id(t) for t in tags.values()}
    assert all(int(r["size_bytes"]) > 0 and r["git_sha"] for r in rows)


def test_a_library_missing_from_the_image_fails_the_proof(proven):
    """The NEEDED check can fail: the same image with cuDNN's directory taken from the loader's cache."""
    tag = docker.image_tags(matrix.entry(ENTRY))["infer"]
    broken = "myops-lab/test-broken-infer:cudnn-hidden"
    dockerfile = (f"FROM {tag}\nUSER root\n"
                  "RUN sed -i '/cudnn/d' /etc/ld.so.conf.d/myops-cuda-wheels.conf && ldconfig\n")
    subprocess.run(["docker", "build", "-t", broken, "-"], input=dockerfile.encode(), check=True, capture_output=True,
                   env=docker.daemon_env(None))
    try:
        check = proof._ldd(broken, proof.PROVIDER, preload=proof.PROVIDER_SHARED)
    finally:
        subprocess.run(["docker", "rmi", broken], capture_output=True, env=docker.daemon_env(None))
    assert not check.ok and "libcudnn.so.9 => not found" in check.detail, check.detail


def test_layers_1_and_2_pass_inside_train_on_the_cpu(proven):
    """torch 2.4.1's extension (CPU kernels), TorchScript exports and onnxruntime-gpu 1.21.1's CPU EP."""
    result = docker.run(docker.image_tags(matrix.entry(ENTRY))["train"], timeout=1800)
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out[-4000:] + result.stderr.decode(errors="replace")[-2000:]
    assert " passed" in out and " failed" not in out, out[-2000:]
