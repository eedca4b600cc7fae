"""The lab's images against a real Docker daemon: build the cpu entry, run layers 1-2 in train,
verify in infer (no torch, non-root), move the infer image to a second daemon as an archive.

Skipped with a visible reason where no daemon answers; MYOPS_REQUIRE_DOCKER=1 (set by .ci/run)
turns that skip into a failure, so CI cannot pass without running them.
"""
from __future__ import annotations

import csv
import json
import subprocess
import time
from pathlib import Path

import pytest

from lab import docker, matrix

pytestmark = pytest.mark.docker


def test_unchanged_rebuild_is_a_no_op(cpu_images):
    """Builds its own: the rebuild (all from Docker's cache) is what it checks."""
    before = {kind: docker.image_id(tag) for kind, tag in cpu_images.items()}
    started = time.perf_counter()
    docker.build_images("cpu", log=lambda message: None)
    after = {kind: docker.image_id(tag) for kind, tag in cpu_images.items()}
    assert before == after, "an unchanged entry must rebuild to the very same images (layer cache)"
    assert time.perf_counter() - started < 300


def _layers(tag: str) -> list[str]:
    out = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.ID}} {{.CreatedBy}}", tag],
                         capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def _remove_namespace(namespace: str) -> None:
    """A test's own images (MYOPS_IMAGE_NAMESPACE), gigabytes of their own layers, removed."""
    listed = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", f"{namespace}/*"],
                            capture_output=True, text=True).stdout.split()
    if listed:
        subprocess.run(["docker", "rmi", *listed], capture_output=True)


def test_a_new_commit_with_the_same_sources_rebuilds_only_metadata(cpu_images, monkeypatch):
    """Builds its own images beside cpu_images, under a namespace of its own (their tags stay where they
    are: other tests, on another worker, may be using them); only the metadata steps may run again."""
    before = {kind: _layers(tag) for kind, tag in cpu_images.items()}
    monkeypatch.setattr(docker, "revision", lambda: "f" * 40)
    monkeypatch.setenv("MYOPS_IMAGE_NAMESPACE", "myops-lab-next-commit")
    try:
        rebuilt = docker.build_images("cpu", log=lambda message: None)
        after = {kind: _layers(tag) for kind, tag in rebuilt.items()}
    finally:
        _remove_namespace("myops-lab-next-commit")
    assert set(rebuilt.values()).isdisjoint(cpu_images.values())
    for kind in cpu_images:
        changed = [line.split(" ", 1)[1] for line in after[kind] if line not in before[kind]]
        assert changed and all(step.startswith("/bin/sh -c #(nop) ") and (" LABEL " in step or " ENV " in step)
                               for step in changed), f"{kind}: rebuilt {changed}"


def test_layers_1_and_2_pass_inside_train(cpu_images):
    result = docker.run(cpu_images["train"], timeout=1800)
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out[-4000:] + result.stderr.decode(errors="replace")[-2000:]
    assert " passed" in out and " failed" not in out, out[-2000:]


def test_images_hold_exactly_the_matrix_pins(cpu_images):
    entry = matrix.entry("cpu")
    ort = entry["onnxruntime"]
    pins = [f"python={entry['python']}", f"numpy={entry['numpy']}", f"{ort['package']}={ort['version']}"]
    program = (docker.DOCKER_DIR / "check_versions.py").read_text()  # what the builds ran, run again inside
    for kind, extra in (("train", [f"torch={entry['torch']['version']}", f"onnx={entry['onnx']}"]), ("infer", [])):
        good = docker.run(cpu_images[kind], "-c", program, *pins, *extra, entrypoint="/opt/venv/bin/python")
        assert good.returncode == 0, good.stderr.decode()
        bad = docker.run(cpu_images[kind], "-c", program, *pins, "numpy=1.0.0", entrypoint="/opt/venv/bin/python")
        assert bad.returncode == 1 and "numpy 2" in bad.stderr.decode() and "pins 1.0.0" in bad.stderr.decode()


def test_infer_verifies_the_plugin(cpu_images):
    result = docker.run(cpu_images["infer"], "verify")
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out + result.stderr.decode(errors="replace")
    # 3 models (swish, ffn, rms_norm) x 2 lowerings x 2 exporters x 3 opsets
    assert "all models match" in out and out.count("ok  ") == 36, out
    assert out.count("ok   rms_norm-") == 12, out
    # The image's recorded contents checked first; the same digest as the manifest the build wrote.
    # /opt/myops and the plugin's installed package and .dist-info
    package = Path(docker.installed_plugin(matrix.entry("cpu"))).parent
    recorded = docker.run(cpu_images["infer"], "-c", "from pathlib import Path; from ort_plugin import contents; "
                          f"print(contents.digest(contents.manifest_lines(Path('/opt/myops'), [Path('{package}'), "
                          f"*Path('{package.parent}').glob('myops_ort*.dist-info')])))",
                          entrypoint="python").stdout.decode().strip()
    assert f"verify: contents sha256 {recorded} (" in out, out


def test_infer_runs_the_plugin_pip_installed_from_its_wheel(cpu_images):
    """The plugin is the myops-ort package pip installed from the wheel the image carries, and the runner's
    MYOPS_ORT_PLUGIN is that package's library."""
    script = r"""
import hashlib, json, os, pathlib, zipfile
import myops_ort
from importlib import metadata
dist = metadata.distribution("myops-ort")
(wheel,) = pathlib.Path("/opt/myops/wheels").glob("myops_ort-*.whl")
print(json.dumps({"library": myops_ort.get_library_path(), "env": os.environ["MYOPS_ORT_PLUGIN"],
                  "files": sorted(str(f) for f in dist.files), "installer": dist.read_text("INSTALLER").strip(),
                  "direct_url": json.loads(dist.read_text("direct_url.json")), "wheel": wheel.name,
                  "same_bytes": zipfile.ZipFile(wheel).read("myops_ort/libmyops_ort.so")
                                == pathlib.Path(myops_ort.get_library_path()).read_bytes(), "build": myops_ort.BUILD,
                  "old_path": os.path.exists("/opt/myops/lib"), "manifest": open("/opt/myops/CONTENTS").read()}))
"""
    result = docker.run(cpu_images["infer"], "-c", script, entrypoint="python")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    found = json.loads(result.stdout.decode())
    expected = docker.installed_plugin(matrix.entry("cpu"))
    assert found["library"] == found["env"] == expected, found
    assert "myops_ort/libmyops_ort.so" in found["files"] and found["installer"] == "pip"
    assert found["direct_url"]["url"] == f"file:///opt/myops/wheels/{found['wheel']}" and found["same_bytes"], found
    assert found["wheel"].endswith("-py3-none-linux_x86_64.whl") and found["build"]["entry"] == "cpu"
    assert not found["old_path"], "the library is no longer copied beside the wheel"
    assert f"  {expected}\n" in found["manifest"], found["manifest"][:2000]


def test_infer_doctor_is_green_without_torch(cpu_images):
    result = docker.run(cpu_images["infer"], "doctor", "/opt/myops/artifacts/ffn-custom-dynamo-opset18.onnx")
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out + result.stderr.decode(errors="replace")
    plugin = docker.installed_plugin(matrix.entry("cpu"))
    for expected in ("doctor: all green", f"plugin: {plugin}", "exported symbols: RegisterCustomOps",
                     "myops::Swish (1 node): registered by the plugin", "dynamic axes 0 (batch), 1 (seq)"):
        assert expected in out, out


def test_infer_bench_writes_ort_rows_with_the_images_provenance(cpu_images):
    """What a GPU host runs with --gpus all; here on the CPU EP (the cpu entry's onnxruntime)."""
    script = ("python -m infer.runner bench --workload swish --warmup 1 --runs 5 --out /tmp/r "
              "&& echo ===CSV=== && cat /tmp/r/cpu/bench.csv")
    result = docker.run(cpu_images["infer"], "-c", script, entrypoint="sh")
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out + result.stderr.decode(errors="replace")
    assert "[bench 5/5]" in out and "CPUExecutionProvider" in out
    rows = list(csv.DictReader(out.split("===CSV===\n", 1)[1].splitlines()))
    assert sorted((r["row"], r["ort_opt_level"]) for r in rows) == [
        ("ort_composite", "all"), ("ort_composite", "basic"), ("ort_copy", "all"), ("ort_custom", "all"),
        ("ort_plugin_copy", "all")]
    for r in rows:
        assert r["image"] == cpu_images["infer"] and r["git_sha"] == docker.revision() and r["torch"] == ""
        assert float(r["p50_ms"]) > 0 and r["ort_graph_nodes"]


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
              "sys.exit(subprocess.run([sys.executable, '-m', 'infer.runner', 'verify', '--artifacts', '/tmp/a']).returncode)")
    result = docker.run(cpu_images["infer"], "-c", script, entrypoint="python")
    assert result.returncode == 2
    assert "does not match the manifest" in result.stderr.decode(errors="replace")


def test_registry_moves_infer_to_another_daemon(cpu_images, registry, second_daemon):
    # `nox -s publish -- cpu --registry R --infer-only` is docker.push; the GPU host pulls. Runs
    # before the archive test, so the second daemon has no layers yet: the pull transfers them all.
    import json
    import urllib.request

    (remote,) = docker.push([cpu_images["infer"]], f"{registry}/lab", log=lambda m: None)
    name, tag = remote.split("/", 1)[1].rsplit(":", 1)
    request = urllib.request.Request(f"http://{registry}/v2/{name}/manifests/{tag}", headers={
        "Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        manifest = json.load(response)
    assert manifest["layers"], manifest
    assert docker.image_id(remote, host=second_daemon) is None
    assert docker.pull(remote, host=second_daemon) == docker.image_id(cpu_images["infer"])
    result = docker.run(remote, "verify", host=second_daemon)
    assert result.returncode == 0 and b"all models match" in result.stdout, result.stdout + result.stderr


def test_push_to_a_registry_that_does_not_answer_says_what_to_do(cpu_images):
    import socket

    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(docker.DockerError) as info:
        docker.push([cpu_images["infer"]], dead, log=lambda m: None)
    message = str(info.value)
    assert f"could not push to {dead}" in message and "--archive" in message, message
    assert docker.image_id(f"{dead}/{cpu_images['infer'].split('/', 1)[-1]}") is None


def test_archive_moves_infer_to_another_daemon(cpu_images, second_daemon, infer_on_second_daemon):
    # infer_on_second_daemon saved the image to a .tar.gz + .sha256 and loaded it into the second
    # daemon (which holds at most the registry test's pull of the same image).
    assert docker.image_id(cpu_images["infer"], host=second_daemon) == docker.image_id(cpu_images["infer"])
    assert docker.image_id(cpu_images["train"], host=second_daemon) is None
    result = docker.run(cpu_images["infer"], "verify", host=second_daemon)
    assert result.returncode == 0 and b"all models match" in result.stdout, result.stdout + result.stderr


def test_damaged_archive_is_refused(tmp_path):
    archive = tmp_path / "x.tar.gz"
    archive.write_bytes(b"not an archive")
    (tmp_path / "x.tar.gz.sha256").write_text("0" * 64 + "  x.tar.gz\n")
    with pytest.raises(docker.DockerError, match="damaged"):
        docker.load_archive(archive)


def test_an_official_base_that_is_not_here_stops_with_what_to_do(daemon):
    """CUDA entries build on the lab's own bases; an official one named with --base-image must be
    present or pullable, and no registry answers here."""
    tag = "nvidia/cuda:12.1.1-devel-ubuntu22.04"
    if docker.image_id(tag):
        pytest.skip(f"{tag} is present here: the build would proceed")
    with pytest.raises(docker.DockerError) as info:
        docker.build_images("cuda12.1", base_overrides={"build": tag}, log=lambda message: None)
    message = str(info.value)
    assert tag in message and "--base-image build=" in message and "docker load" in message, message


def test_no_daemon_is_one_clear_message(tmp_path):
    with pytest.raises(docker.DockerError, match="no Docker daemon answers at unix://"):
        docker.require_daemon(host=f"unix://{tmp_path}/nobody.sock")


def _contents_digest(tag: str) -> str:
    result = docker.run(tag, "verify")
    line = next(line for line in result.stdout.decode().splitlines() if line.startswith("verify: contents sha256 "))
    return line.split()[3]


def test_two_builds_of_one_commit_hold_the_same_contents(cpu_images, tmp_path):
    """Builds its own images, from a clone in another folder with umask 077 (every file 0600 in it), under
    a namespace of its own: the build context's modes are normalised, so every layer comes from Docker's
    cache but the metadata (the clone has no commit: another revision label); the image ID changes, the
    recorded contents do not."""
    import os
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    first = _contents_digest(cpu_images["infer"])
    first_ids = {kind: docker.image_id(tag) for kind, tag in cpu_images.items()}
    clone = tmp_path / "elsewhere" / "myops-lab"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=repo,
                           capture_output=True, check=True).stdout.decode().split("\0")
    old_umask = os.umask(0o077)
    try:  # the working tree (what cpu_images was built from), every file written anew: mode 0600
        for name in filter(None, files):
            if (repo / name).is_file():
                (clone / name).parent.mkdir(parents=True, exist_ok=True)
                (clone / name).write_bytes((repo / name).read_bytes())
                (clone / name).chmod((repo / name).stat().st_mode & 0o700)  # as git would: its owner's bits only
    finally:
        os.umask(old_umask)
    subprocess.run(["git", "init", "--quiet"], cwd=clone, check=True)  # revision() asks git; unknown is fine
    assert (clone / "lab" / "docker.py").stat().st_mode & 0o777 == 0o600
    # under a namespace of its own: cpu_images keep their tags (other tests may be using them meanwhile)
    namespace = "myops-lab-umask"
    try:
        subprocess.run([sys.executable, "-c", "from lab import docker; docker.build_images('cpu', log=lambda m: None)"],
                       cwd=clone, check=True, timeout=1800, preexec_fn=lambda: os.umask(0o077),
                       env=dict(os.environ, PYTHONPATH=str(clone), MYOPS_IMAGE_NAMESPACE=namespace))
        again = cpu_images["infer"].replace("myops-lab/", f"{namespace}/", 1)
        assert docker.image_id(again) not in (None, first_ids["infer"])
        assert _contents_digest(again) == first
        for kind, tag in cpu_images.items():
            rebuilt = tag.replace("myops-lab/", f"{namespace}/", 1)
            changed = [line.split(" ", 1)[1] for line in _layers(rebuilt) if line not in _layers(tag)]
            assert changed and all(step.startswith("/bin/sh -c #(nop) ") and (" LABEL " in step or " ENV " in step)
                                   for step in changed), f"{kind}: the umask-077 clone built again {changed}"
    finally:
        _remove_namespace(namespace)
