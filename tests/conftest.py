"""Shared fixtures: the extension and the plugin are built once per test session (cached builds)."""
from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def pytest_configure(config):
    config.addinivalue_line("markers", "bigmem: needs ~18 GB of free memory (tensors beyond 2^31 elements); "
                                       "runs alone")
    config.addinivalue_line("markers", "alone: runs with no other test beside it under several workers (a "
                                       "verdict on timings it measures)")
    config.addinivalue_line("markers", "nvcc: compiles CUDA sources; needs nvcc")
    config.addinivalue_line("markers", "cuda: runs on a CUDA GPU (tests/devices.py); skipped with the reason where "
                                       "there is none; `python -m bench.gpu_check` runs them")
    config.addinivalue_line("markers", "docker: needs a Docker daemon (required in CI via MYOPS_REQUIRE_DOCKER=1)")
    config.addinivalue_line("markers", "sanitizers: the plugin under ASan/UBSan (python -m ort_plugin.sanitize)")


# ---------------------------------------------------------------- several workers (pytest-xdist)
# `nox -s tests` runs the suite on 2 workers. A unit is what one worker runs as a whole: a module with a
# module-scoped fixture, the tests of a session fixture that must be made once (SHARED_ONCE), or the
# modules of TOGETHER; every other test is a unit of its own. Units start costliest first, by the
# durations a fresh-clone CI run measured (tests/durations.csv; docs/ci.md). The workers collect and
# write each test's unit to a file; the controller's scheduler (UnitScheduling) reads it.
DURATIONS = Path(__file__).resolve().parent / "durations.csv"
UNKNOWN_SECONDS = 1.0  # a test the committed durations do not list
# The suite's disk peaks, one after the other: the cuda12.1 images (about 10 GB, removed as the first
# module ends in CI) and the py3.13 container's CUDA torch.
TOGETHER = {"cuda12.1 and py3.13": ("test_cuda_images", "test_host_python")}
# Built once per worker that asks: minutes of emulated work each.
SHARED_ONCE = ("arm64_images",)
UNITS = "xdist-units.json"


def _unit(item) -> str | None:
    module = item.module.__name__.rsplit(".", 1)[-1]
    for unit, modules in TOGETHER.items():
        if module in modules:
            return unit
    for fixture in SHARED_ONCE:
        if fixture in item.fixturenames:
            return fixture
    scopes = {defs[-1].scope for defs in item._fixtureinfo.name2fixturedefs.values() if defs}
    return module if scopes & {"module", "class", "package"} else None


def _committed_durations() -> dict[str, float]:
    if not DURATIONS.exists():
        return {}
    with open(DURATIONS, newline="") as handle:
        return {row["test"]: float(row["seconds"]) for row in csv.DictReader(handle)}


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):
        return  # one process (or xdist's controller, which does not collect): the files' own order
    seconds = _committed_durations()
    units = {item.nodeid: _unit(item) or item.nodeid for item in items}
    cost: dict[str, float] = {}
    for item in items:
        cost[units[item.nodeid]] = cost.get(units[item.nodeid], 0.0) + seconds.get(item.nodeid, UNKNOWN_SECONDS)
    first_seen = {unit: n for n, unit in reversed(list(enumerate(units[i.nodeid] for i in items)))}
    items.sort(key=lambda item: (-cost[units[item.nodeid]], first_seen[units[item.nodeid]]))
    # every worker collects the same tests: each writes the same map, atomically
    from lab.files import write_text_atomic

    write_text_atomic(config._tmp_path_factory.getbasetemp().parent / UNITS, json.dumps(units))


# optional: the images and a GPU host run the suite without pytest-xdist; tryfirst: before xdist's own,
# which would pick its scheduler by --dist
@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") not in ("load", "loadscope"):
        return None  # another --dist asked for by name: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with the units the workers wrote: a unit's tests on one worker, the
        units in the order the workers collected them (costliest first)."""

        def _split_scope(self, nodeid: str) -> str:
            if not hasattr(self, "_units"):  # read once the workers have collected
                self._units = json.loads((config._tmp_path_factory.getbasetemp() / UNITS).read_text())
            return self._units.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # the workers' order is the schedule
    return UnitScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With several workers: a bigmem or alone test takes the machine alone (most of its memory, or a
    verdict on its own timings); every other test holds a shared claim for its setup (fixtures that
    build images included), call and teardown, so such a test waits for the tests under way and none
    starts beside it."""
    worker = getattr(item.config, "workerinput", None)  # only an xdist worker's (not a pytest it starts)
    if worker is None:
        yield
        return
    alone = any(item.get_closest_marker(mark) is not None for mark in ("bigmem", "alone"))
    # the workers' base folders (popen-gwN) share a parent, which pytest removes in a later run
    folder = item.config._tmp_path_factory.getbasetemp().parent
    with open(folder / f"machine-{worker['testrunuid']}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield


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


def _run_folder(config) -> Path:
    """A folder every process of this run shares: the workers' base folders' parent under xdist."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


@pytest.fixture(scope="session")
def artifacts(ext, request) -> Path:
    """The infer side's artifacts (ONNX files, inputs, references) of every model, dynamo at opset 18,
    written once per run (the first worker to ask writes them, another waits and reads them); read only:
    a test that damages one copies the folder first."""
    from lab.files import held
    from ops.artifacts import write

    out = _run_folder(request.config) / "shared-artifacts" / "artifacts"
    with held(out.parent.parent / ".shared-artifacts.lock", what="writing the artifacts", log=lambda m: None):
        if not (out / "manifest.json").is_file():  # the manifest is written last
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
