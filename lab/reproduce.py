"""Build an entry's artifacts twice and compare them byte for byte, in the manner of reprotest.

    python -m lab.reproduce [ENTRY] [--cuda-architectures 90-real] [--results results]
    python -m lab.reproduce cuda12.1     (a CUDA entry: its wheels, built in its images, twice)

Two clones of the committed HEAD, in folders of different names and depths, each built with a
different time zone, locale and umask (SOURCE_DATE_EPOCH is the commit's time in both): the
PyTorch extension, the ONNX Runtime plugin (CPU, and CUDA where nvcc is here and architectures are
given), the wheels users install (lab.dist: myops-ort, myops-torch), and every artifact the infer
side runs (ONNX files, inputs, references, manifest). Each pair is compared by sha256; a difference gets a diffoscope report under build/reproduce/ where
diffoscope is installed. Where the entry's images are here, the host build is compared with
theirs as well: identical where the toolchains match, and the record says why where they cannot.

Writes the entry's rows of results/reproducibility.csv (other entries' rows stay); exits 1 on any
difference not explained in EXPLAINED.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .docker import DockerError
from .files import read_csv, shown, write_csv_atomic

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "build" / "reproduce"
COLUMNS = ["entry", "artifact", "compared", "sha256_a", "sha256_b", "identical", "cause", "git_sha", "timestamp"]

# The two builds' differences of circumstance (reprotest's variations that matter here).
VARIATIONS = {
    "a": {"folder": "a/myops-lab", "env": {"TZ": "UTC", "LC_ALL": "C", "LANG": "C"}, "umask": 0o022},
    "b": {"folder": "build-two/deeper/other-name", "env": {"TZ": "Pacific/Chatham", "LC_ALL": "C.UTF-8",
                                                           "LANG": "C.UTF-8"}, "umask": 0o077},
}

# Differences that are understood and cannot be removed, by artifact or by (comparison, artifact):
# none today. A new one goes here with its cause, or is fixed.
EXPLAINED: dict = {}


class ReproduceError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[reproduce] {message}", flush=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


@dataclass
class Build:
    label: str
    root: Path
    env: dict
    umask: int

    def run(self, *args: str, what: str, timeout: float = 1800) -> str:
        began = time.monotonic()
        result = subprocess.run([sys.executable, *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                                timeout=timeout, preexec_fn=lambda: os.umask(self.umask))
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise ReproduceError(f"build {self.label}: {what} failed ({result.returncode}):\n{tail}")
        log(f"build {self.label}: {what} ({time.monotonic() - began:.0f} s)")
        return result.stdout


def clone(workdir: Path, label: str, epoch: str) -> Build:
    variation = VARIATIONS[label]
    root = workdir / variation["folder"]
    root.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(root)], check=True)
    # Nothing that points a build at another folder's files.
    env = {key: value for key, value in os.environ.items()
           if key not in ("MYOPS_ORT_PLUGIN", "MYOPS_BUILD_DIR", "MYOPS_PLUGIN_BUILD_DIR", "ORT_INCLUDE_DIR")}
    env.update(variation["env"], SOURCE_DATE_EPOCH=epoch, PYTHONDONTWRITEBYTECODE="1")
    return Build(label, root, env, variation["umask"])


def build_all(build: Build, entry: str, cuda_architectures: str | None) -> dict[str, Path]:
    """{artifact name: file} of one clone's build."""
    found: dict[str, Path] = {}
    build.run("-m", "ops.build", what="PyTorch extension")
    (extension,) = build.root.glob("build/ops/*/myops.so")
    found["extension"] = extension
    plugin = build.run("-m", "ort_plugin.build", "--cuda", "OFF", what="ORT plugin, CPU").strip().splitlines()[-1]
    found["ort plugin (CPU)"] = Path(plugin)
    if cuda_architectures:
        plugin = build.run("-m", "ort_plugin.build", "--cuda", "ON", "--cuda-architectures", cuda_architectures,
                           what=f"ORT plugin, CUDA {cuda_architectures}").strip().splitlines()[-1]
        found[f"ort plugin (CUDA {cuda_architectures})"] = Path(plugin)
    dist = build.root / "dist" / entry
    build.run("-m", "lab.dist", entry, "--out", str(dist), what="wheels (myops-ort, myops-torch)")
    for wheel in sorted(dist.glob("*.whl")):
        found[f"wheel {wheel.name.split('-')[0]}"] = wheel
    artifacts = build.root / "build" / "artifacts"
    build.run("-m", "ops.artifacts", "--out", str(artifacts), "--entry", entry, what="ONNX files, inputs, references")
    for path in sorted(artifacts.iterdir()):
        found[f"artifacts/{path.name}"] = path
    return found


def build_cuda_wheels(build: Build, entry: str) -> dict[str, Path]:
    """{artifact name: file} of one clone's build of a CUDA entry's wheels: in the entry's images (lab.dist),
    the infer image's plugin stage built again without Docker's cache, the extension compiled anew in the
    train image. Its other artifacts come from its images (nox -s build) and are not rebuilt here."""
    dist = build.root / "dist" / entry
    build.run("-m", "lab.dist", entry, "--no-cache", "--out", str(dist), what=f"{entry} wheels, in its images",
              timeout=7200)
    return {f"wheel {wheel.name.split('-')[0]}": wheel for wheel in sorted(dist.glob("*.whl"))}


def merged(path: Path, entry: str, rows: list[dict]) -> list[dict]:
    """The rows of path for other entries, then `rows`: one entry's run replaces only its own rows."""
    return [r for r in read_csv(path) if r["entry"] != entry] + rows


HOST_VS_IMAGE = "host build (a) vs the entry's images"
REVISION_LABEL = "org.opencontainers.image.revision"


def from_images(entry_id: str, head: str, out: Path, *, build: bool) -> tuple[dict[str, Path], str | None]:
    """{artifact: file} copied out of the entry's images (built first when missing or from another
    commit, if `build`), or why there are none."""
    from . import docker, matrix

    entry = matrix.entry(entry_id)
    tags = docker.image_tags(entry)
    if docker.daemon_version() is None:
        return {}, "no Docker daemon answers here"

    def stale() -> str | None:
        for tag in tags.values():
            if docker.image_id(tag) is None:
                return f"{tag} is not built here"
            if (docker.image_labels(tag) or {}).get(REVISION_LABEL) != head:
                return f"{tag} was built from another commit than HEAD {head[:12]}"
        return None

    why = stale()
    if why and build:
        log(f"{why}: building the {entry_id} images from this checkout")
        docker.build_images(entry_id, log=log)
        why = stale()
    if why:
        return {}, why + f" (`nox -s build -- {entry_id}`, or --images to build them here)"
    found: dict[str, Path] = {}
    for kind, copies in (("infer", {docker.installed_plugin(entry): "ort plugin (image)",
                                    "/opt/myops/artifacts": "artifacts"}),
                         ("train", {"/lab/build/ops": "train-build"})):
        (out / kind).mkdir(parents=True, exist_ok=True)
        container = docker._docker("create", tags[kind]).stdout.decode().strip()
        try:
            for source, name in copies.items():
                docker._docker("cp", f"{container}:{source}", str(out / kind / name.replace(" ", "_")))
        finally:
            docker._docker("rm", container, check=False)
    found["ort plugin (CPU)" if entry["device"] == "cpu" else "ort plugin (CUDA, image)"] = \
        out / "infer" / "ort_plugin_(image)"
    for path in sorted((out / "infer" / "artifacts").iterdir()):
        found[f"artifacts/{path.name}"] = path
    (extension,) = (out / "train" / "train-build").glob("*/myops.so")
    found["extension"] = extension
    return found, None


LOCK_AGAIN = "the committed lock vs one written again from its wheels"


def locks_again(entry_id: str, out: Path) -> tuple[dict[str, Path], dict[str, Path], str | None]:
    """Each committed lock of the entry and the lock lab.wheels writes from the very wheels it pins
    (the wheels-to-lock mapping), or why not: the wheels must be in the wheelhouse (--images fetches them)."""
    from . import matrix, wheels

    entry = matrix.entry(entry_id)
    house = wheels.WHEELHOUSE / entry["id"]
    committed, again = {}, {}
    for kind in wheels.KINDS:
        lock = wheels.lock_path(entry, kind)
        if not lock.exists():
            continue
        _, pinned = wheels.read_lock(lock)
        try:
            found = {wheels.find_wheel(house, p.name, p.version): p.index for p in pinned}
        except wheels.WheelError:
            return {}, {}, f"the wheelhouse {shown(house)} lacks {lock.name}'s wheels (--images fetches them)"
        name = f"lock {shown(lock)}"
        committed[name], again[name] = lock, out / lock.name
        out.mkdir(parents=True, exist_ok=True)
        wheels.write_lock(again[name], entry, kind, wheels.requirements(entry, kind), found)
    return committed, again, None


def diffoscope(name: str, a: Path, b: Path) -> str:
    """A report of how a and b differ, kept under build/reproduce/; what it says, in one line."""
    if shutil.which("diffoscope") is None:
        return "diffoscope is not installed (Debian: apt-get install diffoscope-minimal) to say how"
    REPORTS.mkdir(parents=True, exist_ok=True)
    report = REPORTS / (name.replace("/", "_").replace(" ", "_") + ".diffoscope.txt")
    subprocess.run(["diffoscope", "--text", str(report), "--no-progress", str(a), str(b)], capture_output=True,
                   timeout=600)
    return f"see {shown(report)}"


def compare(entry: str, a: dict[str, Path], b: dict[str, Path], compared: str, facts: dict) -> list[dict]:
    rows = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            rows.append(dict(facts, entry=entry, artifact=name, compared=compared, identical=False,
                             sha256_a=sha256(a[name]) if name in a else "", sha256_b=sha256(b[name]) if name in b else "",
                             cause=f"only in build {'a' if name in a else 'b'}"))
            continue
        digest_a, digest_b = sha256(a[name]), sha256(b[name])
        same = digest_a == digest_b
        cause = "" if same else (EXPLAINED.get((compared, name)) or EXPLAINED.get(name)
                                 or f"unexplained: {diffoscope(name, a[name], b[name])}")
        rows.append(dict(facts, entry=entry, artifact=name, compared=compared, sha256_a=digest_a, sha256_b=digest_b,
                         identical=same, cause=cause))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.reproduce", description=__doc__.splitlines()[0])
    parser.add_argument("entry", nargs="?", default="cpu")
    parser.add_argument("--cuda-architectures", help="also build the CUDA plugin for these (CMake syntax), where "
                                                     "nvcc is here; e.g. 90-real")
    parser.add_argument("--images", action="store_true", help="build the entry's images from this checkout where "
                        "they are missing or from another commit, and compare the host build with them")
    parser.add_argument("--results", type=Path, default=REPO / "results")
    args = parser.parse_args(argv)
    if args.cuda_architectures and shutil.which("nvcc") is None:
        print("error: --cuda-architectures needs nvcc on PATH", file=sys.stderr)
        return 2
    from . import matrix

    try:
        cuda = matrix.entry(args.entry)["device"] == "cuda"
    except matrix.MatrixError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if cuda and (args.cuda_architectures or args.images):
        print(f"error: {args.entry} is a CUDA entry: its reproduction builds its wheels in its images; "
              "--cuda-architectures and --images are for a CPU entry's host build", file=sys.stderr)
        return 2
    if _git("status", "--porcelain", "--untracked-files=no"):
        log("note: uncommitted changes are not part of the comparison (both builds are clones of HEAD)")
    epoch = _git("log", "-1", "--format=%ct")
    facts = {"git_sha": _git("rev-parse", "HEAD"), "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="myops-reproduce-") as tmp:
            builds = [clone(Path(tmp), label, epoch) for label in VARIATIONS]
            for build in builds:
                log(f"build {build.label} in {build.root} (TZ {build.env['TZ']}, LC_ALL {build.env['LC_ALL']}, "
                    f"umask {build.umask:03o})")
            if cuda:
                found = [build_cuda_wheels(build, args.entry) for build in builds]
            else:
                found = [build_all(build, args.entry, args.cuda_architectures) for build in builds]
            rows = compare(args.entry, *found, compared="two clean builds in different folders", facts=facts)
            imaged, why = ({}, "a CUDA entry's clones build its wheels; tests/test_cuda_images.py compares the plugin "
                               "wheel's library with the infer image's") if cuda else \
                from_images(args.entry, facts["git_sha"], Path(tmp) / "images", build=args.images)
            if why:
                log(f"host vs image: not compared: {why}")
                rows.append(dict(facts, entry=args.entry, artifact="(the entry's images)", compared=HOST_VS_IMAGE,
                                 sha256_a="", sha256_b="", identical="", cause=f"not compared: {why}"))
            else:
                shared = {name: found[0][name] for name in imaged if name in found[0]}
                rows += compare(args.entry, shared, {name: imaged[name] for name in shared}, HOST_VS_IMAGE, facts)
            committed, again, why = locks_again(args.entry, Path(tmp) / "locks")
            if why:
                log(f"locks: not compared: {why}")
                rows.append(dict(facts, entry=args.entry, artifact="(the entry's locks)", compared=LOCK_AGAIN,
                                 sha256_a="", sha256_b="", identical="", cause=f"not compared: {why}"))
            else:
                rows += compare(args.entry, committed, again, LOCK_AGAIN, facts)
    except (ReproduceError, subprocess.SubprocessError, ValueError, DockerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_csv_atomic(args.results / "reproducibility.csv", merged(args.results / "reproducibility.csv", args.entry, rows),
                     COLUMNS)
    different = [r for r in rows if r["identical"] is False]
    unexplained = [r for r in different if r["cause"].startswith(("unexplained", "only in"))]
    compared = [r for r in rows if r["identical"] != ""]
    for r in compared:
        log(f"{'identical' if r['identical'] else 'DIFFERENT'}  {r['artifact']} ({r['compared']})"
            + (f"  {r['sha256_a'][:16]}" if r["identical"] else f"  {r['cause']}"))
    log(f"{len(compared) - len(different)} of {len(compared)} comparisons identical, {len(unexplained)} unexplained "
        "differences; "
        f"{time.monotonic() - began:.0f} s; wrote {shown(args.results / 'reproducibility.csv')}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    raise SystemExit(main())
