"""The source folders the wheels are built from (build/dist/<entry>/..., and the infer image's
plugin-wheel/ context): a pyproject folder of wheels/ with the sources it compiles and the Python it
ships, file modes made the same whatever the checkout's umask (a wheel records them)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from . import ort_headers, platforms
from .files import write_text_atomic

REPO = Path(__file__).resolve().parent.parent
VERSION = "0.1.0"


def copy_tree(source: Path, dest: Path, *, python_only: bool = False) -> None:
    def ignore(folder, names):
        return [n for n in names if n == "__pycache__" or n.endswith(".pyc")
                or (python_only and not n.endswith(".py") and not (Path(folder) / n).is_dir())]
    shutil.copytree(source, dest, ignore=ignore, dirs_exist_ok=True)


def normalise_modes(stage: Path) -> None:
    """644 for files, 755 for folders, whatever the checkout's umask was (the wheel's zip records modes)."""
    for folder, dirs, files in os.walk(stage):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(Path(folder) / name, 0o644)


def fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def distribution_name(entry: dict) -> str:
    """myops-ort for a CPU entry; myops-ort-cu12 (by CUDA major) for a CUDA one: two distributions, so pip
    never takes one for the other, and a CUDA 11 library cannot replace a CUDA 12 one as an upgrade."""
    if entry["device"] != "cuda":
        return "myops-ort"
    return f"myops-ort-cu{entry['cuda'].split('.')[0]}"


def stage_plugin(entry: dict, headers: ort_headers.Headers, plat: platforms.Platform, stage: Path, *,
                 cuda_architectures: str = "", with_headers: bool = False, log=print) -> Path:
    """The plugin wheel's source folder: wheels/myops_ort with the plugin's sources, the op catalogue
    and build.json. with_headers: the pinned ORT headers too, under headers/ (the infer
    image's plugin stage builds from this folder alone)."""
    fresh(stage)
    copy_tree(REPO / "wheels" / "myops_ort", stage)
    pyproject = stage / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('name = "myops-ort"', f'name = "{distribution_name(entry)}"', 1))
    plugin = stage / "ort_plugin"
    plugin.mkdir()
    for name in ("CMakeLists.txt", "exports.map"):
        shutil.copy2(REPO / "ort_plugin" / name, plugin / name)
    copy_tree(REPO / "ort_plugin" / "src", plugin / "src")
    copy_tree(REPO / "ort_plugin" / "glibc_baseline", plugin / "glibc_baseline")
    copy_tree(REPO / "kernels", stage / "kernels")
    copy_tree(REPO / "opspec", stage / "myops_ort" / "opspec", python_only=True)
    cuda = entry["device"] == "cuda"
    build = {"version": VERSION, "entry": entry["id"], "distribution": distribution_name(entry),
             "ort_headers": headers.version, "ort_api_version": headers.api_version, "cuda": cuda,
             "machine": plat.machine}
    if cuda:
        build.update(cuda_major=int(entry["cuda"].split(".")[0]), cuda_architectures=cuda_architectures)
    write_text_atomic(stage / "myops_ort" / "build.json", json.dumps(build, indent=2, sort_keys=True) + "\n")
    if with_headers:
        copy_tree(Path(headers.include_dir), stage / "headers" / "ort" / headers.version / "include")
    normalise_modes(stage)
    return stage
