"""The CUDA toolkit the entry's images compile with on the lab's own bases, assembled from pinned
packages into build/cuda-toolkits/<pin>/ (CUDA_HOME layout: bin, nvvm, include, lib64).

    source: debian   nvidia-cuda-toolkit (nvcc, cicc, ptxas, fatbinary, nvlink, cuobjdump) with the
                     nvidia-cuda-dev (headers, static cudart, the driver stub) and libcudart it names,
                     from one Debian suite's non-free component, unpacked, not installed
    source: wheels   NVIDIA's CUDA 13 wheels (cuda-toolkit[nvcc,crt,nvvm,...]), which hold the whole nvcc

docker/locks/<entry>-toolkit.txt pins every file by sha256. NVIDIA's container registry is not
needed (and deletes end-of-life tags); an official nvidia/cuda devel base, where one is used, brings
its own toolkit and this one is ignored. `python -m lab.toolkit ENTRY` assembles and prints it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from . import debian, matrix, wheels
from .files import held, shown, write_text_atomic

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "build" / "cuda-toolkits"
DOWNLOADS = REPO / "build" / "downloads"
DEB_MARK = "deb "

# Our own nvcc.profile: the standard TOP-relative layout, whatever the packages' paths were (CUDA 13
# keeps Thrust/CUB/libcu++ under include/cccl; Debian's packages put them in include/).
NVCC_PROFILE = """\
TOP              = $(_HERE_)/..
CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(CICC_PATH):$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
SYSTEM_INCLUDES +=  "-isystem" "$(TOP)/include/cccl" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""
# CUDA's C++ core library (nv/target, cuda/std) and CUB/Thrust: Debian ships them apart, in main.
DEB_CCCL = ["libcu++-dev", "libcub-dev", "libthrust-dev"]
DEB_TOOLS = ["cudafe++", "fatbinary", "nvlink", "ptxas", "bin2c", "cuobjdump", "nvdisasm", "nvprune", "cu++filt"]
DEB_LIBS = ["libcudart_static.a", "libcudadevrt.a", "libculibos.a"]
# CUDA 13 wheels: the compiler's own parts, and the libraries whose headers torch's CUDA headers include.
WHEEL_EXTRAS = ["nvcc", "crt", "nvvm", "cudart", "cccl", "culibos"]
WHEEL_HEADER_EXTRAS = ["cublas", "cusparse", "cusolver", "curand", "cufft"]
WHEEL_CUOBJDUMP = "nvidia-cuda-cuobjdump==13.2.51"  # its first wheel; reads 13.0 binaries


class ToolkitError(RuntimeError):
    pass


def lock_path(entry: dict) -> Path:
    return wheels.LOCKS / f"{entry['id']}-toolkit.txt"


def home(entry: dict) -> Path:
    """One directory per toolkit pin: entries that share a compiler share its assembly."""
    return ROOT / re.sub(r"[^A-Za-z0-9.]+", "-", pin_text(entry)).strip("-")


def pin_text(entry: dict) -> str:
    t = entry["toolkit"]
    return f"debian {t['suite']} nvidia-cuda-toolkit={t['version']}" if t["source"] == "debian" \
        else f"wheels cuda-toolkit=={t['version']}"


# ---------------------------------------------------------------- Debian

def _deb_lock_lines(entry: dict, apt: debian.Apt) -> list[tuple[str, str]]:
    """(package, version) of the compiler, the dev package it names, the runtime that one names,
    and the suite's CCCL headers."""
    version = entry["toolkit"]["version"]
    dev = apt.depends_on("nvidia-cuda-toolkit", version, "nvidia-cuda-dev")
    runtime = apt.depends_on(*dev, "libcudart")
    return [("nvidia-cuda-toolkit", version), dev, runtime] + [(p, apt.show(p)["Version"]) for p in DEB_CCCL]


def _fetch_debs(entry: dict, log) -> list[Path]:
    suite = entry["toolkit"]["suite"]
    lock = lock_path(entry)
    dest = DOWNLOADS / "debian" / suite
    with debian.Apt(suite, ("main", "non-free")) as apt:
        if lock.exists():
            pinned = [(m[1], m[2], m[3]) for m in re.finditer(r"^deb (\S+)=(\S+) sha256:([0-9a-f]{64})$",
                                                             lock.read_text(), flags=re.M)]
        else:
            pinned = [(name, version, None) for name, version in _deb_lock_lines(entry, apt)]
        files = []
        for name, version, digest in pinned:
            # A file apt already fetched (and checked) here: by the lock's sha256, or by its exact name.
            named = dest / f"{name}_{version.replace(':', '%3a')}_amd64.deb"
            existing = [p for p in dest.glob(f"{name}_*.deb") if digest and wheels.sha256(p) == digest]
            existing += [named] if not digest and named.exists() else []
            if existing:
                files.append(existing[0])
                continue
            log(f"[toolkit] apt-get download {name}={version} ({suite}) ...")
            with tempfile.TemporaryDirectory(dir=DOWNLOADS) as tmp:
                deb = apt.download(name, version, Path(tmp))
                if digest and wheels.sha256(deb) != digest:
                    raise ToolkitError(f"{deb.name}: sha256 differs from {shown(lock)}: the archive changed "
                                       f"under the same version; re-pin what it serves now with "
                                       f"`{wheels.LOCK_COMMAND.format(entry=entry['id'])}` and commit the lock")
                dest.mkdir(parents=True, exist_ok=True)
                os.replace(deb, dest / deb.name)
                files.append(dest / deb.name)
    if not lock.exists():
        lines = [f"# {entry['id']} toolkit: {pin_text(entry)}",
                 "# Generated by lab/toolkit.py; each .deb is fetched with apt (signatures) and checked against this sha256."]
        lines += [f"{DEB_MARK}{name}={version} sha256:{wheels.sha256(f)}" for (name, version, _), f in zip(pinned, files)]
        write_text_atomic(lock, "\n".join(lines) + "\n")
        log(f"[toolkit] wrote {shown(lock)}")
    return files


def _assemble_debian(files: list[Path], out: Path) -> None:
    toolkit_deb, dev_deb, runtime_deb, *cccl_debs = files
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        root = Path(tmp)
        for deb in cccl_debs:
            debian.extract(deb, root, ["./usr/include/*"])
        debian.extract(toolkit_deb, root, ["./usr/bin/*", "./usr/lib/nvidia-cuda-toolkit/*", "./usr/include/*"])
        debian.extract(dev_deb, root, ["./usr/include/*", *(f"./usr/lib/x86_64-linux-gnu/{lib}" for lib in DEB_LIBS),
                                       "./usr/lib/x86_64-linux-gnu/stubs/libcuda.so"])
        debian.extract(runtime_deb, root, ["./usr/lib/x86_64-linux-gnu/libcudart.so.*"])
        debian_bin = root / "usr" / "lib" / "nvidia-cuda-toolkit" / "bin"
        (out / "bin" / "crt").mkdir(parents=True)
        shutil.copy2(debian_bin / "nvcc", out / "bin" / "nvcc")  # Debian's /usr/bin/nvcc is a wrapper script
        for stub in (debian_bin / "crt").iterdir():
            shutil.copy2(stub, out / "bin" / "crt" / stub.name)
        for tool in DEB_TOOLS:
            if (root / "usr" / "bin" / tool).exists():
                shutil.copy2(root / "usr" / "bin" / tool, out / "bin" / tool)
        (out / "nvvm" / "bin").mkdir(parents=True)
        shutil.copy2(debian_bin / "cicc", out / "nvvm" / "bin" / "cicc")
        shutil.copytree(root / "usr" / "lib" / "nvidia-cuda-toolkit" / "libdevice", out / "nvvm" / "libdevice")
        shutil.copytree(root / "usr" / "include", out / "include", symlinks=True)
        libdir = root / "usr" / "lib" / "x86_64-linux-gnu"
        (out / "lib64" / "stubs").mkdir(parents=True)
        for lib in DEB_LIBS:
            shutil.copy2(libdir / lib, out / "lib64" / lib)
        shutil.copy2(libdir / "stubs" / "libcuda.so", out / "lib64" / "stubs" / "libcuda.so")
        runtime = sorted(p for p in libdir.glob("libcudart.so.*") if not p.is_symlink())[0]
        soname = "libcudart.so." + runtime.name.split(".so.")[1].split(".")[0]
        shutil.copy2(runtime, out / "lib64" / soname)
        os.symlink(soname, out / "lib64" / "libcudart.so")


# ---------------------------------------------------------------- CUDA 13 wheels

def _wheel_requirements(entry: dict) -> list[str]:
    extras = ",".join(WHEEL_EXTRAS + WHEEL_HEADER_EXTRAS)
    return [f"cuda-toolkit[{extras}]=={entry['toolkit']['version']}", WHEEL_CUOBJDUMP]


def _fetch_wheels(entry: dict, log) -> list[Path]:
    lock = lock_path(entry)
    house = DOWNLOADS / "toolkit-wheels" / entry["id"]
    tgt = wheels.target(entry)
    if lock.exists():
        wheels.fetch(lock, house, entry, log=log)
        _, pinned = wheels.read_lock(lock)
        return [wheels.find_wheel(house, p.name, p.version) for p in pinned]
    house.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=house.parent) as tmp:
        wheels._run_pip(wheels.download_command(_wheel_requirements(entry), Path(tmp), tgt), dedicated=False,
                        what=f"the {entry['id']} toolkit", log=log)
        found = []
        for wheel in Path(tmp).glob("*.whl"):
            os.replace(wheel, house / wheel.name)
            found.append(house / wheel.name)
    reqs = [wheels.Requirement(r) for r in _wheel_requirements(entry)]
    wheels.write_lock(lock, entry, "toolkit", reqs, {w: None for w in found})
    lines = lock.read_text().splitlines()
    lines[0] = f"# {entry['id']} toolkit: {pin_text(entry)} ({wheels.describe(reqs)})"
    lines[2] = "# Generated by lab/toolkit.py; the toolkit is unpacked from these wheels, each checked by its hash."
    write_text_atomic(lock, "\n".join(lines) + "\n")
    return found


def _assemble_wheels(files: list[Path], out: Path) -> None:
    header_only = {f"nvidia-{name}" for name in WHEEL_HEADER_EXTRAS}
    for wheel in files:
        name = wheels.wheel_name_version(wheel.name)[0]
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                parts = info.filename.split("/")
                if parts[0] != "nvidia" or len(parts) < 4 or info.is_dir():
                    continue
                relative = "/".join(parts[2:])  # nvidia/cu13/<relative>
                if name in header_only and not relative.startswith("include/"):
                    continue
                if relative.startswith("lib/"):
                    relative = "lib64/" + relative[4:]
                target = out / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as source, open(target, "wb") as sink:
                    shutil.copyfileobj(source, sink)
                if info.external_attr >> 16 & 0o111 or relative.startswith("bin/") or relative.startswith("nvvm/bin/"):
                    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    libs = out / "lib64"
    for versioned in libs.glob("libcudart.so.*"):
        if not (libs / "libcudart.so").exists():
            os.symlink(versioned.name, libs / "libcudart.so")


# ---------------------------------------------------------------- both

def relock(entry: dict, *, log=print) -> Path:
    """Pin the entry's toolkit anew (what its source serves now) and rewrite its lock; the old lock
    comes back if that fails."""
    lock = lock_path(entry)
    kept = lock.with_name(lock.name + ".old")
    if lock.exists():
        os.replace(lock, kept)
    try:
        _fetch_debs(entry, log) if entry["toolkit"]["source"] == "debian" else _fetch_wheels(entry, log)
    except BaseException:
        if kept.exists():
            os.replace(kept, lock)
        raise
    kept.unlink(missing_ok=True)
    log(f"[toolkit] rewrote {shown(lock)}: review and commit it")
    return lock


def assemble(entry: dict, *, log=print) -> Path:
    """The entry's toolkit under build/cuda-toolkits/<pin>/ (reused while its lock is unchanged)."""
    if entry["device"] != "cuda":
        raise ToolkitError(f"entry '{entry['id']}' is not a CUDA entry: it has no toolkit")
    out = home(entry)
    lock = lock_path(entry)
    if lock.exists() and _stamp(out) == _pins_of(lock.read_text()):
        return out
    # one assembly at a time: another process may be copying the toolkit this one would replace
    with held(ROOT / f".{out.name}.lock", what=f"assembling {pin_text(entry)}", log=lambda m: log(f"[toolkit] {m}")):
        return _assemble(entry, out, lock, log=log)


def _assemble(entry: dict, out: Path, lock: Path, *, log) -> Path:
    if lock.exists() and _stamp(out) == _pins_of(lock.read_text()):  # made while this one waited
        return out
    if lock.exists() and pin_text(entry) not in lock.read_text().splitlines()[0]:
        raise ToolkitError(f"{shown(lock)} pins another toolkit than matrix.yaml ({pin_text(entry)}): "
                           f"re-pin it with `{wheels.LOCK_COMMAND.format(entry=entry['id'])}` and commit the lock")
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    source = entry["toolkit"]["source"]
    files = _fetch_debs(entry, log) if source == "debian" else _fetch_wheels(entry, log)
    if _stamp(out) == _pins_of(lock.read_text()):  # another entry with the same pins assembled it
        return out
    log(f"[toolkit] assembling {pin_text(entry)} into {shown(out)} ...")
    ROOT.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=ROOT, prefix=f".{entry['id']}-"))
    try:
        (_assemble_debian if source == "debian" else _assemble_wheels)(files, staging)
        (staging / "bin" / "nvcc.profile").write_text(NVCC_PROFILE)
        version = nvcc_version(staging)
        (staging / "toolkit.json").write_text(json.dumps({"pin": pin_text(entry), "nvcc": version}, indent=2) + "\n")
        (staging / ".lock").write_text(_pins_of(lock.read_text()))
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"[toolkit] {shown(out)}: nvcc {version}")
    return out


def _pins_of(lock_text: str) -> str:
    return "\n".join(line for line in lock_text.splitlines() if not line.startswith("#"))


def _stamp(out: Path) -> str | None:
    return (out / ".lock").read_text() if (out / ".lock").is_file() else None


def nvcc_version(cuda_home: Path) -> str:
    result = subprocess.run([str(cuda_home / "bin" / "nvcc"), "--version"], capture_output=True, text=True)
    match = re.search(r"release (\d+\.\d+), V([\d.]+)", result.stdout)
    if result.returncode != 0 or not match:
        raise ToolkitError(f"the assembled nvcc does not run: {(result.stderr or result.stdout).strip()[-300:]}")
    return match[2]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        entry = matrix.entry(argv[0] if argv else "cuda12.1")
        print(assemble(entry))
    except (ToolkitError, debian.DebianError, wheels.WheelError, matrix.MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
