"""Python wheels for an entry's images: resolved for the image's Python and platform from the
entry's own indexes, pinned by hash in docker/locks/<entry>-<kind>.txt, fetched again from there.

Resolution never looks at the host's interpreter: the target is the entry's `python` and the glibc
of its base OS (manylinux tags). A package with a dedicated index (a torch CUDA index, an
onnxruntime feed) is resolved from that index alone, so a same-numbered PyPI build cannot win;
everything else comes from pip's own configuration (the machine's index, whatever it is).
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import compat, platforms
from .files import held, shown, write_text_atomic

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "docker" / "locks"
WHEELHOUSE = REPO / "build" / "wheelhouse"
TOOLS = REPO / "requirements" / "tools.txt"
# The wheels' build backends, each locked per entry: "plugin" for the infer image's plugin stage (which
# runs on the build base, always the primary platform's: another architecture's plugin is cross-compiled
# there), "extension" for a CUDA entry's extension wheel built in its train image.
BACKENDS = {"plugin": REPO / "requirements" / "plugin-build.txt",
            "extension": REPO / "requirements" / "extension-build.txt"}
# Lock kinds: one per image, then the build backends'.
IMAGE_KINDS = ("train", "infer")
KINDS = (*IMAGE_KINDS, *BACKENDS)
INDEX_MARK = "# index: "

# The NVIDIA wheels that hold what onnxruntime's CUDA provider links against (cudart, cuBLAS,
# cuFFT, cuRAND, cuDNN) and what cuDNN 9 compiles fused kernels with (NVRTC), per CUDA major.
CUDA_LIBRARIES = {
    11: ["nvidia-cuda-runtime-cu11", "nvidia-cublas-cu11", "nvidia-cufft-cu11", "nvidia-curand-cu11",
         "nvidia-cudnn-cu11", "nvidia-cuda-nvrtc-cu11"],
    12: ["nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12", "nvidia-cufft-cu12", "nvidia-curand-cu12",
         "nvidia-cudnn-cu12", "nvidia-cuda-nvrtc-cu12"],
    13: ["nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cufft", "nvidia-curand", "nvidia-cudnn-cu13",
         "nvidia-cuda-nvrtc"],
}


class WheelError(RuntimeError):
    pass


class PipFailed(WheelError):
    """A pip download that failed; `unreachable`: its output says an index did not answer."""

    def __init__(self, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class Target:
    python: str           # "3.11"
    platforms: tuple      # manylinux tags, newest first

    def pip_args(self) -> list[str]:
        abi = "cp" + self.python.replace(".", "")
        args = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp",
                "--abi", abi, "--abi", "abi3", "--abi", "none"]
        for tag in self.platforms:
            args += ["--platform", tag]
        return args


def manylinux_tags(glibc: str, arch: str = "x86_64") -> tuple:
    """Every manylinux tag a system with this glibc runs, newest first (PEP 600 and the legacy aliases)."""
    major, minor = (int(p) for p in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    tags += [f"{alias}_{arch}" for floor, alias in ((17, "manylinux2014"), (12, "manylinux2010"), (5, "manylinux1"))
             if minor >= floor]
    return tuple(tags)


def target(entry: dict, plat: platforms.Platform = platforms.PRIMARY) -> Target:
    """The entry's Python on the oldest glibc among its base images, for the platform's machine."""
    systems = [compat.base_os(image) for image in entry["base_images"].values()]
    glibcs = [s.glibc for s in systems if s is not None]
    if not glibcs:
        raise WheelError(f"entry '{entry['id']}': the OS of its base images is unknown; give them an `os` "
                         "in matrix.yaml so wheels can be resolved for its glibc")
    return Target(entry["python"], manylinux_tags(min(glibcs, key=compat.release), plat.machine))


# ---------------------------------------------------------------- what each image needs

@dataclass(frozen=True)
class Requirement:
    spec: str                # a pip requirement ("torch==2.4.1") or "-r FILE"
    index: str | None = None  # a dedicated index for this package alone; None: pip's configuration


def requirements(entry: dict, kind: str) -> list[Requirement]:
    if kind in BACKENDS:
        return [Requirement(f"-r {BACKENDS[kind].relative_to(REPO)}")]
    ort = entry["onnxruntime"]
    ort_req = Requirement(f"{ort['package']}=={ort['version']}", ort["index"])
    if kind == "train":
        models = [Requirement(f"transformers=={entry['transformers']}")] if entry.get("transformers") else []
        return [Requirement(f"torch=={entry['torch']['version']}", entry["torch"]["index"]),
                Requirement(f"onnx=={entry['onnx']}"), Requirement(f"onnxscript=={entry['onnxscript']}"),
                Requirement(f"numpy=={entry['numpy']}"), ort_req, *models, Requirement(f"-r {TOOLS.relative_to(REPO)}")]
    reqs = [ort_req, Requirement(f"numpy=={entry['numpy']}")]
    if entry["device"] == "cuda":
        major = compat.release(entry["cuda"]).major
        for name in CUDA_LIBRARIES[major]:
            # cuDNN by the entry's major; the rest follow the train lock (same CUDA user space)
            reqs.append(Requirement(f"{name}=={entry['cudnn']}.*" if "cudnn" in name else name))
    return reqs


def describe(reqs: list[Requirement]) -> str:
    """The lock's header: its requirements, a -r file by its content too (an edit makes the lock stale)."""
    parts = []
    for r in reqs:
        if r.spec.startswith("-r "):
            digest = hashlib.sha256((REPO / r.spec[3:]).read_bytes()).hexdigest()[:12]
            parts.append(f"{r.spec} (sha256 {digest})")
        else:
            parts.append(r.spec)
    return " ".join(parts)


def lock_path(entry: dict, kind: str, plat: platforms.Platform = platforms.PRIMARY) -> Path:
    return LOCKS / f"{entry['id']}-{kind}{platforms.tag_suffix(plat)}.txt"


def wheelhouse_dir(entry: dict, plat: platforms.Platform = platforms.PRIMARY) -> Path:
    """One folder per platform: a name and version alone would not tell two platforms' wheels apart."""
    return WHEELHOUSE / f"{entry['id']}{platforms.tag_suffix(plat)}"


# ---------------------------------------------------------------- pip

# What makes pip ask a dedicated index alone: no pip.conf, no extra index, no find-links, no no-index,
# no machine-wide constraints (None: the variable is removed).
DEDICATED_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None,
                 "PIP_FIND_LINKS": None, "PIP_NO_INDEX": None, "PIP_CONSTRAINT": None}
LOCK_COMMAND = "nox -s lock -- {entry}"


def pip_env(dedicated: bool) -> dict:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    if dedicated:
        # A dedicated index alone: no pip.conf extra indexes or find-links can offer another build.
        for key, value in DEDICATED_ENV.items():
            env.pop(key, None)
            if value is not None:
                env[key] = value
    return env


def install_torch(python: str, entry: dict, *, log=print, warn=print) -> str:
    """Install the entry's torch into the interpreter `python`: from the entry's own index alone (the cpu
    entry: PyTorch's CPU builds; PyPI has CUDA builds only), then, where that index cannot be reached,
    the same build (the lock's version, local label included) from pip's own configuration, and only
    then the plain version, said loudly. Returns the requirement installed."""
    index = entry["torch"]["index"]
    pin = f"torch=={entry['torch']['version']}"
    locked = locked_version(entry, "train", "torch")
    if locked is None:
        warn(f"docker/locks/{entry['id']}-train.txt is missing: torch's exact build (local label) is not known; "
             f"asking for {pin} (make the lock with `nox -s lock -- {entry['id']}`)")
    exact = f"torch=={locked or entry['torch']['version']}"
    attempts = [(f"{exact} from pip's own configuration", [exact], False)]
    if index:
        attempts.insert(0, (f"{exact} from {index} alone", ["--index-url", index, exact], True))
    for what, args, dedicated in attempts:
        log(f"installing {what}")
        done = subprocess.run([python, "-m", "pip", "install", "--quiet", *args], capture_output=True, text=True,
                              env=pip_env(dedicated))
        if done.returncode == 0:
            return exact
        reason = "the index cannot be reached from here" if unreachable(done.stderr) else \
            next((line for line in reversed(done.stderr.splitlines()) if line.startswith("ERROR")), "failed")
        warn(f"{what}: {reason}")
    warn(f"neither {index} nor pip's configuration serves {exact} for this Python: installing {pin} from "
         "pip's configuration, which on PyPI is a CUDA build of a few GB (the extension is still built for "
         "the CPU only); to avoid it, reach that index or put the CPU build's wheel in a PIP_FIND_LINKS folder")
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", pin], capture_output=True, text=True,
                          env=pip_env(False))
    if done.returncode != 0:
        raise PipFailed(f"pip could not install {pin}: {done.stderr.strip().splitlines()[-1:]}")
    return pin


def download_command(specs: list[str], dest: Path, tgt: Target, *, index: str | None = None,
                     find_links: Path | None = None, extra: list[str] | None = None) -> list[str]:
    """The exact `pip download` a resolution runs (tests check it for indexes unreachable here)."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest), *tgt.pip_args()]
    if index:
        cmd += ["--index-url", index]
    if find_links:
        cmd += ["--find-links", str(find_links)]
    return cmd + (extra or []) + specs


def _run_pip(cmd: list[str], *, dedicated: bool, what: str, log) -> None:
    words = [a for a in cmd[cmd.index("--dest") + 2:] if not a.startswith(("manylinux", "--platform", "--abi"))]
    log("[wheels] pip download " + " ".join(words)[:300])
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=pip_env(dedicated))
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip() and "WARNING" not in line]
        raise PipFailed(f"{what}: pip download failed: {' | '.join(lines[-4:])}", unreachable=unreachable(result.stderr))


def unreachable(pip_stderr: str) -> bool:
    """pip's output says an index did not answer (pip calls that "no matching distribution" too)."""
    signs = ("NewConnectionError", "Name or service not known", "Could not fetch URL", "ConnectTimeout",
             "ProxyError", "SSLError")
    return any(sign in pip_stderr for sign in signs)


def available_versions(package: str, tgt: Target, index: str | None = None) -> list[str] | None:
    """Versions of `package` the index serves for the target (None when the index does not answer)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package, "--retries", "1", "--timeout", "20",
           *tgt.pip_args()]
    if index:
        cmd += ["--index-url", index]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=pip_env(bool(index)))
    match = re.search(r"Available versions: (.*)", result.stdout)
    if result.returncode == 0 and match:
        return [v.strip() for v in match[1].split(",")]
    if unreachable(result.stderr):
        return None
    return [] if "No matching distribution" in result.stderr else None


def _explain_failure(entry: dict, reqs: list[Requirement], tgt: Target, failure: WheelError) -> WheelError:
    """Which pin does not exist where the entry says it lives: entry, field, what is there."""
    fields = {"torch": "torch.version", entry["onnxruntime"]["package"]: "onnxruntime.version",
              "onnx": "onnx", "onnxscript": "onnxscript", "numpy": "numpy"}
    for req in reqs:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^*\s]+)", req.spec)
        if not match or match[1] not in fields:
            continue
        versions = available_versions(match[1], tgt, req.index)
        where = req.index or "the configured index"
        if versions is None:
            return WheelError(f"entry '{entry['id']}', field '{fields[match[1]]}': {where} cannot be reached from here "
                              f"({failure}). Resolve this entry where it can be (`{LOCK_COMMAND.format(entry=entry['id'])}` on a "
                              f"machine with access to {where}), commit docker/locks/{entry['id']}-*.txt, and builds "
                              "here fetch exactly those files.")
        if match[2] not in versions:
            series = ".".join(match[2].split(".")[:2]) + "."
            closest = [v for v in versions if v.startswith(series)]
            near = ", ".join(closest + [v for v in versions if v not in closest][:8 - len(closest)]) or "none"
            return WheelError(f"entry '{entry['id']}', field '{fields[match[1]]}': {match[1]} {match[2]} does not exist "
                              f"for Python {tgt.python} on manylinux {tgt.platforms[0].split('_', 3)[-1]} at {where} (it has: {near}): pin one of those")
    return failure


# ---------------------------------------------------------------- locks

def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_name_version(filename: str) -> tuple[str, str]:
    name, version = filename.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


@dataclass(frozen=True)
class Locked:
    name: str
    version: str
    sha256: str
    index: str | None


def read_lock(lock: Path) -> tuple[str, list[Locked]]:
    """(the requirements the lock was made from, its pinned wheels)."""
    lines = lock.read_text().splitlines()
    header = lines[0].split(" image: ", 1)[1] if lines and " image: " in lines[0] else ""
    pinned = []
    for line in lines:
        if not line or line.startswith("#"):
            continue
        spec, _, index = line.partition(INDEX_MARK)
        name, version = spec.split()[0].split("==")
        digest = re.search(r"--hash=sha256:([0-9a-f]{64})", spec)[1]
        pinned.append(Locked(name, version, digest, index.strip() or None))
    return header, pinned


def target_line(entry: dict, plat: platforms.Platform = platforms.PRIMARY) -> str:
    tgt = target(entry, plat)
    return f"# for: Python {tgt.python} on {tgt.platforms[0]} (and older manylinux)"


def write_lock(lock: Path, entry: dict, kind: str, reqs: list[Requirement], wheels: dict[Path, str | None],
               plat: platforms.Platform = platforms.PRIMARY) -> None:
    lines = [f"# {entry['id']} {kind} image: {describe(reqs)}", target_line(entry, plat),
             "# Generated by lab/wheels.py from the resolved wheelhouse; images install with --require-hashes."]
    for wheel in sorted(wheels, key=lambda p: p.name.lower()):
        name, version = wheel_name_version(wheel.name)
        line = f"{name}=={version} --hash=sha256:{sha256(wheel)}"
        if wheels[wheel]:
            line += f"  {INDEX_MARK}{wheels[wheel]}"
        lines.append(line)
    write_text_atomic(lock, "\n".join(lines) + "\n")


def _constraints_from(lock: Path) -> list[str]:
    """The train lock's NVIDIA wheels, direct and indirect (nvJitLink, ...): the infer image's CUDA
    user space is the train image's, version for version."""
    if not lock.exists():
        return []
    _, pinned = read_lock(lock)
    return [f"{p.name}=={p.version}" for p in pinned if p.name.startswith("nvidia-")]


def _locked_file_by_hash(lock: Path, req: Requirement, dest: Path, tgt: Target, log) -> bool:
    """Where a dedicated index does not answer, the file the current lock already pins for `req` (same
    version, same index) from pip's configuration, accepted only with the lock's sha256: it is the file
    that index serves, so the new lock is what a machine reaching the index would write. Its
    dependencies are resolved with everything else. False when the lock pins no such file."""
    if not lock.exists():
        return False
    name, _, version = req.spec.partition("==")
    pinned = next((p for p in read_lock(lock)[1] if p.name == name and p.index == req.index
                   and p.version.split("+")[0] == version.split("+")[0]), None)
    if pinned is None:
        return False
    pins = dest / "locked.txt"
    pins.write_text(f"{pinned.name}=={pinned.version} --hash=sha256:{pinned.sha256}\n")
    log(f"[wheels] {req.index} cannot be reached from here: taking the locked {pinned.name}=={pinned.version} "
        "from pip's configured indexes, accepted only by the lock's sha256")
    try:
        _run_pip(download_command(["-r", str(pins)], dest, tgt, extra=["--no-deps", "--require-hashes"]),
                 dedicated=False, what=f"the locked {pinned.name}=={pinned.version} by hash", log=log)
    except PipFailed:
        return False
    finally:
        pins.unlink()
    return True


def resolve(entry: dict, kind: str, house: Path, *, plat: platforms.Platform = platforms.PRIMARY, log=print) -> Path:
    """Resolve the entry's `kind` image for its target, write the lock; wheels land in `house`."""
    tgt = target(entry, plat)
    reqs = requirements(entry, kind)
    lock = lock_path(entry, kind, plat)
    house.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=house.parent, prefix=".resolve-") as tmp:
        links, final_dir = Path(tmp) / "dedicated", Path(tmp) / "final"
        links.mkdir()
        origin: dict[str, tuple[str, str]] = {}  # file name -> (sha256, dedicated index it came from)
        specs, extra = [], []
        try:
            # 1. Each package with a dedicated index, from that index alone (its dependencies too).
            for req in reqs:
                if not req.index:
                    specs += ["-r", str(REPO / req.spec[3:])] if req.spec.startswith("-r ") else [req.spec]
                    continue
                scratch = Path(tempfile.mkdtemp(dir=tmp))
                try:
                    _run_pip(download_command([req.spec], scratch, tgt, index=req.index), dedicated=True,
                             what=f"{req.spec} from {req.index}", log=log)
                except PipFailed as exc:
                    if not (exc.unreachable and _locked_file_by_hash(lock, req, scratch, tgt, log)):
                        raise
                name = req.spec.split("==")[0]
                for wheel in scratch.iterdir():
                    origin[wheel.name] = (sha256(wheel), req.index)
                    if wheel_name_version(wheel.name)[0] == name:
                        specs.append(str(links / wheel.name))  # the exact file, as a requirement
                    os.replace(wheel, links / wheel.name)
            # 2. Everything together, those files included, for one consistent set.
            if kind == "infer" and entry["device"] == "cuda":
                constraints = _constraints_from(lock_path(entry, "train"))
                if constraints:
                    (Path(tmp) / "constraints.txt").write_text("\n".join(constraints) + "\n")
                    extra = ["-c", str(Path(tmp) / "constraints.txt")]
            _run_pip(download_command(specs, final_dir, tgt, find_links=links, extra=extra),
                     dedicated=False, what=f"the {entry['id']} {kind} image", log=log)
        except WheelError as exc:
            raise _explain_failure(entry, reqs, tgt, exc) from None
        wheels = {}
        for wheel in final_dir.glob("*.whl"):
            digest = sha256(wheel)
            kept = house / wheel.name
            if not kept.exists() or sha256(kept) != digest:  # a stale file of that name is replaced
                shutil.copy2(wheel, kept)
            came_from = origin.get(wheel.name)
            wheels[house / wheel.name] = came_from[1] if came_from and came_from[0] == digest else None
        verify_onnxruntime_build(entry, list(wheels), log=log)
        if kind == "train":
            verify_onnxscript_api(entry, list(wheels), log=log)
        write_lock(lock, entry, kind, reqs, wheels, plat)
    log(f"[wheels] wrote {shown(lock)} ({len(wheels)} wheels)")
    return lock


@dataclass(frozen=True)
class FetchStep:
    """One pip download of a lock's files: from `index` alone (a dedicated index; None: pip's own
    configuration), and, for a dedicated index that cannot serve them here, the same files by hash
    from pip's configuration (a local mirror of that index)."""
    index: str | None
    names: tuple[str, ...]
    command: list[str]
    fallback: list[str] | None


def fetch_steps(lock: Path, house: Path, entry: dict, requirements_file: Path,
                plat: platforms.Platform = platforms.PRIMARY, pinned: list[Locked] | None = None) -> list[FetchStep]:
    """The exact commands `fetch` runs, one per index; `requirements_file` gets each step's pins (with
    hashes) before its command runs, as fetch writes it."""
    pinned = read_lock(lock)[1] if pinned is None else pinned
    tgt = target(entry, plat)
    steps = []
    for index in sorted({p.index for p in pinned}, key=lambda i: i or ""):
        group = tuple(f"{p.name}=={p.version}" for p in pinned if p.index == index)
        exact = ["-r", str(requirements_file)]
        command = download_command(exact, house, tgt, index=index, extra=["--no-deps", "--require-hashes"])
        fallback = download_command(exact, house, tgt, extra=["--no-deps", "--require-hashes"]) if index else None
        steps.append(FetchStep(index, group, command, fallback))
    return steps


def fetch(lock: Path, house: Path, entry: dict, *, plat: platforms.Platform = platforms.PRIMARY, log=print) -> None:
    """Exactly the locked files into `house`, each from the index it was resolved from, hashes checked.

    A dedicated index that cannot serve its files here (this machine cannot reach the PyTorch index)
    is stood in for by pip's own configuration, which may hold a mirror: any file it serves is taken
    only if it has the lock's sha256 (--require-hashes)."""
    _, pinned = read_lock(lock)
    missing = [p for p in pinned if not _have(house, p)]
    if not missing:
        return
    house.mkdir(parents=True, exist_ok=True)
    redo = f"re-resolve the entry with `{LOCK_COMMAND.format(entry=entry['id'])}` where its indexes answer " \
           f"(it rewrites {shown(lock)} and says so), then commit the lock"
    offline = "no index answered: connect this machine to its package indexes (or a mirror in pip's configuration) " \
              "and run again; the lock itself may be fine"
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=house.parent) as tmp:
        req_file = Path(tmp) / "pinned.txt"
        for step in fetch_steps(lock, house, entry, req_file, plat, missing):
            group = [p for p in missing if p.index == step.index]
            req_file.write_text("".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in group))
            where = step.index or "the configured index"
            try:
                _run_pip(step.command, dedicated=bool(step.index), what=f"{lock.name} ({where})", log=log)
                continue
            except PipFailed as exc:
                if step.fallback is None:
                    advice = offline if exc.unreachable else redo
                    raise WheelError(f"{exc}. {shown(lock)} pins files that cannot be fetched from here: {advice}") from None
                first = exc
                log(f"[wheels] {step.index} cannot serve {', '.join(step.names)} here; asking pip's configured "
                    "indexes for the same files, accepted only by the lock's sha256")
            try:
                _run_pip(step.fallback, dedicated=False, what=f"{lock.name} (pip's configured indexes, by hash)", log=log)
            except PipFailed as exc:
                advice = offline if first.unreachable and exc.unreachable else redo
                raise WheelError(f"{shown(lock)} pins {', '.join(step.names)} from {step.index}, which cannot serve "
                                 f"them from here ({first}), and pip's configured indexes hold no file with the "
                                 f"locked sha256 ({exc}): {advice}") from None


def locked_version(entry: dict, kind: str, name: str) -> str | None:
    """The version a committed lock pins for `name` ('2.13.0+cpu'), local label included; None without one."""
    lock = lock_path(entry, kind)
    if not lock.exists():
        return None
    return next((p.version for p in read_lock(lock)[1] if p.name == name), None)


def _have(house: Path, pinned: Locked) -> bool:
    for wheel in house.glob("*.whl"):
        if wheel_name_version(wheel.name) == (pinned.name, pinned.version) and sha256(wheel) == pinned.sha256:
            return True
    return False


def find_wheel(house: Path, name: str, version: str) -> Path:
    for wheel in house.glob("*.whl"):
        if wheel_name_version(wheel.name) == (name, version):
            return wheel
    raise WheelError(f"the wheelhouse {house} lacks {name}=={version}: delete it and build again")


def lock_staleness(entry: dict, kind: str, lock: Path, plat: platforms.Platform = platforms.PRIMARY) -> str | None:
    """Why a committed lock no longer fits matrix.yaml (None: it fits): what it was resolved from,
    for which Python and platform, and from which dedicated index each such package came."""
    made_from, pinned = read_lock(lock)
    reqs = requirements(entry, kind)
    if made_from != describe(reqs):
        return f"was made from '{made_from}' but matrix.yaml now asks for '{describe(reqs)}'"
    if target_line(entry, plat) not in lock.read_text().splitlines()[:3]:
        return f"was not resolved '{target_line(entry, plat)[2:]}'"
    for req in reqs:
        name = req.spec.split("==")[0]
        for p in pinned:
            if p.name == name and p.index != req.index:
                return f"has {name} from {p.index or 'the configured index'}, matrix.yaml says {req.index or 'the configured index'}"
    return None


def wheelhouse(entry: dict, *, kinds=("train", "infer"), plat: platforms.Platform = platforms.PRIMARY, log=print) -> dict:
    """Host-side wheels for the entry's images and one lock per image kind; returns {kind: lock}.

    A committed lock is fetched exactly (and refused when matrix.yaml has moved on from it);
    without one, the entry is resolved and the lock written.
    """
    house = wheelhouse_dir(entry, plat)
    locks = {}
    # one process fills a wheelhouse at a time (the tests' workers may ask for the same one at once)
    with held(house.parent / f".{house.name}.lock", what=f"filling {shown(house)}", log=lambda m: log(f"[wheels] {m}")):
        for kind in kinds:
            lock = lock_path(entry, kind, plat)
            if lock.exists():
                stale = lock_staleness(entry, kind, lock, plat)
                if stale:
                    raise WheelError(f"{shown(lock)} {stale}: re-resolve it with "
                                     f"`{LOCK_COMMAND.format(entry=entry['id'])}`, and commit the new lock")
                fetch(lock, house, entry, plat=plat, log=log)
            else:
                resolve(entry, kind, house, plat=plat, log=log)
            locks[kind] = lock
    return locks


# ---------------------------------------------------------------- what the resolved wheels say

def elf_needed(data: bytes) -> list[str]:
    from elftools.elf.elffile import ELFFile

    dynamic = ELFFile(io.BytesIO(data)).get_section_by_name(".dynamic")
    return [tag.needed for tag in dynamic.iter_tags("DT_NEEDED")] if dynamic else []


def symbols_beyond(library: bytes, allowed: dict[str, set[str]]) -> list[str]:
    """name@VERSION of each symbol the library takes from another at a version `allowed` does not hold
    (GLIBC_2.34 where manylinux_2_28 stops at 2.28), read off its .gnu.version and .gnu.version_r."""
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(library))
    dynsym, versym = elf.get_section_by_name(".dynsym"), elf.get_section_by_name(".gnu.version")
    needed = elf.get_section_by_name(".gnu.version_r")
    if dynsym is None or versym is None or needed is None:
        return []
    names = {aux.entry["vna_other"]: aux.name for _, auxes in needed.iter_versions() for aux in auxes}
    beyond = set()
    for index, symbol in enumerate(dynsym.iter_symbols()):
        version = names.get(versym.get_symbol(index).entry["ndx"])
        if symbol["st_shndx"] != "SHN_UNDEF" or not version or "_" not in version:
            continue
        prefix, number = version.rsplit("_", 1)
        if prefix in allowed and number not in allowed[prefix]:
            beyond.add(f"{symbol.name}@{version}")
    return sorted(beyond)


def onnxruntime_cuda_needs(wheel: Path) -> list[str] | None:
    """NEEDED of the CUDA provider inside an onnxruntime-gpu wheel (None: the wheel has none)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith("libonnxruntime_providers_cuda.so")]
        return elf_needed(archive.read(names[0])) if names else None


def verify_onnxruntime_build(entry: dict, wheels: list[Path], *, log=print) -> None:
    """The resolved onnxruntime-gpu wheel links the entry's CUDA and cuDNN majors (read off its ELF)."""
    if entry["device"] != "cuda":
        return
    ort = [w for w in wheels if wheel_name_version(w.name)[0] == "onnxruntime-gpu"]
    if not ort:
        return
    needed = onnxruntime_cuda_needs(ort[0]) or []
    cudart = [n for n in needed if n.startswith("libcudart.so.")]
    cudnn = [n for n in needed if n.startswith("libcudnn.so.")]
    major = str(compat.release(entry["cuda"]).major)
    found_cuda = cudart[0].split(".so.")[1].split(".")[0] if cudart else "?"
    found_cudnn = cudnn[0].split(".so.")[1].split(".")[0] if cudnn else "?"
    if found_cuda != major or found_cudnn != str(entry["cudnn"]):
        raise WheelError(f"entry '{entry['id']}', field 'onnxruntime.version': the resolved {ort[0].name} links "
                         f"{', '.join(cudart + cudnn) or 'no CUDA runtime'} (CUDA {found_cuda}, cuDNN {found_cudnn}), "
                         f"not CUDA {major} with cuDNN {entry['cudnn']}: pin a build for the entry's CUDA, from its own feed")
    log(f"[wheels] {ort[0].name}: CUDA provider links {', '.join(cudart + cudnn)} (CUDA {major}, cuDNN {entry['cudnn']})")


def torch_onnxscript_api(torch_wheel: Path) -> str | None:
    """The onnxscript module torch's dynamo exporter imports ('onnxscript._framework_apis.torch_2_11'),
    read from torch/onnx/_internal/_lazy_import.py inside the wheel; None where torch names none."""
    with zipfile.ZipFile(torch_wheel) as archive:
        try:
            text = archive.read("torch/onnx/_internal/_lazy_import.py").decode()
        except KeyError:
            return None
    match = re.search(r"onnxscript\._framework_apis\.torch_\d+_\d+", text)
    return match[0] if match else None


def verify_onnxscript_api(entry: dict, wheels_found: list[Path], *, log=print) -> None:
    """With the dynamo exporter, the resolved onnxscript must hold the module the resolved torch imports
    (torch 2.11 imports torch_2_11, which onnxscript has from 0.6; 0.5.6 fails with ModuleNotFoundError)."""
    if "dynamo" not in entry["exporters"]:
        return
    by_name = {wheel_name_version(w.name)[0]: w for w in wheels_found}
    if "torch" not in by_name or "onnxscript" not in by_name:
        return
    module = torch_onnxscript_api(by_name["torch"])
    if module is None:
        return
    wanted = module.replace(".", "/") + ".py"
    with zipfile.ZipFile(by_name["onnxscript"]) as archive:
        has = wanted in archive.namelist()
    if not has:
        raise WheelError(f"entry '{entry['id']}', field 'onnxscript': torch {entry['torch']['version']}'s dynamo exporter "
                         f"imports {module}, which onnxscript {entry['onnxscript']} does not have: pin an onnxscript "
                         f"that does, or drop 'dynamo' from exporters")
    log(f"[wheels] onnxscript {entry['onnxscript']} has {module}, which torch {entry['torch']['version']} imports")
