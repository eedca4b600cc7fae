"""User-mode emulation of another architecture (qemu-user through binfmt_misc): what the lab needs to
make and run an arm64 image on an x86-64 machine. Checked before any such build or run, and set up by

    python -m lab.emulation install [ARCH]     (as root; .ci/run does it)

which fetches Debian trixie's static qemu-user (a throw-away apt configuration on the mirror this
machine already uses, signatures checked), keeps its emulator under build/emulation/ and registers
it with the kernel with the F flag: the kernel opens the emulator at once, so containers use it too.
Timings under emulation measure the emulator: the lab never reports them.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.version import Version

from . import debian, platforms

REPO = Path(__file__).resolve().parent.parent
BINFMT = Path("/proc/sys/fs/binfmt_misc")
HOME = REPO / "build" / "emulation"
SUITE = "trixie"
# Measured here: Debian bookworm's qemu-user 7.2 crashes (SIGSEGV) importing onnxruntime 1.32's
# aarch64 wheel and hangs in a session; trixie's 10.0 runs the infer image's verify, dump and bench.
# Releases in between were not tried, so they are refused rather than assumed.
QEMU_MIN = Version("10.0")


class EmulationError(RuntimeError):
    pass


def handler(plat: platforms.Platform) -> Path:
    return BINFMT / f"qemu-{plat.machine}"


def registered(plat: platforms.Platform) -> dict | None:
    """The kernel's handler for the platform's binaries: {'enabled', 'interpreter', 'flags'}; None: none."""
    path = handler(plat)
    try:
        text = path.read_text()
    except OSError:
        return None
    fields = {key.rstrip(":"): value for key, _, value in (line.partition(" ") for line in text.splitlines()[1:])}
    return {"enabled": text.startswith("enabled"), "interpreter": fields.get("interpreter", ""),
            "flags": fields.get("flags", "")}


def qemu_version(interpreter: str) -> Version | None:
    try:
        out = subprocess.run([interpreter, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"version (\d+\.\d+(?:\.\d+)?)", out)
    return Version(match[1]) if match else None


def problem(plat: platforms.Platform) -> str | None:
    """Why this machine cannot run the platform's images (None: it can, natively or emulated)."""
    if plat == platforms.host():
        return None
    fix = f"run `python -m lab.emulation install {plat.docker}` as root (it fetches and registers qemu-user {QEMU_MIN}+)"
    found = registered(plat)
    if not BINFMT.joinpath("register").exists():
        return f"binfmt_misc is not mounted at {BINFMT}, so no {plat.os_arch} binary can run here: {fix}"
    if found is None:
        return f"no qemu-{plat.machine} handler is registered with binfmt_misc: {fix}"
    if not found["enabled"]:
        return f"the qemu-{plat.machine} handler is disabled: {fix}"
    if "F" not in found["flags"]:
        return (f"the qemu-{plat.machine} handler lacks the F flag, so containers cannot reach its emulator "
                f"{found['interpreter']}: {fix}")
    version = qemu_version(found["interpreter"])
    if version is None or version < QEMU_MIN:
        return (f"the registered emulator {found['interpreter']} is qemu {version or 'of an unknown version'}, older "
                f"than {QEMU_MIN}, which the lab needs (qemu 7.2 crashes importing onnxruntime's aarch64 wheel): {fix}")
    return None


def install(plat: platforms.Platform, *, log=print) -> Path | None:
    """Fetch trixie's qemu-user, keep its emulator for `plat` under build/emulation/ and register it
    (None on a machine of that architecture: nothing to do)."""
    if plat == platforms.host():
        log(f"[emulation] this machine runs {plat.os_arch} natively: nothing to emulate")
        return None
    if os.geteuid() != 0:
        raise EmulationError("registering a binfmt_misc handler needs root: run this as root")
    if not BINFMT.joinpath("register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=False, capture_output=True)
        if not BINFMT.joinpath("register").exists():
            raise EmulationError(f"binfmt_misc cannot be mounted at {BINFMT} (a container without the privilege "
                                 "to mount it): register the handler on the host instead")
    with debian.Apt(SUITE, timeout_s=900) as apt, tempfile.TemporaryDirectory() as tmp:
        version = apt.show("qemu-user")["Version"]
        log(f"[emulation] fetching qemu-user {version} ({SUITE}) ...")
        deb = apt.download("qemu-user", version, Path(tmp))
        rule = f"./usr/share/qemu/binfmt.d/qemu-{plat.machine}.conf"
        debian.extract(deb, Path(tmp) / "root", [f"./usr/bin/qemu-{plat.machine}", rule])
        HOME.mkdir(parents=True, exist_ok=True)
        emulator = HOME / f"qemu-{plat.machine}"
        staged = emulator.with_name(f".{emulator.name}.new")
        shutil.copy2(Path(tmp) / "root" / f"usr/bin/qemu-{plat.machine}", staged)
        os.replace(staged, emulator)
        # Debian's rule (the ELF header's magic and mask), pointed at this emulator, flags as Debian's.
        name, kind, offset, magic, mask, _, flags = (Path(tmp) / "root" / rule).read_text().strip().split(":")[1:8]
    if "F" not in flags:
        flags += "F"
    if registered(plat) is not None:
        handler(plat).write_text("-1")  # unregister the old one
    BINFMT.joinpath("register").write_text(f":{name}:{kind}:{offset}:{magic}:{mask}:{emulator}:{flags}")
    left = problem(plat)
    if left:
        raise EmulationError(f"registered {emulator}, yet: {left}")
    log(f"[emulation] {plat.os_arch} binaries run under {emulator} (qemu {qemu_version(str(emulator))})")
    return emulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.emulation", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["check", "install"])
    parser.add_argument("arch", nargs="?", default="arm64")
    args = parser.parse_args(argv)
    try:
        plat = platforms.get(args.arch)
        if args.command == "install":
            install(plat)
        why = problem(plat)
        print(f"{plat.os_arch}: {why or 'runs here'}")
        return 1 if why else 0
    except (EmulationError, debian.DebianError, platforms.PlatformError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
