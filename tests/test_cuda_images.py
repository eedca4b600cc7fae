"""The cuda12.1 entry's two images, built here from the committed locks (no registry, no GPU), and
their proof: every library resolves, the CUDA EP reaches the driver stub, the binaries hold exactly
the architectures built, torch's CUDA and cuDNN are the entry's. CI builds them before the tests
(`nox -s build -- cuda12.1`); here they are reused from the daemon's cache."""
from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest

from lab import docker, matrix, proof

pytestmark = pytest.mark.docker

ENTRY = "cuda12.1"
INFER_CHECKS = {"no-torch", "plugin-needed", "verify-cpu", "ort-cuda-needed", "ort-cuda-session", "plugin-cuda-archs"}
TRAIN_CHECKS = {"torch-cuda", "extension-archs", "extension-loads", "plugin-cuda", "nvcc"}


@pytest.fixture(scope="module", autouse=True)
def _images_removed_after_in_ci():
    """MYOPS_TESTS_FREE_DISK=1 (.ci/run): this module is the run's last reader of the entry's images
    (about 10 GB), so they go once it ends; a developer's stay."""
    yield
    if os.environ.get("MYOPS_TESTS_FREE_DISK") == "1":
        tags = [*docker.image_tags(matrix.entry(ENTRY)).values(), docker.plugin_wheel_tag(ENTRY)]
        subprocess.run(["docker", "rmi", *tags], capture_output=True, env=docker.daemon_env(None))


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
    """The NEEDED check can fail: the same image with cuDNN's directory taken from the loader's cache.
    Builds its own image: one layer on the infer image, the broken one the check must catch."""
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


BULLSEYE = {"tag": "myops-lab/bullseye-runtime:1", "recipe": "debootstrap-bullseye-runtime"}  # glibc 2.31
# What a manylinux wheel may link: glibc's libraries and the C++ runtime (the manylinux policies' list).
GLIBC_AND_CXX = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libstdc++.so.6",
                 "libgcc_s.so.1", "ld-linux-x86-64.so.2"}


@pytest.fixture(scope="module")
def cuda_wheels(proven, tmp_path_factory):
    """What `nox -s wheels -- cuda12.1` writes: the plugin wheel (the infer image's plugin stage) and the
    extension wheel (built in the train image), both from the images built above."""
    from lab import dist

    out = tmp_path_factory.mktemp("dist")
    records = dist.build_all(ENTRY, out, log=lambda message: None)
    return {kind: (out / record["wheel"], record) for kind, record in records.items()}


@pytest.fixture(scope="module")
def cuda_plugin_wheel(cuda_wheels):
    return cuda_wheels["ort"]


def test_the_cuda_plugin_wheel_is_the_infer_images_and_manylinux_2_28(cuda_plugin_wheel, tmp_path):
    import json
    import zipfile

    from lab import dist

    wheel, record = cuda_plugin_wheel
    assert wheel.name.startswith("myops_ort_cu12-0.1.0-py3-none-manylinux_"), wheel.name  # not installable as myops-ort
    assert dist.policy_glibc(record["policy"]) <= (2, 28), record["policy"]
    (needs,) = record["needs"].values()
    assert set(needs) <= GLIBC_AND_CXX and not any("cuda" in n for n in needs), needs  # cudart is linked statically
    with zipfile.ZipFile(wheel) as archive:
        library = archive.read("myops_ort/libmyops_ort.so")
        build = json.loads(archive.read("myops_ort/build.json"))
    entry = matrix.entry(ENTRY)
    assert build["cuda"] is True and build["cuda_major"] == 12 and build["distribution"] == "myops-ort-cu12"
    assert build["cuda_architectures"] == docker.cmake_cuda_architectures(matrix.build_archs(entry)[0])
    # the infer image runs the library pip installed from this very wheel
    tag = docker.image_tags(entry)["infer"]
    container = subprocess.run(["docker", "create", tag], capture_output=True, text=True, check=True).stdout.strip()
    try:
        subprocess.run(["docker", "cp", f"{container}:{docker.installed_plugin(entry)}", str(tmp_path / "image.so")],
                       check=True, capture_output=True)
    finally:
        subprocess.run(["docker", "rm", container], capture_output=True)
    assert (tmp_path / "image.so").read_bytes() == library


def _loads_on_bullseye(library: Path) -> subprocess.CompletedProcess:
    base = docker.ensure_base_image("runtime", BULLSEYE, log=lambda message: None)
    script = "import ctypes, platform; ctypes.CDLL('/lib-under-test/' + __import__('sys').argv[1]); " \
             "print('loaded with glibc', platform.libc_ver()[1])"
    return subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{library.parent}:/lib-under-test:ro",
                           base, "python3", "-c", script, library.name], capture_output=True, text=True, timeout=300,
                          env=docker.daemon_env(None))


def test_the_cuda_plugin_loads_with_a_glibc_older_than_2_34(cuda_plugin_wheel, tmp_path):
    """Debian bullseye (glibc 2.31) loads the CUDA plugin (every symbol resolved at once, as ctypes asks);
    the same kind of library linked here without the stand-ins of ort_plugin/glibc_baseline does not."""
    import zipfile

    wheel, _ = cuda_plugin_wheel
    (tmp_path / "libmyops_ort.so").write_bytes(zipfile.ZipFile(wheel).read("myops_ort/libmyops_ort.so"))
    loaded = _loads_on_bullseye(tmp_path / "libmyops_ort.so")
    assert loaded.returncode == 0 and "loaded with glibc 2.31" in loaded.stdout, loaded.stdout + loaded.stderr
    # the control: pthread_create bound on the entry's build base (bookworm, glibc 2.36), as cudart_static's
    # was before the stand-ins
    (tmp_path / "control.cc").write_text('#include <pthread.h>\nextern "C" int start(void *(*f)(void *)) '
                                         '{ pthread_t t; return pthread_create(&t, nullptr, f, nullptr); }\n')
    build_base = docker.ensure_base_image("build", matrix.entry(ENTRY)["base_images"]["build"], log=lambda m: None)
    subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{tmp_path}:/w", build_base, "g++", "-shared",
                    "-fPIC", "-o", "/w/libcontrol.so", "/w/control.cc", "-lpthread"], check=True, capture_output=True,
                   env=docker.daemon_env(None))
    refused = _loads_on_bullseye(tmp_path / "libcontrol.so")
    assert refused.returncode != 0 and "GLIBC_2.34' not found" in refused.stderr, refused.stdout + refused.stderr


EXTENSION_CHECK = r"""
import json, sys, torch, myops_torch
from importlib import metadata
assert "site-packages" in myops_torch.__file__, myops_torch.__file__
x, weight = torch.randn(4, 16, 64), torch.rand(64) + 0.5
torch.testing.assert_close(torch.ops.myops.swish(x), x * torch.sigmoid(x))
torch.testing.assert_close(myops_torch.rms_norm(x, weight, 1e-6),
                           x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)
assert torch.autograd.gradcheck(torch.ops.myops.swish, (torch.randn(3, 8, dtype=torch.float64, requires_grad=True),))
torch.library.opcheck(torch.ops.myops.swish.default, (x,))
try:
    myops_torch.check_torch(torch.__version__, None)  # the same release, a CPU build
    refused = None
except myops_torch.TorchMismatch as exc:
    refused = str(exc)
print(json.dumps({"build": myops_torch.BUILD, "torch": torch.__version__, "refused_cpu_torch": refused,
                  "library": myops_torch.load(),
                  "requires": [r for r in metadata.requires("myops-torch") if r.startswith("torch")]}))
"""


def test_the_cuda_extension_wheel_holds_the_entrys_architectures_and_leaves_torch_to_torch(cuda_wheels, tmp_path):
    import zipfile

    wheel, record = cuda_wheels["torch"]
    entry = matrix.entry(ENTRY)
    assert wheel.name.startswith("myops_torch-0.1.0+torch2.4.1.cu121-cp311-cp311-manylinux_"), wheel.name
    (needs,) = record["needs"].values()
    # torch's libraries and its NVIDIA wheels' CUDA runtime: left to them (auditwheel --exclude), not copied in
    assert {"libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libcudart.so.12", "libgomp.so.1"} <= set(needs), needs
    assert set(needs) - set(record["provided_at_run_time"]) <= GLIBC_AND_CXX, record
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.startswith("myops_torch/_myops") and n.endswith(".so")]
        (tmp_path / "_myops.so").write_bytes(archive.read(name))
    proof._toolkit_on_path(entry)  # the entry's own cuobjdump
    found = proof._archs(tmp_path / "_myops.so", matrix.build_archs(entry)[0])
    assert found.ok, found.detail


def test_the_cuda_extension_wheel_runs_in_a_clean_venv_with_the_entrys_torch(cuda_wheels):
    """A new venv (the train image's Python, a throwaway container, no network) holding only the entry's
    torch (2.4.1+cu121 with its NVIDIA wheels) and numpy from the entry's locked wheelhouse, then the wheel:
    the ops on the CPU against their formulas, gradcheck, opcheck; a CPU torch is refused. Builds its own
    venv: a clean one is what a user installs the wheel into."""
    import json

    from lab import wheels

    wheel, _ = cuda_wheels["torch"]
    entry = matrix.entry(ENTRY)
    train = docker.image_tags(entry)["train"]
    pins = " ".join(p for p in matrix.pip_pins(entry) if p.split("==")[0] in ("torch", "numpy"))
    script = (f"set -e; python -m venv /tmp/v; /tmp/v/bin/pip install -q --no-index --find-links /house {pins} "
              f"/wheels/{wheel.name}; cd /tmp; /tmp/v/bin/python -I -c \"$CHECK\"")
    done = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{wheel.parent}:/wheels:ro",
                           "-v", f"{wheels.wheelhouse_dir(entry)}:/house:ro", "-e", f"CHECK={EXTENSION_CHECK}",
                           "--entrypoint", "sh", train, "-c", script],
                          capture_output=True, text=True, timeout=1800, env=docker.daemon_env(None))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["build"]["torch_cuda"] == "12.1" and report["torch"] == "2.4.1+cu121", report
    assert report["build"]["torch_cuda_arch_list"] == " ".join(matrix.build_archs(matrix.entry(ENTRY))[0]), report
    assert report["requires"] == ["torch==2.4.1"], report
    assert report["library"].startswith("/tmp/v/lib/python3.11/site-packages/myops_torch/"), report
    assert "is a CPU build: install the torch build for CUDA 12.1" in report["refused_cpu_torch"], report
