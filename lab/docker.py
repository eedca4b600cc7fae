"""Docker side of the lab: daemon checks, local base images, wheelhouses with lock files, the two
images per matrix entry, and publishing them. Used by `nox -s build|publish` and the tests.

Every failure a user can hit ends in one DockerError whose message says what to do.
"""
from __future__ import annotations

import datetime as _dt
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ort_plugin.headers import debian_mirror

from . import matrix
from .files import write_text_atomic

REPO = Path(__file__).resolve().parent.parent
DOCKER_DIR = REPO / "docker"
LOCKS = DOCKER_DIR / "locks"
WHEELHOUSE = REPO / "build" / "wheelhouse"
CONTEXT_ROOT = REPO / "build" / "docker-context"
TOOLS = REPO / "requirements" / "tools.txt"
# Debian packages of the locally made base images (containers here cannot reach a package index).
BASE_RECIPES = {
    "debootstrap-runtime": ["python3", "python3-venv", "ca-certificates"],
    "debootstrap-build": ["python3", "python3-venv", "ca-certificates", "g++", "make", "cmake", "python3-dev"],
}


class DockerError(RuntimeError):
    pass


def _docker(*args: str, host: str | None = None, timeout: float | None = 600, check: bool = True,
            capture: bool = True) -> subprocess.CompletedProcess:
    if shutil.which("docker") is None:
        raise DockerError("the docker CLI is not installed: install Docker (Debian: apt-get install docker.io) "
                          "or use --backend local")
    env = daemon_env(host)
    try:
        result = subprocess.run(["docker", *args], capture_output=capture, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise DockerError(f"`docker {' '.join(args[:2])}` did not answer within {timeout} s"
                          f"{f' (daemon {host})' if host else ''}") from exc
    if check and result.returncode != 0:
        err = (result.stderr or b"").decode(errors="replace").strip().splitlines()
        raise DockerError(f"`docker {' '.join(args[:3])}` failed: {' | '.join(err[-6:])}")
    return result


def daemon_env(host: str | None) -> dict:
    """Environment for the docker CLI: host is a daemon address (unix://, tcp://, ssh://) or
    'context:NAME' for a docker context; None is the CLI's own default."""
    env = dict(os.environ, DOCKER_BUILDKIT="0")  # the classic builder: no buildx plugin needed
    if host and host.startswith("context:"):
        env["DOCKER_CONTEXT"] = host.split(":", 1)[1]
        env.pop("DOCKER_HOST", None)
    elif host:
        env["DOCKER_HOST"] = host
    return env


def daemon_version(host: str | None = None, timeout: float = 15) -> str | None:
    """The daemon's version, or None when no daemon answers."""
    try:
        result = _docker("version", "--format", "{{.Server.Version}}", host=host, timeout=timeout, check=False)
    except DockerError:
        return None
    return result.stdout.decode().strip() or None if result.returncode == 0 else None


def require_daemon(host: str | None = None) -> str:
    version = daemon_version(host)
    if version is None:
        where = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        raise DockerError(
            f"no Docker daemon answers at {where}. Start one (systemctl start docker; on this kind of machine: "
            "dockerd --storage-driver vfs --iptables=false --bridge=none &), or use `--backend local`."
        )
    return version


def image_id(tag: str, host: str | None = None) -> str | None:
    result = _docker("image", "inspect", "--format", "{{.Id}}", tag, host=host, check=False, timeout=60)
    return result.stdout.decode().strip() if result.returncode == 0 else None


def make_base_image(recipe: str, tag: str, *, log=print) -> None:
    """debootstrap a minimal Debian bookworm with the recipe's packages and import it as `tag`."""
    if recipe not in BASE_RECIPES:
        raise DockerError(f"unknown base image recipe {recipe!r}; known: {', '.join(BASE_RECIPES)}")
    if shutil.which("debootstrap") is None:
        raise DockerError(f"base image {tag} must be made locally but debootstrap is missing: apt-get install debootstrap")
    packages = BASE_RECIPES[recipe]
    log(f"[docker] making base image {tag} with debootstrap ({', '.join(packages)}) ...")
    with tempfile.TemporaryDirectory(prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        result = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", "bookworm",
                                 str(rootfs), debian_mirror()], capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            raise DockerError(f"debootstrap failed for {tag}: {result.stderr.strip().splitlines()[-3:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            imported = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, capture_output=True, timeout=1800)
        finally:
            tar.stdout.close()
            tar.wait()
        if imported.returncode != 0:
            raise DockerError(f"docker import of {tag} failed: {imported.stderr.decode().strip()}")


def ensure_base_image(role: str, spec: dict, override: str | None = None, *, log=print) -> str:
    """The base image for `role` (build/runtime): present, made locally, or pulled; else a clear error."""
    tag = override or spec["tag"]
    if image_id(tag):
        return tag
    if not override and spec.get("recipe"):
        make_base_image(spec["recipe"], tag, log=log)
        return tag
    log(f"[docker] base image {tag} is not on this daemon; pulling ...")
    result = _docker("pull", tag, check=False, timeout=600)
    if result.returncode != 0:
        reason = (result.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no answer"]
        raise DockerError(
            f"base image {tag} ({role}) is not on this daemon and cannot be pulled ({reason[0]}). "
            f"Either pull it where a registry is reachable and bring it here (docker save {tag} | docker load), "
            f"or point --base-image {role}=<local image> at a compatible image you have."
        )
    return tag


# ---------------------------------------------------------------- wheelhouse and locks

def _pip_download(requirements: list[str], dest: Path, *, log=print) -> None:
    cmd = ["python3", "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
           "--dest", str(dest), *requirements]
    log("[docker] " + " ".join(cmd[2:6]) + " ...")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise DockerError(f"pip download failed: {result.stderr.strip().splitlines()[-3:]}")


def _wheel_name_version(filename: str) -> tuple[str, str]:
    name, version = filename.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def _write_lock(lock: Path, wheels: list[Path], header: str) -> None:
    lines = [f"# {header}", "# Generated by lab/docker.py from the resolved wheelhouse; images install with --require-hashes."]
    for wheel in sorted(wheels, key=lambda p: p.name.lower()):
        name, version = _wheel_name_version(wheel.name)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        lines.append(f"{name}=={version} --hash=sha256:{digest}")
    write_text_atomic(lock, "\n".join(lines) + "\n")


def wheelhouse(entry: dict, *, log=print) -> dict:
    """Host-side wheels for the entry's images and one lock file per image kind (train, infer).

    With a lock already committed, exactly the locked files are fetched and checked; without, the
    entry's pins are resolved once and the lock is written.
    """
    house = WHEELHOUSE / entry["id"]
    house.mkdir(parents=True, exist_ok=True)
    ort = entry["onnxruntime"]
    kinds = {
        "train": [*matrix.pip_pins(entry), "-r", str(TOOLS)],
        "infer": [f"{ort['package']}=={ort['version']}", f"numpy=={entry['numpy']}"],
    }
    locks = {}
    for kind, requirements in kinds.items():
        lock = LOCKS / f"{entry['id']}-{kind}.txt"
        if lock.exists():
            _pip_download(["--no-deps", "--require-hashes", "-r", str(lock)], house, log=log)
        else:
            with tempfile.TemporaryDirectory(dir=house.parent, prefix=".resolve-") as tmp:
                _pip_download(requirements, Path(tmp), log=log)
                wheels = list(Path(tmp).glob("*.whl"))
                for wheel in wheels:
                    if not (house / wheel.name).exists():
                        shutil.copy2(wheel, house / wheel.name)
                described = " ".join(str(Path(r).relative_to(REPO)) if r.startswith(str(REPO)) else r for r in requirements)
                _write_lock(lock, [house / w.name for w in wheels], f"{entry['id']} {kind} image: {described}")
            log(f"[docker] wrote {lock.relative_to(REPO)}")
        locks[kind] = lock
    return locks


# What the images are built from. NOTE: each COPY is a full filesystem copy under the vfs storage
# driver these machines use, so the context is prepared to need as few COPY steps as possible.
SOURCES = ["kernels", "ops", "ort_plugin", "lab", "bench", "tests", "matrix.yaml", "requirements"]
RUNNER_FILES = ["ort_plugin/__init__.py", "ort_plugin/loader.py", "ort_plugin/runner.py", "ort_plugin/doctor.py",
                "ort_plugin/diagnose.py", "ort_plugin/library_info.py", "ort_plugin/onnx_file.py", "lab/__init__.py",
                "lab/provenance.py", "lab/files.py", "bench/__init__.py", "bench/measure.py", "bench/workloads.py",
                "bench/rows.py", "bench/nvml.py"]


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def prepare_context(entry: dict, locks: dict, *, log=print) -> tuple[Path, str]:
    """build/docker-context/<entry>/: src/ (+ ORT headers), app/ (the runner only), per-image wheels and locks."""
    from ort_plugin.headers import pin_from_matrix, resolve

    context = CONTEXT_ROOT / entry["id"]
    if context.exists():
        shutil.rmtree(context)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, context / "src" / name, ignore=ignore)
        else:
            _link_or_copy(source, context / "src" / name)
    for name in RUNNER_FILES:
        _link_or_copy(REPO / name, context / "app" / name)
    _link_or_copy(DOCKER_DIR / "train-entrypoint.sh", context / "src" / ".image-entrypoint")
    image_env = {
        "PATH": "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": "/lab", "XDG_CACHE_HOME": "/lab/.cache", "MYOPS_MATRIX_ENTRY": entry["id"],
        "TORCH_CUDA_ARCH_LIST": " ".join(entry["torch_cuda_arch_list"]),
    }  # NOTE: no git revision here (it is a label): a commit that leaves the sources alone rebuilds nothing
    (context / "src" / ".image.env").write_text("".join(f"{k}='{v}'\n" for k, v in image_env.items()))
    found = resolve(pin=pin_from_matrix(entry["id"]), log=log)
    # Inside the image src/ is /lab and XDG_CACHE_HOME=/lab/.cache: the header cache layout.
    shutil.copytree(found.include_dir, context / "src" / ".cache" / "myops-lab" / "ort-headers" / found.version / "include")
    _link_or_copy(DOCKER_DIR / "check_versions.py", context / "locks" / "check_versions.py")
    for kind, lock in locks.items():
        _link_or_copy(lock, context / "locks" / f"{kind}.txt")
        for line in lock.read_text().splitlines():
            if line and not line.startswith("#"):
                name, version = line.split()[0].split("==")
                wheel = _find_wheel(WHEELHOUSE / entry["id"], name, version)
                _link_or_copy(wheel, context / f"wheels-{kind}" / wheel.name)
    return context, found.version


def _find_wheel(house: Path, name: str, version: str) -> Path:
    for wheel in house.glob("*.whl"):
        if _wheel_name_version(wheel.name) == (name, version):
            return wheel
    raise DockerError(f"the wheelhouse {house} lacks {name}=={version}: delete it and build again")


# ---------------------------------------------------------------- images

def image_tags(entry: dict) -> dict:
    torch_v = entry["torch"]["version"]
    ort_v = entry["onnxruntime"]["version"]
    return {"train": f"myops-lab/train:{entry['id']}-torch{torch_v}-ort{ort_v}",
            "infer": f"myops-lab/infer:{entry['id']}-ort{ort_v}"}


def _created() -> str:
    """OCI 'created' from SOURCE_DATE_EPOCH, else the commit time, so rebuilds do not differ."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        result = subprocess.run(["git", "log", "-1", "--format=%ct"], capture_output=True, text=True, cwd=REPO)
        epoch = result.stdout.strip() or "0"
    return _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc).isoformat().replace("+00:00", "Z")


def revision() -> str:
    result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return result.stdout.strip() or "unknown"


def cmake_cuda_architectures(arch_list: list[str]) -> str:
    """TORCH_CUDA_ARCH_LIST items as CMake's: '8.6' -> '86-real' (SASS only), '9.0+PTX' -> '90' (SASS + PTX)."""
    return ";".join(a.replace("+PTX", "").replace(".", "") + ("" if a.endswith("+PTX") else "-real") for a in arch_list)


def build_images(entry_id: str, *, base_overrides: dict | None = None, log=print) -> dict:
    """Build the entry's train and infer images; returns their tags."""
    require_daemon()
    entry = matrix.entry(entry_id)
    overrides = base_overrides or {}
    bases = {role: ensure_base_image(role, entry["base_images"][role], overrides.get(role), log=log)
             for role in ("build", "runtime")}
    locks = wheelhouse(entry, log=log)
    context, headers_version = prepare_context(entry, locks, log=log)
    tags = image_tags(entry)
    cuda = entry["device"] == "cuda"
    source_revision = revision()
    common = {
        "ENTRY": entry["id"], "BASE_BUILD": bases["build"], "BASE_RUNTIME": bases["runtime"], "REVISION": source_revision,
        "TORCH_CUDA_ARCH_LIST": " ".join(entry["torch_cuda_arch_list"]),
        "CUDA_MODE": "ON" if cuda else "OFF",
        "CUDA_ARCHITECTURES": cmake_cuda_architectures(entry["torch_cuda_arch_list"]),
        # Every version pin as its own build arg; the images check what they installed against them.
        "PYTHON_VERSION": entry["python"], "TORCH_VERSION": entry["torch"]["version"], "ONNX_VERSION": entry["onnx"],
        "ONNXSCRIPT_VERSION": entry["onnxscript"], "NUMPY_VERSION": entry["numpy"],
        "ORT_PACKAGE": entry["onnxruntime"]["package"], "ORT_VERSION": entry["onnxruntime"]["version"],
    }
    versions = {"train": f"torch{entry['torch']['version']}-ort{entry['onnxruntime']['version']}",
                "infer": f"ort{entry['onnxruntime']['version']}-headers{headers_version}"}
    for kind in ("train", "infer"):
        args = dict(common, TRAIN_IMAGE=tags["train"], IMAGE=tags["infer"]) if kind == "infer" else dict(common)
        # The OCI labels are set by one LABEL at the end of each Dockerfile from these args: every
        # `--label` would be an instruction of its own, i.e. one more copy of the image under vfs.
        args.update(VERSION=versions[kind], CREATED=_created())
        build_args = [part for key, value in args.items() for part in ("--build-arg", f"{key}={value}")]
        log(f"[docker] building {tags[kind]} ...")
        started = time.perf_counter()
        _docker("build", "-f", str(DOCKER_DIR / f"{kind}.Dockerfile"), "-t", tags[kind], *build_args, str(context),
                timeout=3600)
        log(f"[docker] built {tags[kind]} in {time.perf_counter() - started:.0f} s")
    return tags


def run_interactive(tag: str, *args: str, volumes: dict, env: dict, host: str | None = None) -> int:
    """docker run --rm with output streamed to the terminal (long jobs show their progress)."""
    mounts = [part for source, target in volumes.items() for part in ("-v", f"{source}:{target}")]
    variables = [part for key, value in env.items() for part in ("-e", f"{key}={value}")]
    result = subprocess.run(["docker", "run", "--rm", "--network", "none", *mounts, *variables, tag, *args],
                            env=daemon_env(host))
    return result.returncode


def run(tag: str, *args: str, host: str | None = None, entrypoint: str | None = None, timeout: float = 1800):
    """docker run --rm with no network; returns the completed process (not checked)."""
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return _docker("run", "--rm", "--network", "none", *extra, tag, *args, host=host, timeout=timeout, check=False)


# ---------------------------------------------------------------- publishing

def save_archive(tags: list[str], out_dir: Path, name: str, *, host: str | None = None, log=print) -> Path:
    """docker save | gzip into out_dir/name.tar.gz plus its .sha256, written atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"{name}.tar.gz"
    tmp = out_dir / f".{name}.tar.gz.partial"
    env = daemon_env(host)
    log(f"[docker] saving {', '.join(tags)} to {archive} ...")
    digest = hashlib.sha256()
    with subprocess.Popen(["docker", "save", *tags], stdout=subprocess.PIPE, env=env) as proc, open(tmp, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3, mtime=0) as zipped:
            for block in iter(lambda: proc.stdout.read(1 << 20), b""):
                zipped.write(block)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise DockerError(f"docker save {' '.join(tags)} failed")
    with open(tmp, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    os.replace(tmp, archive)
    write_text_atomic(out_dir / f"{name}.tar.gz.sha256", f"{digest.hexdigest()}  {archive.name}\n")
    return archive


def load_archive(archive: Path, *, host: str | None = None) -> None:
    """Check the archive against its .sha256, then docker load it into the daemon at `host`."""
    sums = Path(str(archive) + ".sha256")
    if not sums.exists():
        raise DockerError(f"{sums} missing: refusing to load an archive that cannot be checked")
    expected = sums.read_text().split()[0]
    digest = hashlib.sha256()
    with open(archive, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise DockerError(f"{archive}: sha256 does not match {sums.name}: the archive is damaged; copy it again")
    env = daemon_env(host)
    with gzip.open(archive, "rb") as stream, subprocess.Popen(["docker", "load"], stdin=subprocess.PIPE, env=env,
                                                              stdout=subprocess.DEVNULL) as proc:
        for block in iter(lambda: stream.read(1 << 20), b""):
            proc.stdin.write(block)
        proc.stdin.close()
    if proc.returncode != 0:
        raise DockerError(f"docker load of {archive} failed")


def push(tags: list[str], registry: str, *, host: str | None = None, log=print) -> list[str]:
    """Tag each image under `registry` (host[:port][/path]) and push it; returns the remote names."""
    pushed = []
    for tag in tags:
        remote = f"{registry.rstrip('/')}/{tag.split('/', 1)[-1]}"
        _docker("tag", tag, remote, host=host)
        log(f"[docker] pushing {remote} ...")
        try:
            _docker("push", remote, host=host, timeout=3600)
        except DockerError as exc:
            _docker("rmi", remote, host=host, check=False)  # no stray local tag for a failed push
            raise DockerError(f"could not push to {registry}: {exc}. Check that the registry answers and that "
                              f"`docker login {registry.split('/')[0]}` was done, or use --archive to carry the "
                              "images over as a file instead") from exc
        pushed.append(remote)
    return pushed


def pull(remote: str, *, host: str | None = None) -> str:
    """What a GPU host does with a pushed image: docker pull; returns the image id."""
    _docker("pull", remote, host=host, timeout=3600)
    return image_id(remote, host=host)


def main(argv: list[str] | None = None) -> int:
    """`python -m lab.docker bases [ENTRY]`: make sure the entry's base images exist (made or pulled)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m lab.docker")
    parser.add_argument("command", choices=["bases"])
    parser.add_argument("entry", nargs="?", default=matrix.DEFAULT_ENTRY)
    args = parser.parse_args(argv)
    try:
        require_daemon()
        entry = matrix.entry(args.entry)
        for role in ("build", "runtime"):
            print(f"{role}: {ensure_base_image(role, entry['base_images'][role])}")
    except (DockerError, matrix.MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
