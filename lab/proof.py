"""Proof, without a GPU, that an entry's images are right up to the driver.

    python -m lab.proof ENTRY        (nox -s build runs it after building each entry)

Each check runs in a container of the image (no network) or on a file copied out of it, and lands
as one row of results/image_proofs.csv (entry, image, image id, size, check, result, detail):

infer  no-torch                  `import torch` fails: the image is PyTorch-free
       plugin-needed             every NEEDED of the plugin resolves (`ldd -r`: the real loader, no code run)
       ort-cuda-needed           the same for onnxruntime's CUDA provider, symbols included
       ort-cuda-session          a CUDA-EP session against the toolkit's driver stub ends in the driver's
                                 own "stub"/"no device" error, never in a missing library
       plugin-cuda-archs         cuobjdump of the plugin lists exactly the architectures built
       verify-cpu                the artifacts run through the plugin on the CPU EP, matching torch
infer-arm64 (and any other architecture in infer_platforms; run here under qemu-user emulation)
       architecture              the image, its Python (uname -m) and the plugin's ELF machine are that architecture
       no-torch, plugin-needed, verify-cpu    as above
train  torch-cuda                torch.version.cuda and the cuDNN major are the entry's
       extension-archs           cuobjdump of the extension lists exactly the architectures built
       extension-loads           the extension loads into torch (its CUDA symbols resolve) with a CUDA kernel
       plugin-cuda               the train image's plugin was built with CUDA, for those architectures
       nvcc                      the compiler the image built with
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import compat, docker, emulation, matrix, platforms, toolkit
from .files import write_text_atomic

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "image_proofs.csv"
COLUMNS = ["entry", "kind", "image", "image_id", "size_bytes", "check", "result", "detail", "git_sha", "timestamp"]
# onnxruntime's CUDA provider library inside an image, as a shell expression; ORT loads it after
# libonnxruntime_providers_shared.so (RTLD_GLOBAL), which defines symbols it uses (Provider_GetHost).
_CAPI = "$(python -c 'import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))')/capi"
PROVIDER = f"{_CAPI}/libonnxruntime_providers_cuda.so"
PROVIDER_SHARED = f"{_CAPI}/libonnxruntime_providers_shared.so"
# What a CUDA-EP session says when it got as far as the driver (cudart's own messages).
DRIVER_ANSWERS = ("stub library", "no CUDA-capable device", "CUDA driver version is insufficient",
                  "cudaErrorStubLibrary", "cudaErrorNoDevice", "cudaErrorInsufficientDriver")
STUB_DIR = "/opt/driver-stub"
MISSING_LIBRARY = ("cannot open shared object file", "Failed to load library", "undefined symbol", "not found")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _in_image(image: str, script: str, *, entrypoint: str = "sh", mounts: dict | None = None, env: dict | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    extra = []
    for source, target in (mounts or {}).items():
        extra += ["-v", f"{source}:{target}:ro"]
    for key, value in (env or {}).items():
        extra += ["-e", f"{key}={value}"]
    cmd = ["docker", "run", "--rm", "--network", "none", "--entrypoint", entrypoint, *extra, image, "-c", script]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                              env=docker.daemon_env(None))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"no answer within {timeout} s")


def _out(result: subprocess.CompletedProcess) -> str:
    return (result.stdout + result.stderr).strip()


def _copy_out(image: str, path: str, dest: Path) -> Path:
    container = docker._docker("create", image).stdout.decode().strip()
    try:
        docker._docker("cp", f"{container}:{path}", str(dest))
    finally:
        docker._docker("rm", container, check=False)
    return dest


def _ldd(image: str, library_expr: str, preload: str | None = None, stub: Path | None = None) -> Check:
    """`ldd -r` inside the image: the loader resolves NEEDED and symbols, and runs no library code.
    The driver (libcuda.so.1, which newer onnxruntime builds link) comes from the host under --gpus;
    here the toolkit's driver stub stands in for it."""
    first = f'LD_PRELOAD={preload} ' if preload else ""
    mounts, env = ({str(stub): f"{STUB_DIR}/libcuda.so.1"}, {"LD_LIBRARY_PATH": STUB_DIR}) if stub else ({}, {})
    result = _in_image(image, f'lib={library_expr}; echo "$lib"; {first}ldd -r "$lib"', mounts=mounts, env=env)
    out = _out(result)
    lines = out.splitlines()
    bad = [line.strip() for line in lines[1:] if any(m in line for m in ("not found", "undefined symbol"))]
    resolved = [re.sub(r"\s*\(0x[0-9a-f]+\)", "", line.strip()) for line in lines[1:] if "=>" in line]
    resolved = [re.sub(r"/opt/venv/lib/python[\d.]+/site-packages/", "", line) for line in resolved]
    resolved = ["libcuda.so.1 => the driver stub (the host's driver under --gpus)" if STUB_DIR in line else line
                for line in resolved]
    cuda = [r for r in resolved if re.match(r"lib(cu|nv)", r)]
    if result.returncode != 0 or bad or not lines:
        return Check("", False, f"{lines[0] if lines else '?'}: " + ("; ".join(bad[:6]) or out[-400:]))
    return Check("", True, f"{len(resolved)} NEEDED resolved" + (": " + "; ".join(cuda) if cuda else ""))


def _archs(library: Path, wanted: list[str]) -> Check:
    from lab.cuda_archs import compare, compiled_archs, expected_archs, find_cuobjdump

    tool = find_cuobjdump()
    if tool is None:
        return Check("", False, "no cuobjdump here (the entry's toolkit has one: python -m lab.toolkit ENTRY)")
    try:
        have = compiled_archs(library, tool)
    except RuntimeError as exc:
        return Check("", False, str(exc))
    problem = compare(have, expected_archs(" ".join(wanted)))
    return Check("", problem is None, f"{', '.join(sorted(have))}" + (f": {problem}" if problem else ""))


SESSION = r'''
import sys, onnxruntime as ort
from pathlib import Path
artifacts = Path("/opt/myops/artifacts")
model = min(artifacts.glob("*-decomposed-*.onnx"), key=lambda path: (path.stat().st_size, path.name))
options = ort.SessionOptions()
options.log_severity_level = 3
try:
    # The provider options the lab's sessions pass (lab.compat.ort_fp32_exact): a release that did
    # not know one would refuse it here, before reaching the driver.
    session = ort.InferenceSession(str(model), options, providers=[("CUDAExecutionProvider", PROVIDER_OPTIONS)])
    print("SESSION providers:", session.get_providers())
except Exception as exc:
    print("SESSION error:", exc)
'''


def prove_infer(entry: dict, image: str, archs: list[str], stub: Path | None) -> list[Check]:
    checks = []
    result = _in_image(image, "import torch", entrypoint="python")
    checks.append(Check("no-torch", result.returncode != 0 and "No module named 'torch'" in result.stderr,
                        _out(result).splitlines()[-1] if _out(result) else "import torch succeeded"))
    plugin = _ldd(image, docker.installed_plugin(entry))
    checks.append(Check("plugin-needed", plugin.ok, plugin.detail))
    result = _in_image(image, "python -m infer.runner verify --providers CPUExecutionProvider")
    said = result.stdout.strip().splitlines() or _out(result).splitlines()  # stdout: its verdict, not a warning
    checks.append(Check("verify-cpu", result.returncode == 0 and "all models match" in result.stdout,
                        said[-1] if said else "no output"))
    if entry["device"] != "cuda":
        return checks
    provider = _ldd(image, PROVIDER, preload=PROVIDER_SHARED, stub=stub)
    checks.append(Check("ort-cuda-needed", provider.ok, provider.detail))
    if stub is None:
        checks.append(Check("ort-cuda-session", False, "no CUDA driver stub (libcuda.so) in the toolkit to run against"))
    else:
        provider_options = {"arena_extend_strategy": "kSameAsRequested",
                            **compat.ort_fp32_exact(entry["onnxruntime"]["version"])[0]}
        script = SESSION.replace("PROVIDER_OPTIONS", repr(provider_options))
        result = _in_image(image, script, entrypoint="python", mounts={str(stub): f"{STUB_DIR}/libcuda.so.1"},
                           env={"LD_LIBRARY_PATH": STUB_DIR})
        found = _classify_session(result)
        checks.append(Check(found.name, found.ok, f"{found.detail} (driver stub of {stub.parent.parent.parent.name})"))
    with tempfile.TemporaryDirectory() as tmp:
        library = _copy_out(image, docker.installed_plugin(entry), Path(tmp) / "libmyops_ort.so")
        found = _archs(library, archs)
    checks.append(Check("plugin-cuda-archs", found.ok, found.detail))
    return checks


ELF_MACHINE = {"amd64": "EM_X86_64", "arm64": "EM_AARCH64"}


def prove_foreign_infer(entry: dict, image: str, plat: platforms.Platform) -> list[Check]:
    """An infer image for another architecture: it is that architecture through and through, and it
    runs the artifacts through its plugin, matching torch's outputs (under emulation here)."""
    from elftools.elf.elffile import ELFFile

    marked = docker.image_architecture(image)
    # stdout alone: the docker CLI warns on stderr that the image is not the host's platform.
    machine = _in_image(image, "import platform; print(platform.machine())", entrypoint="python").stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        library = _copy_out(image, docker.installed_plugin(entry), Path(tmp) / "libmyops_ort.so")
        with open(library, "rb") as handle:
            elf = ELFFile(handle)["e_machine"]
    ok = marked == plat.docker and machine == plat.machine and elf == ELF_MACHINE[plat.docker]
    checks = [Check("architecture", ok, f"image {marked}, python on {machine}, plugin {elf}")]
    return checks + prove_infer(entry, image, [], None)


def _classify_session(result: subprocess.CompletedProcess) -> Check:
    out = _out(result)
    said = next((line for line in out.splitlines() if any(a in line for a in DRIVER_ANSWERS)), None)
    missing = next((line for line in out.splitlines() if any(m in line for m in MISSING_LIBRARY)), None)
    if missing:
        return Check("ort-cuda-session", False, f"a library is missing: {missing.strip()[:300]}")
    if result.returncode < 0 or result.returncode > 128:
        return Check("ort-cuda-session", False, f"crashed (signal {abs(result.returncode) % 128}) after: "
                     + " | ".join(out.splitlines()[-3:])[:300])
    if said:
        failure = re.search(r"CUDA failure (\d+): ([^;]+?)\s*;.*?expr=([^;]+);", out)
        words = f"CUDA failure {failure[1]} ({failure[2]}) at {failure[3]}" if failure else said.strip()
        return Check("ort-cuda-session", True, f"reached the driver: {words[:300]}")
    return Check("ort-cuda-session", False, "neither a driver answer nor a missing library: " + out[-300:])


TORCH_FACTS = r'''
import json, torch
print(json.dumps({"cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}))
'''
EXTENSION_LOADS = r'''
import torch
from ops.build import build_info
torch.ops.load_library(build_info()["library"])
from opspec import TORCH_OPS
print("CUDA kernel:", all(torch._C._dispatch_has_kernel_for_dispatch_key(f"myops::{op}", "CUDA") for op in TORCH_OPS))
'''
PLUGIN_INFO = r'''
import json
from pathlib import Path
info = [json.loads(p.read_text()) for p in Path("/lab/build/ort_plugin").glob("*/build_info.json")]
print(json.dumps(info))
'''


def prove_train(entry: dict, image: str, archs: list[str], own_toolkit: bool = True) -> list[Check]:
    if entry["device"] != "cuda":
        return []
    checks = []
    result = _in_image(image, TORCH_FACTS, entrypoint="python")
    try:
        facts = json.loads(result.stdout.strip().splitlines()[-1])
        cudnn_major = (facts["cudnn"] or 0) // 10000 if (facts["cudnn"] or 0) >= 10000 else (facts["cudnn"] or 0) // 1000
        ok = facts["cuda"] == entry["cuda"] and cudnn_major == entry["cudnn"]
        checks.append(Check("torch-cuda", ok, f"torch.version.cuda {facts['cuda']}, cuDNN {facts['cudnn']} "
                                              f"(entry: CUDA {entry['cuda']}, cuDNN {entry['cudnn']})"))
    except (ValueError, IndexError, KeyError, TypeError):
        checks.append(Check("torch-cuda", False, _out(result)[-300:]))
    result = _in_image(image, "python -m ops.check_archs")
    checks.append(Check("extension-archs", result.returncode == 0, _out(result).splitlines()[-1] if _out(result) else ""))
    result = _in_image(image, EXTENSION_LOADS, entrypoint="python")
    checks.append(Check("extension-loads", result.returncode == 0 and "CUDA kernel: True" in result.stdout,
                        _out(result).splitlines()[-1] if _out(result) else ""))
    result = _in_image(image, PLUGIN_INFO, entrypoint="python")
    try:
        infos = [i for i in json.loads(result.stdout.strip().splitlines()[-1]) if i.get("with_cuda")]
        ok = bool(infos) and set(infos[0]["cuda_architectures"].split(";")) == set(docker.cmake_cuda_architectures(archs).split(";"))
        checks.append(Check("plugin-cuda", ok, f"with CUDA {infos[0]['cuda_compiler_version']}, architectures "
                                               f"{infos[0]['cuda_architectures']}" if infos else "no CUDA build of the plugin"))
    except (ValueError, IndexError, KeyError):
        checks.append(Check("plugin-cuda", False, _out(result)[-300:]))
    result = _in_image(image, "nvcc --version | tail -n 2 | head -n 1")
    version = _out(result)
    # the lab's toolkit: exactly its pin's CUDA release; a base image's own: the entry's major
    wanted = f"release {matrix.toolkit_cuda_version(entry['toolkit'])}," if own_toolkit else f"release {entry['cuda'].split('.')[0]}."
    checks.append(Check("nvcc", result.returncode == 0 and wanted in version, f"{version} (wanted: {wanted.strip(',.')})"))
    return checks


def _image_facts(tag: str) -> tuple[str, int]:
    out = docker._docker("image", "inspect", "--format", "{{.Id}} {{.Size}}", tag).stdout.decode().split()
    return out[0], int(out[1])


def prove(entry_id: str, *, base_overrides: dict | None = None, results: Path = RESULTS, log=print) -> list[dict]:
    """Run every check on the entry's two built images; write their rows into `results` and return them."""
    from lab.provenance import git_state

    entry = matrix.entry(entry_id)
    tags = docker.image_tags(entry)
    plan = docker.build_plan(entry, base_overrides)
    stub = None
    if entry["device"] == "cuda":
        stub = driver_stub(entry, log=log)
        _toolkit_on_path(entry)
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    sha = git_state()["git_sha"]
    rows = []
    own_toolkit = not (base_overrides or {}).get("build")
    for kind, checks in (("train", lambda: prove_train(entry, tags["train"], plan["archs"], own_toolkit)),
                         ("infer", lambda: prove_infer(entry, tags["infer"], plan["archs"], stub))):
        if docker.image_id(tags[kind]) is None:
            raise docker.DockerError(f"{tags[kind]} is not built: run `nox -s build -- {entry_id}` first")
        image_id, size = _image_facts(tags[kind])
        found = checks()
        for check in found:
            log(f"[proof] {tags[kind]}: {'PASS' if check.ok else 'FAIL'} {check.name}: {check.detail}")
            rows.append({"entry": entry_id, "kind": kind, "image": tags[kind], "image_id": image_id, "size_bytes": size,
                         "check": check.name, "result": "pass" if check.ok else "fail", "detail": check.detail,
                         "git_sha": sha, "timestamp": now})
        if plan["not_built"] and kind == "infer":  # a statement, not a check: it is in the image's labels too
            note = "not compiled here, not claimed (the toolkit cannot target them): " + "; ".join(plan["not_built"])
            log(f"[proof] {tags[kind]}: NOTE {note}")
            rows.append({**rows[-1], "check": "archs-not-built", "result": "note", "detail": note})
    for plat in platforms.infer_platforms(entry)[1:]:
        tag = docker.image_tags(entry, plat)["infer"]
        if docker.image_id(tag) is None:
            continue  # built only when asked for (nox -s build -- ENTRY --arch all)
        image_id, size = _image_facts(tag)
        why = emulation.problem(plat)
        found = [Check("architecture", False, f"cannot run it here: {why}")] if why else prove_foreign_infer(entry, tag, plat)
        for check in found:
            log(f"[proof] {tag}: {'PASS' if check.ok else 'FAIL'} {check.name}: {check.detail}")
            rows.append({"entry": entry_id, "kind": f"infer-{plat.docker}", "image": tag, "image_id": image_id,
                         "size_bytes": size, "check": check.name, "result": "pass" if check.ok else "fail",
                         "detail": check.detail, "git_sha": sha, "timestamp": now})
    _upsert(rows, results)
    return rows


def driver_stub(entry: dict, *, log=print) -> Path:
    """The driver stub (libcuda.so) of the entry's toolkit. CUDA 13's wheels ship none; then the one
    of the newest Debian-packaged toolkit in the matrix, assembled if need be: any CUDA's stub exports
    the driver API and answers cuInit with "stub library"."""
    own = toolkit.home(entry) / "lib64" / "stubs" / "libcuda.so"
    if own.exists():
        return own
    debian_entries = [e for e in (matrix.entry(name) for name in matrix.load()["entries"])
                      if e["device"] == "cuda" and e["toolkit"]["source"] == "debian"]
    donor = max(debian_entries, key=lambda e: compat.release(matrix.toolkit_cuda_version(e["toolkit"])))
    return toolkit.assemble(donor, log=log) / "lib64" / "stubs" / "libcuda.so"


def _toolkit_on_path(entry: dict) -> None:
    """cuobjdump for the copied-out binaries: the entry's own toolkit's, when assembled here."""
    import os

    home = toolkit.home(entry)
    if (home / "bin" / "cuobjdump").exists() and not os.environ.get("CUOBJDUMP"):
        os.environ["CUOBJDUMP"] = str(home / "bin" / "cuobjdump")


def _upsert(rows: list[dict], results: Path) -> None:
    keep = []
    if results.exists():
        with open(results, newline="") as handle:
            done = {(r["entry"], r["kind"]) for r in rows}
            keep = [r for r in csv.DictReader(handle) if (r["entry"], r["kind"]) not in done]
    ordered = sorted(keep + rows, key=lambda r: (r["entry"], r["kind"], r["check"]))
    with tempfile.TemporaryFile("w+", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(ordered)
        handle.seek(0)
        buffer = handle.read()
    write_text_atomic(results, buffer)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        rows = prove(argv[0])
    except (docker.DockerError, matrix.MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    checks = [r for r in rows if r["result"] != "note"]
    failed = [r for r in checks if r["result"] != "pass"]
    print(f"[proof] {argv[0]}: {len(checks) - len(failed)}/{len(checks)} checks passed; {RESULTS.relative_to(REPO)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
