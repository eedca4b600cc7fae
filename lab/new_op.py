"""Scaffold a new op across the three layers: `nox -s new_op -- NAME [--kind elementwise|rowwise]
[--inputs N|x,...] [--outputs N|y,...] [--weights W,...] [--attributes A=V,...] [--native EXPR]` (or
`python -m lab.new_op NAME ...`).

Writes, from lab/new_op_templates/<kind>/:
- an elementwise op: two files, its torch-free declaration (opspec/<name>.py, with its decomposed form in
  ONNX ops) and its math (kernels/<name>.h: one element's forward and backward). Everything else is made
  from them: the extension's and the plugin's adapters, loops and CUDA launchers (opspec/codegen), its torch
  side (ops.registry), its ONNX parts and fuse rule (ops/onnx_parts.py) and its tests
  (tests/test_declared_ops.py). It is x*x (the product of its inputs, with several; each further output
  twice the one before) until edited.
- a row-wise op, over the last dimension with per-channel weights and float attributes: the same two
  files, its math being seven functions of one element and its row's sums (kernels/rowwise_cpu.h and
  rowwise_cuda.cuh hold the row loops around them); it centres each row and scales it by its weights
  until edited.
Either way the scaffold builds and its tests pass as written, and nothing else is edited: the registries
and the builds' globs find the new files.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import keyword
import math
import os
import re
import sys
import shutil
import subprocess
import tempfile
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
    "cpu_isa", "row_math", "op_math",
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
                      "beta"}  # the bench passes its --beta (Swish's, default 1) to every op's attributes by name
# And the elementwise kind's inputs and outputs: the names the generated adapters use themselves (those
# of opspec.GENERATED_RESERVED that a snake_case name can be: the declaration refuses them too, and lab
# imports no package of the chain), the math's own, and C++ keywords the general list leaves out.
INPUT_RESERVED = {
    "a", "in", "out", "n", "rows", "cols", "workspace", "dtype", "stream", "result", "m", "at", "std", "myops",
    "forward", "backward", "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "static_assert",
    "thread_local", "wchar_t", "char8_t", "char16_t", "char32_t", "co_await", "co_yield", "co_return", "concept",
    "requires", "consteval", "constinit", "and_eq", "bitand", "bitor", "compl", "not_eq", "or_eq", "xor_eq",
    "module", "import", "final", "override", "int64_t", "size_t",
} | set(dir(builtins))  # an input is also a Python parameter of the torch reference
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
    if (repo / "opspec" / name).is_dir():
        raise ScaffoldError(f"{name!r} is a package of opspec/ (its tools, not an op): choose another name")
    # a module of the ops package by that name would shadow the op's function there (ops.<name>)
    if (repo / "ops" / f"{name}.py").is_file() or (repo / "ops" / name).is_dir():
        raise ScaffoldError(f"{name!r} is a module of the ops package (ops/{name}), not an op: choose another name")
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


def _check_parameter(kind: str, given: str, taken: set[str]) -> None:
    if not NAME_PATTERN.fullmatch(given) or keyword.iskeyword(given):
        raise ScaffoldError(f"{kind} name {given!r}: use lower-case snake_case starting with a letter (e.g. scale)")
    if given in CPP_RESERVED or given in PARAMETER_RESERVED:
        raise ScaffoldError(f"{kind} name {given!r} is a C++ keyword or a name the generated code uses: choose "
                            f"another (e.g. {given}_value)")
    if given in taken:
        raise ScaffoldError(f"{kind} name {given!r} is given twice")
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
    """The generated parts of the row-wise templates (the declaration and the math header): signatures over
    the weights and attributes, and the placeholder math y = (x - mean(x)) * the product of the weights + the
    sum of the attributes."""
    taken: set[str] = set()
    for weight in weights:
        _check_parameter("weight", weight, taken)
    for attribute in attributes:
        _check_parameter("attribute", attribute, taken)

    def others(k: int) -> str:  # the product of the weights other than k
        return "".join(f" * c.{w}" for i, w in enumerate(weights) if i != k)

    return {
        "weight_args": ", ".join(weights),
        "attribute_list": "".join(f", {a}" for a in attributes),
        "onnx_weight_inputs": ", ".join(f'"{w}"' for w in weights),
        "attribute_defaults": ", ".join(f'"{a}": {v!r}' for a, v in attributes.items()),
        # the attributes are added: a form must use each (a fuse rule reads them off the graph)
        "decomposed_product": ("op.Add(" * len(attributes) +
                               f"{'op.Mul(' * len(weights)}op.Sub(x, op.ReduceMean(x)){''.join(f', {w})' for w in weights)}"
                               + "".join(f", {a})" for a in attributes)),
        "product": " * ".join(f"c.{w}" for w in weights),
        "attribute_sum": "".join(f" + at.{a}" for a in attributes),
        "product_text": "*".join(weights) + "".join(f" + {a}" for a in attributes),
        "channel_text": ", ".join(f"c.{w}" for w in weights),
        "attributes_text": ", ".join(f"at.{a}" for a in attributes) or "none yet",
        "weight_grad_list": ", ".join(f"grad * (x - row.mean){others(k)}" for k in range(len(weights))),
    }


def _parse_names(text: str, what: str, first: str, example: str, suffix: str) -> tuple[str, ...]:
    """--inputs or --outputs: a count ("2": x and x2) or names, the first always `first`."""
    option = f"--{what}s"
    text = text.strip()
    if text.isdigit():
        count = int(text)
        names = (first, *(f"{first}{k}" for k in range(2, count + 1))) if count >= 1 else ()
    else:
        names = tuple(part.strip() for part in text.split(",") if part.strip())
        if names and names[0] != first:
            raise ScaffoldError(f"{option} {text!r}: the first {what} is always {first}, as every op's; e.g. {option} "
                                f"{first},{','.join(n for n in names if n != first)}")
        if names.count(first) > 1:
            raise ScaffoldError(f"{option} {text!r}: {first} is given twice; the first {what} is {first}, name the others")
    if not 1 <= len(names) <= 8:
        raise ScaffoldError(f"{option} {text!r}: give 1 to 8 {what}s, a count ({option} 2) or names whose first is "
                            f"{first} ({option} {example})")
    taken: set[str] = {first}
    for extra in names[1:]:
        if extra in INPUT_RESERVED:
            raise ScaffoldError(f"{what} name {extra!r} is a name the generated code uses: choose another "
                                f"(e.g. {extra}_{suffix})")
        _check_parameter(what, extra, taken)
    return names


def parse_inputs(text: str) -> tuple[str, ...]:
    """--inputs: a count (2: x and x2) or names ("x,gate"; the first is always x), each of the output's
    shape. At most 8: the kernels pass them as one array each."""
    names = _parse_names(text, "input", "x", "x,gate", "in")
    _check_generated_names(names, ("y",))
    return names


def parse_outputs(text: str) -> tuple[str, ...]:
    """--outputs: a count (2: y and y2) or names ("y,total"; the first is always y), each of the inputs'
    shape. At most 8, as the inputs."""
    return _parse_names(text, "output", "y", "y,total", "out")


def _check_generated_names(inputs: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    """The names the math header's functions take: the inputs, the outputs, each output's gradient (grad,
    grad_<output>) and each input's (d<input>); no two may meet (x and dx, an output named like an input)."""
    derived = [*inputs, *outputs, "grad", *(f"grad_{o}" for o in outputs[1:]), *(f"d{i}" for i in inputs)]
    clash = sorted({d for d in derived if derived.count(d) > 1})
    if clash:
        what = "input and output" if len(outputs) > 1 else "input"
        raise ScaffoldError(f"--inputs {','.join(inputs)}{' --outputs ' + ','.join(outputs) if len(outputs) > 1 else ''}: "
                            f"the math's functions would name two things {', '.join(clash)}; choose {what} names that "
                            "are not another's name with a d or grad_ in front")


def elementwise_values(name: str, inputs: tuple[str, ...], outputs: tuple[str, ...] = ("y",)) -> dict[str, str]:
    """The generated parts of the elementwise templates (the declaration and the math header): signatures
    over the inputs (x first) and the outputs (y first), and the placeholder math: y is x*x for one input,
    the product of the inputs for several; each further output is twice the one before (y, 2y, 4y, ...)."""
    _check_generated_names(inputs, outputs)
    n, m = len(inputs), len(outputs)
    many, several = n > 1, m > 1
    extra = outputs[1:]
    out_grads = ["grad", *(f"grad_{o}" for o in extra)]
    grads = [f"d{i}" for i in inputs]
    factors = list(inputs) if many else ["x", "x"]
    doublings = [(o, outputs[k]) for k, o in enumerate(extra)]  # (output, the one before it)
    onnx_names = ("X", *inputs[1:])  # as the old scaffold named them: X, then the others as given
    onnx_outputs = ("Y", *extra)
    quoted_outputs = [f'"{o}"' for o in onnx_outputs]
    indent = "\n  "

    def product(items) -> str:
        return " * ".join(items)

    def product_without(k: int) -> str:  # grad times the factors other than the k-th
        return product(["grad", *(f for j, f in enumerate(factors) if j != k)])

    # y's gradient gathers the further outputs' first: the k-th further output is 2^k y.
    gathered = "".join(f"{indent}grad = grad + T({2 ** (k + 1)}) * {g};" for k, g in enumerate(out_grads[1:]))
    if many:
        backward = gathered + "".join(f"{indent}{d} = {product_without(k)};" for k, d in enumerate(grads))
    else:  # d(x*x)/dx, summed as torch's autograd sums the two factors' terms
        backward = gathered + f"{indent}dx = grad * x + grad * x;"
    decomposed = ("op.Mul(" * (len(factors) - 1)) + factors[0] + "".join(f", {f})" for f in factors[1:])
    decomposed_lines = (f"    y = {decomposed}" + "".join(f"\n    {o} = op.Add({a}, {a})" for o, a in doublings)
                        + f"\n    return {', '.join(outputs)}") if several else f"    return {decomposed}"
    return {
        "input_args": ", ".join(inputs),
        "onnx_input_list": ", ".join(onnx_names),
        "onnx_inputs": ", ".join(f'"{i}"' for i in onnx_names) + ("" if many else ","),
        "full_inputs": f" full_inputs={n}," if many else "",
        "outputs_field": f" outputs=({', '.join(quoted_outputs)})," if several else "",
        "placeholder": ("the product of its inputs" if many else "x*x")
                       + (f" (y), with {', '.join(f'{o} = {2 ** (k + 1)}y' for k, o in enumerate(extra))}" if several else ""),
        "output_text": f"({', '.join(outputs)})" if several else "y",
        "onnx_output_text": f"({', '.join(onnx_outputs)})" if several else "Y",
        "decomposed_lines": decomposed_lines,
        "forward_params": ", ".join([*(f"T {i}" for i in inputs), *(f"T& {o}" for o in outputs)]),
        "forward_lines": f"  y = {product(factors)};" + "".join(f"{indent}{o} = {a} + {a};" for o, a in doublings),
        "grad_args": ", ".join(grads),
        "outgrad_args": ", ".join(out_grads),
        "backward_params": ", ".join([*(f"T {g}" for g in out_grads), *(f"T {i}" for i in inputs),
                                      *(f"T& {d}" for d in grads)]),
        "backward_lines": backward.removeprefix("\n"),
        "copy_floor_limit": f"{1.3 * (n + m) / 2:.2f}".rstrip("0").rstrip(".") if many or several else "1.3",
        "copy_floor_note": (f"\n    # ({n} input{'s' if many else ''} and {f'{m} outputs' if several else 'the output'} move "
                            f"{n + m} tensors where the copy floor moves 2: its limit scales with that.)"
                            if many or several else ""),
    }


def _check_declaration(name: str, text: str) -> None:
    """The declaration as opspec will import it, beside the lab's own catalogue code in a scratch folder:
    what it refuses (a name the generated code uses, ...) is refused here, before anything is written,
    rather than by the next `import opspec`. A child process: lab imports no package of the chain."""
    with tempfile.TemporaryDirectory() as scratch:
        package = Path(scratch) / "opspec"
        package.mkdir()
        for part in ("__init__.py", "_forms.py"):
            shutil.copy2(REPO / "opspec" / part, package / part)
        (package / f"{name}.py").write_text(text)
        checked = subprocess.run([sys.executable, "-B", "-c", "import opspec"], cwd=scratch, capture_output=True,
                                 text=True, timeout=120, env={**os.environ, "PYTHONPATH": scratch})
    if checked.returncode != 0:
        reason = (checked.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ScaffoldError(f"{reason.split(': ', 1)[-1]}; choose other names")


def planned_files(name: str, onnx_type: str, repo: Path = REPO, native: str | None = None, kind: str = "elementwise",
                  weights: tuple[str, ...] = ("weight",), attributes: dict[str, float] | None = None,
                  inputs: tuple[str, ...] = ("x",), outputs: tuple[str, ...] = ("y",)) -> dict[Path, str]:
    """Every file the scaffold writes, with its text; raises ScaffoldError before anything is written."""
    if kind not in KINDS:
        raise ScaffoldError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    _check(name, onnx_type, repo)
    values = {"name": name, "Type": onnx_type}
    if kind == "rowwise":
        if tuple(outputs) != ("y",):
            raise ScaffoldError("--outputs describes an elementwise op (a row-wise op has one output, y)")
        attributes = dict(attributes or {})
        values.update(rowwise_values(name, weights, attributes))
        names = ("x", *weights, *attributes)
        values["native"] = f"\n    native={check_native(native, names)!r}," if native else ""
    else:
        if attributes or tuple(weights) != ("weight",):
            raise ScaffoldError("--weights and --attributes describe a row-wise op: add --kind rowwise")
        values.update(elementwise_values(name, inputs, outputs))
        # PyTorch's own function, as the declaration's expression (its bench row: torch_native_<name>)
        values["native"] = f"\n    native={check_native(native, inputs)!r}," if native else ""
    templates = TEMPLATES / kind
    files = {}
    for template in sorted(templates.rglob("*.tmpl")):
        relative = template.relative_to(templates).as_posix().replace("NAME", name).removesuffix(".tmpl")
        files[repo / relative] = Template(template.read_text()).substitute(values)
    _check_declaration(name, files[repo / "opspec" / f"{name}.py"])
    existing = sorted(str(p.relative_to(repo)) for p in files if p.exists())
    if existing:
        raise ScaffoldError(f"these files exist already and would be overwritten: {', '.join(existing)}; "
                            "move them away or choose another name")
    return files


def scaffold(name: str, onnx_type: str | None = None, repo: Path = REPO, log=print, native: str | None = None,
             kind: str = "elementwise", weights: tuple[str, ...] = ("weight",),
             attributes: dict[str, float] | None = None, inputs: tuple[str, ...] = ("x",),
             outputs: tuple[str, ...] = ("y",)) -> list[Path]:
    """Write the op's files; all of them or, on any failure, none."""
    files = planned_files(name, onnx_type or onnx_type_of(name), repo, native, kind, weights, attributes, inputs,
                          outputs)
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
                             "per-channel weights and float attributes (norms such as LayerNorm)")
    parser.add_argument("--inputs", metavar="N|x,NAME,...",
                        help="elementwise: how many inputs of one shape (2: x and x2), or their names (x,gate): a "
                             "gated op such as SwiGLU, or bias + activation (default: 1, x)")
    parser.add_argument("--outputs", metavar="N|y,NAME,...",
                        help="elementwise: how many outputs of the inputs' shape (2: y and y2), or their names "
                             "(y,total): an op that also returns what it computed on the way (default: 1, y)")
    parser.add_argument("--weights", metavar="W,...",
                        help="rowwise: the per-channel weights, each [hidden], in input order (default: weight)")
    parser.add_argument("--attributes", metavar="A=V,...",
                        help="rowwise: float attributes with their defaults, e.g. epsilon=1e-5 (default: none)")
    parser.add_argument("--native", metavar="EXPRESSION",
                        help="PyTorch's own function for the op, an expression in x (torch, F = torch.nn.functional), "
                             "e.g. \"F.gelu(x, approximate='tanh')\" (rowwise: in x, its weights and attributes, e.g. "
                             "\"F.layer_norm(x, x.shape[-1:], weight, bias, epsilon)\"): the bench shows it as a row, "
                             "beside the op's own rows (asked for when not given and a terminal is attached; "
                             "empty for none; with --outputs, a tuple of one tensor per output)")
    args = parser.parse_args(argv)
    rowwise = args.kind == "rowwise"
    if not rowwise and (args.weights is not None or args.attributes is not None):
        print("error: --weights and --attributes describe a row-wise op: add --kind rowwise", file=sys.stderr)
        return 2
    if rowwise and args.inputs is not None:
        print("error: --inputs describes an elementwise op (a row-wise op has one input, x, and --weights)",
              file=sys.stderr)
        return 2
    if rowwise and args.outputs is not None:
        print("error: --outputs describes an elementwise op (a row-wise op has one output, y)", file=sys.stderr)
        return 2
    try:
        inputs = parse_inputs(args.inputs or "1")
        outputs = parse_outputs(args.outputs or "1")
        weights = parse_weights(args.weights if args.weights is not None else "weight")
        attributes = parse_attributes(args.attributes or "")
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.native is None and sys.stdin.isatty():
        names = ", ".join(("x", *weights, *attributes)) if rowwise else ", ".join(inputs)
        args.native = input(f"PyTorch's own function for this op, as an expression in {names} (e.g. F.gelu(x)); "
                            "empty if there is none: ").strip() or None
    try:
        scaffold(args.name, args.onnx_type, native=args.native, kind=args.kind, weights=weights, attributes=attributes,
                 inputs=inputs, outputs=outputs)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    onnx_type = args.onnx_type or onnx_type_of(args.name)
    name = args.name
    if rowwise:
        print(f"[new_op] myops::{name} (ONNX myops::{onnx_type}, row-wise, weights {', '.join(weights)}) scaffolded: "
              f"it centres each row and scales it until you edit it.\n"
              f"  its two files: opspec/{name}.py (the declaration: `decomposed`, the op in ONNX ops) and\n"
              f"                 kernels/{name}.h (the math: seven functions of one element and its row's sums)\n"
              f"  next: nox -s tests -- tests/test_declared_ops.py -k {name}   (builds both libraries, runs its tests)\n"
              f"  then: edit both (docs/examples/layer_norm.patch and bias_softmax.patch are worked examples);\n"
              f"        `nox -s bench -- --workload {name}` measures it into build/results/ until its files are committed")
        return 0
    what = f"the product of its inputs ({', '.join(inputs)})" if len(inputs) > 1 else "x*x"
    if len(outputs) > 1:
        what += f", and {', '.join(f'{o} = {2 ** k}y' for k, o in enumerate(outputs[1:], 1))}"
    print(f"[new_op] myops::{name} (ONNX myops::{onnx_type}) scaffolded: {what} until you edit it.\n"
          f"  its two files: opspec/{name}.py (the declaration: `decomposed`, the op in ONNX ops) and\n"
          f"                 kernels/{name}.h (the math: forward and backward of one element)\n"
          f"  next: nox -s tests -- tests/test_declared_ops.py -k {name}   (builds both libraries, runs its tests)\n"
          f"  then: edit both (docs/examples/mish.patch is a worked example); `nox -s bench -- --workload {name}`\n"
          f"        measures it into build/results/ until its files are committed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
