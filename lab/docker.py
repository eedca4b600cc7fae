"""Docker side of the lab: daemon checks, local base images, wheelhouses with lock files, the two
images per matrix entry, and publishing them. Used by `nox -s build|publish` and the tests.

Every failure a user can hit ends in one DockerError whose message says what to do.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import gzip
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path

from . import debian, matrix, platforms, toolkit, wheel_stage, wheels
from .files import held, write_text_atomic

REPO = Path(__file__).resolve().parent.parent
DOCKER_DIR = REPO / "docker"
CONTEXT_ROOT = REPO / "build" / "docker-context"
# The locally made base images: Debian suite and packages (containers here cannot reach a package
# index). trixie (Python 3.13) is no entry's base: the tests run the README's commands in it.
BASE_RECIPES = {
    "debootstrap-runtime": ("bookworm", ["python3", "python3-venv", "ca-certificates"]),
    "debootstrap-build": ("bookworm", ["python3", "python3-venv", "ca-certificates", "g++", "make", "cmake", "python3-dev"]),
    "debootstrap-trixie-build": ("trixie", ["python3", "python3-venv", "ca-certificates", "g++", "make", "cmake",
                                            "python3-dev", "git"]),
    # glibc 2.31 (before 2.34 moved libpthread, libdl and librt into libc): the CUDA plugin wheel's test
    # that its library loads where manylinux_2_28 promises. No entry's base.
    "debootstrap-bullseye-runtime": ("bullseye", ["python3"]),
    # amd64, with Debian's cross g++: the plugin of an arm64 infer image compiles at native speed.
    "debootstrap-build-cross-arm64": ("bookworm", ["python3", "python3-venv", "ca-certificates", "g++", "make", "cmake",
                                                   "python3-dev", "g++-aarch64-linux-gnu"]),
}
# The build base of each non-primary platform's infer image (the plugin is cross-compiled in it).
CROSS_BUILD_BASES = {"arm64": {"tag": "myops-lab/bookworm-build-cross-arm64:1", "recipe": "debootstrap-build-cross-arm64"}}


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
            "dockerd --storage-driver overlay2 --iptables=false --bridge=none &), or use `--backend local`."
        )
    return version


def image_id(tag: str, host: str | None = None) -> str | None:
    result = _docker("image", "inspect", "--format", "{{.Id}}", tag, host=host, check=False, timeout=60)
    return result.stdout.decode().strip() if result.returncode == 0 else None


def image_architecture(tag: str, host: str | None = None) -> str | None:
    """Docker's name of the image's architecture (amd64, arm64); None when the image is absent."""
    result = _docker("image", "inspect", "--format", "{{.Architecture}}", tag, host=host, check=False, timeout=60)
    return result.stdout.decode().strip() or None if result.returncode == 0 else None


def require_emulation(plat: platforms.Platform) -> None:
    """A foreign platform's binaries must run here (lab.emulation), else a clear error."""
    from . import emulation

    why = emulation.problem(plat)
    if why:
        raise DockerError(f"{plat.os_arch} images are made and run here under emulation, but {why}")


def make_base_image(recipe: str, tag: str, *, plat: platforms.Platform = platforms.PRIMARY, log=print) -> None:
    """debootstrap a minimal Debian of the recipe's suite with its packages and import it as `tag`
    (for a foreign platform the packages' scripts run under qemu-user: minutes, not seconds)."""
    if recipe not in BASE_RECIPES:
        raise DockerError(f"unknown base image recipe {recipe!r}; known: {', '.join(BASE_RECIPES)}")
    if shutil.which("debootstrap") is None:
        raise DockerError(f"base image {tag} must be made locally but debootstrap is missing: apt-get install debootstrap")
    suite, packages = BASE_RECIPES[recipe]
    require_emulation(plat)
    log(f"[docker] making base image {tag} with debootstrap ({suite} {plat.docker}: {', '.join(packages)}) ...")
    try:
        mirror = debian.mirror()
    except debian.DebianError as exc:
        raise DockerError(f"base image {tag} must be made with debootstrap: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        result = subprocess.run(["debootstrap", f"--arch={plat.docker}", "--variant=minbase",
                                 f"--include={','.join(packages)}", suite, str(rootfs), mirror],
                                capture_output=True, text=True, timeout=3600)
        if result.returncode != 0:
            raise DockerError(f"debootstrap failed for {tag}: {result.stderr.strip().splitlines()[-3:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        if plat == platforms.host():
            _import_rootfs(rootfs, tag)
        else:
            _build_rootfs_image(rootfs, tag, plat)


def _import_rootfs(rootfs: Path, tag: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        imported = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, capture_output=True, timeout=1800)
    finally:
        tar.stdout.close()
        tar.wait()
    if imported.returncode != 0:
        raise DockerError(f"docker import of {tag} failed: {imported.stderr.decode().strip()}")


def _build_rootfs_image(rootfs: Path, tag: str, plat: platforms.Platform) -> None:
    """Another architecture's rootfs as an image marked with that architecture (Docker 20.10 ignores
    `docker import --platform`; a FROM scratch build honours --platform)."""
    context = rootfs.parent / "context"
    context.mkdir()
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(context / "rootfs.tar"), "."], check=True, timeout=1800)
    (context / "Dockerfile").write_text("FROM scratch\nADD rootfs.tar /\n")
    built = _docker("build", "--quiet", "--platform", plat.os_arch, "-t", tag, str(context), timeout=1800, check=False)
    if built.returncode != 0:
        raise DockerError(f"making {tag} from its rootfs failed: {built.stderr.decode(errors='replace').strip()[-500:]}")


def ensure_base_image(role: str, spec: dict, override: str | None = None, *,
                      plat: platforms.Platform = platforms.PRIMARY, log=print) -> str:
    """The base image for `role` (build/runtime): present, made locally, or pulled; else a clear error.
    A non-primary platform's own base carries the architecture in its tag."""
    tag = override or spec["tag"] + platforms.tag_suffix(plat)
    if image_id(tag):
        found = image_architecture(tag)
        if found != plat.docker:
            raise DockerError(f"base image {tag} is {found}, not {plat.docker}: remove it (docker rmi {tag}) so it is "
                              "made again, or point --base-image at one for that architecture")
        return tag
    if not override and spec.get("recipe"):
        make_base_image(spec["recipe"], tag, plat=plat, log=log)
        return tag
    # A registry's image: another architecture's is that platform of the plain tag, kept under `tag`.
    remote = tag if override or plat == platforms.PRIMARY else spec["tag"]
    log(f"[docker] base image {tag} is not on this daemon; pulling {remote} ({plat.os_arch}) ...")
    result = _docker("pull", "--platform", plat.os_arch, remote, check=False, timeout=600)
    if result.returncode != 0:
        reason = (result.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no answer"]
        raise DockerError(
            f"base image {tag} ({role}) is not on this daemon and cannot be pulled ({reason[0]}). "
            f"Either pull it where a registry is reachable and bring it here (docker save {tag} | docker load), "
            f"or point --base-image {role}=<local image> at a compatible image you have."
        )
    if remote != tag:
        _docker("tag", remote, tag)
    found = image_architecture(tag)
    if found != plat.docker:
        raise DockerError(f"base image {remote} was pulled as {found}, not {plat.docker}: the registry has no "
                          f"{plat.os_arch} build of it; point --base-image {role}=<local image> at one that is")
    return tag


# ---------------------------------------------------------------- build contexts

# What the images are built from: one context per image kind. The wheels are not in it: they are
# served to the build over loopback (see _serve_wheels), so they never land in a layer.
SOURCES = ["kernels", "opspec", "ops", "ort_plugin", "infer", "lab", "bench", "tests", "matrix.yaml", "requirements"]
# The inference side, installed whole (every Python file of these packages): none imports torch,
# ops or bench, which tests/test_layers.py checks.
RUNNER_PACKAGES = ["infer", "ort_plugin", "opspec", "lab"]
SCRIPTS = ["ensure_python.sh", "use_toolkit.sh", "cuda_wheel_libs.py"]


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _link_tree(source: Path, target: Path) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_symlink():
            (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(path), target / path.relative_to(source))
        elif path.is_file():
            _link_or_copy(path, target / path.relative_to(source))


def _sources(dest: Path, headers) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=ignore)
        else:
            _link_or_copy(source, dest / name)
    # Inside the images src/ is /lab (or /src) with XDG_CACHE_HOME=<it>/.cache: the header cache layout.
    shutil.copytree(headers.include_dir, dest / ".cache" / "myops-lab" / "ort-headers" / headers.version / "include")


def prepare_context(entry: dict, locks: dict, toolkit_home: Path | None, *, cuda_architectures: str = "",
                    plat: platforms.Platform = platforms.PRIMARY, log=print) -> tuple[dict, str]:
    """build/docker-context/<entry>[-<arch>]/<kind>/ for each image kind in `locks` ("plugin" is the
    infer image's plugin stage, part of its context): locks/, scripts/, toolkit/ (the assembled CUDA
    toolkit; empty for a CPU entry); train: src/ (+ ORT headers); infer: plugin-wheel/ (the plugin
    wheel's source folder) and app/ (the runner). Beside each, wheels-<kind>/ with exactly the locked
    wheels. A kind whose lock is None gets its context without wheels (a build that stops at the
    plugin stage)."""
    from .ort_headers import pin_from_matrix, resolve

    headers = resolve(pin=pin_from_matrix(entry["id"]), log=log)
    root = CONTEXT_ROOT / f"{entry['id']}{platforms.tag_suffix(plat)}"
    if root.exists():
        shutil.rmtree(root)
    contexts = {}
    for kind, lock in locks.items():
        if kind == "plugin":
            continue
        context = root / kind
        for script in SCRIPTS:
            _link_or_copy(DOCKER_DIR / script, context / "scripts" / script)
        (context / "toolkit").mkdir()
        if toolkit_home is not None:
            _link_tree(toolkit_home, context / "toolkit")
        _link_or_copy(DOCKER_DIR / "check_versions.py", context / "locks" / "check_versions.py")
        served = [(lock, plat)] if lock is not None else []
        if kind == "infer":
            # the plugin stage runs on the primary platform's build base (cross-compiling for another)
            served.append((locks["plugin"], platforms.PRIMARY))
            _link_or_copy(locks["plugin"], context / "locks" / "plugin.txt")
            wheel_stage.stage_plugin(entry, headers, plat, context / "plugin-wheel", with_headers=True,
                                     cuda_architectures=cuda_architectures, log=log)
            for package in RUNNER_PACKAGES:
                for source in sorted((REPO / package).rglob("*.py")):
                    if "__pycache__" not in source.parts:
                        _link_or_copy(source, context / "app" / source.relative_to(REPO))
        else:
            _sources(context / "src", headers)
        if lock is not None:
            _link_or_copy(lock, context / "locks" / f"{kind}.txt")
        (root / f"wheels-{kind}").mkdir(parents=True, exist_ok=True)
        for served_lock, served_plat in served:
            for p in wheels.read_lock(served_lock)[1]:
                wheel = wheels.find_wheel(wheels.wheelhouse_dir(entry, served_plat), p.name, p.version)
                if not (root / f"wheels-{kind}" / wheel.name).exists():  # one file both locks pin (packaging)
                    _link_or_copy(wheel, root / f"wheels-{kind}" / wheel.name)
        _normalise_modes(context)
        contexts[kind] = context
    return contexts, headers.version


def _normalise_modes(folder: Path) -> None:
    """Every file of a build context 0644 (0755 where its owner may run it), every folder 0755: a COPY's
    cache key holds the modes, so a checkout made with another umask (077: every file 0600) would run
    every step after its first COPY again, and build other layers. A file hard-linked from the checkout
    with another mode is copied first: the checkout's own modes stay as they are."""
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        info = path.stat()
        wanted = 0o755 if path.is_dir() or info.st_mode & 0o100 else 0o644
        if info.st_mode & 0o7777 == wanted:
            continue
        if path.is_file() and info.st_nlink > 1:
            copy = path.with_name(f".{path.name}.copy")
            shutil.copy2(path, copy)
            os.replace(copy, path)
        path.chmod(wanted)


def installed_plugin(entry: dict) -> str:
    """Where the infer image's pip installed the plugin (its MYOPS_ORT_PLUGIN; infer.Dockerfile sets the same)."""
    return f"/opt/venv/lib/python{entry['python']}/site-packages/myops_ort/libmyops_ort.so"


# ---------------------------------------------------------------- images

NAMESPACE = "myops-lab"
NAMESPACE_PATTERN = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")


def image_namespace() -> str:
    """The namespace of the entries' images: myops-lab, or $MYOPS_IMAGE_NAMESPACE for a second set
    built beside them without retagging them (the tests' rebuilds; the base images stay shared)."""
    namespace = os.environ.get("MYOPS_IMAGE_NAMESPACE") or NAMESPACE
    if not NAMESPACE_PATTERN.fullmatch(namespace):
        raise DockerError(f"MYOPS_IMAGE_NAMESPACE must be lower-case letters and digits, parts joined by '.', '_' "
                          f"or '-' (as Docker names a repository); got {namespace!r}")
    return namespace


def image_tags(entry: dict, plat: platforms.Platform = platforms.PRIMARY) -> dict:
    """The entry's local tags; a non-primary platform's infer image has the architecture appended
    (a registry holds both under the plain tag, as one multi-arch image: see push_multiarch)."""
    torch_v = entry["torch"]["version"]
    ort_v = entry["onnxruntime"]["version"]
    namespace = image_namespace()
    return {"train": f"{namespace}/train:{entry['id']}-torch{torch_v}-ort{ort_v}",
            "infer": f"{namespace}/infer:{entry['id']}-ort{ort_v}{platforms.tag_suffix(plat)}"}


def _created() -> str:
    """OCI 'created' from SOURCE_DATE_EPOCH, else the commit time, so rebuilds do not differ."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        result = subprocess.run(["git", "log", "-1", "--format=%ct"], capture_output=True, text=True, cwd=REPO)
        epoch = result.stdout.strip() or "0"
    return _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc).isoformat().replace("+00:00", "Z")


def image_labels(tag: str) -> dict | None:
    """The image's labels (the lab's carry org.opencontainers.image.revision and .version); None: no such image."""
    found = _docker("image", "inspect", "--format", "{{json .Config.Labels}}", tag, check=False, timeout=60)
    return (json.loads(found.stdout.decode()) or {}) if found.returncode == 0 else None


def train_version(entry: dict) -> str:
    """The train image's version label: the pins it is built with."""
    return f"torch{entry['torch']['version']}-ort{entry['onnxruntime']['version']}"


def revision() -> str:
    result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return result.stdout.strip() or "unknown"


def cmake_cuda_architectures(arch_list: list[str]) -> str:
    """TORCH_CUDA_ARCH_LIST items as CMake's: '8.6' -> '86-real' (SASS only), '9.0+PTX' -> '90' (SASS + PTX)."""
    return ";".join(a.replace("+PTX", "").replace(".", "") + ("" if a.endswith("+PTX") else "-real") for a in arch_list)


# The wheel servers' ports: fixed per entry and platform, because build args are part of the layer
# cache key; apart, so that two entries' images can be built at once.
WHEELS_PORT = 48735
WHEELS_PORT_RANGE = 500
PORT_WAIT_SECONDS = 900


def wheels_port(entry_id: str, plat: platforms.Platform = platforms.PRIMARY) -> int:
    return WHEELS_PORT + zlib.crc32(f"{entry_id}/{plat.docker}".encode()) % WHEELS_PORT_RANGE


@contextlib.contextmanager
def _serve_wheels(directory: Path, port: int, *, log=print):
    """An HTTP server on 127.0.0.1 for the duration of a build: pip in the build's RUN reads the
    locked wheels from it (--find-links, hashes checked), so no layer ever holds them. Where another
    build (another checkout's) serves on the port, this one waits for it, up to PORT_WAIT_SECONDS."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    deadline = time.monotonic() + PORT_WAIT_SECONDS
    server, told = None, False
    while server is None:
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError:
            if time.monotonic() > deadline:  # any free port: this build then misses Docker's layer cache
                log(f"[docker] port {port} stayed taken for {PORT_WAIT_SECONDS} s: serving the wheels on another "
                    "one (this build's pip steps run again, uncached)")
                server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            else:
                if not told:
                    log(f"[docker] port {port} is taken (another build of this entry?): waiting up to "
                        f"{PORT_WAIT_SECONDS} s for it to end ...")
                    told = True
                time.sleep(2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _one_build_of(entry_id: str, *, log=print):
    """One build of an entry's images at a time from this checkout: builds share its context folders
    and wheelhouse. Another waits, then finds Docker's cache warm."""
    return held(CONTEXT_ROOT / f".{entry_id}.lock", what=f"building the {entry_id} images from this checkout",
                log=lambda m: log(f"[docker] {m}"))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _build(dockerfile: str, tag: str, context: Path, build_args: dict, wheels_dir: Path, *, port: int, log,
           target: str | None = None, no_cache: bool = False) -> None:
    """docker build with each step shown as it starts; a failure quotes the build's last lines.
    no_cache: every step runs again (a second, independent build, as lab.reproduce wants)."""
    tail: list[str] = []
    started = time.perf_counter()
    with _serve_wheels(wheels_dir, port, log=log) as url:
        args = [part for key, value in dict(build_args, WHEELS=url).items() for part in ("--build-arg", f"{key}={value}")]
        # host network: the build's RUN steps reach the wheel server on loopback (and, on a user's
        # machine, an official base's apt mirror); pip itself never looks past the locked files.
        cmd = ["docker", "build", "--network", "host", "-f", str(DOCKER_DIR / dockerfile), "-t", tag,
               *(["--target", target] if target else []), *(["--no-cache"] if no_cache else []), *args, str(context)]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=daemon_env(None),
                              text=True, errors="replace") as proc:
            for line in proc.stdout:
                tail = (tail + [line.rstrip()])[-40:]
                if line.startswith("Step "):
                    log(f"[docker] {tag} +{time.perf_counter() - started:.0f}s: {line.strip()[:150]}")
    if proc.returncode != 0:
        shown = "\n".join(t for t in tail if t.strip())
        raise DockerError(f"docker build of {tag} failed (exit {proc.returncode}); its last lines:\n{shown}")


def build_plan(entry: dict, base_overrides: dict | None = None) -> dict:
    """What the entry's images are built with: architectures, toolkit, and the build args' CUDA part."""
    cuda = entry["device"] == "cuda"
    if not cuda:
        return {"archs": [], "not_built": [], "toolkit": "", "CUDA_MODE": "OFF"}
    if (base_overrides or {}).get("build"):
        # An official devel base brings its own nvcc: the entry's full list, checked by the build.
        archs, not_built, toolkit_pin = list(entry["torch_cuda_arch_list"]), [], f"the base image's ({base_overrides['build']})"
    else:
        archs, not_built = matrix.build_archs(entry)
        toolkit_pin = toolkit.pin_text(entry)
    return {"archs": archs, "not_built": not_built, "toolkit": toolkit_pin, "CUDA_MODE": "ON"}


def _require_local_daemon() -> None:
    if (os.environ.get("DOCKER_HOST") or "unix://").split("://")[0] not in ("unix", "npipe"):
        raise DockerError(f"images are built on the local daemon (the wheels are served to it on 127.0.0.1), "
                          f"but DOCKER_HOST={os.environ['DOCKER_HOST']}: unset it to build here, then publish")
    require_daemon()


def _common_args(entry: dict, bases: dict, plan: dict) -> dict:
    return {
        "ENTRY": entry["id"], "BASE_BUILD": bases["build"], "BASE_RUNTIME": bases["runtime"], "REVISION": revision(),
        "TORCH_CUDA_ARCH_LIST": " ".join(plan["archs"]), "CUDA_MODE": plan["CUDA_MODE"],
        "CUDA_ARCHITECTURES": cmake_cuda_architectures(plan["archs"]), "TOOLKIT": plan["toolkit"],
        # Every version pin as its own build arg; the images check what they installed against them.
        "PYTHON_VERSION": entry["python"], "TORCH_VERSION": entry["torch"]["version"], "ONNX_VERSION": entry["onnx"],
        "ONNXSCRIPT_VERSION": entry["onnxscript"], "NUMPY_VERSION": entry["numpy"],
        "ORT_PACKAGE": entry["onnxruntime"]["package"], "ORT_VERSION": entry["onnxruntime"]["version"],
    }


def plugin_wheel_tag(entry_id: str) -> str:
    """The image build_plugin_wheel builds its plugin wheel in (the infer image's plugin stage)."""
    return f"{image_namespace()}/plugin-wheel:{entry_id}"


def build_plugin_wheel(entry_id: str, out: Path, *, no_cache: bool = False, log=print) -> Path:
    """The entry's plugin wheel as its infer image builds it (the plugin stage alone, on the entry's
    build base with its CUDA toolkit), copied into `out`; not yet checked or tagged by auditwheel.
    no_cache: the stage is built again even where Docker's cache holds it."""
    _require_local_daemon()
    with _one_build_of(entry_id, log=log):
        return _build_plugin_wheel(entry_id, out, no_cache=no_cache, log=log)


def _build_plugin_wheel(entry_id: str, out: Path, *, no_cache: bool, log) -> Path:
    entry = matrix.entry(entry_id)
    bases = {"build": ensure_base_image("build", entry["base_images"]["build"], log=log),
             "runtime": entry["base_images"]["runtime"]["tag"]}  # not built: the build stops at the plugin stage
    plan = build_plan(entry)
    try:
        locks = {"infer": None, **wheels.wheelhouse(entry, kinds=("plugin",), log=log)}
        toolkit_home = toolkit.assemble(entry, log=log) if entry["device"] == "cuda" else None
    except (wheels.WheelError, toolkit.ToolkitError, debian.DebianError) as exc:
        raise DockerError(str(exc)) from exc
    contexts, _ = prepare_context(entry, locks, toolkit_home, cuda_architectures=cmake_cuda_architectures(plan["archs"]),
                                  log=log)
    tag = plugin_wheel_tag(entry_id)
    args = dict(_common_args(entry, bases, plan), TRAIN_IMAGE=image_tags(entry)["train"])
    log(f"[docker] building the plugin stage of the {entry_id} infer image ({tag}) ...")
    _build("infer.Dockerfile", tag, contexts["infer"], args, contexts["infer"].parent / "wheels-infer",
           port=wheels_port(entry_id), log=log, target="plugin", no_cache=no_cache)
    out.mkdir(parents=True, exist_ok=True)
    container = _docker("create", tag, "true").stdout.decode().strip()  # never started: a command it could run
    try:
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            _docker("cp", f"{container}:/wheels/.", tmp)
            built = sorted(Path(tmp).glob("*.whl"))
            if len(built) != 1:
                raise DockerError(f"the plugin stage of {tag} holds {[p.name for p in built]} in /wheels, not one "
                                  f"wheel: remove the image (docker rmi {tag}) and run again")
            os.replace(built[0], out / built[0].name)
    finally:
        _docker("rm", container, check=False)
    return out / built[0].name


# Run in the train image: every library torch and its NVIDIA wheels install (what the extension may
# leave to them at run time), by file name and by SONAME: PyPI's torch ships libgomp-a34b3233.so.1 whose
# SONAME is libgomp.so.1, so the extension's libgomp.so.1 is torch's, already loaded when it loads.
_TORCH_PROVIDES = """
import glob, json, os, re, subprocess, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
folders = [os.path.join(site, "torch", "lib"), *glob.glob(os.path.join(site, "nvidia", "*", "lib"))]
files = [os.path.join(folder, name) for folder in folders for name in os.listdir(folder) if ".so" in name]
sonames = re.findall(r"SONAME\\s+(\\S+)", subprocess.run(["objdump", "-p", *files], capture_output=True, text=True).stdout)
print(json.dumps(sorted({os.path.basename(f) for f in files} | set(sonames))))
"""


def build_extension_wheel(entry_id: str, stage: Path, out: Path, *, backend: Path, epoch: str,
                          log=print) -> tuple[Path, set[str]]:
    """The extension wheel of `stage` (lab/dist.py's myops_torch folder) built in the entry's train image
    (built first where missing or stale: its torch, nvcc and TORCH_CUDA_ARCH_LIST) with the build backend
    in `backend` (its wheels and lock.txt, installed with their hashes checked and put first on its path),
    its zip dated SOURCE_DATE_EPOCH `epoch`, into `out`; with the names of the libraries torch
    provides there. Not yet checked or tagged by auditwheel. The train image is only the toolchain here
    (its torch and nvcc; the sources are `stage`): one built from this commit is used as it is."""
    entry = matrix.entry(entry_id)
    train = image_tags(entry)["train"]
    labels = image_labels(train) or {}
    built_here = {"org.opencontainers.image.revision": revision(),
                  "org.opencontainers.image.version": train_version(entry),
                  "lab.cuda.archs": " ".join(build_plan(entry)["archs"]), "lab.cuda.toolkit": build_plan(entry)["toolkit"]}
    if any(labels.get(key) != value for key, value in built_here.items()):
        train = build_images(entry_id, log=log)["train"]
    out.mkdir(parents=True, exist_ok=True)
    # a copy of the read-only stage to build in (setuptools writes build/ beside setup.py), always at one
    # path, so the binary's file names are the same from any checkout
    script = ("set -e; umask 022; cp -r /stage /tmp/myops_torch; cd /tmp/myops_torch; "
              "pip install -q --no-cache-dir --no-index --find-links /backend --require-hashes -r /backend/lock.txt "
              "--target /tmp/backend >&2; "
              "PYTHONPATH=/tmp/backend pip wheel --no-cache-dir --no-build-isolation --no-deps --no-index "
              "--wheel-dir /tmp/wheels . >&2; "
              "cp /tmp/wheels/*.whl /out/; python -c \"$PROVIDES\"")
    log(f"[docker] building the extension wheel in {train} (its CUDA kernels: a few minutes) ...")
    try:
        done = _run_extension_build(train, stage, backend, out, epoch, script)
    except subprocess.TimeoutExpired:
        raise DockerError(f"building the extension wheel in {train} took over 2 hours and was stopped: is the "
                          "machine short of memory or CPUs (docker stats)? Run it again") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-30:])
        raise DockerError(f"building the extension wheel in {train} failed (exit {done.returncode}):\n{tail}")
    built = sorted(out.glob("myops_torch-*.whl"))
    if len(built) != 1:
        raise DockerError(f"the extension build in {train} wrote {[p.name for p in built]} into {out}, not one "
                          "wheel: remove that folder and run again")
    return built[0], set(json.loads(done.stdout.strip().splitlines()[-1]))


def _run_extension_build(train: str, stage: Path, backend: Path, out: Path, epoch: str, script: str):
    return subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{stage}:/stage:ro",
                           "-v", f"{backend}:/backend:ro", "-v", f"{out}:/out",
                           "-e", f"SOURCE_DATE_EPOCH={epoch}", "-e", f"PROVIDES={_TORCH_PROVIDES}", "-e", "PYTHONPATH=",
                           "--entrypoint", "sh", train, "-c", script],
                          capture_output=True, text=True, errors="replace", env=daemon_env(None), timeout=7200)


def build_images(entry_id: str, *, base_overrides: dict | None = None, arches: tuple = ("amd64",), log=print) -> dict:
    """Build the entry's train and infer images, and its infer image for each other architecture in
    `arches` that matrix.yaml lists (`all`: every one); returns their tags ({'infer-arm64': ...})."""
    _require_local_daemon()
    with _one_build_of(entry_id, log=log):
        return _build_images(entry_id, base_overrides=base_overrides, arches=arches, log=log)


def _build_images(entry_id: str, *, base_overrides: dict | None, arches: tuple, log) -> dict:
    entry = matrix.entry(entry_id)
    foreign = infer_platforms_wanted(entry, arches)[1:]  # checked before any long build
    for plat in foreign:
        require_emulation(plat)
    overrides = base_overrides or {}
    bases = {role: ensure_base_image(role, entry["base_images"][role], overrides.get(role), log=log)
             for role in ("build", "runtime")}
    plan = build_plan(entry, overrides)
    if plan["not_built"]:
        log(f"[docker] {entry_id}: not built here, the toolkit cannot target them: {'; '.join(plan['not_built'])}")
    try:
        locks = wheels.wheelhouse(entry, kinds=(*wheels.IMAGE_KINDS, "plugin"), log=log)
        toolkit_home = toolkit.assemble(entry, log=log) if entry["device"] == "cuda" and not overrides.get("build") else None
    except (wheels.WheelError, toolkit.ToolkitError, debian.DebianError) as exc:
        raise DockerError(str(exc)) from exc
    contexts, headers_version = prepare_context(entry, locks, toolkit_home, log=log,
                                                cuda_architectures=cmake_cuda_architectures(plan["archs"]))
    tags = image_tags(entry)
    common = _common_args(entry, bases, plan)
    versions = {"train": train_version(entry),
                "infer": f"ort{entry['onnxruntime']['version']}-headers{headers_version}"}
    for kind in ("train", "infer"):
        args = dict(common, TRAIN_IMAGE=tags["train"], IMAGE=tags["infer"]) if kind == "infer" else dict(common)
        args.update(VERSION=versions[kind], CREATED=_created())
        log(f"[docker] building {tags[kind]} ...")
        started = time.perf_counter()
        _build(f"{kind}.Dockerfile", tags[kind], contexts[kind], args, contexts[kind].parent / f"wheels-{kind}",
               port=wheels_port(entry_id), log=log)
        log(f"[docker] built {tags[kind]} in {time.perf_counter() - started:.0f} s")
    for plat in foreign:
        tags[f"infer-{plat.docker}"] = _build_foreign_infer(entry, plat, dict(common, TRAIN_IMAGE=tags["train"]),
                                                            versions["infer"], log=log)
    return tags


def infer_platforms_wanted(entry: dict, arches) -> list[platforms.Platform]:
    """The entry's infer platforms that `arches` asks for, the primary always first."""
    declared = platforms.infer_platforms(entry)
    if "all" in arches:
        return declared
    try:
        wanted = [platforms.get(a) for a in arches]
    except platforms.PlatformError as exc:
        raise DockerError(str(exc)) from None
    undeclared = [p.docker for p in wanted if p not in declared]
    if undeclared:
        raise DockerError(f"entry '{entry['id']}' has no {', '.join(undeclared)} infer image: its infer_platforms in "
                          f"matrix.yaml are {', '.join(p.docker for p in declared)}")
    return [platforms.PRIMARY] + [p for p in declared[1:] if p in wanted]


def _build_foreign_infer(entry: dict, plat: platforms.Platform, common: dict, version: str, *, log) -> str:
    """The infer image for another architecture: its own base and locked wheels (installed under
    qemu-user), the plugin cross-compiled on the primary platform, the same artifacts and runner."""
    runtime = ensure_base_image("runtime", entry["base_images"]["runtime"], plat=plat, log=log)
    cross = ensure_base_image("build", CROSS_BUILD_BASES[plat.docker], log=log)
    try:
        locks = {**wheels.wheelhouse(entry, kinds=("infer",), plat=plat, log=log),
                 **wheels.wheelhouse(entry, kinds=("plugin",), log=log)}  # the plugin stage runs here
    except (wheels.WheelError, debian.DebianError) as exc:
        raise DockerError(str(exc)) from exc
    contexts, _ = prepare_context(entry, locks, None, plat=plat, log=log,
                                  cuda_architectures=common["CUDA_ARCHITECTURES"])
    tag = image_tags(entry, plat)["infer"]
    args = dict(common, BASE_BUILD=cross, BASE_RUNTIME=runtime, IMAGE=tag, VERSION=version, CREATED=_created(),
                PLUGIN_CMAKE_ARGS=f"-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR={plat.machine} "
                                  f"-DCMAKE_CXX_COMPILER={plat.triplet}-g++",
                PLUGIN_WHEEL_PLATFORM=f"linux-{plat.machine}")  # the wheel's tag (scikit-build-core reads it)
    log(f"[docker] building {tag} ({plat.os_arch}; its RUN steps under emulation) ...")
    started = time.perf_counter()
    _build("infer.Dockerfile", tag, contexts["infer"], args, contexts["infer"].parent / "wheels-infer",
           port=wheels_port(entry["id"], plat), log=log)
    found = image_architecture(tag)
    if found != plat.docker:
        _docker("rmi", tag, check=False)  # a wrong-architecture image must not pass for a built one
        raise DockerError(f"{tag} was built as {found}, not {plat.docker}: its runtime base {runtime} is not "
                          f"{plat.docker}; remove it (docker rmi {runtime}) so it is made again")
    log(f"[docker] built {tag} in {time.perf_counter() - started:.0f} s")
    return tag


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


def push(tags: list[str], registry: str, *, rename: dict | None = None, host: str | None = None, log=print) -> list[str]:
    """Tag each image under `registry` (host[:port][/path]), by the name in `rename` if it has one, and
    push it; returns the remote names."""
    pushed = []
    for tag in tags:
        remote = f"{registry.rstrip('/')}/{(rename or {}).get(tag, tag).split('/', 1)[-1]}"
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


def push_multiarch(images: dict, registry: str, *, host: str | None = None, log=print) -> str:
    """One multi-arch tag in the registry for the same image built for several architectures.

    images: {architecture: local tag}, the primary's tag being the plain name. Each is pushed as
    <name>-<arch>, then a manifest list under <name> points at them: `docker pull <name>` on an arm64
    host gets the arm64 image. Returns <name>."""
    plain = images[platforms.PRIMARY.docker]
    remote = f"{registry.rstrip('/')}/{plain.split('/', 1)[-1]}"
    for arch, tag in images.items():
        found = image_architecture(tag, host=host)
        if found != arch:
            raise DockerError(f"{tag} is {found or 'not built'}, not {arch}: build it (nox -s build -- ENTRY --arch {arch})")
    parts = push(list(images.values()), registry, rename={plain: f"{plain}-{platforms.PRIMARY.docker}"}, host=host, log=log)
    # The CLI talks to the registry itself: plain HTTP only for one on this machine, or one the user
    # names in MYOPS_INSECURE_REGISTRIES (as the daemon's insecure-registries).
    server = registry.split("/")[0]
    loopback = server.startswith(("localhost", "127.", "[::1]"))
    insecure = ["--insecure"] if loopback or server in os.environ.get("MYOPS_INSECURE_REGISTRIES", "").split(",") else []
    _docker("manifest", "rm", remote, host=host, check=False)  # a list left by an earlier publish
    log(f"[docker] {remote}: one multi-arch tag for {', '.join(images)} ...")
    try:
        _docker("manifest", "create", *insecure, remote, *parts, host=host, timeout=600)
        _docker("manifest", "push", *insecure, "--purge", remote, host=host, timeout=600)
    except DockerError as exc:
        raise DockerError(f"the per-architecture images are pushed ({', '.join(parts)}), but the multi-arch tag "
                          f"{remote} could not be made: {exc}. A plain-HTTP registry: MYOPS_INSECURE_REGISTRIES={server}; "
                          f"then publish again (each host can pull its -<arch> tag meanwhile)") from exc
    return remote


def pull(remote: str, *, host: str | None = None, arch: str | None = None, timeout: float = 3600) -> str:
    """What a GPU host does with a pushed image: docker pull (of one architecture of a multi-arch
    tag: the daemon's own unless `arch` says); returns the image id."""
    _docker("pull", *(["--platform", platforms.get(arch).os_arch] if arch else []), remote, host=host, timeout=timeout)
    return image_id(remote, host=host)


def main(argv: list[str] | None = None) -> int:
    """`python -m lab.docker bases [ENTRY] [--arch ARCH]`: make sure the entry's base images exist (made
    or pulled); with --arch, also those of its infer image for that architecture."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m lab.docker")
    parser.add_argument("command", choices=["bases"])
    parser.add_argument("entry", nargs="?", default=matrix.DEFAULT_ENTRY)
    parser.add_argument("--arch", action="append", default=[], help="also the bases of the entry's infer image for "
                        "this architecture (arm64: its runtime base, made under emulation, and the cross build base)")
    args = parser.parse_args(argv)
    try:
        require_daemon()
        entry = matrix.entry(args.entry)
        for role in ("build", "runtime"):
            print(f"{role}: {ensure_base_image(role, entry['base_images'][role])}")
        for plat in infer_platforms_wanted(entry, args.arch)[1:] if args.arch else []:
            require_emulation(plat)
            print(f"runtime ({plat.docker}): {ensure_base_image('runtime', entry['base_images']['runtime'], plat=plat)}")
            print(f"build (cross to {plat.docker}): {ensure_base_image('build', CROSS_BUILD_BASES[plat.docker])}")
    except (DockerError, matrix.MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
