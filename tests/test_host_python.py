"""The host's Python is not the entry's: the README's test command on a fresh Debian trixie
(Python 3.13), in a container made here with debootstrap, against the cpu entry's pins resolved for
3.13 on the host (the container has no network: pip reads that wheelhouse only)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab import compat, docker, matrix, wheels
from ort_plugin.headers import cache_root

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parent.parent
TRIXIE = {"tag": "myops-lab/trixie-build:1", "recipe": "debootstrap-trixie-build"}
HOUSE = REPO / "build" / "wheelhouse" / "host-py3.13"


@pytest.fixture(scope="module")
def trixie(daemon):
    return docker.ensure_base_image("build", TRIXIE, log=lambda message: None)


@pytest.fixture(scope="module")
def py313_wheels():
    """nox, the tooling and the cpu entry's pins, for CPython 3.13 on trixie's glibc."""
    target = wheels.Target("3.13", wheels.manylinux_tags(compat.BASE_OS["trixie"].glibc))
    specs = ["-r", str(REPO / "requirements" / "nox.txt"), "-r", str(REPO / "requirements" / "tools.txt"),
             *matrix.pip_pins(matrix.entry("cpu"))]
    HOUSE.mkdir(parents=True, exist_ok=True)
    wheels._run_pip(wheels.download_command(specs, HOUSE, target), dedicated=False, what="the host-py3.13 wheels",
                    log=lambda message: None)
    return HOUSE


def test_readme_test_command_runs_on_python_3_13(trixie, py313_wheels):
    readme = (REPO / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("python3 -m venv") and "nox -s tests" in line)
    # the README's command, on a subset of the suite (the rest is this run's job on the host)
    script = ("set -e; mkdir /work; cd /src; tar -c --exclude=./build --exclude=./.nox --exclude=./.venv --exclude=./.git . "
              "| tar -x -C /work; cd /work; python3 --version; "
              f"{command} -- tests/test_swish_extension.py tests/test_alignment_onnx.py -q -x -m 'not bigmem'")
    headers = cache_root()
    cmd = ["docker", "run", "--rm", "--network", "none", "-v", f"{REPO}:/src:ro", "-v", f"{py313_wheels}:/wheels:ro",
           "-v", f"{headers}:/root/.cache/myops-lab/ort-headers:ro", "-e", "PIP_NO_INDEX=1", "-e", "PIP_FIND_LINKS=/wheels",
           trixie, "sh", "-c", script]
    result = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=3000,
                            env=docker.daemon_env(None))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "Python 3.13" in out and "on this host's Python 3.13" in out, out[-3000:]
    assert " passed" in out and " failed" not in out, out[-2000:]
