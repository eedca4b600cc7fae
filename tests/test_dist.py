"""The wheels users pip install (lab/dist.py, `nox -s wheels -- cpu`), built once, checked by
auditwheel, then installed as a user would: each into a new venv with only what it needs, and run
there on nothing of the checkout (python -I from another folder)."""
from __future__ import annotations

import base64
import hashlib
import json
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lab import dist, matrix, platforms, wheels

REPO = Path(__file__).resolve().parent.parent
CHECKS = Path(__file__).resolve().parent / "wheel_checks"
ENTRY = matrix.entry(matrix.DEFAULT_ENTRY)
# what the manylinux policies let a wheel take from the system (PEP 600's "system libraries")
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2",
                    "librt.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


def _pin(name: str) -> str:
    return next(p for p in matrix.pip_pins(ENTRY) if p.split("==")[0] == name)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("dist")
    records = dist.build_all(ENTRY["id"], out, log=lambda m: None)
    return {kind: {**record, "path": out / record["wheel"]} for kind, record in records.items()}


def test_a_rebuild_replaces_the_recorded_wheel_and_bad_tools_change_nothing(tmp_path, monkeypatch):
    """Builds its own plugin wheel (seconds, on the host): a rebuild into a folder holding an older one is
    what it checks."""
    out = tmp_path / "dist"
    out.mkdir()
    old = out / "myops_ort-0.0.9-py3-none-manylinux_2_17_x86_64.whl"
    old.write_bytes(b"an earlier build")
    (out / "wheels.json").write_text(json.dumps({"ort": {"wheel": old.name, "entry": "cpu", "sha256": "0"}}))
    record = dist.build_all(ENTRY["id"], out, kinds=("ort",), log=lambda m: None)["ort"]
    # one plugin wheel left, so `pip install dist/cpu/myops_ort-*.whl` names one file
    assert sorted(p.name for p in out.glob("myops_ort-*.whl")) == [record["wheel"]], list(out.iterdir())
    assert json.loads((out / "wheels.json").read_text())["ort"]["sha256"] == record["sha256"]

    pins = tmp_path / "wheels.txt"  # the backend's pin in a file it includes, as requirements/wheels.txt does
    pins.write_text("-r plugin-build.txt\n")
    (tmp_path / "plugin-build.txt").write_text("scikit-build-core==0.0.1\n")
    monkeypatch.setattr(dist, "WHEEL_TOOLS", pins)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(dist.DistError, match=r"scikit-build-core 1\.1\.2 \(pinned 0\.0\.1\).*pip install -r"):
        dist.build_all(ENTRY["id"], out, kinds=("ort",), log=lambda m: None)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def _venv(where: Path, *packages: str) -> Path:
    """Builds its own venv (where missing): the wheels' tests install them into a clean one, as a user does."""
    if not (where / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def _run_check(python: Path, script: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-I", str(CHECKS / script), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=900)


def test_plugin_wheel_is_manylinux_2_28_and_needs_only_system_libraries(built):
    ort = built["ort"]
    # tagged with auditwheel's own reading of the symbol versions: manylinux_2_28 or older
    assert ort["wheel"] == f"myops_ort-{dist.VERSION}-py3-none-{ort['policy']}.whl", ort
    assert ort["policy"].endswith("_x86_64") and dist.policy_glibc(ort["policy"]) <= dist.PLUGIN_GLIBC, ort["policy"]
    assert ort["overall_policy"] == ort["policy"] and ort["entry"] == ENTRY["id"], ort
    assert set(ort["needs"]) == {"myops_ort/libmyops_ort.so"}, ort["needs"]
    assert set(ort["needs"]["myops_ort/libmyops_ort.so"]) <= SYSTEM_LIBRARIES, ort["needs"]
    with zipfile.ZipFile(ort["path"]) as archive:
        names = archive.namelist()
        build = json.loads(archive.read("myops_ort/build.json"))
    assert "myops_ort/opspec/__init__.py" in names and not any("torch" in n for n in names), names
    assert build["ort_headers"] == ENTRY["ort_headers"]["version"], build


def test_plugin_wheel_in_a_clean_venv_runs_every_artifact_and_refuses_an_old_onnxruntime(built, artifacts, tmp_path):
    python = _venv(tmp_path / "venv", _pin("onnxruntime"), _pin("numpy"), str(built["ort"]["path"]))
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
    assert not {"torch", "onnx"} & {p["name"] for p in json.loads(listed.stdout)}, listed.stdout
    done = _run_check(python, "plugin_layer2.py", artifacts, 1e-5, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    manifest = json.loads((artifacts / "manifest.json").read_text())
    assert len(report["checked"]) == len(manifest["models"]) > 0, report
    assert any(m["lowering"] == "custom" for m in manifest["models"]), manifest["models"]
    assert "onnxruntime 1.16.3 is older" in report["refused"] and "upgrade onnxruntime" in report["refused"], report
    assert str(tmp_path / "venv") in report["library"], report


def test_extension_wheel_is_pinned_to_its_torch(built):
    torch_wheel = built["torch"]
    torch_version = ENTRY["torch"]["version"]
    assert torch_wheel["wheel"].startswith(f"myops_torch-{dist.VERSION}+torch{torch_version}.cpu-"), torch_wheel
    # torch's libraries are left to torch (auditwheel --exclude); everything else is a system library
    (library, needs), = torch_wheel["needs"].items()
    assert set(needs) - set(torch_wheel["provided_at_run_time"]) <= SYSTEM_LIBRARIES, torch_wheel
    assert {"libc10.so", "libtorch_cpu.so"} <= set(torch_wheel["provided_at_run_time"]), torch_wheel
    with zipfile.ZipFile(torch_wheel["path"]) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        names = archive.namelist()
    assert f"Requires-Dist: torch=={torch_version}" in metadata, metadata
    # the lab's own tooling stays out of the wheel; the ops' Python and the catalogue go in
    assert "myops_torch/ops/declaration.py" in names and "myops_torch/opspec/swish.py" in names, names
    assert not any(n.startswith(("lab/", "ops/", "opspec/")) or n.endswith(("/build.py", "/fuse.py")) for n in names)


def test_extension_wheel_in_a_clean_venv_runs_layer1_and_an_export(built, tmp_path):
    """Builds its own venv: a clean one, torch installed as the sessions do, then the wheel."""
    # torch as the nox sessions install it: the entry's index first (PyPI's x86-64 torch is a CUDA build)
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    wheels.install_torch(str(tmp_path / "venv" / "bin" / "python"), ENTRY, log=lambda m: None, warn=lambda m: None)
    python = _venv(tmp_path / "venv", _pin("numpy"), _pin("onnx"), _pin("onnxscript"), str(built["torch"]["path"]))
    done = _run_check(python, "torch_layer1.py", tmp_path, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["custom_nodes"] == ["Swish", "RMSNorm"], report  # in graph order: rms_norm(swish(proj(h)))
    assert report["requires"] == [f"torch=={ENTRY['torch']['version']}"], report
    assert str(tmp_path / "venv") in report["library"], report

    mismatch = _run_check(python, "torch_mismatch.py", cwd=tmp_path)
    assert mismatch.returncode == 0, mismatch.stderr[-3000:]
    refused = json.loads(mismatch.stdout.splitlines()[-1])
    assert refused["type"] == "TorchMismatch", refused
    assert f"compiled for torch {ENTRY['torch']['version']} (CPU)" in refused["message"], refused
    assert "this environment has torch 2.12.1" in refused["message"], refused


def test_a_cuda_entrys_wheels_are_for_its_own_architecture_only(tmp_path):
    """A CUDA entry's wheels are built in its images (tests/test_cuda_images.py); another architecture's
    plugin is refused before anything runs, and nothing is written."""
    with pytest.raises(dist.DistError, match="built for x86_64 only"):
        dist.build_all("cuda12.1", tmp_path, kinds=("ort",), plat=platforms.get("arm64"))
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(shutil.which("nox") is None and not (Path(sys.executable).parent / "nox").exists(),
                    reason="nox is not installed beside this Python")
def test_nox_wheels_takes_a_cuda_entry_to_lab_dist():
    """`nox -s wheels -- cuda12.1` is not refused as the local backend's sessions refuse a CUDA entry: it
    runs in the cpu entry's venv (.nox/cpu, shared by the sessions: the suite's own, nothing to install)
    and reaches lab.dist (here its refusal of an arm64 CUDA wheel, which builds nothing)."""
    nox = shutil.which("nox") or str(Path(sys.executable).parent / "nox")
    out = subprocess.run([nox, "-s", "wheels", "--", "cuda12.1", "--arch", "arm64"],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "its plugin wheel is built for x86_64 only" in said, said[-3000:]
    assert "the local backend builds only the cpu entry" not in said, said[-3000:]


def test_the_distribution_names_keep_cuda_majors_apart():
    from lab import wheel_stage

    names = {wheel_stage.distribution_name(matrix.entry(n)) for n in ("cpu", "cuda11.8", "cuda12.1", "cuda12.4")}
    assert names == {"myops-ort", "myops-ort-cu11", "myops-ort-cu12"}


def test_publish_writes_each_wheel_with_its_sha256_and_refuses_a_changed_one(built, tmp_path):
    dist_dir = built["ort"]["path"].parent
    written = dist.publish(dist_dir, tmp_path / "shipped", log=lambda m: None)
    assert sorted(p.name for p in written) == sorted(r["wheel"] for r in (built["ort"], built["torch"]))
    for wheel in written:
        line = (wheel.parent / f"{wheel.name}.sha256").read_text()
        # sha256sum -c reads this line: "<digest>  <file>"
        assert line == f"{hashlib.sha256(wheel.read_bytes()).hexdigest()}  {wheel.name}\n", line

    changed = tmp_path / "changed"
    shutil.copytree(dist_dir, changed)
    wheel = changed / built["ort"]["wheel"]
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01
    wheel.write_bytes(data)
    with pytest.raises(dist.DistError, match="does not match its sha256"):
        dist.publish(changed, tmp_path / "refused", log=lambda m: None)
    assert not (tmp_path / "refused").exists()
    with pytest.raises(dist.DistError, match="holds no wheels built by"):
        dist.recorded(tmp_path)
    with pytest.raises(dist.DistError, match="built for the entry 'cpu', not 'cuda12.1'"):
        dist.publish(dist_dir, tmp_path / "other", entry_id="cuda12.1", log=lambda m: None)


def _wheel_with_library(tmp_path: Path, source: str) -> Path:
    """A real wheel (metadata and RECORD) around one library compiled here from C `source`."""
    library = tmp_path / "libdemo.so"
    (tmp_path / "demo.c").write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "demo.c"), "-lpthread"], check=True)
    files = {"demo/libdemo.so": library.read_bytes(), "demo/__init__.py": b"",
             "demo-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 0.1\n",
             "demo-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                                         b"Tag: py3-none-linux_x86_64\n"}
    digest = lambda data: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()  # noqa: E731
    record = "".join(f"{name},sha256={digest(data)},{len(data)}\n" for name, data in files.items())
    files["demo-0.1.dist-info/RECORD"] = (record + "demo-0.1.dist-info/RECORD,,\n").encode()
    raw = tmp_path / "raw" / "demo-0.1-py3-none-linux_x86_64.whl"
    raw.parent.mkdir()
    with zipfile.ZipFile(raw, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return raw


@pytest.mark.skipif(platforms.host() != platforms.PRIMARY or shutil.which("gcc") is None
                    or tuple(map(int, platform.libc_ver()[1].split("."))) < (2, 34),
                    reason="links a library for x86-64 with the host's gcc against glibc 2.34 or newer")
def test_a_plugin_past_manylinux_2_28_is_refused_naming_its_symbols(tmp_path):
    # glibc 2.34 and newer bind pthread_create at GLIBC_2.34; puts stays at its first version (2.2.5)
    source = ("#include <pthread.h>\n#include <stdio.h>\nstatic void *run(void *a) { return a; }\n"
              "int start(pthread_t *t, const char *s) { puts(s); return pthread_create(t, 0, run, 0); }\n")
    raw = _wheel_with_library(tmp_path, source)
    with zipfile.ZipFile(raw) as archive:
        library = archive.read("demo/libdemo.so")
    assert "puts" in {n.split("@")[0] for n in wheels.symbols_beyond(library, {"GLIBC": set()})}  # it is imported
    with pytest.raises(dist.DistError) as refused:
        dist._repaired_plugin(raw, lambda m: None, why="build it on bookworm")
    message = str(refused.value)
    assert "need manylinux_2_34" in message and "newer than manylinux_2_28" in message, message
    assert "pthread_create@GLIBC_2.34" in message and "puts" not in message, message
    assert message.endswith(": build it on bookworm"), message


def test_no_cache_is_refused_for_a_cpu_entry_before_anything_is_built(tmp_path):
    with pytest.raises(dist.DistError, match="--no-cache is for a CUDA entry"):
        dist.build_all("cpu", tmp_path, kinds=("ort",), no_cache=True)
    assert not any(tmp_path.iterdir())


def test_cmake_is_asked_of_the_host_only_where_the_host_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no cmake on it
    assert "cmake missing" in dist.build_tools_problem() and "install cmake" in dist.build_tools_problem()
    assert dist.build_tools_problem(cmake=False) is None  # a CUDA entry's builds run in its images
