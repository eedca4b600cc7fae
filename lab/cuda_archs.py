"""CUDA architectures in a binary, read with cuobjdump, against the list that was asked for.

Torch-free: used by ops.check_archs (the build's own check), lab.proof (images) and the tests.
A list takes TORCH_CUDA_ARCH_LIST items ("8.6", "9.0+PTX") or CMAKE_CUDA_ARCHITECTURES ones
("86-real", "90"); a binary's contents come back as {"sm_80", ..., "compute_90"} (PTX as compute_NN).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path


def expected_archs(arch_list: str) -> set[str]:
    """'8.0 8.6 9.0+PTX' -> {'sm_80', 'sm_86', 'sm_90', 'compute_90'}; '80-real;90' means the same."""
    wanted = set()
    for item in arch_list.replace(";", " ").replace(",", " ").split():
        torch_style = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", item)
        cmake_style = re.fullmatch(r"(\d{2,})([af]?)(-real|-virtual)?", item)
        if torch_style:
            number = torch_style[1] + torch_style[2] + torch_style[3]
            sass, ptx = True, bool(torch_style[4])
        elif cmake_style:
            number = cmake_style[1] + cmake_style[2]
            sass, ptx = cmake_style[3] != "-virtual", cmake_style[3] != "-real"
        else:
            raise ValueError(f"{item!r} is neither a TORCH_CUDA_ARCH_LIST item (8.6, 9.0+PTX) "
                             "nor a CMAKE_CUDA_ARCHITECTURES one (86-real, 90)")
        if sass:
            wanted.add(f"sm_{number}")
        if ptx:
            wanted.add(f"compute_{number}")
    return wanted


def parse_listing(elf_listing: str, ptx_listing: str) -> set[str]:
    """Architectures named in `cuobjdump --list-elf` and `--list-ptx` output (PTX as compute_NN)."""
    found = set(re.findall(r"\.(sm_\d+[af]?)\.cubin", elf_listing))
    found |= {a.replace("sm_", "compute_") for a in re.findall(r"\.(sm_\d+[af]?)\.ptx", ptx_listing)}
    return found


def find_cuobjdump() -> str | None:
    """$CUOBJDUMP, PATH, $CUDA_HOME/bin, then the nvidia-cuda-cuobjdump wheel (a toolkit may lack it)."""
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home:
            candidates.append(str(Path(home) / "bin" / "cuobjdump"))
    try:
        from importlib import metadata

        dist = metadata.distribution("nvidia-cuda-cuobjdump")
        candidates += [str(dist.locate_file(f)) for f in dist.files or [] if f.name == "cuobjdump"]
    except metadata.PackageNotFoundError:
        pass
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def _listing(tool: str, flag: str, library: Path) -> str:
    result = subprocess.run([tool, flag, str(library)], capture_output=True, text=True)
    if result.returncode != 0:
        # A library with SASS but no PTX (or none at all) is an answer, not a failure.
        if "does not contain" in result.stdout + result.stderr:
            return ""
        raise RuntimeError(f"{tool} {flag} {library} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def compiled_archs(library: Path, tool: str | None = None) -> set[str]:
    tool = tool or find_cuobjdump()
    if tool is None:
        raise RuntimeError("cuobjdump not found (CUDA toolkit, or pip install nvidia-cuda-cuobjdump; or set "
                           "$CUOBJDUMP): cannot list the architectures in the library")
    if not library.is_file():
        raise RuntimeError(f"{library} does not exist: build it first")
    return parse_listing(_listing(tool, "--list-elf", library), _listing(tool, "--list-ptx", library))


def compare(have: set[str], wanted: set[str]) -> str | None:
    """None when equal, else what is missing and extra."""
    if have == wanted:
        return None
    return f"missing {sorted(wanted - have)}, extra {sorted(have - wanted)}"
