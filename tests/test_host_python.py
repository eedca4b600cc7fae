"""The host's Python is not the entry's: the README's test command on a fresh Debian trixie
(Python 3.13), in a container made here with debootstrap, against the cpu entry's pins resolved for
3.13 on the host (the container has no network: pip reads that wheelhouse only)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import compat, docker, matrix, wheels
from lab.ort_headers import cache_root

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parent.parent
TRIXIE = {"tag": "myops-lab/trixie-build:2", "recipe": "debootstrap-trixie-build"}
HOUSE = REPO / "build" / "wheelhouse" / "host-py3.13"


@pytest.fixture(scope="module")
def trixie(daemon):
    return docker.ensure_base_image("build", TRIXIE, log=lambda message: None)


@pytest.fixture(scope="module")
def py313_wheels():
    """nox, the tooling (the tests session adds compare.txt, wheels.txt and tests.txt) and the cpu entry's pins, for
    CPython 3.13 on trixie's glibc."""
    target = wheels.Target("3.13", wheels.manylinux_tags(compat.BASE_OS["trixie"].glibc))
    specs = ["-r", str(REPO / "requirements" / "nox.txt"), "-r", str(REPO / "requirements" / "tools.txt"),
             "-r", str(REPO / "requirements" / "compare.txt"), "-r", str(REPO / "requirements" / "wheels.txt"),
             "-r", str(REPO / "requirements" / "tests.txt"),
             *matrix.pip_pins(matrix.entry("cpu"), models=True)]
    HOUSE.mkdir(parents=True, exist_ok=True)
    wheels._run_pip(wheels.download_command(specs, HOUSE, target), dedicated=False, what="the host-py3.13 wheels",
                    log=lambda message: None)
    yield HOUSE
    if os.environ.get("MYOPS_TESTS_FREE_DISK") == "1":  # .ci/run: nothing later reads them (about 3 GB)
        shutil.rmtree(HOUSE, ignore_errors=True)


WHEEL_PART = "=== the extension wheel, built by nox -s wheels in the venv the tests made ==="


@pytest.fixture(scope="module")
def readme_then_wheel(trixie, py313_wheels, tmp_path_factory):
    """One container (and one install of 3.13's torch, a CUDA build of several GB, fewer than two): the
    README's test command in a clone, then `nox -s wheels -- cpu --only torch` in the entry venv it made,
    then that wheel in a clean venv holding only torch, numpy, onnx and onnxscript. Returns the finished
    process and the folder the wheel was written to."""
    entry = matrix.entry("cpu")
    release = entry["torch"]["version"].split("+")[0]
    pins = [p for p in matrix.pip_pins(entry) if p.split("==")[0] in ("torch", "numpy", "onnx", "onnxscript")]
    readme = (REPO / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("python3 -m venv") and "nox -s tests" in line)
    out = tmp_path_factory.mktemp("py313-out")
    out.chmod(0o777)
    # the README's command, on a subset of the suite (the rest is this run's job on the host), in a clone as a
    # user has it (git history included: results carry the git sha), build outputs left out; the entry venv
    # goes before the clean one is made (one torch on disk at a time)
    script = ("set -e; mkdir /work; cd /src; tar -c --exclude=./build --exclude=./.nox --exclude=./.venv "
              "--exclude=./dist . | tar -x -C /work; cd /work; git config --global --add safe.directory /work; "
              f"python3 --version; {command} -- tests/test_swish.py tests/test_alignment_onnx.py -q -x -m 'not bigmem'; "
              f"echo '{WHEEL_PART}'; "
              # PyPI's torch for 3.13 is a CUDA build: the entry venv builds the CPU kernels against it
              ".venv/bin/nox -s wheels -- cpu --only torch --out /out/dist; rm -rf .nox; "
              f"python3 -m venv /tmp/v; /tmp/v/bin/pip install --quiet {' '.join(pins)} /out/dist/myops_torch-*.whl; "
              "mkdir /tmp/o; cd /tmp; /tmp/v/bin/python -I /checks/torch_layer1.py /tmp/o; "
              "/tmp/v/bin/python -I /checks/torch_mismatch.py")
    cmd = ["docker", "run", "--rm", "--network", "none", "-v", f"{REPO}:/src:ro", "-v", f"{py313_wheels}:/wheels:ro",
           "-v", f"{out}:/out", "-v", f"{cache_root().parent}:/root/.cache/myops-lab:ro",
           "-v", f"{REPO / 'tests' / 'wheel_checks'}:/checks:ro", "-e", "PIP_NO_INDEX=1", "-e", "PIP_FIND_LINKS=/wheels",
           trixie, "sh", "-c", script]
    result = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=3600,
                            env=docker.daemon_env(None))
    return result, out, release


def test_readme_test_command_runs_on_python_3_13(readme_then_wheel):
    result, _, _ = readme_then_wheel
    out = result.stdout + result.stderr
    readme_part = result.stdout.split(WHEEL_PART)[0]
    assert WHEEL_PART in result.stdout, out[-4000:]  # set -e: the README's command passed
    # nox says what it installs on stderr (the wheels session after it adds nothing of that)
    assert "Python 3.13" in readme_part and "on this host's Python 3.13" in result.stderr, out[-3000:]
    assert " passed" in readme_part and " failed" not in readme_part, readme_part[-2000:]


def test_a_base_without_the_entry_python_says_what_to_do(trixie):
    """ensure_python.sh in a base whose distribution has another Python (trixie: 3.13) and no way to
    get 3.11 (no network): one message naming the Python and what to do; the lab's base passes."""
    script = (REPO / "docker" / "ensure_python.sh").read_text()
    run = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh"]
    bad = subprocess.run([*run, trixie, "-c", script, "ensure_python", "3.11", "build"], capture_output=True, text=True,
                         env=docker.daemon_env(None))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "error: this base image has no python3.11 (with venv), g++, make or cmake" in bad.stderr, bad.stderr
    assert "apt could not install python3.11 python3.11-venv" in bad.stderr and "use a base that has them" in bad.stderr
    assert "matrix.yaml pins python 3.11" in bad.stderr
    bookworm = docker.ensure_base_image("build", matrix.entry("cpu")["base_images"]["build"], log=lambda m: None)
    good = subprocess.run([*run, bookworm, "-c", script, "ensure_python", "3.11", "build"], capture_output=True,
                          text=True, env=docker.daemon_env(None))
    assert good.returncode == 0 and "base image has python3.11, g++, make and cmake" in good.stdout, good.stderr


def test_the_plugin_wheel_runs_every_artifact_on_python_3_13(trixie, py313_wheels, artifacts, tmp_path):
    """The myops-ort wheel (py3-none: one file for every CPython 3) in a clean 3.13 venv holding only the
    entry's onnxruntime and numpy for 3.13: every artifact against PyTorch's outputs, as on 3.11. Builds its
    own venv: a clean one is what a user installs the wheel into."""
    from lab import dist

    entry = matrix.entry("cpu")
    built = dist.build_all("cpu", tmp_path / "dist", kinds=("ort",), log=lambda m: None)["ort"]
    pins = [p for p in matrix.pip_pins(entry) if p.split("==")[0] in ("numpy", entry["onnxruntime"]["package"])]
    script = ("set -e; python3 --version; python3 -m venv /tmp/v; /tmp/v/bin/pip install --quiet "
              f"{' '.join(pins)} /dist/{built['wheel']}; cd /tmp && /tmp/v/bin/python -I /checks/plugin_layer2.py "
              "/artifacts 1e-5")
    cmd = ["docker", "run", "--rm", "--network", "none", "-v", f"{py313_wheels}:/wheels:ro",
           "-v", f"{tmp_path / 'dist'}:/dist:ro", "-v", f"{artifacts}:/artifacts:ro",
           "-v", f"{REPO / 'tests' / 'wheel_checks'}:/checks:ro", "-e", "PIP_NO_INDEX=1", "-e", "PIP_FIND_LINKS=/wheels",
           trixie, "sh", "-c", script]
    result = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=900,
                            env=docker.daemon_env(None))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "Python 3.13" in out, out[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    manifest = json.loads((artifacts / "manifest.json").read_text())
    assert len(report["checked"]) == len(manifest["models"]) > 0, report
    assert "python3.13/site-packages/myops_ort/" in report["library"], report


def test_the_extension_wheel_builds_and_runs_layer1_on_python_3_13(readme_then_wheel):
    """The myops-torch wheel is per interpreter (cp313): `nox -s wheels -- cpu --only torch` on 3.13 with
    the entry's torch release for 3.13, then the wheel in a clean 3.13 venv holding only torch, numpy, onnx
    and onnxscript: layer 1 and an export, and another torch release refused on import."""
    from lab import dist

    result, out, release = readme_then_wheel
    out_text = result.stdout + result.stderr
    assert result.returncode == 0, out_text[-4000:]
    built = json.loads((out / "dist" / "wheels.json").read_text())["torch"]
    assert built["wheel"].startswith(f"myops_torch-{dist.VERSION}+torch{release}.cpu-cp313-cp313-manylinux_"), built
    layer1, refused = (json.loads(line) for line in result.stdout.splitlines()[-2:])
    assert layer1["custom_nodes"] == ["Swish", "RMSNorm"] and layer1["requires"] == [f"torch=={release}"], layer1
    assert "/tmp/v/lib/python3.13/site-packages/myops_torch/" in layer1["library"], layer1
    assert refused["type"] == "TorchMismatch" and "this environment has torch 2.12.1" in refused["message"], refused
