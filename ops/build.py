"""Build (or reuse) the myops extension for the torch in the running interpreter.

One call, no hand steps: `python -m ops.build` or `ops.load()`. The build lives under
build/ops/<torch-tag>/ and ninja reuses it when nothing changed. Next to the library we record
what matters when it later fails to load: torch version, the CXX11 ABI flag, compiler and nvcc.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

from lab.provenance import first_line
from opspec import TORCH_OPS, codegen

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "kernels"
CSRC = Path(__file__).resolve().parent / "csrc"
ADAPTER_INCLUDES = (CSRC, CSRC / "cuda")  # the generic adapters the generated sources include
BUILD_ROOT = Path(os.environ.get("MYOPS_BUILD_DIR", REPO / "build" / "ops"))
LIB_NAME = "myops"
INFO_FILE = "build_info.json"


def torch_facts() -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": platform.python_version(),
    }


def build_tag(facts: dict) -> str:
    device = f"cu{facts['torch_cuda'].replace('.', '')}" if facts["torch_cuda"] else "cpu"
    return f"torch{facts['torch']}-{device}-abi{facts['cxx11_abi']}-py{sys.version_info.major}{sys.version_info.minor}"


def _cuda_wanted(facts: dict) -> bool:
    from torch.utils.cpp_extension import CUDA_HOME

    if os.environ.get("MYOPS_NO_CUDA") == "1" or not facts["torch_cuda"]:
        return False
    if CUDA_HOME is None:
        raise RuntimeError(
            f"torch {facts['torch']} is a CUDA {facts['torch_cuda']} build but no CUDA toolkit (nvcc) was found. "
            "Install the toolkit and set CUDA_HOME, or set MYOPS_NO_CUDA=1 to build the CPU kernels only."
        )
    return True


def _check_cuda_major(facts: dict) -> str:
    from torch.utils.cpp_extension import CUDA_HOME

    from lab.provenance import nvcc_version

    version = nvcc_version(str(Path(CUDA_HOME) / "bin" / "nvcc")) or "unknown"
    if version.split(".")[0] != facts["torch_cuda"].split(".")[0]:
        raise RuntimeError(
            f"nvcc is CUDA {version} but torch was built with CUDA {facts['torch_cuda']}: the major versions must match. "
            "Point CUDA_HOME at a matching toolkit or install the torch build for your CUDA."
        )
    return version


def _openmp_flags() -> list[str]:
    # NOTE: at::parallel_for is inline; under ATen's OpenMP backend it only splits work when the
    # extension itself is compiled with -fopenmp, otherwise every call silently runs on one thread.
    import torch

    return ["-fopenmp"] if "OpenMP" in torch.__config__.parallel_info().split("ATen parallel backend:")[-1].splitlines()[0] else []


def build(verbose: bool = False) -> Path:
    """Compile if needed; return the path of the shared library."""
    from torch.utils import cpp_extension

    facts = torch_facts()
    with_cuda = _cuda_wanted(facts)
    nvcc_version = _check_cuda_major(facts) if with_cuda else None
    build_dir = BUILD_ROOT / build_tag(facts)
    build_dir.mkdir(parents=True, exist_ok=True)

    found = source_files(build_dir / "generated")
    sources = found["cpp"]
    if with_cuda:
        sources += found["cuda_ops"] + [_kernels_unit(build_dir, kernel) for kernel in found["cuda_kernels"]]
    print(f"[ops.build] {LIB_NAME}: {'CPU+CUDA' if with_cuda else 'CPU'} build in {build_dir}", file=sys.stderr)
    started = time.perf_counter()
    lib = cpp_extension.load(
        name=LIB_NAME,
        sources=[str(s) for s in sources],
        extra_include_paths=[str(KERNELS), *map(str, ADAPTER_INCLUDES)],
        # No -std here: cpp_extension passes the one torch's headers need (C++20; a later -std=c++17
        # would override it, and torch 2.14's headers no longer compile as C++17).
        extra_cflags=["-O3", *_openmp_flags(), *_path_free_flags(build_dir)],
        # --discard-all: nvcc's host pass names a tmpxft_<pid> file, which would reach the symbol table.
        extra_ldflags=[*_openmp_flags(), "-Wl,--discard-all"],
        extra_cuda_cflags=["-O3", *[f for flag in _path_free_flags(build_dir) for f in ("-Xcompiler", flag)]],
        build_directory=str(build_dir),
        with_cuda=with_cuda,
        is_python_module=False,
        verbose=verbose,
    )
    so_path = Path(lib) if isinstance(lib, (str, os.PathLike)) else build_dir / f"{LIB_NAME}.so"
    info = {
        **facts,
        "library": str(so_path),
        "with_cuda": with_cuda,
        "nvcc": nvcc_version,
        "torch_cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST") if with_cuda else None,
        "compiler": first_line([os.environ.get("CXX", "c++"), "--version"]),
        "built_seconds": round(time.perf_counter() - started, 2),
    }
    _write_json_atomically(build_dir / INFO_FILE, info)
    return so_path


def _path_free_flags(build_dir: Path) -> list[str]:
    """The checkout's, torch's and the build's folders out of the binary (__FILE__ in torch's
    checks): the same sources then give the same bytes wherever they are cloned, in any venv or
    image. Most specific last: GCC applies the last map that matches."""
    import torch

    site_packages = Path(torch.__file__).resolve().parent.parent
    maps = {REPO: ".", site_packages: "site-packages", build_dir: "build"}
    return [f"-ffile-prefix-map={folder}={name}" for folder, name in maps.items()]


def source_files(generated: Path) -> dict[str, list[Path]]:
    """Every op's sources: the few lines per op of a kind that call the generic adapters, written into
    `generated` from the declarations (opspec/codegen); hand-written adapters, found by name in
    ops/csrc/*.cpp and ops/csrc/cuda/*.cu; and kernels/*_cuda.cu (the shared CUDA kernels). A new op
    adds files and touches no list."""
    problems = codegen.own_kernel_problems(KERNELS)
    if problems:
        raise RuntimeError("\n".join(problems))
    written = codegen.write_torch_sources(generated, generated / "cuda")
    return {
        "cpp": written["cpp"] + sorted(CSRC.glob("*.cpp")),
        "cuda_ops": written["cuda_ops"] + sorted((CSRC / "cuda").glob("*.cu")),
        "cuda_kernels": torch_cuda_kernels(KERNELS),
    }


def torch_cuda_kernels(kernels: Path) -> list[Path]:
    """kernels/<op>_cuda.cu of each torch op (a plugin-only op's, the Copy floor's, is the plugin's alone)."""
    return sorted(path for path in kernels.glob("*_cuda.cu") if path.name[:-len("_cuda.cu")] in TORCH_OPS)


def _kernels_unit(build_dir: Path, kernel: Path) -> Path:
    """kernels/X_cuda.cu under another name: cpp_extension names objects after the file name alone,
    so with ops/csrc/cuda/X_cuda.cu ninja stops at "multiple rules generate X_cuda.cuda.o"."""
    unit = build_dir / f"kernels_{kernel.name}"
    text = f'// Written by ops/build.py (_kernels_unit).\n#include "{kernel}"\n'
    if not unit.exists() or unit.read_text() != text:  # rewritten only on change: ninja goes by mtime
        unit.write_text(text)
    return unit


def _write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def build_info() -> dict:
    """What the current environment's build recorded (empty when never built)."""
    path = BUILD_ROOT / build_tag(torch_facts()) / INFO_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def main() -> int:
    path = build(verbose="-v" in sys.argv)
    print(json.dumps(build_info(), indent=2, sort_keys=True))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
