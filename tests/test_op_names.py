"""No file outside an op's own files names Swish or RMSNorm (issue 45): the lab's generic code reads the
ops from their declarations. The tree is read as code, not prose: in Python the identifiers and the
string constants other than docstrings (comments are not code), in C++ and CUDA the text without its
comments, elsewhere the lines that are not `#` comments. tests/, docs/, results/, Markdown and the model
catalogue may name the ops; ALLOWED lists each other place that still does, with why."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The ops' names in every spelling the tree uses: torch and ONNX names, their workloads, models, native rows and
# functions, and the names others give them (SiLU, ORT's QuickGelu). CamelCase ones also inside a longer
# name (LlamaRMSNorm, SwishFFN).
TOKENS = ("swish", "Swish", "SWISH", "rms_norm", "RMSNorm", "RMS_NORM", "swish_large", "rms_norm_4096", "ffn",
          "torch_silu", "torch_rms_norm", "silu", "SiLU", "QuickGelu")
OWN_FILES = {"opspec/swish.py", "kernels/swish.h",
             "opspec/rms_norm.py", "kernels/rms_norm.h", "kernels/rms_norm_cuda.cu", "kernels/rms_norm_cuda.h"}
FREE = ("tests/", "docs/", "results/", "bench/models/catalog.py")
# (path or folder/, token or "*") -> why it may name the op
ALLOWED = {
    ("bench/gpu/targets.py", "*"): "the GPU run's targets are written per op; the GPU issue's run (ORT rows on "
                                   "the device) reworks them",
    ("bench/gpu/rows.py", "*"): "the GPU rows' plan names the first op's large workload; reworked with the targets",
    ("bench/gpu/kernels.py", "*"): "reads RMSNorm's packed CUDA kernels' constants (its stated exception) for the "
                                   "GPU run's facts",
    ("bench/gpu/plugin.py", "*"): "the plugin's CUDA harness checks and times Swish's kernel against a float64 "
                                  "reference of Swish: Swish's by construction",
    ("bench/gpu/plugin_harness.cu", "*"): "the same harness's C++ side",
    ("bench/models/run.py", "*"): "the model runs' op shares count ORT's fusions and the exporters' variant forms "
                                  "of each op (SkipSimplifiedLayerNormalization, the Reciprocal form), which no "
                                  "declaration lists yet",
    ("bench/run_args.py", "ffn"): "--ffn-warmup, --ffn-runs, --ffn-rounds: the bench's CLI stays as it is; they "
                                  "time the models around an op",
    ("bench/run.py", "ffn"): "the same flags' values",
    ("bench/fanout.py", "ffn"): "the same flags, passed on to the infer image",
    ("infer/runner.py", "ffn"): "the same flags in the infer image's runner",
    ("bench/compare.py", "ffn"): "names --ffn-rounds in its advice",
    ("bench/tolerances.yaml", "ffn"): "the artifacts' tolerances are matched by model name",
    ("docker/train.Dockerfile", "swish"): "the train image's default command runs layer 1's test file",
    ("lab/examples.py", "rms_norm"): "the LayerNorm example benches RMSNorm's plugin beside it (its peer)",
    ("wheels/myops_ort/pyproject.toml", "*"): "the wheel's description names the ops it ships",
    ("wheels/myops_torch/pyproject.toml", "*"): "the wheel's description names the ops it ships",
}
_CAMEL = [t for t in TOKENS if t[0].isupper() and not t.isupper()]
PATTERN = re.compile("|".join(
    [r"(?<![A-Za-z0-9])(?:" + "|".join(sorted(set(TOKENS) - set(_CAMEL), key=len, reverse=True)) + r")(?![A-Za-z0-9])",
     r"(?<![A-Z0-9])(?:" + "|".join(sorted(_CAMEL, key=len, reverse=True)) + r")(?![a-z0-9])"]))


def _python_code(text: str) -> list[str]:
    """The identifiers and non-docstring string constants of a Python file."""
    tree = ast.parse(text)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.append(node.value)
        elif isinstance(node, ast.Name):
            found.append(node.id)
        elif isinstance(node, ast.Attribute):
            found.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(node.name)
        elif isinstance(node, ast.alias):
            found.append(node.name)
        elif isinstance(node, ast.arg):
            found.append(node.arg)
    return found


def names_in(path: str, text: str) -> set[str]:
    """The op tokens a file's code names."""
    if path.endswith(".py"):
        pieces = _python_code(text)
    elif path.endswith((".h", ".cc", ".cu", ".cuh", ".cpp", ".tmpl")):
        pieces = [re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)]
    else:
        pieces = [re.sub(r"(?m)^\s*#.*$", "", text)]
    return {match.group(0) for piece in pieces for match in PATTERN.finditer(piece)}


def _allowed(path: str, token: str) -> bool:
    return any((path == where or (where.endswith("/") and path.startswith(where))) and what in ("*", token)
               for where, what in ALLOWED)


def _scanned() -> dict[str, set[str]]:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    found = {}
    for path in filter(None, files.split("\0")):
        if path in OWN_FILES or path.startswith(FREE) or path.endswith(".md") or not (REPO / path).is_file():
            continue
        try:
            text = (REPO / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:  # images, archives: not code
            continue
        names = names_in(path, text)
        if names:
            found[path] = names
    return found


def test_no_generic_file_names_an_op():
    found = _scanned()
    offending = {path: sorted(t for t in names if not _allowed(path, t)) for path, names in found.items()}
    offending = {path: names for path, names in offending.items() if names}
    assert not offending, ("these files name an op outside its own files; read it from the declarations "
                           f"(opspec.OPS, opspec.PRIMARY) or add an ALLOWED entry with the reason: {offending}")
    stale = [key for key in ALLOWED if not any(
        (path == key[0] or (key[0].endswith("/") and path.startswith(key[0]))) and (key[1] == "*" or key[1] in names)
        for path, names in found.items())]
    assert not stale, f"ALLOWED entries that no longer match anything (remove them): {stale}"


def test_the_scan_reads_code_and_skips_prose():
    """It finds each spelling in code, and none in comments or docstrings."""
    python = ('"""Swish and rms_norm in a docstring."""\n# swish in a comment\n'
              'def run(ffn_runs):\n    """RMSNorm."""\n    return OPS["rms_norm"], torch_silu, "a SWISH word"\n')
    assert names_in("x.py", python) == {"ffn", "rms_norm", "torch_silu", "SWISH"}
    assert names_in("x.cu", "// swish\n/* RMSNorm */ swish::cuda::forward(x);\n") == {"swish"}
    assert names_in("x.toml", "# Swish\ndescription = \"RMSNorm\"\n") == {"RMSNorm"}
    assert names_in("x.py", "swishy = rms_normal = Swishy = RMSNormalization = 1\n") == set()  # whole names only
    assert names_in("x.py", "LlamaRMSNorm = SwishFFN = QuickGeluActivation = 1\n") == {"RMSNorm", "Swish", "QuickGelu"}
    own = names_in("opspec/swish.py", (REPO / "opspec" / "swish.py").read_text())
    assert {"swish", "Swish", "swish_large", "ffn", "torch_silu"} <= own
