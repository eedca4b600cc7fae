"""The CUDA toolkit assembled from pinned Debian packages compiles both CUDA sources here, for
exactly the architectures asked (no GPU, no NVIDIA registry)."""
from __future__ import annotations

import subprocess

import pytest

from lab import debian, matrix, toolkit
from lab.cuda_archs import compare, compiled_archs, expected_archs
from opspec import OPS, codegen

REPO = toolkit.REPO


@pytest.fixture(scope="module")
def cuda12_toolkit():
    """Debian trixie's nvcc 12.4 with its headers: what cuda12.1, 12.4 and 12.8 build with here."""
    try:
        with debian.Apt("trixie"):  # apt-get, dpkg-deb and a configured Debian mirror
            pass
    except debian.DebianError as exc:
        pytest.skip(f"Debian's packages cannot be fetched on this host: {exc}")
    return toolkit.assemble(matrix.entry("cuda12.1"), log=lambda m: None)


def test_the_committed_lock_pins_each_package(cuda12_toolkit):
    lock = toolkit.lock_path(matrix.entry("cuda12.1")).read_text().splitlines()
    assert lock[0] == "# cuda12.1 toolkit: debian trixie nvidia-cuda-toolkit=12.4.131~12.4.1-2"
    packages = [line.split()[1].split("=")[0] for line in lock if line.startswith("deb ")]
    assert packages[:3] == ["nvidia-cuda-toolkit", "nvidia-cuda-dev", "libcudart12"] and "libcu++-dev" in packages
    assert all(len(line.split("sha256:")[1]) == 64 for line in lock if line.startswith("deb "))


def test_entries_that_share_a_compiler_share_its_assembly(cuda12_toolkit):
    assert toolkit.home(matrix.entry("cuda12.8")) == cuda12_toolkit == toolkit.home(matrix.entry("cuda12.4"))
    assert toolkit.nvcc_version(cuda12_toolkit) == "12.4.131"
    for part in ("bin/nvcc", "bin/ptxas", "bin/cuobjdump", "nvvm/bin/cicc", "include/cuda_runtime.h",
                 "include/nv/target", "lib64/libcudart_static.a", "lib64/stubs/libcuda.so"):
        assert (cuda12_toolkit / part).exists(), part


def test_it_compiles_the_shared_kernels_for_the_asked_architectures(cuda12_toolkit, tmp_path):
    archs = ["8.0", "9.0+PTX"]
    obj = tmp_path / "swish_launch.o"
    source = tmp_path / "swish_launch.cu"  # Swish's CUDA launchers, as the builds write them from its math
    source.write_text(codegen.launchers(OPS["swish"]))
    gencode = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=[sm_90,compute_90]"]
    result = subprocess.run([str(cuda12_toolkit / "bin" / "nvcc"), "-c", "-O3", "-std=c++17", *gencode,
                             "-Xcompiler", "-fPIC", f"-I{REPO / 'kernels'}", str(source), "-o", str(obj)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    have = compiled_archs(obj, str(cuda12_toolkit / "bin" / "cuobjdump"))
    assert compare(have, expected_archs(" ".join(archs))) is None, have


def test_a_changed_package_is_refused(cuda12_toolkit, tmp_path, monkeypatch):
    entry = matrix.entry("cuda12.1")
    lock = tmp_path / "cuda12.1-toolkit.txt"
    text = toolkit.lock_path(entry).read_text()
    lock.write_text(text.replace(text.split("sha256:")[1][:64], "0" * 64, 1))
    monkeypatch.setattr(toolkit, "lock_path", lambda e: lock)
    monkeypatch.setattr(toolkit, "ROOT", tmp_path / "toolkits")
    monkeypatch.setattr(toolkit, "DOWNLOADS", tmp_path / "downloads")
    with pytest.raises(toolkit.ToolkitError, match="sha256 differs from"):
        toolkit.assemble(entry, log=lambda m: None)


def test_a_failed_relock_puts_the_old_lock_back(tmp_path, monkeypatch):
    # `nox -s lock` re-pins a toolkit; when its source cannot serve the pin, the committed lock stays.
    monkeypatch.setattr(toolkit.wheels, "LOCKS", tmp_path / "locks")
    monkeypatch.setattr(toolkit, "DOWNLOADS", tmp_path / "downloads")
    (tmp_path / "locks").mkdir()
    entry = dict(matrix.entry("cuda13.0"), id="relock-check")
    entry["toolkit"] = dict(entry["toolkit"], version="0.0.1")  # no such cuda-toolkit release
    lock = toolkit.lock_path(entry)
    lock.write_text("# the committed lock\n")
    with pytest.raises(toolkit.wheels.WheelError):
        toolkit.relock(entry, log=lambda m: None)
    assert lock.read_text() == "# the committed lock\n" and sorted(p.name for p in lock.parent.iterdir()) == [lock.name]
