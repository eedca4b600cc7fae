"""Check that a library holds exactly the CUDA architectures it was asked to hold.

    python -m ops.check_archs                                   # the extension, against its TORCH_CUDA_ARCH_LIST
    python -m ops.check_archs --library LIB --arch-list "8.0 8.6 9.0+PTX"
    python -m ops.check_archs --build-info build/ort_plugin/<dir>/build_info.json   # the plugin

Exit 1 on a mismatch, naming what is missing or extra. The list takes TORCH_CUDA_ARCH_LIST items
("8.6", "9.0+PTX") or CMAKE_CUDA_ARCHITECTURES items ("86-real", "90"). What cuobjdump found is
written into the build_info.json as cuda_archs_found, so the build records what its binary holds.

A GPU whose architecture is missing fails at run time with "no kernel image is available"; this
turns that into a build-time error. CPU-only builds have nothing to check.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from lab.cuda_archs import compare, compiled_archs, expected_archs, find_cuobjdump, parse_listing  # noqa: F401

INFO_FILE = "build_info.json"


def _record(info_path: Path, have: set[str]) -> None:
    info = json.loads(info_path.read_text())
    info["cuda_archs_found"] = sorted(have)
    tmp = info_path.with_suffix(info_path.suffix + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, info_path)


def _default_info_path() -> Path | None:
    from .build import BUILD_ROOT, build_tag, torch_facts

    path = BUILD_ROOT / build_tag(torch_facts()) / INFO_FILE
    return path if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.check_archs", description=__doc__.splitlines()[0])
    parser.add_argument("--library", type=Path, help="the shared library to check (default: from the build info)")
    parser.add_argument("--arch-list", help="the architectures wanted, TORCH_CUDA_ARCH_LIST or CMake style "
                                            "(default: the list the build info recorded)")
    parser.add_argument("--build-info", type=Path,
                        help="a build_info.json (extension or plugin) to read and record into (default: the one "
                             "beside --library, else the extension's for this environment's torch)")
    parser.add_argument("--cuobjdump", help="the cuobjdump binary (default: $CUOBJDUMP, PATH, $CUDA_HOME/bin, "
                                             "then the nvidia-cuda-cuobjdump wheel)")
    args = parser.parse_args(argv)

    info_path = args.build_info
    if info_path is None and args.library is not None:
        beside = args.library.parent / INFO_FILE
        info_path = beside if beside.exists() else None
    elif info_path is None:
        info_path = _default_info_path()
        if info_path is None:
            print("error: the extension was not built yet: run `python -m ops.build`", file=sys.stderr)
            return 1
    if info_path is not None and not info_path.is_file():
        print(f"error: {info_path} does not exist: build first", file=sys.stderr)
        return 1
    info = json.loads(info_path.read_text()) if info_path else {}
    library = args.library or Path(info["library"])
    if info and not info.get("with_cuda") and args.arch_list is None:
        print(f"check_archs: {library.name} is a CPU-only build, no CUDA architectures to check")
        return 0
    # The extension records TORCH_CUDA_ARCH_LIST, the plugin CMAKE_CUDA_ARCHITECTURES.
    arch_list = args.arch_list or info.get("torch_cuda_arch_list") or info.get("cuda_architectures")
    if not arch_list:
        print(f"error: no architecture list for {library}: pass --arch-list", file=sys.stderr)
        return 1
    try:
        wanted = expected_archs(arch_list)
        have = compiled_archs(library, args.cuobjdump)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if info_path:
        _record(info_path, have)
    problem = compare(have, wanted)
    if problem:
        print(f"error: {library} holds {sorted(have)} but {arch_list!r} asks for {sorted(wanted)}: {problem}",
              file=sys.stderr)
        return 1
    print(f"check_archs: {library.name} holds {sorted(have)}, as {arch_list!r} asks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
