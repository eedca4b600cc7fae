"""Where a result came from: versions, git revision, machine, image. `python -m lab.provenance`.

Imports nothing heavy at module level and never requires torch (the inference side has none).
"""
from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def first_line(cmd: list[str]) -> str | None:
    """The first non-empty line a command prints (e.g. a compiler's --version), None if it fails."""
    out = _run(cmd)
    lines = [line.strip() for line in (out or "").splitlines() if line.strip()]
    return lines[0] if lines else None


def _version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # not installed, or broken: provenance says so, it does not fail
        return None


# Where an op's files live: an untracked file there (a scaffolded op not yet committed) is part of what
# runs, so it makes the tree dirty; untracked files elsewhere (notes, data) do not.
OP_FOLDERS = ("kernels", "ops", "opspec", "ort_plugin", "tests")


def _changed_paths() -> list[str] | None:
    """Tracked files that differ from HEAD anywhere, and untracked files in the op folders (None
    outside a git checkout)."""
    # NUL-separated names (no quoting of odd paths; _run's strip cannot cut a name): staged or not.
    tracked = _run(["git", "diff", "--name-only", "-z", "HEAD"], cwd=REPO)
    untracked = _run(["git", "ls-files", "-z", "--others", "--exclude-standard", "--", *OP_FOLDERS], cwd=REPO)
    if tracked is None or untracked is None:
        return None
    return [name for name in tracked.split("\0") + untracked.split("\0") if name]


def git_state() -> dict:
    sha = _run(["git", "rev-parse", "HEAD"], cwd=REPO)
    changed = _changed_paths()
    # Outside a checkout (inside an image) the host's view, where it was handed in.
    handed = {"True": True, "False": False}.get(os.environ.get("MYOPS_GIT_DIRTY", ""))
    return {"git_sha": sha or os.environ.get("MYOPS_GIT_SHA"), "git_dirty": bool(changed) if changed is not None else handed}


# What follows an op's name in the names of its files (the two `nox -s new_op` writes; its own kernels, an
# ONNX module, hand-written adapters where it has them): not any prefix, so that my_op_gated.h is not taken
# for one of my_op's files.
OP_FILE_SUFFIXES = (".cpp", ".h", ".py", "_cuda.cu", "_cuda.h", "_onnx.py", "_op.cc", "_op_base.h")


def uncommitted_op_files(op: str) -> list[str]:
    """An op's files (<op> and one of OP_FILE_SUFFIXES, or test_<op>.py, in the op folders) that are
    untracked or differ from HEAD: a run of such an op measures work in progress. [] outside a git checkout."""
    def of_op(path: str) -> bool:
        name = Path(path).name
        return path.split("/", 1)[0] in OP_FOLDERS and (
            name in {op + suffix for suffix in OP_FILE_SUFFIXES} or name == f"test_{op}.py")
    return [path for path in _changed_paths() or [] if of_op(path)]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_caches(cpu: int = 0) -> dict[str, int]:
    """This CPU's data and unified caches from sysfs, e.g. {"L1": 49152, "L2": 1048576, "L3": 33554432}
    (bytes; the size one core sees at that level); empty where sysfs does not say."""
    caches = {}
    for index in sorted(Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip()
            level = (index / "level").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        caches[f"L{level}"] = int(size.rstrip("KMG")) * scale
    return caches


def nvcc_version(nvcc: str = "nvcc") -> str | None:
    """'13.0' from nvcc's last line ('Build cuda_13.0.r13.0/compiler...'), None without nvcc."""
    out = _run([nvcc, "--version"])
    return out.splitlines()[-1].split("cuda_")[-1].split(".r")[0] if out and "cuda_" in out else None


def cuda_toolkit_root(nvcc: str = "nvcc") -> Path | None:
    """The toolkit an nvcc belongs to, as nvcc itself reports it: a wrapper script or a link on PATH
    (/usr/local/bin/nvcc here) hides it, and torch's guess from nvcc's folder then lacks libcudart."""
    if shutil.which(nvcc) is None:
        return None
    try:  # the dry run prints its settings on stderr
        done = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    here = re.search(r"^#\$ _HERE_=(.+)$", done.stdout + done.stderr, flags=re.M)
    return Path(here.group(1).strip()).parent if here else None


def gpu() -> dict:
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"])
    if not out:
        return {"gpu": None, "driver": None, "compute_capability": None}
    name, driver, cap = [part.strip() for part in out.splitlines()[0].split(",")]
    return {"gpu": name, "driver": driver, "compute_capability": cap}


def collect(*, with_torch: bool = True) -> dict:
    facts = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "nvcc": nvcc_version(),
        "docker": _run(["docker", "version", "--format", "{{.Server.Version}}"]),
        "image": os.environ.get("MYOPS_IMAGE"),
        "matrix_entry": os.environ.get("MYOPS_MATRIX_ENTRY", "cpu"),
        **git_state(),
        **gpu(),
    }
    if with_torch:
        facts["torch"] = _version("torch")
        try:
            import torch

            facts["torch_cuda"] = torch.version.cuda
        except ImportError:
            facts["torch_cuda"] = None
    return facts


def main() -> int:
    facts = collect(with_torch="--no-torch" not in sys.argv)
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        print(f"{key:<{width}}  {value if value is not None else '-'}")
    if "--json" in sys.argv:
        print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
