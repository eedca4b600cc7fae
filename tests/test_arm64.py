"""linux/arm64: the cpu entry's infer image built here (plugin cross-compiled, wheels installed under
qemu-user), proven, compared with x86-64 (layer 3), published as one multi-arch tag, and a target of
the bench fan-out. Real daemons, a real registry, real emulation; .ci/run registers qemu-user-static."""
from __future__ import annotations

import csv
import fnmatch
import json
import subprocess
from pathlib import Path

import pytest

from bench import cross_machine_diff as xdiff
from bench import fanout
from lab import docker, matrix, platforms, proof

pytestmark = pytest.mark.docker
ARM64 = platforms.get("arm64")


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_image_is_arm64_through_and_through(arm64_images):
    tag = arm64_images["infer-arm64"]
    assert tag == docker.image_tags(matrix.entry("cpu"), ARM64)["infer"]
    checks = {c.name: c for c in proof.prove_foreign_infer(matrix.entry("cpu"), tag, ARM64)}
    assert set(checks) == {"architecture", "no-torch", "plugin-needed", "verify-cpu"}
    failed = {name: c.detail for name, c in checks.items() if not c.ok}
    assert not failed, failed
    assert checks["architecture"].detail == "image arm64, python on aarch64, plugin EM_AARCH64"
    # The amd64 image is untouched by the arm64 build: still x86-64, still its own tag.
    assert docker.image_architecture(arm64_images["infer"]) == "amd64"


# One custom-lowering model per model kind: the cap changes only which kernel the plugin dispatches to, and a
# custom node reaches the same kernel whichever exporter and opset wrote it (the proof verified all 36 models on
# the default path; under emulation each model takes seconds).
ONE_CUSTOM_MODEL_EACH = "*-custom-dynamo-opset18.onnx"


@pytest.mark.parametrize("cap", ["neon", "baseline"])
def test_every_cpu_path_of_the_arm64_plugin_verifies(arm64_images, cap):
    # MYOPS_CPU_ISA=neon leaves aarch64's widest path on and says so; baseline drops to the scalar code.
    result = docker._docker("run", "--rm", "--network", "none", "-e", f"MYOPS_CPU_ISA={cap}",
                            arm64_images["infer-arm64"], "verify", "--only", ONE_CUSTOM_MODEL_EACH, timeout=900,
                            check=False)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0 and "all models match" in out, (out + err)[-1500:]
    manifest = json.loads(docker._docker("run", "--rm", "--network", "none", "--entrypoint", "cat",
                                         arm64_images["infer-arm64"], "/opt/myops/artifacts/manifest.json").stdout)
    chosen = [m["file"] for m in manifest["models"] if fnmatch.fnmatch(m["file"], ONE_CUSTOM_MODEL_EACH)]
    models = {m["model"] for m in manifest["models"]}
    assert len(chosen) == len(models) > 1, (chosen, models)  # each model's custom nodes, once
    assert f"verify: {len(chosen)} of the {len(manifest['models'])} models" in out and all(
        f" {name} " in out for name in chosen), out[-3000:]
    assert f"MYOPS_CPU_ISA={cap}: the CPU path is {cap}" in err, err[-800:]


def test_layer3_local_x86_against_arm64_under_emulation(arm64_images, artifacts, plugin_path, tmp_path):
    log = []
    status = xdiff.run(["local", "docker@cpu/arm64"], artifacts=artifacts, results=tmp_path, log=log.append,
                       plugins={"local": str(plugin_path)})
    assert status == 0, log
    rows = _csv(tmp_path / "cross_machine_diff.csv")
    assert rows and all(r["ok"] == "True" for r in rows), rows
    assert {r["target"] for r in rows} == {"docker@cpu/arm64"}
    # Each side really ran its own architecture's plugin.
    assert len({r["reference_plugin_sha256"] for r in rows} | {r["target_plugin_sha256"] for r in rows}) == 2


def test_arch_target_spelling_is_checked():
    target = xdiff.parse_target("ssh://me@box@cpu/arm64")
    assert (target.host, target.entry, target.arch) == ("ssh://me@box", "cpu", "arm64")
    assert xdiff.parse_target("docker@cpu/aarch64").arch == "arm64"
    with pytest.raises(ValueError, match="no arm64 infer image"):
        xdiff.parse_target("docker@cuda12.1/arm64")
    with pytest.raises(ValueError, match="unknown architecture 'riscv64'"):
        xdiff.parse_target("docker@cpu/riscv64")
    with pytest.raises(ValueError, match="goes with a Docker target"):
        xdiff.parse_target("local@cpu/arm64")


def test_one_multiarch_tag_is_pushed_and_each_host_pulls_its_own(arm64_images, registry, second_daemon):
    images = {"amd64": arm64_images["infer"], "arm64": arm64_images["infer-arm64"]}
    remote = docker.push_multiarch(images, f"{registry}/multi", log=lambda m: None)
    assert remote == f"{registry}/multi/{arm64_images['infer'].split('/', 1)[1]}"
    listed = json.loads(subprocess.run(["docker", "manifest", "inspect", "--insecure", remote], capture_output=True,
                                       text=True, check=True).stdout)
    assert sorted(m["platform"]["architecture"] for m in listed["manifests"]) == ["amd64", "arm64"]
    for arch, tag in images.items():
        assert docker.pull(remote, host=second_daemon, arch=arch) == docker.image_id(tag)
        assert docker.image_architecture(remote, host=second_daemon) == arch
    docker._docker("rmi", remote, host=second_daemon, check=False)


def test_publish_refuses_a_missing_architecture_clearly(cpu_images, registry):
    with pytest.raises(docker.DockerError, match="not built.*--arch arm64"):
        docker.push_multiarch({"amd64": cpu_images["infer"], "arm64": "myops-lab/infer:no-such-arm64"}, registry,
                              log=lambda m: None)


BENCH_ARGS = ["--workload", "swish", "--warmup", "2", "--runs", "10", "--threads", "1"]


def test_fanout_over_two_daemons_and_arm64_merges_into_one_set(arm64_images, tmp_path_factory, tmp_path):
    from conftest import extra_daemon

    results = tmp_path / "results"
    log = []
    # A fresh daemon without the image: the fan-out copies it there and checks it by image id.
    with extra_daemon(tmp_path_factory.mktemp("dockerd-fanout")) as fresh:
        status = fanout.run(["docker@cpu", f"{fresh}@cpu", "docker@cpu/arm64"], BENCH_ARGS, results=results,
                            timeout=1500, log=log.append)
        assert status == 0, log
        assert docker.image_id(arm64_images["infer"], host=fresh) == docker.image_id(arm64_images["infer"])
    assert any("copying" in line and fresh in line for line in log), log
    # One machine: its three targets ran one after another, the native ones first.
    assert any("3 target(s) on 1 machine(s)" in line and line.endswith("then docker@cpu/arm64") for line in log), log
    folders = sorted(p.parent.name for p in (results / "cpu").glob("*/bench.csv"))
    assert len(folders) == 3 and sum("-arm64-" in f for f in folders) == 1, folders
    merged = _csv(results / "bench_all.csv")
    assert {r["host"] for r in merged} == set(folders)
    assert {r["arch"] for r in merged} == {"x86_64", "aarch64"}
    native = [r for r in merged if r["arch"] == "x86_64"]
    emulated = [r for r in merged if r["arch"] == "aarch64"]
    assert {r["row"] for r in emulated} == {r["row"] for r in native} >= {"ort_composite", "ort_custom", "ort_copy"}
    assert all(float(r["p50_ms"]) > 0 and r["device"] for r in native)
    # Emulated timings are never results: the rows say where they ran and leave the figures empty.
    assert all(r["p50_ms"] == "" and r["gb_per_s"] == "" and r["timing_method"] == fanout.EMULATED_METHOD
               for r in emulated)
    assert not list((results / "cpu").glob("*-arm64-*/samples.csv"))
    assert (results / "across_hosts.png").stat().st_size > 10_000


def test_fanout_pulls_a_missing_image_from_the_registry_and_checks_it(arm64_images, registry, tmp_path_factory,
                                                                      tmp_path):
    from conftest import extra_daemon

    images = {"amd64": arm64_images["infer"], "arm64": arm64_images["infer-arm64"]}
    docker.push_multiarch(images, f"{registry}/fan", log=lambda m: None)
    results = tmp_path / "results"
    with extra_daemon(tmp_path_factory.mktemp("dockerd-pull")) as fresh:
        status = fanout.main([f"--on={fresh}@cpu/arm64", "--registry", f"{registry}/fan", "--results", str(results),
                              "--timeout", "1200", *BENCH_ARGS])
        assert status == 0
        assert docker.image_id(images["arm64"], host=fresh) == docker.image_id(images["arm64"])
        assert docker.image_architecture(images["arm64"], host=fresh) == "arm64"
    rows = _csv(next((results / "cpu").glob("*-arm64-*/bench.csv")))
    assert rows and all(r["p50_ms"] == "" and r["arch"] == "aarch64" for r in rows)


def test_fanout_failure_of_one_target_leaves_the_others(arm64_images, tmp_path):
    results = tmp_path / "results"
    log = []
    status = fanout.run(["docker@cpu", "unix:///nonexistent/docker.sock@cpu"], BENCH_ARGS, results=results,
                        timeout=600, log=log.append)
    assert status == 1
    assert any(line.startswith("FAIL unix:///nonexistent/docker.sock@cpu") and "no Docker daemon answers" in line
               for line in log), log
    assert len(list((results / "cpu").glob("*/bench.csv"))) == 1
    assert _csv(results / "bench_all.csv")


def test_fanout_timeout_removes_its_container_and_writes_nothing(arm64_images, tmp_path):
    results = tmp_path / "results"
    log = []
    # the fan-out's own containers (another worker's tests may run containers of their own meanwhile)
    mine = ("ps", "-aq", "--filter", f"label={fanout.FANOUT_LABEL}")
    before = set(docker._docker(*mine).stdout.decode().split())
    status = fanout.run(["docker@cpu"], ["--workload", "swish", "--runs", "100000"], results=results, timeout=20,
                        log=log.append)
    assert status == 1 and any("did not finish in time" in line for line in log), log
    assert not results.exists()
    assert set(docker._docker(*mine).stdout.decode().split()) <= before


def test_fanout_refuses_what_it_cannot_run(tmp_path):
    with pytest.raises(ValueError, match="a fan-out target is a Docker daemon"):
        fanout.run(["local"], [], results=tmp_path)
    with pytest.raises(ValueError, match="given twice"):
        fanout.run(["docker", "docker"], [], results=tmp_path)


def test_the_aarch64_plugin_wheel_runs_every_artifact_under_emulation(arm64_images, artifacts, tmp_path):
    """`nox -s wheels -- cpu --only ort --arch arm64`: the plugin cross-compiled into a manylinux aarch64
    wheel, installed in a clean venv of an arm64 container (qemu-user) with the entry's aarch64 onnxruntime
    and numpy, and every artifact that runs the plugin (custom lowering: the decomposed ones are ORT's own,
    which the proof ran under emulation) against PyTorch's x86-64 outputs (layer 3's tolerance). Builds its
    own venv: a clean one is what a user installs the wheel into."""
    from lab import dist, wheels

    entry = matrix.entry("cpu")
    built = dist.build_all("cpu", tmp_path / "dist", kinds=("ort",), plat=ARM64, log=lambda m: None)
    record = built["ort-aarch64"]
    assert record["policy"].endswith("_aarch64") and record["wheel"].endswith(f"-py3-none-{record['policy']}.whl")
    assert dist.policy_glibc(record["policy"]) <= dist.PLUGIN_GLIBC, record
    pins = [p for p in matrix.pip_pins(entry) if p.split("==")[0] in ("numpy", entry["onnxruntime"]["package"])]
    script = (f"python{entry['python']} -m venv /tmp/v && /tmp/v/bin/pip install --quiet --no-index --find-links "
              f"/wheels {' '.join(pins)} /dist/{record['wheel']} && cd /tmp && /tmp/v/bin/python -c "
              "'import platform; print(platform.machine())' && /tmp/v/bin/python -I /checks/plugin_layer2.py /artifacts 1e-5 '*-custom-*'")
    house = wheels.wheelhouse_dir(entry, ARM64)
    result = docker._docker("run", "--rm", "--network", "none", "--entrypoint", "sh", "-v", f"{house}:/wheels:ro",
                            "-v", f"{tmp_path / 'dist'}:/dist:ro", "-v", f"{artifacts}:/artifacts:ro",
                            "-v", f"{Path(__file__).parent / 'wheel_checks'}:/checks:ro",
                            arm64_images["infer-arm64"], "-c", script, timeout=1800, check=False)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, (out + err)[-3000:]
    assert out.splitlines()[0] == "aarch64", out[-2000:]
    report = json.loads(out.splitlines()[-1])
    manifest = json.loads((artifacts / "manifest.json").read_text())
    custom = [m["file"] for m in manifest["models"] if "-custom-" in m["file"]]
    assert [c.split(":")[0] for c in report["checked"]] == custom and custom, report
