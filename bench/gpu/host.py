"""Preflight of a GPU host: the matrix entry its rows belong to, nvcc matching torch's CUDA, the driver,
provenance. What the host lacks is a HostError (bench.gpu_check exits 2 with its message)."""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .stages import HostError, log

MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"


def no_gpu_message(torch) -> str:
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"no CUDA device: run this on a GPU host; torch {torch.__version__} ({build}) sees none"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""))


def matrix_entries() -> dict[str, str]:
    """{entry id: device} of matrix.yaml; validated through lab.matrix where PyYAML and jsonschema exist."""
    from lab import matrix

    try:
        return {name: e["device"] for name, e in matrix.load()["entries"].items()}
    except ImportError:
        pass
    except matrix.MatrixError as exc:
        raise HostError(str(exc)) from None
    # A GPU host may have neither: entry ids sit at indent 2 under `entries:`, `device:` at indent 4.
    entries: dict[str, str] = {}
    current, inside = None, False
    for line in MATRIX.read_text().splitlines():
        if re.match(r"^entries:\s*(#.*)?$", line):
            inside = True
        elif inside and re.match(r"^\S", line):
            inside = False
        elif inside and (m := re.match(r"^  ([A-Za-z0-9_.\-]+):\s*(#.*)?$", line)):
            current = m.group(1)
            entries[current] = ""
        elif inside and current and (m := re.match(r"^    device:\s*([A-Za-z]+)", line)):
            entries[current] = m.group(1)
    return entries


def choose_entry(requested: str | None, torch_cuda: str | None, entries: dict[str, str]) -> tuple[str, str | None]:
    """The matrix entry the rows belong to, and a note when it is not an exact match for torch's CUDA."""
    cuda_entries = {name for name, device in entries.items() if device == "cuda"}
    if requested:
        if requested not in cuda_entries:
            raise HostError(f"--entry {requested}: not a CUDA entry of {MATRIX.name} (CUDA entries: "
                            f"{', '.join(sorted(cuda_entries))})")
        return requested, None
    if not torch_cuda:
        raise HostError("torch is a CPU-only build: install a CUDA build of PyTorch")
    major, minor = (int(part) for part in torch_cuda.split(".")[:2])
    exact = f"cuda{major}.{minor}"
    if exact in cuda_entries:
        return exact, None
    # The newest entry of the same CUDA major that is not newer than torch's CUDA.
    versions = []
    for name in cuda_entries:
        m = re.fullmatch(r"cuda(\d+)\.(\d+)", name)
        if m and int(m.group(1)) == major and int(m.group(2)) <= minor:
            versions.append((int(m.group(2)), name))
    if not versions:
        raise HostError(f"no matrix entry for torch's CUDA {torch_cuda}: pass --entry (CUDA entries: "
                        f"{', '.join(sorted(cuda_entries))})")
    chosen = max(versions)[1]
    return chosen, f"no entry {exact} in {MATRIX.name}: rows go to {chosen} (their `cuda` column says {torch_cuda})"


def pin_cuda_home() -> None:
    """Set CUDA_HOME to the toolkit of the nvcc on PATH, unless set: torch guesses it from nvcc's path,
    which for a wrapper script (/usr/local/bin/nvcc) is a folder without libcudart, and the link fails."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "torch.utils.cpp_extension" in sys.modules:
        return
    nvcc = shutil.which("nvcc")
    from lab.provenance import cuda_toolkit_root

    root = cuda_toolkit_root(nvcc) if nvcc else None
    if root is not None and (root / "bin" / "nvcc").is_file():
        os.environ["CUDA_HOME"] = str(root)


def find_nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").is_file():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def cuda_driver_version() -> str | None:
    """The driver's CUDA version from libcuda itself, for hosts without nvidia-smi."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"CUDA {version.value // 1000}.{version.value % 1000 // 10} (cuDriverGetVersion)"
    except (OSError, AttributeError):
        pass
    return None


@dataclass
class Setup:
    entry: str
    arch: str          # "90": nvcc's -gencode number
    arch_list: str     # "9.0": TORCH_CUDA_ARCH_LIST
    nvcc: str
    device: str
    driver: str | None
    facts: dict
    ort_plugin: Path | None = None  # set once the plugin has passed through onnxruntime's CUDA EP


def preflight(args, torch) -> Setup:
    from lab import provenance

    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        raise HostError("pytest is not installed: pip install pytest (this check runs the test suite's CUDA cases)")
    entry, note = choose_entry(args.entry, torch.version.cuda, matrix_entries())
    if note:
        log(f"note: {note}")
    pin_cuda_home()
    nvcc = find_nvcc()
    if nvcc is None:
        raise HostError("nvcc not found: install the CUDA toolkit matching torch's CUDA "
                        f"{torch.version.cuda} and put it on PATH (or set CUDA_HOME)")
    nvcc_version = provenance.nvcc_version(nvcc)
    if nvcc_version and nvcc_version.split(".")[0] != str(torch.version.cuda).split(".")[0]:
        raise HostError(f"{nvcc} is CUDA {nvcc_version} but torch was built for CUDA {torch.version.cuda}: "
                        "the major versions must match (set CUDA_HOME to a matching toolkit)")
    from lab.compat import extension_cxx_standard

    try:
        extension_cxx_standard(torch.__version__, nvcc_version)
    except ValueError as exc:
        raise HostError(str(exc)) from None
    major, minor = torch.cuda.get_device_capability(0)
    os.environ["MYOPS_MATRIX_ENTRY"] = entry  # what provenance.collect() records; the plugin's build gets it as an argument
    # One architecture only: a full TORCH_CUDA_ARCH_LIST would multiply the build time.
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    if os.environ.pop("MYOPS_NO_CUDA", None) is not None:
        log("note: MYOPS_NO_CUDA ignored: this check needs the CUDA kernels")
    facts = provenance.collect()
    driver = facts.get("driver") or cuda_driver_version()
    device = torch.cuda.get_device_name(0)
    log(f"entry {entry}: {device} (sm_{major}{minor}), driver {driver}, torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), nvcc {nvcc_version} at {nvcc}, git {str(facts['git_sha'])[:12]}"
        f"{' (dirty)' if facts['git_dirty'] else ''}")
    return Setup(entry, f"{major}{minor}", f"{major}.{minor}", nvcc, device, driver, facts)
