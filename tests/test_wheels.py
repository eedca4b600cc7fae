"""Wheel resolution for an entry's images: its Python and platform, its own indexes, its locks."""
from __future__ import annotations

import os

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
    env = wheels.pip_env(dedicated=True)
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
    # cu118's torch index: not from here
    kinds = wheels.KINDS if name != "cuda11.8" else [k for k in wheels.KINDS if k != "train"]
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
    with pytest.raises(wheels.WheelError, match=r"re-resolve it with `nox -s lock -- cpu`"):
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


# ---------------------------------------------------------------- a user's machine: public indexes only

USER_MACHINE = {"PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None,
                "PIP_FIND_LINKS": None, "PIP_NO_INDEX": None, "PIP_CONSTRAINT": None}


def _as_on_a_users_machine(monkeypatch):
    """This machine's pip configuration (a local wheel folder, local indexes) out of the way."""
    for key, value in USER_MACHINE.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


def test_the_cpu_torch_is_asked_of_the_cpu_index_alone(tmp_path, monkeypatch):
    """The exact commands a fetch of the cpu train lock runs: torch from PyTorch's CPU index alone (no
    pip configuration can offer PyPI's CUDA build), its mirror fallback by hash only, the rest from pip's
    own configuration (on a user's machine: PyPI)."""
    _as_on_a_users_machine(monkeypatch)
    entry = matrix.entry("cpu")
    assert entry["torch"]["index"] == compat.TORCH_CPU_INDEX
    lock, pins = wheels.lock_path(entry, "train"), tmp_path / "pinned.txt"
    steps = wheels.fetch_steps(lock, tmp_path, entry, pins)
    assert [s.index for s in steps] == [None, compat.TORCH_CPU_INDEX]
    rest, torch_step = steps
    assert torch_step.names == ("torch==2.13.0+cpu",) and "torch==2.13.0+cpu" not in rest.names
    target = wheels.target(entry).pip_args()
    assert torch_step.command == [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(tmp_path), *target,
                                  "--index-url", compat.TORCH_CPU_INDEX, "--no-deps", "--require-hashes", "-r", str(pins)]
    assert torch_step.fallback == [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(tmp_path), *target,
                                   "--no-deps", "--require-hashes", "-r", str(pins)]
    assert rest.command == torch_step.fallback and rest.fallback is None
    # whatever a machine's environment adds, a dedicated index is asked alone
    for key in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.setenv(key, "/somewhere")
    dedicated = wheels.pip_env(dedicated=True)
    assert dedicated["PIP_CONFIG_FILE"] == "/dev/null" and not {"PIP_FIND_LINKS", "PIP_INDEX_URL",
                                                                "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"} & set(dedicated)


def _locks() -> list[tuple[str, str, object]]:
    from lab import platforms

    found = []
    for name in matrix.load()["entries"]:
        entry = matrix.entry(name)
        for plat in platforms.infer_platforms(entry):
            for kind in wheels.KINDS if plat == platforms.PRIMARY else ("infer",):
                if wheels.lock_path(entry, kind, plat).exists():
                    found.append((name, kind, plat))
    return found


def _public_hashes(specs: list[str], tgt: wheels.Target, index: str | None, tmp_path) -> dict[str, str] | None:
    """{name: sha256} of the files pip picks for these pins with no configuration at all (index: that
    index alone, else pip's default, PyPI), from the index's own listing (no wheel is downloaded).
    None when that index does not answer here."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
           "--disable-pip-version-check", "--target", str(tmp_path / "unused"), "--report", str(report),
           *tgt.pip_args(), *(["--index-url", index] if index else []), *specs]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        if wheels.unreachable(done.stderr):
            return None
        raise AssertionError(f"not on {index or 'PyPI'}: {done.stderr.strip()[-800:]}")
    items = json.loads(report.read_text())["install"]
    return {wheels.wheel_name_version(i["download_info"]["url"].rsplit("/", 1)[1])[0]:
            i["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256") for i in items}


@pytest.mark.parametrize("name,kind,plat", _locks(), ids=lambda v: getattr(v, "docker", v))
def test_every_locked_file_is_served_by_a_public_index(name, kind, plat, tmp_path, in_ci):
    """What only this machine's pip configuration serves (its local wheel folder held torch 2.13.0+cpu,
    which PyPI does not have) must never be in a lock: each pinned file, by its sha256, from the index
    its lock names with no pip configuration (a dedicated index alone; else PyPI)."""
    entry = matrix.entry(name)
    _, pinned = wheels.read_lock(wheels.lock_path(entry, kind, plat))
    tgt = wheels.target(entry, plat)
    unanswered = []
    for n, index in enumerate(sorted({p.index for p in pinned}, key=lambda i: i or "")):
        group = [p for p in pinned if p.index == index]
        (tmp_path / str(n)).mkdir()
        served = _public_hashes([f"{p.name}=={p.version}" for p in group], tgt, index, tmp_path / str(n))
        if served is None:
            if index is None and in_ci:
                pytest.fail("PyPI does not answer from CI")
            unanswered.append(index or "PyPI")
            continue
        wrong = [f"{p.name}=={p.version}" for p in group if served.get(p.name) != p.sha256]
        assert not wrong, f"{name} {kind}: {wrong} are not the files {index or 'PyPI'} serves (re-resolve: nox -s lock -- {name})"
    if unanswered:
        pytest.skip(f"{', '.join(unanswered)} cannot be reached from here: those files were not checked")


def test_the_cuda13_toolkit_wheels_are_served_by_pypi(tmp_path, in_ci):
    entry = matrix.entry("cuda13.0")
    _, pinned = wheels.read_lock(toolkit.lock_path(entry))
    served = _public_hashes([f"{p.name}=={p.version}" for p in pinned], wheels.target(entry), None, tmp_path)
    if served is None:
        if in_ci:
            pytest.fail("PyPI does not answer from CI")
        pytest.skip("PyPI cannot be reached from here")
    assert [p.name for p in pinned if served.get(p.name) != p.sha256] == []


def _torch_only_lock(tmp_path, digest: str | None = None):
    entry = matrix.entry("cpu")
    lines = wheels.lock_path(entry, "train").read_text().splitlines()
    torch_line = next(line for line in lines if line.startswith("torch=="))
    if digest:
        torch_line = torch_line.replace(torch_line.split("sha256:")[1][:64], digest)
    lock = tmp_path / "cpu-train.txt"
    lock.write_text("\n".join(lines[:3] + [torch_line]) + "\n")
    return entry, lock


def test_an_unreachable_index_is_stood_in_for_only_by_the_locked_hash(tmp_path):
    """The CPU index does not answer here; pip's configuration (a local wheel folder) serves a file of
    the same name, taken only because its sha256 is the lock's. Where the index answers (a user's
    machine), the file comes from it and the fallback never runs."""
    entry, lock = _torch_only_lock(tmp_path)
    said = []
    wheels.fetch(lock, tmp_path / "house", entry, log=said.append)
    (wheel,) = (tmp_path / "house").glob("torch-2.13.0+cpu-*.whl")
    assert wheels.sha256(wheel) == wheels.read_lock(lock)[1][0].sha256
    if any("cannot serve" in line for line in said):
        assert "accepted only by the lock's sha256" in said[-2] + said[-1], said


def test_indexes_that_do_not_answer_are_not_blamed_on_the_lock(tmp_path, monkeypatch):
    """Offline (no index and no mirror answers): the message says to connect, not to re-resolve a lock
    that may be fine. Port 9 on this host refuses connections at once, like an index that is down."""
    entry, lock = _torch_only_lock(tmp_path)
    lock.write_text(lock.read_text().replace("https://download.pytorch.org/whl/cpu", "http://127.0.0.1:9/whl/cpu"))
    for key in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "1")  # one retry: its warning is how pip says the index did not answer
    with pytest.raises(wheels.WheelError) as info:
        wheels.fetch(lock, tmp_path / "house", entry, log=lambda m: None)
    message = str(info.value)
    assert "no index answered" in message and "nox -s lock" not in message, message
    assert "http://127.0.0.1:9/whl/cpu" in message, "the dedicated attempt's failure is kept"


def test_a_file_no_index_serves_by_its_hash_says_how_to_relock(tmp_path):
    entry, lock = _torch_only_lock(tmp_path, "0" * 64)
    with pytest.raises(wheels.WheelError) as info:
        wheels.fetch(lock, tmp_path / "house", entry, log=lambda m: None)
    message = str(info.value)
    assert "pins torch==2.13.0+cpu from https://download.pytorch.org/whl/cpu" in message or "cannot be fetched" in message
    assert "re-resolve the entry with `nox -s lock -- cpu`" in message and "rewrites" in message, message
    assert not list((tmp_path / "house").glob("*.whl")), "nothing half-fetched is left behind"


def test_resolve_takes_the_locked_file_by_hash_where_its_index_does_not_answer(tmp_path, monkeypatch):
    """Relocking an entry whose dedicated index does not answer (the CPU index, from here): the file the
    lock already pins for that version comes from pip's configuration by its sha256, and everything
    else is resolved anew around it; a version the lock does not pin still fails, naming the index."""
    import copy

    down = "http://127.0.0.1:9/whl/cpu"  # refuses connections at once, like an index that is down
    entry = copy.deepcopy(matrix.entry("cpu"))
    entry["torch"]["index"] = down
    committed = wheels.lock_path(matrix.entry("cpu"), "train")
    monkeypatch.setattr(wheels, "LOCKS", tmp_path)
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip's retry warning is how it says the index did not answer
    lock = wheels.lock_path(entry, "train")
    lock.write_text(committed.read_text().replace("https://download.pytorch.org/whl/cpu", down))
    said = []
    wheels.resolve(entry, "train", tmp_path / "house", log=said.append)
    assert any(f"{down} cannot be reached from here: taking the locked torch==" in line for line in said), said
    (old,) = [p for p in wheels.read_lock(committed)[1] if p.name == "torch"]
    (new,) = [p for p in wheels.read_lock(lock)[1] if p.name == "torch"]
    assert (new.version, new.sha256, new.index) == (old.version, old.sha256, down)
    entry["torch"]["version"] = "2.12.0"
    with pytest.raises(wheels.WheelError, match="127.0.0.1:9"):
        wheels.resolve(entry, "train", tmp_path / "house", log=lambda m: None)
