"""Scaffold a new op across the three layers: `nox -s new_op -- NAME [--kind elementwise|rowwise]
[--inputs N|x,...] [--outputs N|y,...] [--weights W,...] [--attributes A=V,...] [--native EXPR]` (or
`python -m lab.new_op NAME ...`).

Writes, from lab/new_op_templates/<kind>/, the op's torch-free declaration (opspec/), its math header and
CUDA functors (kernels/), the extension's schema and CPU/CUDA kernels (ops/csrc/), its Python side
with fakes, autograd and declaration (ops/<name>.py), its ONNX lowerings (ops/<name>_onnx.py), the
plugin's CPU and CUDA kernels (ort_plugin/src/) and its tests. An elementwise op is the identity (the
product of its inputs, with several; each further output twice the one before) until edited (its CPU
kernels in Highway vectors, kernels/<name>_vec-inl.h); a row-wise op, over the last dimension with per-channel weights and float
attributes, centres each row and scales it by its weights until edited (plain loops GCC vectorises,
RMSNorm's CUDA reduction). Either way the scaffold
builds and its tests pass as written. Nothing else is edited: the registries
(opspec, ops.registry, the plugin's op_registry.h) and the builds' globs find the new files.
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
    "hwy", "hn", "vm", "vec", "vec_math", "vec_targets", "cpu_isa", "row_math",
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
# And the elementwise kind's inputs: the locals of its kernels and adapters.
INPUT_RESERVED = {"out", "n", "i", "d", "d1", "lanes", "kernel", "t", "begin", "end", "dtype", "guard", "info", "input",
                  "other", "shape", "node", "err", "stream", "e", "p", "q", "v", "floats", "views", "wide", "inputs",
                  # the generated functions and the types the C++ names
                  "forward", "backward", "forward_span", "backward_span", "check_like_x", "check_cpu_dtype",
                  "kernel_dtype", "check_launch", "float_input", "same_shapes", "reference", "register_python_parts",
                  "int64_t", "size_t", "uint8_t", "int32_t", "uintptr_t", "scalar_t", "half", "bfloat16",
                  # C++ keywords and alternative tokens the general list leaves out
                  "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "static_assert", "thread_local",
                  "wchar_t", "char8_t", "char16_t", "char32_t", "co_await", "co_yield", "co_return", "concept",
                  "requires", "consteval", "constinit", "and_eq", "bitand", "bitor", "compl", "not_eq", "or_eq",
                  "xor_eq", "module", "import", "final", "override",
                  } | set(dir(builtins))  # the Python side calls tuple(), len(), ...
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
    """The names the generated code derives from each input and output: no two may meet (gate and gatec,
    x and dx, an output named like an input)."""
    derived = [f"{n}{suffix}" for n in inputs for suffix in ("", "c", "p")] + \
        [f"{prefix}{n}{suffix}" for n in inputs for prefix, suffix in (("d", ""), ("d", "p"), ("vd", ""))] + \
        [f"{prefix}{n}{suffix}" for n in outputs[1:] for prefix, suffix in (("", ""), ("", "p"), ("v", ""),
                                                                            ("grad_", ""), ("grad_", "c"), ("grad_", "p"))]
    fixed = {"gc", "gp", "y", "yp", "vy", "grad", "outs"}
    clash = sorted({d for d in derived if derived.count(d) > 1} | (set(derived) & fixed))
    if clash:
        what = "input and output" if len(outputs) > 1 else "input"
        raise ScaffoldError(f"--inputs {','.join(inputs)}{' --outputs ' + ','.join(outputs) if len(outputs) > 1 else ''}: "
                            f"the generated code would name two things {', '.join(clash)}; choose {what} names that "
                            "are not another's name with a d, v or grad_ in front or a c or p behind")


def elementwise_values(name: str, inputs: tuple[str, ...], outputs: tuple[str, ...] = ("y",)) -> dict[str, str]:
    """The generated parts of the elementwise templates: signatures and lists over the inputs (x first) and
    the outputs (y first), and the placeholder math: y is the identity for one input, the product of the
    inputs for several; each further output is twice the one before (y, 2y, 4y, ...)."""
    _check_generated_names(inputs, outputs)
    n, m = len(inputs), len(outputs)
    many = n > 1
    several = m > 1
    grads = [f"d{i}" for i in inputs]
    others = inputs[1:]
    extra = outputs[1:]
    out_grads = ["grad", *(f"grad_{o}" for o in extra)]
    # The placeholder's further outputs: outputs[k] = outputs[k-1] + outputs[k-1] = 2^k y (exact in any float).
    doublings = [(o, outputs[k]) for k, o in enumerate(extra)]

    def product_without(k: int, prefix: str = "") -> str:
        rest = [f"{prefix}{i}" for j, i in enumerate(inputs) if j != k]
        return " * ".join(["grad", *rest])

    onnx_names = ("X", *others)
    onnx_outputs = ("Y", *extra)
    quoted_outputs = [f'"{o}"' for o in onnx_outputs]
    indent = "\n  "
    base = "the product of its inputs" if many else "the identity"
    forward_body = " * ".join(inputs)
    vec_forward_body = ("hn::Mul(" * (n - 1)) + inputs[0] + "".join(f", {i})" for i in others)
    decomposed_body = (("op.Mul(" * (n - 1)) + inputs[0] + "".join(f", {i})" for i in others)) if many else "op.Identity(x)"
    py_reference = " * ".join(inputs) if many else "x.clone()"
    indexed = ", ".join(f"{i}[i]" for i in inputs)
    in_list = ", ".join(f"in[{k}]" for k in range(n))
    decomposed_nodes = (['"Mul"'] * (n - 1) if many else ['"Identity"']) + ['"Add"'] * (m - 1)

    def doubled(prefix: str, add: str, suffix: str = "", pairs=doublings) -> str:  # each output twice the one before
        return "".join(f"\n{prefix}{o} = {add.format(a=before)}{suffix}" for o, before in pairs)

    # In ONNX the identity's first double reads x: the exporters' optimisers forward an Identity's input to
    # its readers, and the fuse rule must match what they write.
    onnx_doublings = doublings if many else [(doublings[0][0], "x"), *doublings[1:]] if several else []

    def loads(tag: str, names) -> str:
        return ", ".join(f"hn::LoadU({tag}, {i} + i)" for i in names)

    def vec_forward_step(tag: str) -> str:
        if not several:
            return f" hn::StoreU(Forward1({tag}, {loads(tag, inputs)}), {tag}, y + i);"
        return (f" {{\n    hn::Vec<decltype({tag})> {', '.join(f'v{o}' for o in outputs)};"
                f"\n    Forward1({tag}, {loads(tag, inputs)}, {', '.join(f'v{o}' for o in outputs)});"
                + "".join(f"\n    hn::StoreU(v{o}, {tag}, {o} + i);" for o in outputs) + "\n  }")

    def ts_lines(call: str) -> str:  # a TorchScript symbolic's body: each output typed as x
        if several:
            return f"        outputs = {call}\n        for value in outputs:\n            value.setType(x.type())" \
                   "\n        return outputs"
        return f"        y = {call}\n        y.setType(x.type())\n        return y"

    # y's gradient gathers every output's: the placeholder's k-th further output is 2^k y.
    def gathered(line: str) -> str:
        return "".join(indent + line.format(c=2 ** (k + 1), g=g) for k, g in enumerate(out_grads[1:]))

    return {
        "input_count": str(n),
        "input_args": ", ".join(inputs),
        "input_tuple": "".join(f"{i}, " for i in inputs).rstrip(),
        "inputs_note": f" over {n} inputs of one shape" if many else "",
        "placeholder": base + (f" (y), with {', '.join(f'{o} = {2 ** (k + 1)}y' for k, o in enumerate(extra))}"
                               if several else ""),
        "placeholder_py": " * ".join(f"inputs[{k}]" for k in range(n)),
        "onnx_input_list": ", ".join(onnx_names),
        "onnx_inputs": ", ".join(f'"{i}"' for i in onnx_names) + ("" if many else ","),
        "full_inputs": f" full_inputs={n}," if many else "",
        "outputs_field": f" outputs=({', '.join(quoted_outputs)})," if several else "",
        # the outputs
        "output_count": str(m),
        "output_word": "outputs'" if several else "output's",
        "output_text": f"({', '.join(outputs)})" if several else "y",
        "onnx_output_text": f"({', '.join(onnx_outputs)})" if several else "Y",
        "output_args": ", ".join(outputs),
        "outgrad_args": ", ".join(out_grads),
        "input_count_text": f"{n} inputs ({', '.join(onnx_names)})" if many else "one input (X)",
        # kernels/NAME.h
        "t_params": ", ".join(f"T {i}" for i in inputs),
        "outputs_decl": (f"\ninline constexpr int kOutputs = {m};  // {', '.join(outputs)}: each of the inputs' shape"
                         f"\n\n// The outputs of one element.\ntemplate <typename T>\nstruct Outputs {{"
                         + "".join(f"{indent}T {o};" for o in outputs) + "\n};") if several else "",
        "forward_type": "Outputs<T>" if several else "T",
        "forward_lines": (f"  const T y = {forward_body};" + doubled("  const T ", "{a} + {a}", ";")
                          + f"\n  return {{{', '.join(outputs)}}};") if several else f"  return {forward_body};",
        "grads_note": (f"\n// grad is y's gradient, {', '.join(out_grads[1:])} {'each other output' if m > 2 else extra[0]}'s; the "
                       "placeholder's outputs all derive from y (each\n// twice the one before), so y's gradient "
                       "gathers theirs first." if several else ""),
        "t_outgrad_params": ", ".join(f"T {g}" for g in out_grads),
        "grad_fields": "".join(f"{indent}T {i};" for i in inputs),
        "backward_body": gathered("grad = grad + T({c}) * {g};")
        + (f"{indent}return {{{', '.join(product_without(k) for k in range(n))}}};" if many
           else f"{indent}(void)x;{indent}return {{grad}};"),
        "float_in_params": ", ".join(f"const float* {i}" for i in inputs),
        "float_grad_params": ", ".join(f"float* {g}" for g in grads),
        "double_in_params": ", ".join(f"const double* {i}" for i in inputs),
        "double_grad_params": ", ".join(f"double* {g}" for g in grads),
        "float_out_params": ", ".join(f"float* {o}" for o in outputs),
        "double_out_params": ", ".join(f"double* {o}" for o in outputs),
        "float_outgrad_params": ", ".join(f"const float* {g}" for g in out_grads),
        "double_outgrad_params": ", ".join(f"const double* {g}" for g in out_grads),
        "indexed_outgrads": ", ".join(f"{g}[i]" for g in out_grads),
        "double_forward_loop": (f"  for (int64_t i = 0; i < n; ++i) {{\n    const Outputs<double> outs = forward({indexed});"
                                + "".join(f"\n    {o}[i] = outs.{o};" for o in outputs) + "\n  }") if several else
                               f"  for (int64_t i = 0; i < n; ++i) y[i] = forward({indexed});",
        "grad_args": ", ".join(grads),
        "indexed_inputs": indexed,
        "store_grads": "".join(f"\n    {g}[i] = g.{i};" for g, i in zip(grads, inputs)),
        # kernels/NAME_vec-inl.h
        "v_params": ", ".join(f"V {i}" for i in inputs),
        "v_grad_params": ", ".join(f"V& {g}" for g in grads),
        "vec_forward_type": "void" if several else "V",
        "v_out_params": "".join(f", V& {o}" for o in outputs) if several else "",
        "vec_forward_lines": (f"  y = {vec_forward_body};" + doubled("  ", "hn::Add({a}, {a})", ";")) if several
                             else f"  return {vec_forward_body};",
        "vec_forward_step_d": vec_forward_step("d"),
        "vec_forward_step_d1": vec_forward_step("d1"),
        "v_outgrad_params": ", ".join(f"V {g}" for g in out_grads),
        "outgrad_loads_d": loads("d", out_grads),
        "outgrad_loads_d1": loads("d1", out_grads),
        "vec_backward_body": gathered("grad = hn::MulAdd(hn::Set(d, {c}.0f), {g}, grad);") + ("".join(
            f"{indent}{g} = " + ("hn::Mul(" * (n - 1)) + "grad" + "".join(f", {i})" for j, i in enumerate(inputs) if j != k) + ";"
            for k, g in enumerate(grads)) if many else f"{indent}(void)x;{indent}dx = grad;"),
        "loads_d": loads("d", inputs),
        "loads_d1": loads("d1", inputs),
        "vec_grad_decls": ", ".join(f"v{g}" for g in grads),
        "vec_grad_refs": ", ".join(f"v{g}" for g in grads),
        "stores_d": "".join(f"\n    hn::StoreU(v{g}, d, {g} + i);" for g in grads),
        "stores_d1": "".join(f"\n    hn::StoreU(v{g}, d1, {g} + i);" for g in grads),
        # kernels/NAME_cuda.cu and .h
        "in_list": in_list,
        "in_list_after_grad": ", ".join(f"in[{k + m}]" for k in range(n)),
        "cuda_out_count": "kOutputs" if several else "1",
        "cuda_forward_body": (f"    const Outputs<float> outs = {name}::forward({in_list});"
                              + "".join(f"\n    out[{k}] = outs.{o};" for k, o in enumerate(outputs))) if several else
                             f"    out[0] = {name}::forward({in_list});",
        "cuda_outgrad_list": ", ".join(f"in[{k}]" for k in range(m)),
        "void_out_params": ", ".join(f"void* {o}" for o in outputs),
        "void_outgrad_params": ", ".join(f"const void* {g}" for g in out_grads),
        "cuda_store_grads": "".join(f"\n    out[{k}] = g.{i};" for k, i in enumerate(inputs)),
        "void_in_params": ", ".join(f"const void* {i}" for i in inputs),
        "void_grad_params": ", ".join(f"void* {g}" for g in grads),
        # the torch adapters (ops/csrc)
        "cpp_tensor_params": ", ".join(f"const at::Tensor& {i}" for i in inputs),
        "cpp_forward_type": f"std::tuple<{', '.join(['at::Tensor'] * m)}>" if several else "at::Tensor",
        "cpp_forward_return": f"std::make_tuple({', '.join(outputs)})" if several else "y",
        "cpp_more_outputs": "".join(f"\n  at::Tensor {o} = at::empty_like(xc, at::MemoryFormat::Contiguous);" for o in extra),
        "cpp_more_output_pointers": "".join(f"\n    scalar_t* {o}p = {o}.mutable_data_ptr<scalar_t>();" for o in extra),
        "cpp_output_offsets": ", ".join(f"{o}p + begin" for o in outputs),
        "cpp_outgrad_params": ", ".join(f"const at::Tensor& {g}" for g in out_grads),
        "cpp_check_outgrads": "".join(f'\n  check_like_x({g}, x, "{name}_backward", "{g}");' for g in out_grads[1:]),
        "cpp_contiguous_outgrads": "".join(f"\n  const at::Tensor {g}c = {g}.contiguous();" for g in out_grads[1:]),
        "cpp_outgrad_pointers": "".join(f"\n    const scalar_t* {g}p = {g}c.const_data_ptr<scalar_t>();" for g in out_grads[1:]),
        "cpp_outgrad_offsets": ", ".join(["gp + begin", *(f"{g}p + begin" for g in out_grads[1:])]),
        "cuda_output_pointers": ", ".join(f"{o}.mutable_data_ptr()" for o in outputs),
        "cuda_outgrad_pointers": ", ".join(["gc.const_data_ptr()", *(f"{g}c.const_data_ptr()" for g in out_grads[1:])]),
        "schema_returns": f"({', '.join(['Tensor'] * m)})" if several else "Tensor",
        "schema_outgrad_params": ", ".join(f"Tensor {g}" for g in out_grads),
        "cpp_check_others": "".join(f'\n  check_like_x({i}, x, "{name}", "{i}");' for i in others),
        "cpp_check_others_backward": "".join(f'\n  check_like_x({i}, x, "{name}_backward", "{i}");' for i in others),
        "cuda_check_others": "".join(f'\n  check_like_x({i}, x, "{name}", "{i}");' for i in others),
        "cuda_check_others_backward": "".join(f'\n  check_like_x({i}, x, "{name}_backward", "{i}");' for i in others),
        "cpp_contiguous_others": "".join(f"\n  const at::Tensor {i}c = {i}.contiguous();" for i in others),
        "cpp_const_pointers": "".join(f"\n    const scalar_t* {i}p = {i}c.const_data_ptr<scalar_t>();" for i in inputs),
        "cpp_pointer_offsets": ", ".join(f"{i}p + begin" for i in inputs),
        "cpp_grad_outputs": "".join(f"\n  at::Tensor {g} = at::empty_like(xc, at::MemoryFormat::Contiguous);" for g in grads),
        "cpp_grad_pointers": "".join(f"\n    scalar_t* {g}p = {g}.mutable_data_ptr<scalar_t>();" for g in grads),
        "cpp_grad_offsets": ", ".join(f"{g}p + begin" for g in grads),
        "cpp_backward_type": f"std::tuple<{', '.join(['at::Tensor'] * n)}>" if many else "at::Tensor",
        "cpp_backward_return": f"std::make_tuple({', '.join(grads)})" if many else "dx",
        "cuda_const_pointers": ", ".join(f"{i}c.const_data_ptr()" for i in inputs),
        "cuda_grad_pointers": ", ".join(f"{g}.mutable_data_ptr()" for g in grads),
        "schema_params": ", ".join(f"Tensor {i}" for i in inputs),
        "schema_backward_returns": f"({', '.join(['Tensor'] * n)})" if many else "Tensor",
        # the plugin
        "span_in_list": in_list,
        "span_out_list": ", ".join(f"out[{k}]" for k in range(m)),
        "output_count_text": f"{m} outputs ({', '.join(onnx_outputs)}) like X" if several else "one output like X",
        "cuda_plugin_in_list": in_list,
        # Python
        "py_params": ", ".join(f"{i}: torch.Tensor" for i in inputs),
        "py_return_type": f"tuple[{', '.join(['torch.Tensor'] * m)}]" if several else "torch.Tensor",
        "py_reference_lines": (f"    y = {py_reference}" + doubled("    ", "{a} + {a}") + f"\n    return {', '.join(outputs)}")
                              if several else f"    return {py_reference}",
        "py_backward": PY_BACKWARD_SEVERAL.replace("$name", name) if several else PY_BACKWARD_ONE.replace("$name", name),
        "py_grad_params": "*grads" if several else "grad",
        "py_fake_outputs": (f"tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range({m}))"
                            if several else "torch.empty_like(x, memory_format=torch.contiguous_format)"),
        "py_fake_outgrad_checks": "".join(
            f'\n        torch._check({g}.shape == x.shape, lambda: f"myops::{name}_backward: {g} shape {{{g}.shape}} != x '
            f'shape {{x.shape}}")' for g in out_grads[1:]),
        "py_fake_checks": "".join(
            f'\n        torch._check({i}.shape == x.shape and {i}.dtype == x.dtype and {i}.device == x.device,'
            f'\n                     lambda: f"myops::{name}: {i} ({{{i}.dtype}}, {{{i}.shape}}, {{{i}.device}}) must have x\'s "'
            f'\n                             f"dtype, shape and device ({{x.dtype}}, {{x.shape}}, {{x.device}})")'
            for i in others),
        "py_fake_grads": (f"tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in ({', '.join(inputs)}))"
                          if many else "torch.empty_like(x, memory_format=torch.contiguous_format)"),
        "copy_floor_limit": f"{1.3 * (n + m) / 2:.2f}".rstrip("0").rstrip(".") if many or several else "1.3",
        "copy_floor_note": (f"\n    # ({n} input{'s' if many else ''} and {f'{m} outputs' if several else 'the output'} move {n + m} tensors where "
                            "the copy floor moves 2: its limit scales with that.)" if many or several else ""),
        # ONNX
        "decomposed_text": ("Mul" if many else "Identity") + (" and Add" if several else ""),
        "fuse_text": ("every float graph of the placeholder's form" if several
                      else f"every float {'Mul' if many else 'Identity'} node"),
        "decomposed_nodes": ", ".join(decomposed_nodes) + ("," if len(decomposed_nodes) == 1 else ""),
        "decomposed_lines": (f"    y = {decomposed_body}" + doubled("    ", "op.Add({a}, {a})", pairs=onnx_doublings)
                             + f"\n    return {', '.join(outputs)}") if several else f"    return {decomposed_body}",
        "schema_outputs": ", ".join(f'OpSchema.FormalParameter("{o}", "T")' for o in onnx_outputs),
        "ts_custom_lines": ts_lines(f'g.op(f"{{DOMAIN}}::{{ONNX_TYPE}}", {", ".join(inputs)}'
                                    + (f", outputs={m})" if several else ")")),
        "ts_decomposed_lines": ts_lines(f"decomposed_graph(_TorchScriptOps(g), {', '.join(inputs)})"),
        "fuse_outputs": f", _outputs={m}" if several else "",
        "schema_text": f"{n} float tensors of one shape" if many else "one float tensor",
        "schema_inputs": ", ".join(f'OpSchema.FormalParameter("{i}", "T")' for i in onnx_names),
        "parse_args": ", ".join(['"v"'] * n),
        "fuse_imports": "float_input, same_shapes" if many else "float_input",
        "fuse_check": (f'float_input(report, SPEC.name, "decomposed_graph", x) and same_shapes(report, SPEC.name, '
                       f'"decomposed_graph", {", ".join(inputs)})' if many
                       else 'float_input(report, SPEC.name, "decomposed_graph", x)'),
        "mismatch_tests": MISMATCH_TEST if many else "",
    }


# The autograd backward of an op of one output, and of several.
PY_BACKWARD_ONE = '''def _backward(ctx, grad):
    return torch.ops.myops.$name_backward(grad, *ctx.saved_tensors)'''
PY_BACKWARD_SEVERAL = '''def _backward(ctx, *grads):
    # An output the loss did not use may have no gradient (None): that is a zero one.
    if any(g is None for g in grads):
        zeros = torch.zeros_like(ctx.saved_tensors[0])
        grads = tuple(zeros if g is None else g for g in grads)
    return torch.ops.myops.$name_backward(*grads, *ctx.saved_tensors)'''


# The generated test of a several-input op: an input of another shape is refused by both sides.
MISMATCH_TEST = '''


def test_inputs_of_another_shape_are_refused_with_a_message(ext, plugin_path, tmp_path):
    """The op does not broadcast: every input has x's shape, in the extension and in the plugin."""
    from ops import export as E
    from ort_plugin.loader import make_session

    inputs = list(_inputs((2, 3, 768)))
    inputs[-1] = inputs[-1][:, :1]
    with pytest.raises(RuntimeError, match="must have x's dtype, shape and device"):
        OP.function(*inputs)
    elsewhere = list(_inputs((2, 3, 8)))  # the fake kernel runs for a meta input: it checks the device
    elsewhere[-1] = elsewhere[-1].to("meta")
    with pytest.raises(RuntimeError, match="must have x's dtype, shape and device"):
        OP.function(*elsewhere)
    path = E.export(OP.name, exporter=E.available_exporters()[0], lowering="custom", opset=18,
                    path=tmp_path / "c.onnx").path
    with pytest.raises(Exception, match="must have X's shape"):
        make_session(path, library=plugin_path).run(None, _feed(inputs))'''


def planned_files(name: str, onnx_type: str, repo: Path = REPO, native: str | None = None, kind: str = "elementwise",
                  weights: tuple[str, ...] = ("weight",), attributes: dict[str, float] | None = None,
                  inputs: tuple[str, ...] = ("x",), outputs: tuple[str, ...] = ("y",)) -> dict[Path, str]:
    """Every file the scaffold writes, with its text; raises ScaffoldError before anything is written."""
    if kind not in KINDS:
        raise ScaffoldError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    _check(name, onnx_type, repo)
    values = {"name": name, "Type": onnx_type, "NAME": name.upper(),
              # the artifacts' fixed input seed: the same on every machine, different for each op
              "seed": str(1000 + zlib.crc32(name.encode()) % 9000)}
    if kind == "rowwise":
        if tuple(outputs) != ("y",):
            raise ScaffoldError("--outputs describes an elementwise op (a row-wise op has one output, y)")
        attributes = dict(attributes or {})
        values.update(rowwise_values(name, weights, attributes))
        parameters = ", ".join(("x", *weights, *attributes))
        values.update(native_values(name, check_native(native, ("x", *weights, *attributes)) if native else None,
                                    parameters))
    else:
        if attributes or tuple(weights) != ("weight",):
            raise ScaffoldError("--weights and --attributes describe a row-wise op: add --kind rowwise")
        values.update(elementwise_values(name, inputs, outputs))
        values.update(native_values(name, check_native(native, inputs) if native else None, ", ".join(inputs)))
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
                             "per-channel weights and float attributes (LayerNorm, RMSNorm-like ops)")
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
                             "as F.silu is shown for Swish (asked for when not given and a terminal is attached; "
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
              f"  next: nox -s tests -- tests/test_{name}.py      (builds both libraries, runs its tests)\n"
              f"  then: write the seven functions of kernels/{name}.h (row sums and their merge, row statistics,\n"
              f"        output, and the gradient's), the composite in ops/{name}.py and decomposed_graph in\n"
              f"        ops/{name}_onnx.py (docs/examples/layer_norm.patch and bias_softmax.patch are worked\n"
              f"        examples); `nox -s bench -- --workload {name}`\n"
              f"        measures it into build/results/ until its files are committed")
        return 0
    what = f"the product of its inputs ({', '.join(inputs)})" if len(inputs) > 1 else "the identity"
    if len(outputs) > 1:
        what += f", and {', '.join(f'{o} = {2 ** k}y' for k, o in enumerate(outputs[1:], 1))}"
    print(f"[new_op] myops::{name} (ONNX myops::{onnx_type}) scaffolded: {what} until you edit it.\n"
          f"  next: nox -s tests -- tests/test_{name}.py      (builds both libraries, runs its tests)\n"
          f"  then: write f in kernels/{name}.h (one element) and kernels/{name}_vec-inl.h (Highway vectors),\n"
          f"        the composite in ops/{name}.py and the decomposed lowering in ops/{name}_onnx.py\n"
          f"        (docs/examples/mish.patch is a worked example); `nox -s bench -- --workload {name}` measures\n"
          f"        it into build/results/ until its files are committed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
