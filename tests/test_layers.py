"""The packages import each other in one direction only, and the inference side never imports torch.

Every import statement counts, at module level or inside a function: a lazy import is still a
dependency. Layers, lowest first:

    lab         the base: matrix, files, provenance, the ORT header pin, image plumbing
    opspec      the ops as ONNX sees them
    ort_plugin  the ONNX Runtime plugin: build, loader, doctor (torch-free)
    infer       the inference side's runner and benchmark rows (torch-free; the infer image)
    ops         the training side: the PyTorch extension, export, artifacts, the lab's doctor
    bench       the main job: PyTorch rows, rounds, targets, reports, fan-out, gpu_check

A package may import only packages below it, so no two packages can import each other. The infer
image installs the four torch-free packages whole (lab.docker.RUNNER_PACKAGES).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ["lab", "opspec", "ort_plugin", "infer", "ops", "bench"]
TORCH_FREE = ["lab", "opspec", "ort_plugin", "infer"]
# Imports of torch inside try/except ImportError only: lab.provenance records torch's version where
# torch is installed; lab.compat falls back to torch's vendored packaging on a torch+numpy GPU host
# (the infer image has packaging itself: onnxruntime depends on it).
GUARDED_TORCH = {"lab/provenance.py", "lab/compat.py"}


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(top-level module, line) of every absolute import in a file; relative ones stay in the package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno))
    return found


def package_files(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) package -> where: file:line of each import."""
    found = defaultdict(list)
    for package in LAYERS:
        for path in package_files(package):
            for module, line in imports_of(path):
                if module in LAYERS and module != package:
                    found[package, module].append(f"{path.relative_to(REPO)}:{line}")
    return found


def test_every_package_is_in_a_layer():
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages - {"tests"} == set(LAYERS), "add the new package to LAYERS in tests/test_layers.py"


def test_packages_import_only_the_layers_below(edges):
    upward = [f"{importer} imports {imported} ({', '.join(where[:3])})" for (importer, imported), where in edges.items()
              if LAYERS.index(imported) > LAYERS.index(importer)]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_the_base_package_imports_no_other_package(edges):
    assert not [pair for pair in edges if pair[0] == "lab"], "lab must stay the base: matrix, files, provenance, header pin"


@pytest.mark.parametrize("package", TORCH_FREE)
def test_the_inference_side_never_imports_torch_or_the_training_side(package):
    bad = [f"{path.relative_to(REPO)}:{line} imports {module}" for path in package_files(package)
           for module, line in imports_of(path)
           if module in ("torch", "ops", "bench") and str(path.relative_to(REPO)) not in GUARDED_TORCH]
    assert not bad, bad


# Not in the infer image's locked wheels: only ever imported inside the functions that need them.
NOT_IN_THE_IMAGE = ("yaml", "jsonschema", "onnx", "scipy", "elftools")


@pytest.mark.parametrize("package", ["infer", "ort_plugin", "opspec"])
def test_the_inference_side_imports_no_optional_package_at_module_level(package):
    bad = []
    for path in package_files(package):
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            bad += [f"{path.relative_to(REPO)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in NOT_IN_THE_IMAGE]
    assert not bad, bad


def test_the_infer_image_installs_exactly_the_torch_free_packages():
    from lab.docker import RUNNER_PACKAGES

    assert sorted(RUNNER_PACKAGES) == sorted(TORCH_FREE)


def test_the_walk_sees_lazy_imports(tmp_path):
    # A test that cannot fail proves nothing: an import inside a function must be found.
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from bench.run import main\n    import torch.nn\n")
    assert imports_of(source) == [("bench", 2), ("torch", 3)]


def module_imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (absolute or relative, lazy ones too; a
    package's __init__ is left out: importing a package's names is not a cycle of its modules)."""
    files = {".".join(path.relative_to(REPO).with_suffix("").parts): path for path in package_files(package)}
    modules = {name for name in files if not name.endswith("__init__")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name in modules:
        path = files[name]
        base = name.split(".")[:-1]  # the package this module is in
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                stem = base[:len(base) - node.level + 1] if node.level else []
                prefix = ".".join(stem + ([node.module] if node.module else []))
                targets = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


@pytest.mark.parametrize("package", LAYERS)
def test_no_two_modules_of_a_package_import_each_other(package):
    """Within a package too the imports go one way: a cycle (bench.run and bench.sweep once) fails here."""
    import graphlib

    try:
        graphlib.TopologicalSorter(module_imports(package)).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"modules of {package} import each other: {' -> '.join(exc.args[1])}")


def test_the_module_walk_sees_a_cycle(tmp_path, monkeypatch):
    """A lazy relative import one way, an absolute one back: the walk finds both edges."""
    import sys

    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("def f():\n    from .sub import b\n")
    (package / "sub" / "b.py").write_text("from pkg import a\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert module_imports("pkg") == {"pkg.a": {"pkg.sub.b"}, "pkg.sub.b": {"pkg.a"}}
