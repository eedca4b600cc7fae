"""Configure and build the ORT plugin with CMake: `python -m ort_plugin.build [--cuda ON|OFF|AUTO] [--sanitize]`.

The build dir is keyed by the header version and the CUDA choice and is reused (CMake/make only
redo what changed). Next to the library goes build_info.json: which headers and C API version,
compiler, whether CUDA kernels are in and for which architectures, which sanitizers.

--sanitize builds an AddressSanitizer + UndefinedBehaviorSanitizer library for tests only, under
build/ort_plugin/sanitize/ (out of reach of loader.default_library, which must never pick it: it
loads only into a process started with libasan preloaded). `python -m ort_plugin.sanitize` runs it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from lab.provenance import first_line

from lab import ort_headers
from lab.files import held

PLUGIN_DIR = Path(__file__).resolve().parent
REPO = PLUGIN_DIR.parent
BUILD_ROOT = Path(os.environ.get("MYOPS_PLUGIN_BUILD_DIR", REPO / "build" / "ort_plugin"))
LIBRARY_NAME = "libmyops_ort.so"
INFO_FILE = "build_info.json"
SANITIZERS = "address;undefined"


class BuildError(RuntimeError):
    pass


class ToolMissing(BuildError):
    """A tool the build needs is not installed (as opposed to a build that failed)."""


def _run(cmd: list[str], *, log) -> str:
    log("[ort_plugin] " + " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
        raise BuildError(f"command failed ({result.returncode}): {' '.join(cmd)}\n{tail}")
    return result.stdout


def build_dir_for(cuda: str, headers_version: str, sanitize: bool = False, root: Path | None = None) -> Path:
    root = root or BUILD_ROOT
    if sanitize:
        # One level deeper than the normal dirs: loader.default_library globs BUILD_ROOT/*/ only.
        return root / "sanitize" / f"ort{headers_version}-cuda{cuda.lower()}-asan"
    return root / f"ort{headers_version}-cuda{cuda.lower()}"


def _pin(entry: str | None):
    """The header pin of a matrix entry; None: $MYOPS_MATRIX_ENTRY's, else the cpu entry's."""
    return ort_headers.pin_from_matrix(entry) if entry else None


def library_path(cuda: str = "AUTO", include_dir: str | None = None, entry: str | None = None) -> Path:
    """Where build() with these options puts the library (nothing is built)."""
    found = ort_headers.resolve(include_dir, pin=_pin(entry), log=lambda message: None)
    return build_dir_for(cuda.upper(), found.version) / LIBRARY_NAME


def build(*, cuda: str = "AUTO", include_dir: str | None = None, sanitize: bool = False,
          cuda_architectures: str | None = None, root: Path | None = None, fetch_timeout_s: float | None = None,
          entry: str | None = None, log=print) -> Path:
    """Build if needed; return the path of the plugin library (sanitize: the ASan+UBSan test build).

    root: where the build dir goes instead of BUILD_ROOT, for builds that loader.default_library must
    never pick (one architecture only, say). fetch_timeout_s: bounds fetching missing headers.
    """
    cuda = cuda.upper()
    if cuda not in {"ON", "OFF", "AUTO"}:
        raise BuildError(f"cuda must be ON, OFF or AUTO; got {cuda!r}")
    if shutil.which("cmake") is None:
        raise ToolMissing("cmake is not installed: install it (apt-get install cmake, or pip install cmake)")
    found = ort_headers.resolve(include_dir, pin=_pin(entry), log=log, timeout_s=fetch_timeout_s)
    build_dir = build_dir_for(cuda, found.version, sanitize, root)
    configure = [
        "cmake", "-S", str(PLUGIN_DIR), "-B", str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release", f"-DORT_INCLUDE_DIR={found.include_dir}", f"-DMYOPS_CUDA={cuda}",
        # Always explicit, so a hand-set cache value cannot turn a normal build dir into a sanitized one.
        f"-DMYOPS_SANITIZE={SANITIZERS if sanitize else ''}",
        # the interpreter that writes the declared ops' sources (opspec.codegen): this one
        f"-DPython3_EXECUTABLE={sys.executable}",
    ]
    if cuda_architectures:  # CMake syntax ("80-real;90"); else the cached value, CMakeLists.txt's default at first
        configure.append(f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures}")
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    # one build of a build dir at a time: two processes (test workers, two model runs) would write its
    # CMake cache and build_info.json at once
    with held(build_dir.parent / f".{build_dir.name}.lock", what=f"building {build_dir}", log=log):
        return _build_in(build_dir, configure, found, log)


def _build_in(build_dir: Path, configure: list[str], found, log) -> Path:
    _run(configure, log=log)
    _run(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2)], log=log)
    library = build_dir / LIBRARY_NAME
    cache = (build_dir / "CMakeCache.txt").read_text()
    info = {
        "library": str(library),
        "library_sha256": hashlib.sha256(library.read_bytes()).hexdigest(),
        "ort_headers_version": found.version,
        "ort_headers_source": found.source,
        "ort_api_version": found.api_version,
        "with_cuda": _cache_value(cache, "MYOPS_WITH_CUDA") == "ON",
        "cuda_compiler_version": _cache_value(cache, "MYOPS_CUDA_VERSION"),
        "cuda_architectures": _cache_value(cache, "CMAKE_CUDA_ARCHITECTURES"),
        "compiler": first_line([_cache_value(cache, "CMAKE_CXX_COMPILER") or "c++", "--version"]),
        "sanitize": _cache_value(cache, "MYOPS_SANITIZE") or None,
    }
    tmp = build_dir / (INFO_FILE + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, build_dir / INFO_FILE)
    return library


def _cache_value(cache: str, key: str) -> str | None:
    match = re.search(rf"^{re.escape(key)}:[A-Z]+=(.*)$", cache, flags=re.M)
    return match.group(1) if match else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", default="AUTO", choices=["ON", "OFF", "AUTO"], help="build the CUDA kernels")
    parser.add_argument("--ort-include-dir", help="use these ORT headers instead of the pinned ones")
    parser.add_argument("--entry", help="the matrix entry whose pinned headers to build against "
                                        "(default: $MYOPS_MATRIX_ENTRY, else cpu)")
    parser.add_argument("--cuda-architectures", help="CMAKE_CUDA_ARCHITECTURES, e.g. '80-real;86-real;90'")
    parser.add_argument("--sanitize", action="store_true",
                        help=f"the {SANITIZERS} test build (python -m ort_plugin.sanitize runs it)")
    args = parser.parse_args(argv)
    try:
        library = build(cuda=args.cuda, include_dir=args.ort_include_dir, sanitize=args.sanitize,
                        cuda_architectures=args.cuda_architectures, entry=args.entry,
                        log=lambda m: print(m, file=sys.stderr))
    except (BuildError, ort_headers.HeadersNotFound) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(library)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
