"""Check that the extension holds exactly the CUDA architectures TORCH_CUDA_ARCH_LIST asked for.

    python -m ops.check_archs      (exit 1 on a mismatch, naming what is missing or extra)

A GPU whose architecture is missing fails at run time with "no kernel image is available"; this
turns that into a build-time error. CPU-only builds have nothing to check.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path


def expected_archs(arch_list: str) -> set[str]:
    """'8.0 8.6 9.0+PTX' -> {'sm_80', 'sm_86', 'sm_90', 'compute_90'}."""
    wanted = set()
    for item in arch_list.replace(";", " ").split():
        number = item.replace("+PTX", "").replace(".", "")
        wanted.add(f"sm_{number}")
        if item.endswith("+PTX"):
            wanted.add(f"compute_{number}")
    return wanted


def compiled_archs(library: Path) -> set[str]:
    tool = shutil.which("cuobjdump")
    if tool is None:
        raise RuntimeError("cuobjdump (CUDA toolkit) not found: cannot list the architectures in the library")
    found = set()
    for flag, pattern in (("--list-elf", r"\.(sm_\d+a?)\."), ("--list-ptx", r"\.(sm_\d+a?)\.ptx")):
        out = subprocess.run([tool, flag, str(library)], capture_output=True, text=True).stdout
        for arch in re.findall(pattern, out):
            found.add(arch if flag == "--list-elf" else arch.replace("sm_", "compute_"))
    return found


def main() -> int:
    from .build import build_info

    info = build_info()
    if not info:
        print("error: the extension was not built yet: run `python -m ops.build`", file=sys.stderr)
        return 1
    if not info["with_cuda"]:
        print("check_archs: CPU-only build, no CUDA architectures to check")
        return 0
    wanted = expected_archs(info.get("torch_cuda_arch_list") or "")
    try:
        have = compiled_archs(Path(info["library"]))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if have != wanted:
        print(f"error: {info['library']} holds {sorted(have)} but TORCH_CUDA_ARCH_LIST asked for {sorted(wanted)}: "
              f"missing {sorted(wanted - have)}, extra {sorted(have - wanted)}", file=sys.stderr)
        return 1
    print(f"check_archs: {sorted(have)} as requested")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
