"""Scaffold a new op across the three layers: `nox -s new_op -- NAME [--kind elementwise|rowwise]
[--weights W,...] [--attributes A=V,...] [--native EXPR]` (or `python -m lab.new_op NAME ...`).

Writes, from lab/new_op_templates/<kind>/, the op's torch-free declaration (opspec/), its math header and
CUDA functors (kernels/), the extension's schema and CPU/CUDA kernels (ops/csrc/), its Python side
with fakes, autograd and declaration (ops/<name>.py), its ONNX lowerings (ops/<name>_onnx.py), the
plugin's CPU and CUDA kernels (ort_plugin/src/) and its tests. An elementwise op is the identity
until edited (its CPU kernels in Highway vectors, kernels/<name>_vec-inl.h); a row-wise op, over the
last dimension with per-channel weights and float attributes, centres each row and scales it by its
weights until edited (plain loops GCC vectorises, RMSNorm's CUDA reduction). Either way the scaffold
builds and its tests pass as written. Nothing else is edited: the registries
(opspec, ops.registry, the plugin's op_registry.h) and the builds' globs find the new files.
"""
from __future__ import annotations

import argparse
import ast
import keyword
import math
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
# What a --native expression may name: the op's input and PyTorch (and a row-wise op's weights and attributes).
NATIVE_NAMES = {"x", "torch", "F"}
KINDS = ("elementwise", "rowwise")
# Names a row-wise op's weights and attributes may not take: the generated code's own parameters and modules.
PARAMETER_RESERVED = {"x", "y", "g", "op", "ctx", "grad", "grads", "axes", "inputs", "output", "weights", "torch", "onnx",
                      "np", "F", "at", "row", "rows", "cols", "c", "s", "gs", "k", "j", "w", "dw", "dx", "self", "bound",
                      "value", "name", "form", "report", "pending", "context", "model", "result", "centred", "x32",
                      "check", "constant", "decomposed_graph", "forward_cpu", "backward_cpu", "forward_cuda",
                      "backward_cuda", "contiguous", "pointers", "check_inputs", "checked_dtype", "check_launch",
                      "beta", "eps"}  # beta, eps: the bench and export's own overrides of Swish's and RMSNorm's
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


def check_native(expression: str, names: tuple[str, ...] = ("x",)) -> str:
    """A --native expression, stripped: one Python expression in x (a row-wise op's weights and attributes
    too), torch and F (torch.nn.functional)."""
    expression = expression.strip()
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ScaffoldError(f"--native {expression!r} is not a Python expression ({exc.msg}); write PyTorch's "
                            "function of x, e.g. \"F.gelu(x, approximate='tanh')\"") from exc
    # Written into the op's declaration as a lambda's body: a lambda, await, yield or := there would
    # change what the row runs, or not compile.
    odd = sorted({type(node).__name__ for node in ast.walk(tree)
                  if isinstance(node, (ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr))})
    if odd:
        raise ScaffoldError(f"--native {expression!r} holds {', '.join(odd)}: write one plain call of PyTorch's "
                            "function, e.g. \"F.gelu(x, approximate='tanh')\"")
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    unknown = sorted(used - NATIVE_NAMES - set(names))
    if "x" not in used or unknown:
        raise ScaffoldError(f"--native {expression!r} must be a function of {', '.join(names)} that uses only torch "
                            f"and F (torch.nn.functional){'; it names ' + ', '.join(unknown) if unknown else ''}")
    return ast.unparse(tree)  # one line, quotes normalised: safe to write into the templates


def native_values(name: str, native: str | None, parameters: str = "x") -> dict[str, str]:
    """What the templates say about PyTorch's own function for the op: nothing, or its bench row."""
    if not native:
        return {"native_row": "", "native_import": "", "native": ""}
    return {"native_row": f'\n    native_row="torch_native_{name}",  # PyTorch\'s own: {native}',
            "native_import": "\nimport torch.nn.functional as F  # noqa: F401 (the native expression may use it)",
            "native": f"\n    native=lambda {parameters}: {native},\n    native_text={native!r},"}


def _check_parameter(kind: str, given: str, taken: set[str]) -> None:
    if not NAME_PATTERN.fullmatch(given) or keyword.iskeyword(given):
        raise ScaffoldError(f"{kind} name {given!r}: use lower-case snake_case starting with a letter (e.g. scale)")
    if given in CPP_RESERVED or given in PARAMETER_RESERVED:
        raise ScaffoldError(f"{kind} name {given!r} is a C++ keyword or a name the generated code uses: choose "
                            f"another (e.g. {given}_value)")
    if given in taken:
        raise ScaffoldError(f"{kind} name {given!r} is given twice (weights and attributes share one namespace)")
    taken.add(given)


def parse_weights(text: str) -> tuple[str, ...]:
    """--weights "weight,bias": the per-channel weights of a row-wise op, each [hidden]; at least one."""
    weights = tuple(part.strip() for part in text.split(",") if part.strip())
    if not weights:
        raise ScaffoldError("a row-wise op has at least one per-channel weight: --weights NAME[,NAME...] "
                            "(e.g. --weights weight,bias)")
    taken: set[str] = set()
    for weight in weights:
        _check_parameter("weight", weight, taken)
    return weights


def parse_attributes(text: str) -> dict[str, float]:
    """--attributes "epsilon=1e-5,alpha=0.5": float attributes and their defaults."""
    attributes = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            sep = ""
        if not sep or not math.isfinite(number):
            raise ScaffoldError(f"--attributes {part!r}: write NAME=DEFAULT with a finite float default, e.g. epsilon=1e-5")
        if key.strip() in attributes:
            raise ScaffoldError(f"attribute name {key.strip()!r} is given twice")
        attributes[key.strip()] = number
    return attributes


def rowwise_values(name: str, weights: tuple[str, ...], attributes: dict[str, float]) -> dict[str, str]:
    """The generated parts of the row-wise templates: signatures, structs and lists over the weights and
    attributes."""
    taken: set[str] = set()
    for weight in weights:
        _check_parameter("weight", weight, taken)
    for attribute in attributes:
        _check_parameter("attribute", attribute, taken)
    n = len(weights)

    def others(k: int, prefix: str) -> str:  # the product of the weights other than k
        return "".join(f" * {prefix}{w}" for i, w in enumerate(weights) if i != k)

    attr = list(attributes.items())
    return {
        "weight_count": str(n),
        "weight_names_c": ", ".join(f'"{w}"' for w in weights),
        "weight_names_py": "".join(f'"{w}", ' for w in weights).rstrip(),  # a tuple's items, one weight too
        "weight_args": ", ".join(weights),
        "weight_params": ", ".join(f"{w}: torch.Tensor" for w in weights),
        "onnx_weight_inputs": ", ".join(f'"{w}"' for w in weights),
        # C++ (kernels/NAME.h)
        "attribute_fields": "".join(f"\n  float {a};" for a, _ in attr),
        "channel_fields": "".join(f"\n  T {w};" for w in weights),
        "ptr_fields": "".join(f"\n  const S* {w};" for w in weights),
        "grad_ptr_fields": "".join(f"\n  S* {w};" for w in weights),
        "ptr_init": ", ".join(f"w[{k}]" for k in range(n)),
        "load_list": ", ".join(f"static_cast<T>(cast(p.{w}[j]))" for w in weights),
        "add_lines": "".join(f"\n  p.{w}[j] += d.{w};" for w in weights),
        "store_lines": "".join(f"\n  out[{k}] = c.{w};" for k, w in enumerate(weights)),
        "product": " * ".join(f"c.{w}" for w in weights),
        "product_text": "*".join(weights),
        "weight_grad_list": ", ".join(f"grad * (x - row.mean){others(k, 'c.')}" for k in range(n)),
        # the torch adapters
        "cpp_weight_params": ", ".join(f"const at::Tensor& {w}" for w in weights),
        "cpp_attribute_params": "".join(f", double {a}" for a, _ in attr),
        "cpp_attributes": f"{name}::Attributes{{{', '.join(f'static_cast<float>({a})' for a, _ in attr)}}}",
        "cpp_backward_type": f"std::tuple<{', '.join(['at::Tensor'] * (n + 1))}>",
        "cpp_backward_values": ", ".join(f"out[{k}]" for k in range(n + 1)),
        "schema_params": ", ".join(["Tensor x", *(f"Tensor {w}" for w in weights),
                                    *(f"float {a}={v!r}" for a, v in attr)]),
        "schema_backward_params": ", ".join(["Tensor x", *(f"Tensor {w}" for w in weights),
                                             *(f"float {a}" for a, _ in attr)]),
        "schema_backward_returns": f"({', '.join(['Tensor'] * (n + 1))})",
        # the plugin
        "plugin_attribute_reads": "".join(
            f"\n    if (OrtStatus* status = ReadFloatAttribute(api, info, MYOPS_{name.upper()}_NAME, \"{a}\", {v!r}f, "
            f"&at.{a})) {{\n      return status;\n    }}" for a, v in attr),
        # Python
        "attribute_params": "".join(f", {a}: float = {v!r}" for a, v in attr),
        "attribute_params_plain": "".join(f", {a}={v!r}" for a, v in attr),
        "attribute_args": "".join(f", {a}" for a, _ in attr),
        "attribute_defaults": ", ".join(f'"{a}": {v!r}' for a, v in attr),
        "product_py": " * ".join(weights),
        "product_float": " * ".join(f"{w}.float()" for w in weights),
        # ONNX
        "attribute_doc": "".join(f"; float attribute {a}" for a, _ in attr),
        "decomposed_muls": ", ".join(['"Mul"'] * n),
        "decomposed_product": f"{'op.Mul(' * n}centred{''.join(f', {w})' for w in weights)}",
        "parse_args": ", ".join(['"v"'] * n + ['"f"'] * len(attr)),
        "attribute_ts_kwargs": "".join(f", {a}_f={a}" for a, _ in attr),
        "attribute_ts_constants": "".join(f", constant({a})" for a, _ in attr),
        "attribute_kwargs": "".join(f", {a}={a}" for a, _ in attr),
        "attribute_constants": "".join(f", op.Constant(value_float={a})" for a, _ in attr),
    }


def planned_files(name: str, onnx_type: str, repo: Path = REPO, native: str | None = None, kind: str = "elementwise",
                  weights: tuple[str, ...] = ("weight",), attributes: dict[str, float] | None = None) -> dict[Path, str]:
    """Every file the scaffold writes, with its text; raises ScaffoldError before anything is written."""
    if kind not in KINDS:
        raise ScaffoldError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    _check(name, onnx_type, repo)
    values = {"name": name, "Type": onnx_type, "NAME": name.upper(),
              # the artifacts' fixed input seed: the same on every machine, different for each op
              "seed": str(1000 + zlib.crc32(name.encode()) % 9000)}
    if kind == "rowwise":
        attributes = dict(attributes or {})
        values.update(rowwise_values(name, weights, attributes))
        parameters = ", ".join(("x", *weights, *attributes))
        values.update(native_values(name, check_native(native, ("x", *weights, *attributes)) if native else None,
                                    parameters))
    else:
        if attributes or tuple(weights) != ("weight",):
            raise ScaffoldError("--weights and --attributes describe a row-wise op: add --kind rowwise")
        values.update(native_values(name, check_native(native) if native else None))
    templates = TEMPLATES / kind
    files = {}
    for template in sorted(templates.rglob("*.tmpl")):
        relative = template.relative_to(templates).as_posix().replace("NAME", name).removesuffix(".tmpl")
        files[repo / relative] = Template(template.read_text()).substitute(values)
    existing = sorted(str(p.relative_to(repo)) for p in files if p.exists())
    if existing:
        raise ScaffoldError(f"these files exist already and would be overwritten: {', '.join(existing)}; "
                            "move them away or choose another name")
    return files


def scaffold(name: str, onnx_type: str | None = None, repo: Path = REPO, log=print, native: str | None = None,
             kind: str = "elementwise", weights: tuple[str, ...] = ("weight",),
             attributes: dict[str, float] | None = None) -> list[Path]:
    """Write the op's files; all of them or, on any failure, none."""
    files = planned_files(name, onnx_type or onnx_type_of(name), repo, native, kind, weights, attributes)
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
    parser.add_argument("--kind", choices=KINDS, default="elementwise",
                        help="elementwise: y = f(x) per element (default); rowwise: over the last dimension, with "
                             "per-channel weights and float attributes (LayerNorm, RMSNorm-like ops)")
    parser.add_argument("--weights", metavar="W,...",
                        help="rowwise: the per-channel weights, each [hidden], in input order (default: weight)")
    parser.add_argument("--attributes", metavar="A=V,...",
                        help="rowwise: float attributes with their defaults, e.g. epsilon=1e-5 (default: none)")
    parser.add_argument("--native", metavar="EXPRESSION",
                        help="PyTorch's own function for the op, an expression in x (torch, F = torch.nn.functional), "
                             "e.g. \"F.gelu(x, approximate='tanh')\" (rowwise: in x, its weights and attributes, e.g. "
                             "\"F.layer_norm(x, x.shape[-1:], weight, bias, epsilon)\"): the bench shows it as a row, "
                             "as F.silu is shown for Swish (asked for when not given and a terminal is attached; "
                             "empty for none)")
    args = parser.parse_args(argv)
    rowwise = args.kind == "rowwise"
    if not rowwise and (args.weights is not None or args.attributes is not None):
        print("error: --weights and --attributes describe a row-wise op: add --kind rowwise", file=sys.stderr)
        return 2
    try:
        weights = parse_weights(args.weights if args.weights is not None else "weight")
        attributes = parse_attributes(args.attributes or "")
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.native is None and sys.stdin.isatty():
        names = ", ".join(("x", *weights, *attributes)) if rowwise else "x"
        args.native = input(f"PyTorch's own function for this op, as an expression in {names} (e.g. F.gelu(x)); "
                            "empty if there is none: ").strip() or None
    try:
        scaffold(args.name, args.onnx_type, native=args.native, kind=args.kind, weights=weights, attributes=attributes)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    onnx_type = args.onnx_type or onnx_type_of(args.name)
    name = args.name
    if rowwise:
        print(f"[new_op] myops::{name} (ONNX myops::{onnx_type}, row-wise, weights {', '.join(weights)}) scaffolded: "
              f"it centres each row and scales it until you edit it.\n"
              f"  next: nox -s tests -- tests/test_{name}.py      (builds both libraries, runs its tests)\n"
              f"  then: write the six functions of kernels/{name}.h (row sums, row statistics, output, and the\n"
              f"        gradient's), the composite in ops/{name}.py and decomposed_graph in ops/{name}_onnx.py\n"
              f"        (docs/examples/layer_norm.patch is a worked example); `nox -s bench -- --workload {name}`\n"
              f"        measures it into build/results/ until its files are committed")
        return 0
    print(f"[new_op] myops::{name} (ONNX myops::{onnx_type}) scaffolded: the identity until you edit it.\n"
          f"  next: nox -s tests -- tests/test_{name}.py      (builds both libraries, runs its tests)\n"
          f"  then: write f in kernels/{name}.h (one element) and kernels/{name}_vec-inl.h (Highway vectors),\n"
          f"        the composite in ops/{name}.py and the decomposed lowering in ops/{name}_onnx.py\n"
          f"        (docs/examples/mish.patch is a worked example); `nox -s bench -- --workload {name}` measures\n"
          f"        it into build/results/ until its files are committed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
