"""Wheel resolution for an entry's images: its Python and platform, its own indexes, its locks."""
from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from lab import compat, matrix, toolkit, wheels

CUDA_ENTRIES = [name for name, e in matrix.load()["entries"].items() if e["device"] == "cuda"]


def test_manylinux_tags_follow_the_base_os_glibc():
    tags = wheels.target(matrix.entry("cuda12.1")).platforms  # Debian bookworm: glibc 2.36
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_37_x86_64" not in tags
    assert {"manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)


def test_arm64_resolves_for_aarch64_into_a_lock_and_folder_of_its_own():
    from lab import platforms

    entry, arm64 = matrix.entry("cpu"), platforms.get("arm64")
    args = wheels.target(entry, arm64).pip_args()
    tags = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert tags[0] == "manylinux_2_36_aarch64" and "manylinux2014_aarch64" in tags
    assert not any("x86_64" in t for t in tags)
    assert wheels.lock_path(entry, "infer", arm64).name == "cpu-infer-arm64.txt"
    assert wheels.lock_path(entry, "infer").name == "cpu-infer.txt"
    assert wheels.wheelhouse_dir(entry, arm64) != wheels.wheelhouse_dir(entry)
    # The committed arm64 lock was resolved for aarch64 and fits matrix.yaml.
    lock = wheels.lock_path(entry, "infer", arm64)
    assert "manylinux_2_36_aarch64" in lock.read_text().splitlines()[1]
    assert wheels.lock_staleness(entry, "infer", lock, arm64) is None
    assert wheels.lock_staleness(entry, "infer", lock) is not None  # not the amd64 one


def test_resolution_targets_the_entry_python_not_the_host():
    entry = dict(matrix.entry("cuda12.1"), python="3.13")
    args = wheels.target(entry).pip_args()
    assert args[args.index("--python-version") + 1] == "3.13" and args[args.index("--abi") + 1] == "cp313"
    assert "--only-binary=:all:" in args


def test_exact_command_for_the_unreachable_torch_index(tmp_path):
    """cuda11.8's torch lives on the cu118 index, which this machine cannot reach: the command that
    resolves it elsewhere is exactly this one (that index alone, the image's Python and glibc)."""
    entry = matrix.entry("cuda11.8")
    torch_req = wheels.requirements(entry, "train")[0]
    assert torch_req == wheels.Requirement("torch==2.3.1+cu118", "https://download.pytorch.org/whl/cu118")
    cmd = wheels.download_command([torch_req.spec], tmp_path, wheels.target(entry), index=torch_req.index)
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(36, 4, -1)] + [
        "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    assert cmd == [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(tmp_path),
                   "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                   "--abi", "cp311", "--abi", "abi3", "--abi", "none",
                   *[part for tag in platforms for part in ("--platform", tag)],
                   "--index-url", "https://download.pytorch.org/whl/cu118", "torch==2.3.1+cu118"]
    # a dedicated index is asked alone: no pip.conf extra index or find-links can offer PyPI's build
    env = wheels._pip_env(dedicated=True)
    assert env["PIP_CONFIG_FILE"] and "PIP_FIND_LINKS" not in env and "PIP_EXTRA_INDEX_URL" not in env


def test_unreachable_index_is_named_with_what_to_do(tmp_path, monkeypatch):
    entry = matrix.entry("cuda11.8")
    index = entry["torch"]["index"]
    if wheels.available_versions("torch", wheels.target(entry), index) is not None:
        pytest.skip(f"{index} answers on this machine: the unreachable case cannot be shown here")
    monkeypatch.setattr(wheels, "LOCKS", tmp_path)  # never overwrite a committed lock
    with pytest.raises(wheels.WheelError) as info:
        wheels.resolve(entry, "train", tmp_path / "house", log=lambda m: None)
    message = str(info.value)
    assert "entry 'cuda11.8', field 'torch.version': https://download.pytorch.org/whl/cu118 cannot be reached" in message
    assert "commit docker/locks/cuda11.8-*.txt" in message, message


def test_a_version_the_index_does_not_have_is_named(tmp_path, monkeypatch):
    """The pin the matrix used to have: onnxruntime-gpu 1.20.1 is not on PyPI (1.20.0 and 1.20.2 are)."""
    entry = matrix.entry("cuda12.4")
    entry["onnxruntime"] = dict(entry["onnxruntime"], version="1.20.1")
    if not wheels.available_versions("onnxruntime-gpu", wheels.target(entry)):
        pytest.skip("the configured package index does not answer here")
    monkeypatch.setattr(wheels, "LOCKS", tmp_path)
    with pytest.raises(wheels.WheelError) as info:
        wheels.resolve(entry, "infer", tmp_path / "house", log=lambda m: None)
    message = str(info.value)
    assert "entry 'cuda12.4', field 'onnxruntime.version': onnxruntime-gpu 1.20.1 does not exist for Python 3.11" in message
    assert "1.20.2" in message and "1.20.0" in message, message


def _fake_onnxruntime_wheel(tmp_path, cudart: str, cudnn: str):
    """A wheel whose CUDA provider is a real ELF linked against the given sonames."""
    for soname in (cudart, cudnn):
        (tmp_path / "x.c").write_text("int x(void) { return 0; }\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / soname), f"-Wl,-soname,{soname}",
                        str(tmp_path / "x.c")], check=True)
    (tmp_path / "p.c").write_text("int p(void) { return 1; }\n")
    provider = tmp_path / "libonnxruntime_providers_cuda.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(provider), str(tmp_path / "p.c"), "-Wl,--no-as-needed",
                    str(tmp_path / cudart), str(tmp_path / cudnn)], check=True)
    wheel = tmp_path / "onnxruntime_gpu-1.18.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(provider, "onnxruntime/capi/libonnxruntime_providers_cuda.so")
    return wheel


def test_the_resolved_onnxruntime_is_read_off_its_elf(tmp_path):
    wheel = _fake_onnxruntime_wheel(tmp_path, "libcudart.so.11.0", "libcudnn.so.8")
    assert {"libcudart.so.11.0", "libcudnn.so.8"} <= set(wheels.onnxruntime_cuda_needs(wheel))
    with pytest.raises(wheels.WheelError) as info:
        wheels.verify_onnxruntime_build(matrix.entry("cuda12.1"), [wheel], log=lambda m: None)
    message = str(info.value)
    assert "entry 'cuda12.1', field 'onnxruntime.version'" in message
    assert "(CUDA 11, cuDNN 8), not CUDA 12 with cuDNN 9" in message, message
    (tmp_path / "ok").mkdir()
    good = _fake_onnxruntime_wheel(tmp_path / "ok", "libcudart.so.12", "libcudnn.so.9")
    wheels.verify_onnxruntime_build(matrix.entry("cuda12.1"), [good], log=lambda m: None)


@pytest.mark.parametrize("name", CUDA_ENTRIES + ["cpu"])
def test_committed_locks_are_made_from_the_matrix(name):
    """Every entry has its locks, and each says it was made from what matrix.yaml asks today."""
    entry = matrix.entry(name)
    kinds = ["train", "infer"] if name != "cuda11.8" else ["infer"]  # cu118's torch index: not from here
    for kind in kinds:
        lock = wheels.lock_path(entry, kind)
        assert lock.exists(), f"{lock} missing: nox -s build -- {name}"
        made_from, pinned = wheels.read_lock(lock)
        assert made_from == wheels.describe(wheels.requirements(entry, kind)), lock
        assert pinned and all(len(p.sha256) == 64 for p in pinned)
    if entry["device"] == "cuda":
        lock = toolkit.lock_path(entry)
        assert lock.exists() and toolkit.pin_text(entry) in lock.read_text().splitlines()[0], lock


def test_a_stale_lock_is_refused_with_what_to_do(tmp_path, monkeypatch):
    entry = matrix.entry("cpu")
    lock = tmp_path / "cpu-train.txt"
    lock.write_text(wheels.lock_path(entry, "train").read_text().replace("numpy==2.4.6 ", "numpy==2.4.5 ", 1))
    monkeypatch.setattr(wheels, "LOCKS", tmp_path)
    with pytest.raises(wheels.WheelError, match="delete the lock so the entry is resolved again"):
        wheels.wheelhouse(entry, kinds=("train",), log=lambda m: None)


@pytest.mark.parametrize("name", [n for n in CUDA_ENTRIES if n != "cuda11.8"])
def test_infer_cuda_libraries_follow_the_train_lock(name):
    """One CUDA user space per entry: every NVIDIA wheel of the infer image, indirect ones included,
    is the train image's version."""
    entry = matrix.entry(name)
    _, train = wheels.read_lock(wheels.lock_path(entry, "train"))
    _, infer = wheels.read_lock(wheels.lock_path(entry, "infer"))
    train_versions = {p.name: p.version for p in train}
    nvidia = [p for p in infer if p.name.startswith("nvidia-")]
    assert {p.name for p in nvidia} >= set(wheels.CUDA_LIBRARIES[compat.release(entry["cuda"]).major])
    for p in nvidia:
        assert train_versions.get(p.name) == p.version, p
    runtime = next(p.version for p in nvidia if p.name.startswith("nvidia-cuda-runtime"))
    assert runtime.startswith(entry["cuda"] + "."), runtime


def _wheel(path, files: dict):
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_torch_and_onnxscript_must_agree_on_the_exporter_api(tmp_path):
    """torch 2.11's dynamo exporter imports onnxscript._framework_apis.torch_2_11; onnxscript 0.5.6
    has no such module (a ModuleNotFoundError at the first export). Read off the resolved wheels."""
    torch_wheel = _wheel(tmp_path / "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl", {
        "torch/onnx/_internal/_lazy_import.py": "import onnxscript._framework_apis.torch_2_11 as onnxscript_apis\n"})
    old = _wheel(tmp_path / "onnxscript-0.5.6-py3-none-any.whl", {"onnxscript/_framework_apis/torch_2_9.py": ""})
    entry = dict(matrix.entry("cuda13.0"), onnxscript="0.5.6")
    assert wheels.torch_onnxscript_api(torch_wheel) == "onnxscript._framework_apis.torch_2_11"
    with pytest.raises(wheels.WheelError) as info:
        wheels.verify_onnxscript_api(entry, [torch_wheel, old], log=lambda m: None)
    assert "entry 'cuda13.0', field 'onnxscript': torch 2.11.0's dynamo exporter imports " \
           "onnxscript._framework_apis.torch_2_11, which onnxscript 0.5.6 does not have" in str(info.value)
    (tmp_path / "new").mkdir()
    new = _wheel(tmp_path / "new" / "onnxscript-0.7.2-py3-none-any.whl",
                 {"onnxscript/_framework_apis/torch_2_11.py": ""})
    wheels.verify_onnxscript_api(entry, [torch_wheel, new], log=lambda m: None)
    wheels.verify_onnxscript_api(dict(entry, exporters=["torchscript"]), [torch_wheel, old], log=lambda m: None)
