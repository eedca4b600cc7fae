"""Scaffold a new elementwise op across the three layers: `nox -s new_op -- NAME [--native EXPR]` (or `python -m lab.new_op NAME`).

Writes, from lab/new_op_templates/, the op's torch-free declaration (opspec/), its math header and
CUDA functors (kernels/), the extension's schema and CPU/CUDA kernels (ops/csrc/), its Python side
with fakes, autograd and declaration (ops/<name>.py), its ONNX lowerings (ops/<name>_onnx.py), the
plugin's CPU and CUDA kernels (ort_plugin/src/) and its tests. The math is the identity until
edited, so the scaffold builds and its tests pass as written. Nothing else is edited: the registries
(opspec, ops.registry, the plugin's op_registry.h) and the builds' globs find the new files.
"""
from __future__ import annotations

import argparse
import ast
import keyword
import os
import re
import sys
import zlib
from pathlib import Path
from string import Template

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = Path(__file__).resolve().parent / "new_op_templates"
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
# The name becomes a C++ namespace beside <cmath>'s functions and inside myops:: (cpu, cuda), and a
# torch schema name: C++ keywords, the math functions a header may declare globally and the
# namespaces the code already uses would not compile.
CPP_RESERVED = {
    "alignas", "alignof", "and", "asm", "auto", "bool", "case", "catch", "char", "class", "const", "constexpr",
    "continue", "decltype", "default", "delete", "do", "double", "else", "enum", "explicit", "export", "extern",
    "false", "float", "for", "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new",
    "noexcept", "not", "nullptr", "operator", "or", "private", "protected", "public", "register", "return",
    "short", "signed", "sizeof", "static", "struct", "switch", "template", "this", "throw", "true", "try",
    "typedef", "typeid", "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "while", "xor",
    "abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "exp2", "expm1", "fabs", "floor",
    "fma", "fmax", "fmin", "fmod", "hypot", "log", "log10", "log1p", "log2", "max", "min", "pow", "round", "sin",
    "sinh", "sqrt", "tan", "tanh", "trunc", "div", "signbit", "isnan", "isinf",
    "std", "at", "c10", "torch", "cpu", "cuda", "myops", "myops_cuda", "internal", "ops", "onnx",
    "hwy", "hn", "vm", "vec", "vec_math", "vec_targets", "cpu_isa",
}
# What a --native expression may name: the op's input and PyTorch.
NATIVE_NAMES = {"x", "torch", "F"}
ONNX_TYPE_PATTERN = re.compile(r"[A-Z][A-Za-z0-9]*")


class ScaffoldError(ValueError):
    """The name cannot be scaffolded; says why and what to do."""


def onnx_type_of(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _check(name: str, onnx_type: str, repo: Path) -> None:
    if not NAME_PATTERN.fullmatch(name) or keyword.iskeyword(name):
        raise ScaffoldError(f"{name!r} is not a usable op name: use lower-case snake_case starting with a letter "
                            "(e.g. fast_gelu); it becomes torch.ops.myops.<name> and a Python module")
    if name in CPP_RESERVED:
        raise ScaffoldError(f"{name!r} is a C++ keyword, a <cmath> function or a namespace the code uses: it would "
                            f"not compile as the op's namespace; choose a longer name (e.g. my_{name})")
    if name.endswith("_backward"):
        raise ScaffoldError(f"{name!r} ends in _backward, the suffix of every op's gradient op: choose another name")
    if not ONNX_TYPE_PATTERN.fullmatch(onnx_type):
        raise ScaffoldError(f"ONNX op type {onnx_type!r}: use CamelCase starting with a capital (e.g. FastGelu)")
    taken = {p.stem for p in (repo / "opspec").glob("*.py")}
    if name in taken:
        raise ScaffoldError(f"an op named {name!r} exists already (opspec/{name}.py): choose another name")
    # Its workload and model share its name: no other op's may have it (swish's ffn, swish_large...).
    workloads = {m.group(1) for p in (repo / "opspec").glob("*.py")
                 for m in re.finditer(r'(?:WorkloadSpec\(\s*|model=)"([^"]+)"', p.read_text())}
    if name in workloads:
        raise ScaffoldError(f"{name!r} names a workload or model of another op (opspec/): choose another name")
    types = {m.group(1) for p in (repo / "opspec").glob("*.py")
             for m in re.finditer(r'OpSpec\(\s*"[^"]+",\s*"([^"]+)"', p.read_text())}
    if onnx_type in types:
        raise ScaffoldError(f"the ONNX op type {onnx_type!r} belongs to another op: pass --onnx-type with another name")


def check_native(expression: str) -> str:
    """A --native expression, stripped: one Python expression in x, torch and F (torch.nn.functional)."""
    expression = expression.strip()
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ScaffoldError(f"--native {expression!r} is not a Python expression ({exc.msg}); write PyTorch's "
                            "function of x, e.g. \"F.gelu(x, approximate='tanh')\"") from exc
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    unknown = sorted(names - NATIVE_NAMES)
    if "x" not in names or unknown:
        raise ScaffoldError(f"--native {expression!r} must be a function of x that uses only torch and F "
                            f"(torch.nn.functional){'; it names ' + ', '.join(unknown) if unknown else ''}")
    return ast.unparse(tree)  # one line, quotes normalised: safe to write into the templates


def native_values(name: str, native: str | None) -> dict[str, str]:
    """What the templates say about PyTorch's own function for the op: nothing, or its bench row."""
    if not native:
        return {"native_row": "", "native_import": "", "native": ""}
    return {"native_row": f'\n    native_row="torch_native_{name}",  # PyTorch\'s own: {native}',
            "native_import": "\nimport torch.nn.functional as F  # noqa: F401 (the native expression may use it)",
            "native": f"\n    native=lambda x: {native},\n    native_text={native!r},"}


def planned_files(name: str, onnx_type: str, repo: Path = REPO, native: str | None = None) -> dict[Path, str]:
    """Every file the scaffold writes, with its text; raises ScaffoldError before anything is written."""
    _check(name, onnx_type, repo)
    values = {"name": name, "Type": onnx_type, "NAME": name.upper(),
              # the artifacts' fixed input seed: the same on every machine, different for each op
              "seed": str(1000 + zlib.crc32(name.encode()) % 9000),
              **native_values(name, check_native(native) if native else None)}
    files = {}
    for template in sorted(TEMPLATES.rglob("*.tmpl")):
        relative = template.relative_to(TEMPLATES).as_posix().replace("NAME", name).removesuffix(".tmpl")
        files[repo / relative] = Template(template.read_text()).substitute(values)
    existing = sorted(str(p.relative_to(repo)) for p in files if p.exists())
    if existing:
        raise ScaffoldError(f"these files exist already and would be overwritten: {', '.join(existing)}; "
                            "move them away or choose another name")
    return files


def scaffold(name: str, onnx_type: str | None = None, repo: Path = REPO, log=print,
             native: str | None = None) -> list[Path]:
    """Write the op's files; all of them or, on any failure, none."""
    files = planned_files(name, onnx_type or onnx_type_of(name), repo, native)
    written = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.partial")
            partial.write_text(text)
            os.replace(partial, path)
            written.append(path)
    except OSError:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    for path in written:
        log(f"[new_op] wrote {path.relative_to(repo)}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nox -s new_op --", description=__doc__.splitlines()[0])
    parser.add_argument("name", help="snake_case op name: torch.ops.myops.<name>, files <name>*.{h,cu,cpp,cc,py}")
    parser.add_argument("--onnx-type", help="the ONNX node's op type in the myops domain (default: the name in CamelCase)")
    parser.add_argument("--native", metavar="EXPRESSION",
                        help="PyTorch's own function for the op, an expression in x (torch, F = torch.nn.functional), "
                             "e.g. \"F.gelu(x, approximate='tanh')\": the bench shows it as a row, as F.silu is shown "
                             "for Swish (asked for when not given and a terminal is attached; empty for none)")
    args = parser.parse_args(argv)
    if args.native is None and sys.stdin.isatty():
        args.native = input("PyTorch's own function for this op, as an expression in x (e.g. F.gelu(x)); "
                            "empty if there is none: ").strip() or None
    try:
        scaffold(args.name, args.onnx_type, native=args.native)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    onnx_type = args.onnx_type or onnx_type_of(args.name)
    print(f"[new_op] myops::{args.name} (ONNX myops::{onnx_type}) scaffolded: the identity until you edit it.\n"
          f"  next: nox -s tests -- tests/test_{args.name}.py      (builds both libraries, runs its tests)\n"
          f"  then: write f in kernels/{args.name}.h (one element) and kernels/{args.name}_vec-inl.h (Highway vectors),\n"
          f"        the composite in ops/{args.name}.py and the decomposed lowering in ops/{args.name}_onnx.py\n"
          f"        (docs/examples/mish.patch is a worked example); `nox -s bench -- --workload {args.name}` measures\n"
          f"        it into build/results/ until its files are committed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
