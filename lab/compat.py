"""Version facts the matrix is checked against, each with where it comes from.

Pure data and lookups (no torch, no onnxruntime, no network): lab.matrix applies them to every
entry when matrix.yaml loads, lab.wheels confirms the ones a lock can prove (the ELF NEEDED of the
onnxruntime wheel that was actually resolved) when it writes a lock.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

try:
    from packaging.version import Version
except ImportError:  # a GPU host with only torch and numpy (bench.gpu_check): torch vendors packaging (2.2+)
    from torch._vendor.packaging.version import Version


def release(version: str) -> Version:
    """'2.4.1+cu121' -> Version('2.4.1'): the local label names a build, not a release."""
    return Version(version.split("+")[0])


def local_cuda(version: str) -> str | None:
    """'2.3.1+cu118' -> '11.8'; None without a +cuNNN label."""
    match = re.search(r"\+cu(\d+)(\d)$", version)
    return f"{match[1]}.{match[2]}" if match else None


# ---------------------------------------------------------------- onnxruntime-gpu builds

@dataclass(frozen=True)
class Build:
    cuda: str          # "12" for ORT's CUDA-12 builds (they serve any 12.x), "12.1" for torch's
    cudnn: int         # cuDNN major


ORT_FEEDS = {
    # dedicated package feeds, recognised by name in the index URL
    "onnxruntime-cuda-11": "11",
    "onnxruntime-cuda-12": "12",
    "onnxruntime-cuda-13": "13",
}


def ort_cuda_build(version: str, index: str | None) -> Build | None:
    """CUDA and cuDNN majors an onnxruntime-gpu release was built with, by version and feed.

    Sources: onnxruntime docs, CUDA-ExecutionProvider.md#requirements (feeds, 1.18.0 vs 1.18.1);
    for PyPI from 1.27, the wheels' metadata (their 'cuda' extra names -cu13 wheels; 1.26.0's -cu12).
    lab.wheels confirms it on the resolved wheel (its CUDA provider's NEEDED)."""
    v = release(version)
    feed = next((major for name, major in ORT_FEEDS.items() if index and name in index), None)
    if feed == "12":
        # 1.18.0 on the CUDA-12 feed is the last cuDNN 8 build (onnxruntime PR 20907, issue 20829)
        return Build("12", 8 if v <= Version("1.18.0") else 9)
    if feed == "11":
        return Build("11", 8)
    if feed == "13":
        return Build("13", 9)
    if index is not None:
        return None  # an index this table does not know: nothing to check against
    # PyPI: CUDA 11.8 + cuDNN 8 up to 1.18.x, CUDA 12 + cuDNN 9 from 1.19, CUDA 13 from 1.27
    if v < Version("1.19"):
        return Build("11", 8)
    if v < Version("1.27"):
        return Build("12", 9)
    return Build("13", 9)


# ---------------------------------------------------------------- torch builds

# The CUDA build PyPI serves for a torch release (no local label), from the wheels' pins.
_TORCH_PYPI_CUDA = [("2.3", "12.1"), ("2.4", "12.1"), ("2.5", "12.4"), ("2.6", "12.4"), ("2.7", "12.6"),
                    ("2.8", "12.8"), ("2.9", "12.8"), ("2.10", "12.8"), ("2.11", "13.0")]


# PyTorch's own index of CPU-only builds ('2.13.0+cpu'); PyPI has none for Linux x86-64 (source: the
# index pages of both, and `pip download torch==2.13.0+cpu` against PyPI alone: no matching distribution).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_cuda_build(version: str) -> Build | None:
    """CUDA version and cuDNN major of a torch wheel: '+cuNNN' builds from a torch index, else PyPI's
    (source: the PyPI wheels' metadata, their nvidia-cuda-runtime and nvidia-cudnn pins)."""
    v = release(version)
    cudnn = 8 if v < Version("2.4") else 9  # torch 2.3 pins nvidia-cudnn 8.9.2.26, 2.4 pins 9.1.0.70
    cuda = local_cuda(version)
    if cuda is None:
        if "+" in version:
            return None  # +cpu, +rocm...: not a CUDA build
        known = [c for minor, c in _TORCH_PYPI_CUDA if release(minor + ".0") <= v]
        if not known:
            return None
        cuda = known[-1]
    return Build(cuda, cudnn)


# The lab's Python side registers its fake kernel and autograd with torch.library.register_fake and
# register_autograd (new in torch 2.4, torch/library.py at v2.4.0); ops/autograd.py falls back to 2.3's
# impl_abstract and an Autograd-key kernel. torch 2.3 is also the first with numpy 2 support.
TORCH_FLOOR = Version("2.3")

# What each exporter needs of torch. torch.onnx.export has dynamo= since 2.4, but up to 2.5.1 it
# swallows custom_translation_table ("**_: Any,  # ignored options"), so the myops node would never
# be emitted; 2.6.0 passes it to _compat.export_compat (torch/onnx/__init__.py at v2.5.1 and v2.6.0).
EXPORTER_TORCH = {"torchscript": Version("2.0"), "dynamo": Version("2.6")}


def exporters_supported(torch_version: str) -> list[str]:
    v = release(torch_version)
    return [name for name, floor in EXPORTER_TORCH.items() if v >= floor]


# ---------------------------------------------------------------- onnxruntime and ONNX

# Highest ONNX opset each onnxruntime release runs. Up to 1.20: onnxruntime docs,
# reference/compatibility.md. From 1.21 the docs stop (onnxruntime issue 25862); those rows were
# measured by loading probe models into each PyPI wheel ("official support for domain ai.onnx is
# till opset N"). Later releases run at least the last row; ops.export probes the exact top.
ORT_MAX_OPSET = [("1.13", 17), ("1.14", 18), ("1.15", 19), ("1.16", 19), ("1.17", 20), ("1.18", 21),
                 ("1.19", 21), ("1.20", 21), ("1.21", 22), ("1.22", 22), ("1.23", 23), ("1.24", 25),
                 ("1.25", 26), ("1.32", 28)]


def ort_max_opset(version: str) -> int | None:
    v = release(version)
    known = [opset for minor, opset in ORT_MAX_OPSET if Version(minor) <= Version(f"{v.major}.{v.minor}")]
    return known[-1] if known else None


def ort_min_version_for_opset(opset: int) -> str | None:
    return next((minor for minor, top in ORT_MAX_OPSET if top >= opset), None)


# numpy 2 ABI: onnxruntime wheels before 1.19 were built against numpy 1.x and fail to import under
# numpy 2 ("A module that was compiled using NumPy 1.x cannot be run in NumPy 2", measured with
# 1.18.1; onnxruntime issue 21063).
ORT_NUMPY2 = Version("1.19")


# TF32. ORT's CUDA EP runs float32 MatMul/Gemm in TF32 on Ampere and later unless told not to; the
# `use_tf32` provider option exists from 1.18 (onnxruntime PR 19357; measured: the string is in
# 1.18.0's libonnxruntime_providers_cuda.so and not in 1.17.1's), and both reject an unknown provider
# option ('Unknown provider option'). Before 1.18 only NVIDIA_TF32_OVERRIDE=0, read by cuBLAS and
# cuDNN for the whole process, turns it off.
ORT_USE_TF32_OPTION = Version("1.18")


def ort_fp32_exact(version: str) -> tuple[dict[str, str], dict[str, str]]:
    """(CUDA EP provider options, environment) that keep float32 MatMuls in full float32."""
    if release(version) >= ORT_USE_TF32_OPTION:
        return {"use_tf32": "0"}, {}
    return {}, {"NVIDIA_TF32_OVERRIDE": "0"}


# ---------------------------------------------------------------- compiling against torch

# The -std torch.utils.cpp_extension passes: c++17 through 2.11; c++20 from 2.12 (pytorch PR 176659
# changed its default), and ATen's headers stop compiling below C++20 from 2.13 (flash-attention
# PR 2879). nvcc accepts -std=c++20 from CUDA 12.0 (CUDA 12.0 release notes); nvcc 11.8 stops at 17.
EXTENSION_CXX20_TORCH = Version("2.12")
NVCC_CXX20 = Version("12.0")


def extension_cxx_standard(torch_version: str, nvcc_version: str | None = None) -> str:
    """'c++17' or 'c++20' for an extension built against this torch (and nvcc, when it compiles CUDA)."""
    standard = "c++20" if release(torch_version) >= EXTENSION_CXX20_TORCH else "c++17"
    if standard == "c++20" and nvcc_version and release(nvcc_version) < NVCC_CXX20:
        raise ValueError(f"torch {torch_version}'s headers need C++20, which nvcc {nvcc_version} cannot compile: "
                         f"use a CUDA {NVCC_CXX20} or later toolkit, or torch before {EXTENSION_CXX20_TORCH}")
    return standard


# ---------------------------------------------------------------- CUDA architectures

# First CUDA release whose nvcc targets an architecture (`ptxas --help` of each nvidia-cuda-nvcc
# wheel; CUDA release notes): Hopper and Ada in 11.8, Blackwell (sm_100, sm_101, sm_120) in 12.8.
# CUDA 12.0 dropped sm_35/sm_37; CUDA 13.0 dropped everything below sm_75.
ARCH_FIRST_CUDA = {"8.0": "11.0", "8.6": "11.1", "8.7": "11.4", "8.9": "11.8", "9.0": "11.8",
                   "10.0": "12.8", "10.1": "12.8", "12.0": "12.8", "12.1": "12.9"}
CUDA_MIN_ARCH = [("11.0", 3.5), ("12.0", 5.0), ("13.0", 7.5)]


def arch_number(item: str) -> str:
    """'9.0+PTX' -> '9.0', '9.0a' -> '9.0'."""
    return re.sub(r"[af]?(\+PTX)?$", "", item)


def arch_problem(item: str, cuda: str) -> str | None:
    """Why nvcc of CUDA `cuda` cannot target a TORCH_CUDA_ARCH_LIST item, or None."""
    number = arch_number(item)
    cuda_v = release(cuda)
    first = ARCH_FIRST_CUDA.get(number)
    if first and cuda_v < release(first):
        return f"sm_{number.replace('.', '')} needs CUDA {first} or later"
    floor = [low for since, low in CUDA_MIN_ARCH if release(since) <= cuda_v][-1]
    if float(number) < floor:
        return f"CUDA {cuda_v.major} no longer targets sm_{number.replace('.', '')} (its oldest is sm_{int(floor * 10)})"
    return None


# ---------------------------------------------------------------- base images

@dataclass(frozen=True)
class BaseOS:
    name: str
    python: str   # the python3 its own packages install
    glibc: str    # decides which manylinux wheels run there


# Debian and Ubuntu releases' python3 and glibc (packages.debian.org / packages.ubuntu.com).
BASE_OS = {
    "bookworm": BaseOS("Debian 12 bookworm", "3.11", "2.36"),
    "trixie": BaseOS("Debian 13 trixie", "3.13", "2.41"),
    "ubuntu20.04": BaseOS("Ubuntu 20.04", "3.8", "2.31"),
    "ubuntu22.04": BaseOS("Ubuntu 22.04", "3.10", "2.35"),
    "ubuntu24.04": BaseOS("Ubuntu 24.04", "3.12", "2.39"),
}


def base_os(image: dict) -> BaseOS | None:
    """The OS of a base image spec: its `os` field (the lab's own bases), else read off the tag."""
    if image.get("os"):
        return BASE_OS.get(image["os"])
    match = re.search(r"(ubuntu\d+\.\d+)", image["tag"])
    return BASE_OS.get(match[1]) if match else None


# The first release of each package with any Linux aarch64 wheel (source: the packages' file lists on
# PyPI: onnxruntime's manylinux aarch64 CPU wheels start at 1.10, numpy's at 1.19; onnxruntime-gpu
# has none). Whether one exists for the entry's own Python is what resolving its lock (lab.wheels) checks.
AARCH64_WHEELS = {"onnxruntime": Version("1.10"), "numpy": Version("1.19")}


def arm64_problem(ort_package: str, ort_version: str, numpy_version: str) -> str | None:
    """Why an infer image with these packages cannot be built for linux/arm64 (None: it can)."""
    for name, version in ((ort_package, ort_version), ("numpy", numpy_version)):
        first = AARCH64_WHEELS.get(name)
        if first is None:
            return f"{name} has no Linux aarch64 wheels on PyPI"
        if release(version) < first:
            return f"{name} {version} has no Linux aarch64 wheel (they start at {first})"
    return None
