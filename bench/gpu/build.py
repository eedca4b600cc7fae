"""The extension for this GPU's architecture: ops.load() where ninja is (torch's JIT build), else the
same sources through plain compiler calls (direct_build)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from .host import Setup
from .stages import Run, log


def _torch_paths(function, device: str) -> list[str]:
    try:
        return function(device_type=device)
    except TypeError:  # torch before 2.6 took a bool
        return function(cuda=device == "cuda")


def direct_build_plan(arch: str | None, nvcc: str | None) -> tuple[dict[Path, list[str]], list[str], Path]:
    """The compile commands (object -> command), the link command and the library of direct_build.

    Same sources as ops.build and the flags cpp_extension would use. arch None: the CPU kernels only
    (what a machine without a CUDA build of torch can check of this path).
    """
    from torch.utils import cpp_extension

    from lab.compat import extension_cxx_standard
    from lab.provenance import nvcc_version
    from ops import build as ops_build

    facts = ops_build.torch_facts()
    # The standard cpp_extension itself would pass for this torch (C++20 from 2.12; nvcc 11 stops at C++17).
    standard = "-std=" + extension_cxx_standard(facts["torch"], nvcc_version(nvcc) if arch and nvcc else None)
    device = "cuda" if arch else "cpu"
    out = ops_build.BUILD_ROOT / f"{ops_build.build_tag(facts)}-direct-{'sm' + arch if arch else 'cpu'}"
    out.mkdir(parents=True, exist_ok=True)
    openmp = ops_build._openmp_flags()
    defines = [f"-D_GLIBCXX_USE_CXX11_ABI={facts['cxx11_abi']}", f"-DTORCH_EXTENSION_NAME={ops_build.LIB_NAME}",
               "-DTORCH_API_INCLUDE_EXTENSION_H"]
    includes = [f"-I{ops_build.KERNELS}", *(f"-I{folder}" for folder in ops_build.ADAPTER_INCLUDES)]
    for path in _torch_paths(cpp_extension.include_paths, device):
        includes += ["-isystem", path]
    cxx = os.environ.get("CXX", "c++")
    found = ops_build.source_files(out / "generated")
    jobs = {out / f"{source.stem}.o": [cxx, "-c", str(source), "-fPIC", standard, "-O3", *defines, *openmp, *includes]
            for source in found["cpp"]}
    if arch:
        nvcc_flags = ["-c", standard, "-O3", "--compiler-options", "-fPIC", *defines,
                      *getattr(cpp_extension, "COMMON_NVCC_FLAGS", []), f"-gencode=arch=compute_{arch},code=sm_{arch}",
                      *includes]
        for source in found["cuda_ops"]:
            jobs[out / f"{source.stem}_op.o"] = [nvcc, str(source), *nvcc_flags]
        for source in found["cuda_kernels"]:
            jobs[out / f"kernels_{source.stem}.o"] = [nvcc, str(source), *nvcc_flags]
    library = out / f"{ops_build.LIB_NAME}.so"
    torch_libs = [f"-L{cpp_extension.TORCH_LIB_PATH}", "-lc10", "-ltorch_cpu", "-ltorch"]
    if arch:
        # nvcc as the link driver finds its own toolkit's libcudart wherever that lives (CUDA_HOME may
        # be a guess) and records it as libcudart.so.N, the soname torch has already loaded.
        link = [nvcc, "-shared", "--cudart", "shared", *map(str, jobs), "-o", str(library),
                *[part for flag in openmp for part in ("-Xcompiler", flag)], *torch_libs, "-lc10_cuda", "-ltorch_cuda"]
    else:
        link = [cxx, "-shared", *map(str, jobs), "-o", str(library), *openmp, *torch_libs]
    return jobs, link, library


def direct_build(arch: str | None, nvcc: str | None, timeout: float = 600) -> Path:
    """The extension from plain compiler calls, where ninja (which torch's JIT build needs) is missing.

    Objects compiled side by side, then linked; returns the library.
    """
    jobs, link, library = direct_build_plan(arch, nvcc)
    running = []
    for obj, command in jobs.items():
        log_file = open(obj.with_suffix(".log"), "w")
        running.append((obj, subprocess.Popen([*command, "-o", str(obj)], stdout=log_file, stderr=subprocess.STDOUT),
                        log_file))
    deadline = time.monotonic() + timeout
    errors = []
    for obj, process, log_file in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()
        if process.returncode != 0:
            errors.append(f"{obj.name} ({process.returncode}):\n" + obj.with_suffix(".log").read_text()[-2500:])
    if errors:
        raise RuntimeError("direct build failed: " + "\n".join(errors))
    result = subprocess.run(link, capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 30))
    if result.returncode != 0:
        raise RuntimeError(f"direct build: link failed ({result.returncode}):\n{(result.stdout + result.stderr)[-2500:]}")
    return library


def build_extension(setup: Setup, run: Run) -> str:
    """Build and load the extension; returns how it was built."""
    import torch
    from torch.utils import cpp_extension

    import ops

    if cpp_extension.is_ninja_available():
        library = ops.load()
        from ops.build import build_info

        return f"ops.load() (ninja), TORCH_CUDA_ARCH_LIST={build_info().get('torch_cuda_arch_list')}: {library}"
    log("ninja not found (torch's JIT build needs it): compiling the same sources with plain compiler calls")
    library = direct_build(setup.arch, setup.nvcc, timeout=max(run.left(), 60))
    torch.ops.load_library(str(library))
    for op in ops.OPS.values():
        op.register_python_parts()
    ops._loaded_from = str(library)  # so that a later ops.load() does not build again
    return f"direct build (no ninja), sm_{setup.arch}: {library}"
