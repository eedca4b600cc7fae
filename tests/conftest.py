"""Shared fixtures: the extension and the plugin are built once per test session (cached builds)."""
from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def pytest_configure(config):
    config.addinivalue_line("markers", "bigmem: needs ~18 GB of free memory (tensors beyond 2^31 elements)")
    config.addinivalue_line("markers", "nvcc: compiles CUDA sources; needs nvcc")
    config.addinivalue_line("markers", "cuda: runs on a CUDA GPU (tests/devices.py); skipped with the reason where "
                                       "there is none; `python -m bench.gpu_check` runs them")
    config.addinivalue_line("markers", "docker: needs a Docker daemon (required in CI via MYOPS_REQUIRE_DOCKER=1)")
    config.addinivalue_line("markers", "sanitizers: the plugin under ASan/UBSan (python -m ort_plugin.sanitize)")


def pytest_runtest_setup(item):
    """A cuda test where torch sees no GPU: skipped with the reason, or failed where MYOPS_REQUIRE_CUDA=1
    (bench.gpu_check's suite sets it: a GPU host whose tests all skipped must not pass)."""
    if item.get_closest_marker("cuda") is None:
        return
    from devices import CUDA_MISSING

    if CUDA_MISSING is None:
        return
    if os.environ.get("MYOPS_REQUIRE_CUDA") == "1":
        pytest.fail(f"{CUDA_MISSING}; MYOPS_REQUIRE_CUDA=1 says the cuda tests must run here", pytrace=False)
    pytest.skip(CUDA_MISSING)


@pytest.fixture(scope="session")
def ext():
    """The myops extension, built (or reused) and loaded into torch."""
    import ops

    ops.load()
    return ops


@pytest.fixture(scope="session")
def plugin_path() -> Path:
    """The ORT plugin library, built (or reused) with CMake against the pinned headers."""
    from ort_plugin.build import build

    return build(log=lambda message: None)


@pytest.fixture(scope="session")
def artifacts(ext, tmp_path_factory) -> Path:
    """The infer side's artifacts (ONNX files, inputs, references) of every model, dynamo at opset 18;
    read only: a test that damages one copies the folder first."""
    from ops.artifacts import write

    out = tmp_path_factory.mktemp("artifacts") / "artifacts"
    write(out, exporters=["dynamo"], opsets=lambda exporter: [18], log=lambda m: None)
    return out


@pytest.fixture(scope="session")
def in_ci() -> bool:
    return os.environ.get("CI") == "true"


# ---------------------------------------------------------------- Docker (real daemons)

@pytest.fixture(scope="session")
def daemon():
    from lab import docker

    version = docker.daemon_version()
    if version is None:
        reason = "no Docker daemon answers (start dockerd, see .ci/run)"
        if os.environ.get("MYOPS_REQUIRE_DOCKER") == "1":
            pytest.fail(reason + "; MYOPS_REQUIRE_DOCKER=1 says these tests must run here")
        pytest.skip(reason)
    return version


@pytest.fixture(scope="session")
def cpu_images(daemon):
    """The cpu entry's train and infer images on the default daemon (built, or reused from cache)."""
    from lab import docker

    return docker.build_images("cpu", log=lambda message: None)


@contextlib.contextmanager
def extra_daemon(root: Path):
    """Another independent dockerd (own socket, data root, exec root): another 'machine'."""
    import shutil
    import subprocess

    from lab import docker

    if shutil.which("dockerd") is None:
        pytest.fail("dockerd is not installed but a daemon answers: install docker.io to run a second one")
    driver = subprocess.run(["docker", "info", "--format", "{{.Driver}}"], capture_output=True, text=True).stdout.strip()
    host = f"unix://{root}/docker.sock"
    log = open(root / "dockerd.log", "w")
    proc = subprocess.Popen(
        ["dockerd", "--host", host, "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "docker.pid"), "--storage-driver", driver or "overlay2", "--iptables=false", "--bridge=none"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while docker.daemon_version(host, timeout=5) is None:
            if time.time() > deadline or proc.poll() is not None:
                pytest.fail("the extra dockerd did not come up: " + (root / "dockerd.log").read_text()[-2000:])
            time.sleep(1)
        yield host
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        # Its layers are gigabytes that must not pile up across runs.
        shutil.rmtree(root / "data", ignore_errors=True)


@pytest.fixture(scope="session")
def second_daemon(daemon, tmp_path_factory):
    with extra_daemon(tmp_path_factory.mktemp("dockerd-b")) as host:
        yield host


@pytest.fixture(scope="session")
def arm64_images(cpu_images):
    """The cpu entry's images with its linux/arm64 infer image (made and run under qemu-user here)."""
    from lab import docker, platforms

    try:
        docker.require_emulation(platforms.get("arm64"))
    except docker.DockerError as exc:
        if os.environ.get("MYOPS_REQUIRE_DOCKER") == "1":
            pytest.fail(f"{exc}; MYOPS_REQUIRE_DOCKER=1 says the arm64 tests must run here (.ci/run sets it up)")
        pytest.skip(str(exc))
    return docker.build_images("cpu", arches=("amd64", "arm64"), log=lambda message: None)


@pytest.fixture(scope="session")
def infer_on_second_daemon(cpu_images, second_daemon, tmp_path_factory):
    """The cpu infer image moved to the second daemon the way a user would: a checked archive."""
    from lab import docker

    out = tmp_path_factory.mktemp("archive")
    archive = docker.save_archive([cpu_images["infer"]], out, "cpu-infer", log=lambda m: None)
    docker.load_archive(archive, host=second_daemon)
    return second_daemon


@pytest.fixture(scope="session")
def registry(daemon, tmp_path_factory):
    """A real image registry on 127.0.0.1 (Debian's docker-registry), which Docker trusts over HTTP."""
    import shutil
    import socket
    import subprocess
    import time
    import urllib.request

    binary = shutil.which("docker-registry")
    if binary is None:
        reason = "docker-registry is not installed (Debian: apt-get install docker-registry; .ci/run does)"
        if os.environ.get("MYOPS_REQUIRE_DOCKER") == "1":
            pytest.fail(reason + "; MYOPS_REQUIRE_DOCKER=1 says the registry test must run here")
        pytest.skip(reason)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = tmp_path_factory.mktemp("registry")
    config = root / "config.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: warn\n")
    log = open(root / "registry.log", "w")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).close()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    pytest.fail("the registry did not come up: " + (root / "registry.log").read_text()[-2000:])
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(root / "data", ignore_errors=True)


class HostClockStream:
    """A CUDA stream's timing interface on the host clock, for the timing code where there is no GPU.

    Calls run on the host, so events take host time when recorded. A spin, torch.cuda._sleep(cycles),
    marks the stream busy for cycles / cycles_per_s seconds from now, and an event recorded meanwhile
    reports pending (query() False) until then, as a real one queued behind a spin would.
    """

    def __init__(self, cycles_per_s: float = 2.0e9):
        self.cycles_per_s = cycles_per_s
        self.busy_until = 0.0

    def sleep(self, cycles: int) -> None:
        self.busy_until = time.perf_counter() + cycles / self.cycles_per_s

    def event(self, enable_timing: bool = False):
        stream = self

        class Event:
            at = None
            ready_at = None

            def record(self, s=None):
                self.at = time.perf_counter()
                self.ready_at = max(self.at, stream.busy_until)

            def query(self) -> bool:
                return time.perf_counter() >= self.ready_at

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:
                return (end.at - self.at) * 1e3

        return Event()


@pytest.fixture
def host_clock_cuda(monkeypatch):
    """torch.cuda's timing and memory calls backed by HostClockStream; returns the stream."""
    import torch

    stream = HostClockStream()
    for name, value in (("Event", stream.event), ("_sleep", stream.sleep), ("synchronize", lambda *a: None),
                        ("reset_peak_memory_stats", lambda *a: None), ("memory_allocated", lambda *a: 0),
                        ("max_memory_allocated", lambda *a: 2**20), ("empty_cache", lambda: None)):
        monkeypatch.setattr(torch.cuda, name, value)
    return stream
