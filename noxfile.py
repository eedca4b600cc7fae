"""The lab's sessions. `nox -l` lists them; `nox -s NAME -- --help` shows a session's options.

    nox -s tests              # build everything for the cpu entry and run the test suite
    nox -s bench              # the main job: regenerate results/<entry>/ (CSV, charts, summary)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import nox

REPO = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

from lab import matrix  # noqa: E402  (needs the repo on sys.path)
from lab.files import held, write_text_atomic  # noqa: E402

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

# Sessions run on the Python that runs nox (any the cpu entry's wheels serve); an entry's own
# `python` pin governs its images, never the host.
TOOLS = REPO / "requirements" / "tools.txt"
COMPARE = REPO / "requirements" / "compare.txt"
TEST_TOOLS = REPO / "requirements" / "tests.txt"
# The suite's workers (pytest-xdist): 2 fit the 2-core CI machines, whose tests wait on Docker, pip and
# emulation for much of their time (docs/ci.md); MYOPS_TEST_WORKERS=1 runs it in one process.
TEST_WORKERS = "2"
WHEEL_TOOLS = REPO / "requirements" / "wheels.txt"


def _parse(session: nox.Session, parser: argparse.ArgumentParser) -> argparse.Namespace:
    try:
        args, rest = parser.parse_known_args(session.posargs)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        if exc.code:
            session.error("bad arguments (see above)")
        session.skip("help shown")
    if rest:
        session.error(f"unknown arguments {rest}; see `nox -s {session.name} -- --help`")
    return args


def _entry(session: nox.Session, entry_id: str, *, cuda_ok: bool = False) -> dict:
    """The matrix entry; a CUDA one only for a session that builds it in its images (cuda_ok)."""
    try:
        entry = matrix.entry(entry_id)
    except matrix.MatrixError as exc:
        session.error(str(exc))
    if entry["device"] == "cuda" and not cuda_ok:
        session.error(
            f"entry '{entry_id}' is a CUDA entry: the local backend builds only the cpu entry on this machine. "
            "Build its images with the docker backend, or run on a GPU host with its CUDA toolkit."
        )
    return entry


def _venv(session: nox.Session, entry: dict, *, models: bool = False, also: tuple[Path, ...] = ()) -> str:
    """The python of the entry's virtualenv, .nox/<entry>, shared by every session that runs the lab's
    code: one install of the entry's pins, one build of the extension and plugin (their build files
    name the venv's paths, so a venv per session recompiled both). Each session adds what it needs
    beyond the pins (models: transformers; `also`: requirement files), once: a stamp in the venv lists
    the installs done, by the digest of what each asked for (a changed requirements file installs again)."""
    venv = REPO / ".nox" / entry["id"]
    python = venv / "bin" / "python"
    pins = matrix.pip_pins(entry, models=models)
    torch_pin = next(p for p in pins if p.startswith("torch=="))
    steps = [("torch", [torch_pin]), ("pins", [p for p in pins if p != torch_pin] + ["-r", str(TOOLS)]),
             *((f.name, ["-r", str(f)]) for f in also)]
    session.env.update({
        "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "MYOPS_MATRIX_ENTRY": entry["id"],
        # A CPU entry builds CPU kernels only, also where pip's torch is a CUDA build and nvcc is absent.
        "MYOPS_NO_CUDA": "1",
    })
    # one session at a time changes the venv (two in two terminals would corrupt it)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with held(venv.parent / f".{entry['id']}.lock", what=f"changing {venv.relative_to(REPO)}", log=session.log):
        if not python.exists():
            session.log(f"creating the virtualenv every session of entry '{entry['id']}' shares: {venv.relative_to(REPO)}")
            session.run(sys.executable, "-m", "venv", "--clear", str(venv), external=True)
        stamp = venv / "lab-installed.json"
        done = json.loads(stamp.read_text()) if stamp.exists() else {}
        chain = ""  # a changed torch or pin installs again what was installed on top of it
        for what, args in steps:
            digest = _digest([chain, *args])
            if what in ("torch", "pins"):
                chain = digest
            if digest in done:
                continue
            if what == "torch":
                session.log(f"installing matrix entry '{entry['id']}' on this host's Python {sys.version.split()[0]} "
                            f"(its images use {entry['python']}): {', '.join(pins)}")
            if what == "torch" and entry["torch"]["index"]:
                _install_torch(session, str(python), entry)
            else:
                session.run(str(python), "-m", "pip", "install", "--disable-pip-version-check", *args, external=True)
            done[digest] = " ".join(a if not a.startswith("/") else Path(a).name for a in args)
            write_text_atomic(stamp, json.dumps(done, indent=1, sort_keys=True) + "\n")  # an interrupt keeps the last
    session.run(str(python), "-m", "lab.provenance", external=True)
    return str(python)


def _digest(args: list[str]) -> str:
    """What an install asks for: its arguments and the contents of the requirement files it names."""
    digest = hashlib.sha256(sys.version.encode())
    for arg in args:
        digest.update(arg.encode())
        if arg.startswith("/") and Path(arg).is_file():
            digest.update(Path(arg).read_bytes())
    return digest.hexdigest()[:16]


def _install_torch(session: nox.Session, python: str, entry: dict) -> None:
    """torch from the entry's own index, else the same build from pip's configuration (lab.wheels.install_torch)."""
    from lab import wheels

    try:
        wheels.install_torch(python, entry, log=session.log, warn=session.warn)
    except wheels.WheelError as exc:
        session.error(str(exc))


def _build(session: nox.Session, python: str, *, cuda: str = "AUTO") -> None:
    session.log("building the PyTorch extension (cached under build/ops)")
    session.run(python, "-m", "ops.build", external=True)
    session.log("building the ONNX Runtime plugin (cached under build/ort_plugin)")
    session.run(python, "-m", "ort_plugin.build", "--cuda", cuda, external=True)
    # Later steps use exactly this build, not whichever build dir is newest.
    where = session.run(python, "-c", f"from ort_plugin.build import library_path; print(library_path({cuda!r}))",
                        silent=True, external=True)
    if where:
        session.env["MYOPS_ORT_PLUGIN"] = where.strip().splitlines()[-1]


@nox.session(venv_backend="none")
def list(session: nox.Session) -> None:  # noqa: A001 - the session is called `list`
    """Show the matrix at a glance."""
    try:
        matrix.load()
    except matrix.MatrixError as exc:
        session.error(str(exc))
    session.run(sys.executable, "-m", "lab.matrix", external=True)


@nox.session(venv_backend="none")
def lock(session: nox.Session) -> None:
    """Resolve an entry's image locks anew from its indexes and rewrite docker/locks/<entry>-*.txt: `nox -s lock -- ENTRY`."""
    if len(session.posargs) != 1 or session.posargs[0].startswith("-"):
        session.error("give one matrix entry: nox -s lock -- ENTRY (nox -s list shows them)")
    session.run(sys.executable, "-m", "lab.locks", "lock", session.posargs[0], external=True)


def _base_overrides(session: nox.Session, values: list[str]) -> dict:
    overrides = {}
    for value in values:
        role, _, tag = value.partition("=")
        if role not in ("build", "runtime") or not tag:
            session.error(f"--base-image takes build=<image> or runtime=<image>; got {value!r}")
        overrides[role] = tag
    return overrides


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """Build matrix entries (default: cpu; `all` for every entry): Docker images and their proof, or locally."""
    from lab import docker, proof

    parser = argparse.ArgumentParser(prog="nox -s build --", description=build.__doc__)
    parser.add_argument("entries", nargs="*", default=[matrix.DEFAULT_ENTRY],
                        help="matrix entry ids (nox -s list), or `all`")
    parser.add_argument("--backend", choices=["docker", "local"],
                        help="docker: the entry's train and infer images; local: this machine's virtualenv "
                             "(default: docker when a daemon answers, else local)")
    parser.add_argument("--base-image", action="append", default=[], metavar="ROLE=IMAGE",
                        help="use a local image as the build or runtime base (e.g. build=nvidia/cuda:12.1.1-devel-ubuntu22.04)")
    parser.add_argument("--cuda", choices=["ON", "OFF", "AUTO"], default="AUTO", help="local: CUDA kernels in the plugin")
    parser.add_argument("--no-proof", action="store_true", help="docker: skip the images' proof (lab.proof)")
    parser.add_argument("--arch", action="append", metavar="ARCH",
                        help="docker: infer image architectures (amd64, arm64, all; default: each one the entry lists "
                             "that can be built here, another architecture needing qemu-user-static)")
    args = _parse(session, parser)
    entries = [*matrix.load()["entries"]] if args.entries == ["all"] else args.entries  # (`list` is a session here)
    backend = args.backend or ("docker" if docker.daemon_version() else "local")
    session.log(f"backend: {backend}; nvcc {_tool_version(['nvcc', '--version'])}; "
                f"docker {docker.daemon_version() or 'no daemon'}")
    failed = {}
    for entry_id in entries:
        if backend == "local":
            _build(session, _venv(session, _entry(session, entry_id)), cuda=args.cuda)
            continue
        overrides = _base_overrides(session, args.base_image)
        try:
            matrix.entry(entry_id)
            tags = docker.build_images(entry_id, base_overrides=overrides, arches=_arches(session, entry_id, args.arch),
                                       log=session.log)
            session.log(f"{entry_id}: {tags['train']} and {tags['infer']}")
            if not args.no_proof:
                rows = proof.prove(entry_id, base_overrides=overrides, log=session.log)
                bad = [r["check"] for r in rows if r["result"] == "fail"]
                if bad:
                    failed[entry_id] = f"proof failed: {', '.join(bad)} (results/image_proofs.csv)"
        except (matrix.MatrixError, docker.DockerError) as exc:
            if len(entries) == 1:
                session.error(str(exc))
            failed[entry_id] = str(exc)
            session.warn(f"{entry_id}: {exc}")
    if failed:
        session.error("not built or not proven here:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items()))


def _arches(session: nox.Session, entry_id: str, asked: list[str] | None) -> tuple:
    """--arch as given; by default the entry's architectures, less those this machine cannot emulate (said)."""
    from lab import docker, platforms

    if asked:
        return tuple(asked)
    chosen = []
    for plat in platforms.infer_platforms(matrix.entry(entry_id)):
        try:
            docker.require_emulation(plat)
            chosen.append(plat.docker)
        except docker.DockerError as exc:
            session.warn(f"{entry_id}: no {plat.docker} infer image: {exc}")
    return tuple(chosen)


def _tool_version(cmd: list[str]) -> str:
    import shutil
    import subprocess

    if shutil.which(cmd[0]) is None:
        return "not installed"
    out = subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1] if out else "unknown"


@nox.session
def publish(session: nox.Session) -> None:
    """Push an entry's images to --registry, or write them as a docker-save archive for `docker load`
    (with --wheels, the entry's wheels beside it)."""
    from lab import dist, docker, platforms

    parser = argparse.ArgumentParser(prog="nox -s publish --", description=publish.__doc__)
    parser.add_argument("entry", nargs="?", default=matrix.DEFAULT_ENTRY)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--registry", help="e.g. registry.example.com:5000/team; images are tagged and pushed there")
    target.add_argument("--archive", type=Path, help="directory for <entry>-images.tar.gz and its .sha256")
    parser.add_argument("--infer-only", action="store_true", help="only the infer image (what a GPU host needs)")
    parser.add_argument("--wheels", type=Path, help="with --archive: also the wheels of this folder (nox -s wheels "
                        "writes dist/ENTRY), each with its .sha256, beside the images' archive")
    args = _parse(session, parser)
    if args.wheels and not args.archive:
        session.error("--wheels goes with --archive DIR (the wheels are written beside the images' archive)")
    try:
        if args.wheels:
            dist.recorded(args.wheels, args.entry)  # checked before anything is written
        docker.require_daemon()
        entry = matrix.entry(args.entry)
        tags = docker.image_tags(entry)
        wanted = [tags["infer"]] if args.infer_only else [tags["train"], tags["infer"]]
        missing = [t for t in wanted if not docker.image_id(t)]
        if missing:
            session.error(f"images {missing} are not built: run `nox -s build -- {args.entry}` first")
        # Every architecture's infer image that is built here goes along (one multi-arch tag in a registry).
        infer = {p.docker: docker.image_tags(entry, p)["infer"] for p in platforms.infer_platforms(entry)}
        infer = {arch: tag for arch, tag in infer.items() if tag == tags["infer"] or docker.image_id(tag)}
        if len(infer) < len(platforms.infer_platforms(entry)):
            session.warn(f"publishing the infer image for {', '.join(infer)} only: the others are not built here "
                         f"(nox -s build -- {args.entry} --arch all)")
        if args.registry:
            for remote in docker.push([t for t in wanted if t != tags["infer"] or len(infer) == 1], args.registry,
                                      log=session.log):
                session.log(f"pushed {remote}")
            if len(infer) > 1:
                remote = docker.push_multiarch(infer, args.registry, log=session.log)
                session.log(f"pushed {remote} for {', '.join(infer)}: `docker pull {remote}` on each host")
        else:
            wanted += [tag for tag in infer.values() if tag not in wanted]
            archive = docker.save_archive(wanted, args.archive, f"{args.entry}-images", log=session.log)
            session.log(f"wrote {archive} (+ .sha256); on the host: gunzip -c {archive.name} | docker load")
            if args.wheels:
                for wheel in dist.publish(args.wheels, args.archive, entry_id=args.entry, log=session.log):
                    session.log(f"on the host: pip install {wheel.name}")
    except (matrix.MatrixError, docker.DockerError, dist.DistError) as exc:
        session.error(str(exc))


@nox.session(venv_backend="none")
def export(session: nox.Session) -> None:
    """Export every op's models (ops.export.MODELS, from ops.registry) with both exporters, both lowerings and every opset to build/onnx."""
    parser = argparse.ArgumentParser(prog="nox -s export --", description=export.__doc__)
    parser.add_argument("--entry", default=matrix.DEFAULT_ENTRY)
    parser.add_argument("--beta", type=float, default=1.0)
    args = _parse(session, parser)
    entry = _entry(session, args.entry)
    python = _venv(session, entry)
    _build(session, python)
    for exporter in entry["exporters"]:
        for lowering in ("custom", "decomposed"):
            session.log(f"exporting every model ({lowering}) with {exporter}")
            session.run(python, "-m", "ops.export", "--model", "all", "--exporter", exporter,
                        "--lowering", lowering, "--beta", str(args.beta))


@nox.session(venv_backend="none")
def new_op(session: nox.Session) -> None:
    """Scaffold a new op in all three layers: `nox -s new_op -- NAME [--kind elementwise|rowwise] [--inputs N|x,...]
    [--outputs N|y,...] [--weights W,...] [--attributes A=V,...] [--native EXPR]`."""
    from lab import new_op as scaffold

    try:
        status = scaffold.main(session.posargs)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        if exc.code:
            session.error("bad arguments (see above)")
        session.skip("help shown")
    if status:
        session.error("nothing was written (see the message above)")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Build for the cpu entry and run the test suite (pytest options after --)."""
    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY), models=True, also=(COMPARE, WHEEL_TOOLS, TEST_TOOLS))
    _build(session, python)
    # pytest options after --; test files or directories given there replace the whole suite
    chosen = [a for a in session.posargs if a.startswith("tests")]
    workers = os.environ.get("MYOPS_TEST_WORKERS", TEST_WORKERS)
    if not workers.isdigit() or int(workers) < 1:
        session.error(f"MYOPS_TEST_WORKERS is how many pytest workers run the suite (1: one process); got {workers!r}")
    # Units of tests that share a fixture stay on one worker, the costliest first (tests/conftest.py).
    # One process where the options need a terminal (--pdb, -s) or choose the workers themselves.
    own = [a for a in session.posargs if a in ("--pdb", "-s", "--capture=no", "--trace") or a.startswith(("-n", "--numprocesses",
                                                                                                           "--dist"))]
    spread = [] if int(workers) == 1 or own else ["-n", workers]
    # --durations: the slowest 30 tests, so a run shows where its minutes go (docs/ci.md)
    session.run(python, "-m", "pytest", *([] if chosen else ["tests"]), "-ra", "--durations=30", *spread,
                *session.posargs)


@nox.session(venv_backend="none")
def wheels(session: nox.Session) -> None:
    """Build the wheels users pip install into dist/ENTRY/: myops-ort (the ONNX Runtime plugin, no torch)
    and myops-torch (the extension for the entry's torch), checked and tagged by auditwheel; a CUDA
    entry's (myops-ort-cu12, +torch2.4.1.cu121) are built in its images, with Docker."""
    parser = argparse.ArgumentParser(prog="nox -s wheels --", description=wheels.__doc__)
    parser.add_argument("entry", nargs="?", default=matrix.DEFAULT_ENTRY)
    parser.add_argument("--only", choices=["ort", "torch"], help="build one of the two")
    parser.add_argument("--arch", default="amd64", help="the plugin wheel's architecture: amd64, or arm64 "
                        "(cross-compiled with Debian's g++-aarch64-linux-gnu; with --only ort)")
    parser.add_argument("--out", type=Path, help="where the wheels go (default dist/ENTRY)")
    args = _parse(session, parser)
    _entry(session, args.entry, cuda_ok=True)  # a CUDA entry's wheels are built in its images
    # The host's entry venv: the extension wheel builds against its torch; the plugin wheel and a CUDA
    # entry's (built in its images) need only its tools.
    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY), also=(WHEEL_TOOLS,))
    session.run(python, "-m", "lab.dist", args.entry, "--arch", args.arch,
                *(["--only", args.only] if args.only else []), *(["--out", str(args.out)] if args.out else []))


@nox.session(venv_backend="none")
def reproduce(session: nox.Session) -> None:
    """Build an entry's artifacts twice (two clones: other folders, time zones, locales, umasks) and
    compare them byte for byte; results/reproducibility.csv, exit 1 on an unexplained difference.
    A CUDA entry (cuda12.1): its two wheels, built in its images twice (Docker)."""
    parser = argparse.ArgumentParser(prog="nox -s reproduce --", description=reproduce.__doc__)
    parser.add_argument("entry", nargs="?", default=matrix.DEFAULT_ENTRY)
    parser.add_argument("--cuda-architectures", help="also the CUDA plugin for these (CMake syntax, e.g. 90-real)")
    parser.add_argument("--images", action="store_true",
                        help="compare with the entry's images too, building them from this checkout where needed")
    args = _parse(session, parser)
    _entry(session, args.entry, cuda_ok=True)  # a CUDA entry's wheels are built in its images
    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY), also=(WHEEL_TOOLS,))  # the clones build wheels too
    extra = ["--cuda-architectures", args.cuda_architectures] if args.cuda_architectures else []
    extra += ["--images"] if args.images else []
    session.run(python, "-m", "lab.reproduce", args.entry, *extra)


@nox.session(venv_backend="none")
def sanitize(session: nox.Session) -> None:
    """Build the plugin with ASan + UBSan (CPU) and run it through onnxruntime under them."""
    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY))
    session.run(python, "-m", "ort_plugin.sanitize", *session.posargs)


def _cuda_home(session: nox.Session) -> str:
    """$CUDA_HOME, else the toolkit nvcc itself reports: torch's own guess (nvcc's dir/..) is wrong
    when nvcc on PATH is a wrapper script, as /usr/local/bin/nvcc is on these machines."""
    import shutil

    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    if shutil.which("nvcc") is None:
        session.error("nvcc not found: install the CUDA toolkit (13.x, matching torch's CUDA 13) or set CUDA_HOME")
    from lab.provenance import cuda_toolkit_root

    root = cuda_toolkit_root("nvcc")
    if root is None:
        session.error("cannot tell where nvcc's toolkit lies: set CUDA_HOME")
    return str(root.resolve())


# Loading needs no GPU: it registers the kernels; running them would need one.
_CUDA_KERNEL_REGISTERED = (
    "import sys, torch; from ops.build import build_info; torch.ops.load_library(build_info()['library']); "
    "from opspec import TORCH_OPS; "
    "missing = [f'myops::{op}' for op in TORCH_OPS "
    "if not torch._C._dispatch_has_kernel_for_dispatch_key(f'myops::{op}', 'CUDA')]; "
    "print(f'CUDA kernels registered after loading; missing: {missing or None}'); sys.exit(1 if missing else 0)"
)


@nox.session
def cuda_compile(session: nox.Session) -> None:
    """Compile the extension and the plugin with CUDA (no GPU needed) and check their architectures.

    Both are compiled for a CUDA entry's torch_cuda_arch_list with the local nvcc; cuobjdump then
    lists what each binary holds, records it in its build_info.json and fails on any difference.
    The torch is requirements/cuda-compile.txt's CUDA 13 build on this Python, not the entry's own pins.
    """
    import time

    from lab import docker

    parser = argparse.ArgumentParser(prog="nox -s cuda_compile --", description=cuda_compile.__doc__.splitlines()[0])
    parser.add_argument("--entry", default="cuda13.0", help="the CUDA matrix entry whose architectures to compile for "
                             "(CUDA 13, as the torch in requirements/cuda-compile.txt)")
    parser.add_argument("--build-dir", type=Path, default=REPO / "build" / "cuda-compile",
                        help="where both builds go, apart from the cpu builds (default: build/cuda-compile)")
    args = _parse(session, parser)
    try:
        entry = matrix.entry(args.entry)
    except matrix.MatrixError as exc:
        session.error(str(exc))
    if entry["device"] != "cuda":
        session.error(f"entry '{args.entry}' is not a CUDA entry: it has no architectures to compile for")
    started = time.perf_counter()
    arch_list = " ".join(entry["torch_cuda_arch_list"])
    session.install("-r", str(REPO / "requirements" / "cuda-compile.txt"))
    build_dir = args.build_dir.resolve()
    session.env.update({
        "CUDA_HOME": _cuda_home(session),
        # Without a GPU, torch cannot pick architectures itself.
        "TORCH_CUDA_ARCH_LIST": arch_list,
        "MYOPS_BUILD_DIR": str(build_dir / "ops"),
        "MYOPS_PLUGIN_BUILD_DIR": str(build_dir / "ort_plugin"),
        "MYOPS_MATRIX_ENTRY": entry["id"],
    })
    session.log(f"entry {entry['id']}: TORCH_CUDA_ARCH_LIST='{arch_list}', CUDA_HOME={session.env['CUDA_HOME']}")
    session.run("python", "-m", "ops.build")
    session.run("python", "-m", "ops.check_archs", "--arch-list", arch_list)
    session.run("python", "-c", _CUDA_KERNEL_REGISTERED)
    session.run("python", "-m", "ort_plugin.build", "--cuda", "ON",
                "--cuda-architectures", docker.cmake_cuda_architectures(entry["torch_cuda_arch_list"]))
    plugin_info = build_dir / "ort_plugin" / f"ort{entry['ort_headers']['version']}-cudaon" / "build_info.json"
    session.run("python", "-m", "ops.check_archs", "--build-info", str(plugin_info), "--arch-list", arch_list)
    # A check that cannot fail proves nothing: the same plugin against the list less its first item must exit 1.
    wrong = " ".join(entry["torch_cuda_arch_list"][1:])
    session.log(f"expected to FAIL (list without {entry['torch_cuda_arch_list'][0]}):")
    session.run("python", "-m", "ops.check_archs", "--build-info", str(plugin_info), "--arch-list", wrong,
                success_codes=[1])
    session.log(f"cuda_compile: both binaries hold exactly '{arch_list}' ({time.perf_counter() - started:.0f} s)")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """The main job: measure every row for an entry and write results/<entry>/ (CSV, charts, summary).

    Runs inside the entry's train image when a Docker daemon answers (--backend docker), else in a
    local virtualenv with the entry's pins; other options go to `python -m bench.run` (see --help).
    With `--on TARGET` (repeatable) it runs the infer image's bench on those Docker hosts instead
    (bench.fanout: `python -m bench.fanout --help`).
    """
    from lab import docker

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--backend", choices=["docker", "local"])
    parser.add_argument("--entry")
    parser.add_argument("--on", action="append", default=[])
    args, rest = parser.parse_known_args(session.posargs)
    if {"-h", "--help"} & set(rest):  # at once: no venv install, no image build
        _bench_help()
        session.skip("help shown")
    if args.on:
        if args.backend or args.entry:
            session.error("--on runs each target's infer image: give the entry in the target (docker@cpu, "
                          "ssh://me@box@cpu/arm64), not --entry or --backend")
        _fan_out(session, args.on, rest)
        return
    args.entry = args.entry or matrix.DEFAULT_ENTRY
    entry = _entry(session, args.entry)
    backend = args.backend or ("docker" if docker.daemon_version() else "local")
    session.log(f"backend: {backend} (docker daemon: {docker.daemon_version() or 'none'})")
    if backend == "local":
        python = _venv(session, entry)
        _build(session, python)
        session.run(python, "-m", "bench.run", "--entry", args.entry, *rest)
        return
    # Where the run writes is decided here, where git can see the checkout (bench.run_args), and mounted.
    from bench import run_args
    from lab import provenance

    given, rest = _without_results(rest)
    results, why = run_args.destination(run_args.parser().parse_known_args([*rest, "--results", str(given)] if given else rest)[0])
    if why not in ("--results", "the default"):
        session.log(f"writing to {results} ({why}), not the committed results/; pass --results results to write there")
    try:
        tags = docker.build_images(args.entry, log=session.log)
        image = f"{tags['train']}@{docker.image_id(tags['train'])}"
        results.mkdir(parents=True, exist_ok=True)
        result = docker.run_interactive(
            tags["train"], "python", "-m", "bench.run", "--entry", args.entry, "--results", "/lab/results", *rest,
            volumes={str(results.resolve()): "/lab/results"},
            env={"MYOPS_IMAGE": image, "MYOPS_GIT_SHA": docker.revision(),
                 "MYOPS_GIT_DIRTY": str(provenance.git_state()["git_dirty"])})
    except docker.DockerError as exc:
        session.error(str(exc))
    if result != 0:
        session.error(f"the benchmark failed inside {tags['train']} (exit {result})")


def _bench_help() -> None:
    """`nox -s bench -- --help`: this session's own options, then bench.run's (a parser that imports
    nothing heavy)."""
    from bench import run_args

    print("usage: nox -s bench -- [--backend {docker,local}] [--entry ENTRY] [--on TARGET ...] [bench.run options]\n\n"
          "  --backend      docker: inside the entry's train image (the default where a Docker daemon answers);\n"
          "                 local: in a virtualenv with the entry's pins\n"
          "  --entry        the matrix entry (default: cpu)\n"
          "  --on TARGET    run the infer image's bench on Docker hosts instead (python -m bench.fanout --help)\n")
    run_args.parser().print_help()


def _without_results(rest: list[str]) -> tuple[Path | None, list[str]]:
    """(the --results folder given, the other arguments): inside the image the results are a mount."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--results", type=Path)
    known, others = parser.parse_known_args(rest)
    return known.results, others


def _targets(session: nox.Session, specs: list[str]) -> list:
    """The targets as bench.cross_machine_diff reads them (entry, architecture); a bad one ends the session."""
    from bench.cross_machine_diff import parse_target

    try:
        return [parse_target(spec) for spec in specs]
    except ValueError as exc:
        session.error(str(exc))


def _fan_out(session: nox.Session, specs: list[str], rest: list[str]) -> None:
    """`--on TARGET ...`: the infer image's bench on each target at once (bench.fanout); the images are
    built here first where missing, since each target's image is checked against this build."""
    from lab import docker, platforms

    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY))
    wanted: dict = {}
    for target in _targets(session, specs):
        wanted.setdefault(target.entry, {"amd64"}).add(target.arch or "amd64")
    try:
        docker.require_daemon()
        for entry_id, arches in wanted.items():
            entry = matrix.entry(entry_id)
            tags = [docker.image_tags(entry, platforms.get(a))["infer"] for a in arches]
            if not all(docker.image_id(t) for t in tags):
                session.log(f"building {entry_id}'s images for {', '.join(sorted(arches))} first")
                docker.build_images(entry_id, arches=tuple(sorted(arches)), log=session.log)
    except (matrix.MatrixError, docker.DockerError, platforms.PlatformError) as exc:
        session.error(str(exc))
    session.run(python, "-m", "bench.fanout", *[part for spec in specs for part in ("--on", spec)], *rest,
                env={"PYTHONPATH": str(REPO)})


@nox.session(venv_backend="none")
def doctor(session: nox.Session) -> None:
    """Diagnose this machine: torch/nvcc/ABI, GPU vs compiled architectures, ORT, the plugin, and given ONNX files."""
    # --help too runs in the entry's environment: the doctor imports torch and numpy, which nox's has not.
    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY))
    _build(session, python)
    session.run(python, "-m", "ops.doctor", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Rebuild every chart and summary under results/ from the CSVs alone."""
    session.install("-r", str(TOOLS))
    session.run("python", "-m", "bench.report", *session.posargs)


@nox.session(venv_backend="none")
def compare(session: nox.Session) -> None:
    """NEW against BASE, row by row from their samples (results dirs, CSVs or git revisions); exit 1 on a slowdown."""
    own = session.posargs[:session.posargs.index("--")] if "--" in session.posargs else session.posargs
    same_build = any(a == "--same-build" or a.startswith("--same-build=") for a in own)  # runs the benchmark here
    if same_build:
        entry_id = next((a.split("=", 1)[1] for a in own if a.startswith("--entry=")), None)
        if entry_id is None and "--entry" in own[:-1]:
            entry_id = own[own.index("--entry") + 1]
        _entry(session, entry_id or matrix.DEFAULT_ENTRY)  # a CUDA entry is refused here
    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY), also=(COMPARE,))
    if same_build:
        _build(session, python)
    session.run(python, "-m", "bench.compare", *session.posargs, env={"PYTHONPATH": str(REPO)})


@nox.session(venv_backend="none")
def cross_machine_diff(session: nox.Session) -> None:
    """Layer 3: the same ONNX files and inputs on several targets (default: docker local) must agree."""
    from lab import docker, platforms

    # Targets are the positional arguments; each option of bench.cross_machine_diff takes a value.
    args = session.posargs
    specs = [a for i, a in enumerate(args) if not a.startswith("-")
             and not (i and args[i - 1].startswith("--") and "=" not in args[i - 1])] or ["docker", "local"]
    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY))
    if {"-h", "--help"} & set(args):  # its options at once: no build, no artifacts
        session.run(python, "-m", "bench.cross_machine_diff", "--help")
        return
    _build(session, python)
    session.log("writing the artifacts every target runs (build/artifacts)")
    session.run(python, "-m", "ops.artifacts", "--out", "build/artifacts")
    for target in _targets(session, specs):
        arch = target.arch or "amd64"
        tag = docker.image_tags(matrix.entry(target.entry), platforms.get(arch))["infer"]
        if target.kind == "docker" and target.host is None and docker.daemon_version() and not docker.image_id(tag):
            session.log(f"{tag} is not built on the local daemon yet: building it")
            try:
                docker.build_images(target.entry, arches=("amd64", arch), log=session.log)
            except docker.DockerError as exc:
                session.error(str(exc))
    session.run(python, "-m", "bench.cross_machine_diff", *session.posargs)


@nox.session(venv_backend="none")
def model(session: nox.Session) -> None:
    """A whole model through the chain: `nox -s model -- MODEL` (llama, qwen2, or path/to/file.py:factory).

    Patches it with the myops ops, proves layer 1 and layer 2, exports it, measures the rows and writes
    results/<entry>/models/<model>/; options after MODEL go to `python -m bench.models.run` (see --help).
    """
    entry_id = next((a.split("=", 1)[1] for a in session.posargs if a.startswith("--entry=")), None)
    if entry_id is None and "--entry" in session.posargs[:-1]:
        entry_id = session.posargs[session.posargs.index("--entry") + 1]
    entry = _entry(session, entry_id or matrix.DEFAULT_ENTRY)
    if not entry.get("transformers"):
        session.error(f"entry '{entry['id']}' pins no transformers in matrix.yaml: whole-model runs use the cpu entry")
    python = _venv(session, entry, models=True)
    _build(session, python)
    session.run(python, "-m", "bench.models.run", *session.posargs)


@nox.session(venv_backend="none")
def fuse(session: nox.Session) -> None:
    """Rewrite an ONNX file so each op's decomposed forms are one myops node, proven in ORT: `nox -s fuse -- IN.onnx OUT.onnx`."""
    python = _venv(session, _entry(session, matrix.DEFAULT_ENTRY))
    _build(session, python)
    session.run(python, "-m", "ops.fuse", *session.posargs)
