"""The lab's images against a real Docker daemon: build the cpu entry, run layers 1-2 in train,
verify in infer (no torch, non-root), move the infer image to a second daemon as an archive.

Skipped with a visible reason where no daemon answers; MYOPS_REQUIRE_DOCKER=1 (set by .ci/run)
turns that skip into a failure, so CI cannot pass without running them.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from lab import docker, matrix

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def daemon():
    if docker.daemon_version() is None:
        reason = "no Docker daemon answers (start dockerd, see .ci/run)"
        if os.environ.get("MYOPS_REQUIRE_DOCKER") == "1":
            pytest.fail(reason + "; MYOPS_REQUIRE_DOCKER=1 says these tests must run here")
        pytest.skip(reason)
    return docker.daemon_version()


@pytest.fixture(scope="module")
def cpu_images(daemon):
    return docker.build_images("cpu", log=lambda message: None)


def test_unchanged_rebuild_is_a_no_op(cpu_images):
    before = {kind: docker.image_id(tag) for kind, tag in cpu_images.items()}
    started = time.perf_counter()
    docker.build_images("cpu", log=lambda message: None)
    after = {kind: docker.image_id(tag) for kind, tag in cpu_images.items()}
    assert before == after, "an unchanged entry must rebuild to the very same images (layer cache)"
    assert time.perf_counter() - started < 300


def test_layers_1_and_2_pass_inside_train(cpu_images):
    result = docker.run(cpu_images["train"], timeout=1800)
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out[-4000:] + result.stderr.decode(errors="replace")[-2000:]
    assert " passed" in out and " failed" not in out, out[-2000:]


def test_infer_verifies_the_plugin(cpu_images):
    result = docker.run(cpu_images["infer"], "verify")
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out + result.stderr.decode(errors="replace")
    assert "all models match" in out and out.count("ok  ") == 24, out


def test_infer_has_no_torch(cpu_images):
    result = docker.run(cpu_images["infer"], "-c", "import torch", entrypoint="python")
    assert result.returncode != 0
    assert "No module named 'torch'" in result.stderr.decode(errors="replace")


def test_infer_runs_as_non_root_and_carries_labels(cpu_images):
    result = docker.run(cpu_images["infer"], "-u", entrypoint="id")
    assert result.returncode == 0 and result.stdout.decode().strip() not in ("", "0")
    inspect = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", cpu_images["infer"]],
                             capture_output=True, text=True, check=True).stdout
    for label in ("org.opencontainers.image.revision", "org.opencontainers.image.created",
                  "org.opencontainers.image.source", "org.opencontainers.image.version", "lab.matrix.entry"):
        assert label in inspect, inspect


def test_infer_refuses_a_damaged_artifact(cpu_images):
    script = ("import shutil, subprocess, sys; shutil.copytree('/opt/myops/artifacts', '/tmp/a'); "
              "p = '/tmp/a/swish-custom-dynamo-opset18.onnx'; b = bytearray(open(p, 'rb').read()); b[-1] ^= 1; "
              "open(p, 'wb').write(b); "
              "sys.exit(subprocess.run([sys.executable, '-m', 'ort_plugin.runner', 'verify', '--artifacts', '/tmp/a']).returncode)")
    result = docker.run(cpu_images["infer"], "-c", script, entrypoint="python")
    assert result.returncode == 2
    assert "does not match the manifest" in result.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def second_daemon(daemon, tmp_path_factory):
    """A second, independent dockerd (own socket, data root, exec root): another 'machine'."""
    if shutil.which("dockerd") is None:
        pytest.fail("dockerd is not installed but a daemon answers: install docker.io to run a second one")
    root = tmp_path_factory.mktemp("dockerd-b")
    host = f"unix://{root}/docker.sock"
    log = open(root / "dockerd.log", "w")
    proc = subprocess.Popen(
        ["dockerd", "--host", host, "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "docker.pid"), "--storage-driver", "vfs", "--iptables=false", "--bridge=none"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while docker.daemon_version(host, timeout=5) is None:
            if time.time() > deadline or proc.poll() is not None:
                pytest.fail("the second dockerd did not come up: " + (root / "dockerd.log").read_text()[-2000:])
            time.sleep(1)
        yield host
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_archive_moves_infer_to_another_daemon(cpu_images, second_daemon, tmp_path):
    archive = docker.save_archive([cpu_images["infer"]], tmp_path, "cpu-infer", log=lambda m: None)
    assert Path(str(archive) + ".sha256").read_text().split()[0]
    assert docker.image_id(cpu_images["infer"], host=second_daemon) is None
    docker.load_archive(archive, host=second_daemon)
    result = docker.run(cpu_images["infer"], "verify", host=second_daemon)
    assert result.returncode == 0 and b"all models match" in result.stdout, result.stdout + result.stderr


def test_damaged_archive_is_refused(cpu_images, tmp_path):
    archive = tmp_path / "x.tar.gz"
    archive.write_bytes(b"not an archive")
    (tmp_path / "x.tar.gz.sha256").write_text("0" * 64 + "  x.tar.gz\n")
    with pytest.raises(docker.DockerError, match="damaged"):
        docker.load_archive(archive)


def test_cuda_entry_stops_at_the_base_image_with_what_to_do(daemon):
    entry = matrix.entry("cuda12.1")
    tag = entry["base_images"]["build"]["tag"]
    if docker.image_id(tag):
        pytest.skip(f"{tag} is present here: the build would proceed")
    with pytest.raises(docker.DockerError) as info:
        docker.build_images("cuda12.1", log=lambda message: None)
    message = str(info.value)
    assert tag in message and "--base-image build=" in message and "docker load" in message, message


def test_no_daemon_is_one_clear_message(tmp_path):
    with pytest.raises(docker.DockerError, match="no Docker daemon answers at unix://"):
        docker.require_daemon(host=f"unix://{tmp_path}/nobody.sock")
