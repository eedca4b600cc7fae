"""The few lines of C++ per op that the generic adapters need, written from the declarations.

An op of a kind (opspec: `kind="elementwise"` or `"rowwise"`) has no adapter files of its own: its schema,
the functions the dispatcher calls and their registration are written here from its declaration, and
they call the adapters written once per kind (ops/csrc/adapters.h, ops/csrc/cuda/adapters_cuda.h) with
the loops of its math header (kernels/<op>.h, kernels/<op>_cuda.h). The builds (ops/build.py, the
torch wheel's setup.py, bench.gpu's direct build) write these files into their own folders; nothing
generated is committed. Torch-free, and a subpackage, so that the catalogue's discovery passes it by.
"""
from __future__ import annotations

import os
from pathlib import Path

from .. import DOMAIN, OPS, OpSpec

# "declared-": a name no op's own file can have (op names are identifiers), so that the builds may keep
# these beside hand-written adapters, and an earlier build's leftovers are known by it.
PREFIX = "declared-"
LIBRARY_FILE = f"{PREFIX}library.cpp"
HEADER = "// Written by opspec/codegen from opspec/{name}.py: do not edit; edit the declaration.\n"


def generic_ops() -> list[OpSpec]:
    """The ops whose torch adapters are the generic ones, in name order."""
    return [spec for name, spec in sorted(OPS.items()) if spec.kind and not spec.plugin_only]


def _returns(count: int) -> tuple[str, str]:
    """The schema's and C++'s return types of `count` tensors."""
    if count == 1:
        return "Tensor", "at::Tensor"
    return "(" + ", ".join(["Tensor"] * count) + ")", "std::tuple<" + ", ".join(["at::Tensor"] * count) + ">"


def schemas(spec: OpSpec) -> tuple[str, str]:
    """The forward's and the backward's torch schemas: tensors by their torch names, then each float
    attribute (the forward's with its default)."""
    tensors = [f"Tensor {name}" for name in spec.torch_input_names]
    forward_attributes = [f"float {spec.torch_attribute(name)}={float(value)!r}" for name, value in spec.attributes.items()]
    attributes = [f"float {spec.torch_attribute(name)}" for name in spec.attributes]
    grads = [f"Tensor {name}" for name in spec.grad_names]
    forward = f"{spec.name}({', '.join(tensors + forward_attributes)}) -> {_returns(len(spec.outputs))[0]}"
    backward = f"{spec.name}_backward({', '.join(grads + tensors + attributes)}) -> {_returns(len(spec.inputs))[0]}"
    return forward, backward


def _signature(function: str, tensors: list[str], attributes: list[str], returns: int) -> str:
    params = [f"const at::Tensor& {name}" for name in tensors] + [f"double {name}" for name in attributes]
    return f"{_returns(returns)[1]} {function}({', '.join(params)})"


def _result(count: int) -> str:
    if count == 1:
        return "return result[0];"
    return "return {" + ", ".join(f"result[{k}]" for k in range(count)) + "};"


def _list(items) -> str:
    return "{" + ", ".join(items) + "}"


def _names(items) -> str:
    return _list(f'"{item}"' for item in items)


def _pointers(prefix: str, start: int, count: int) -> list[str]:
    return [f"{prefix}[{k}]" for k in range(start, start + count)]


# ---------------------------------------------------------------- an op's one-element functions

def generated(spec: OpSpec, device: str) -> bool:
    """Whether the op's loops (device "cpu") or launchers ("cuda") are written here around its math
    header's functions (an elementwise op's one-element forward and backward, a rowwise op's per-element
    functions), rather than by the header itself (opspec: own_kernels)."""
    return spec.kind in ("elementwise", "rowwise") and device not in spec.own_kernels


def _functor_namespace(spec: OpSpec) -> str:
    return f"myops_declared_{spec.name}"


def _functor(spec: OpSpec, function: str, struct: str, inputs: int, outputs: int) -> str:
    """One call of kernels/<op>.h's `function` as a functor over arrays of one element's values: the
    inputs (and a backward's grads first), the attributes (members, converted to T), the outputs."""
    members = "".join(f"  A {name};\n" for name in _attribute_members(spec))
    arguments = ([f"in[{k}]" for k in range(inputs)] + [f"static_cast<T>({name})" for name in _attribute_members(spec)]
                 + [f"out[{k}]" for k in range(outputs)])
    head = "template <typename A>\n" if spec.attributes else ""
    return (f"{head}struct {struct} {{\n{members}"
            "  template <typename T>\n"
            f"  MYOPS_HD void operator()(const T (&in)[{inputs}], T (&out)[{outputs}]) const {{\n"
            f"    {spec.name}::{function}({', '.join(arguments)});\n  }}\n}};\n")


def _attribute_members(spec: OpSpec) -> list[str]:
    return [f"a{k}" for k in range(len(spec.attributes))]


def functors(spec: OpSpec) -> str:
    """The op's math header and its Forward and Backward functors, compiled as the CPU loops need them
    (elementwise_cpu.h's options, so that GCC inlines them into the loops and vectorises those)."""
    inputs, outputs = len(spec.inputs), len(spec.outputs)
    return ("#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)\n"
            "#pragma GCC push_options\n#pragma GCC optimize(\"O3\", \"no-trapping-math\", \"no-thread-jumps\")\n#endif\n"
            '#include "op_math.h"\n'
            f'#include "{spec.name}.h"\n\n'
            f'namespace __attribute__((visibility("hidden"))) {_functor_namespace(spec)} {{\n\n'
            f"// forward({'inputs..., ' if inputs > 1 else 'x, '}{'attributes..., ' if spec.attributes else ''}"
            f"{'outputs...' if outputs > 1 else 'y'}) of kernels/{spec.name}.h, one element\n"
            + _functor(spec, "forward", "Forward", inputs, outputs) + "\n"
            f"// backward(grads..., inputs..., {'attributes..., ' if spec.attributes else ''}their grads...)\n"
            + _functor(spec, "backward", "Backward", outputs + inputs, inputs) +
            f"\n}}  // namespace {_functor_namespace(spec)}\n"
            "#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)\n#pragma GCC pop_options\n#endif\n")


def _functor_value(spec: OpSpec, struct: str, values: list[str], value_type: str) -> str:
    """A functor object holding the attribute values."""
    if not spec.attributes:
        return f"{_functor_namespace(spec)}::{struct}{{}}"
    return f"{_functor_namespace(spec)}::{struct}<{value_type}>{{{', '.join(values)}}}"


def _launcher_signatures(spec: OpSpec) -> tuple[str, str]:
    """The host launchers' signatures, as kernels/<op>_cuda.h would declare them."""
    inputs, outputs = len(spec.inputs), len(spec.outputs)
    attributes = [f"float {name}" for name in _attribute_members(spec)]
    tail = ["myops_cuda::DType dtype", "cudaStream_t stream"]
    forward = ([f"const void* in{k}" for k in range(inputs)] + [f"void* out{k}" for k in range(outputs)]
               + ["int64_t n"] + attributes + tail)
    backward = ([f"const void* in{k}" for k in range(outputs + inputs)] + [f"void* out{k}" for k in range(inputs)]
                + ["int64_t n"] + attributes + tail)
    return f"cudaError_t forward({', '.join(forward)})", f"cudaError_t backward({', '.join(backward)})"


def launcher_declarations(spec: OpSpec) -> str:
    if spec.kind == "rowwise":
        forward, workspace, backward = _row_launcher_signatures(spec)
        return (f"// the launchers opspec/codegen writes for kernels/{spec.name}.h (declared-{spec.name}_launch.cu)\n"
                f'#include "cuda_dtype.h"\nnamespace {spec.name} {{\nnamespace cuda {{\n{forward};\n{workspace};\n'
                f"{backward};\n}}  // namespace cuda\n}}  // namespace {spec.name}\n")
    forward, backward = _launcher_signatures(spec)
    return (f"// the launchers opspec/codegen writes for kernels/{spec.name}.h (declared-{spec.name}_launch.cu)\n"
            f"namespace {spec.name} {{\nnamespace cuda {{\n{forward};\n{backward};\n}}  // namespace cuda\n"
            f"}}  // namespace {spec.name}\n")


def launchers(spec: OpSpec, header: bool = True) -> str:
    """The CUDA launchers of an op whose math is one element's functions: myops_cuda::dispatch_many over
    the functors, in float32 whatever the storage type. header: the generated file's first line (left out
    where they go into another generated file)."""
    if spec.kind == "rowwise":
        return ((HEADER.format(name=spec.name) if header else "") +
                f"// myops::{spec.onnx_type}'s CUDA launchers: the per-element functions of kernels/{spec.name}.h in\n"
                "// one block per row (kernels/rowwise_cuda.cuh) over float, half and bfloat16 storage, summed in float32.\n"
                + _row_launchers(spec))
    inputs, outputs = len(spec.inputs), len(spec.outputs)
    forward, backward = _launcher_signatures(spec)
    values = _attribute_members(spec)

    def body(struct: str, n_in: int, n_out: int, struct_16bit: str | None = None) -> str:
        functors_ = [_functor_value(spec, name, values, 'float') for name in (struct, struct_16bit) if name]
        return (f"  const void* const in[{n_in}] = {_list(f'in{k}' for k in range(n_in))};\n"
                f"  void* const out[{n_out}] = {_list(f'out{k}' for k in range(n_out))};\n"
                f"  return myops_cuda::dispatch_many(dtype, {', '.join(functors_)}, in, out, n, stream);\n")

    # forward_16bit: the math's faster form for float16 and bfloat16 storage (opspec: forward_16bit)
    forward_16bit = ("" if not spec.forward_16bit else
                     f'namespace __attribute__((visibility("hidden"))) {_functor_namespace(spec)} {{\n'
                     f"// forward_16bit of kernels/{spec.name}.h: float16 and bfloat16 storage\n"
                     + _functor(spec, "forward_16bit", "Forward16", inputs, outputs) +
                     f"}}  // namespace {_functor_namespace(spec)}\n")

    return ((HEADER.format(name=spec.name) if header else "") +
            f"// myops::{spec.onnx_type}'s CUDA launchers: the one-element functions of kernels/{spec.name}.h over\n"
            "// float, half and bfloat16 storage (kernels/elementwise_cuda.cuh), computed in float32.\n"
            '#include "cuda_dtype.h"\n#include "elementwise_cuda.cuh"\n' + functors(spec) + forward_16bit + "\n" +
            f"namespace {spec.name} {{\nnamespace cuda {{\n\n"
            f"{forward} {{\n{body('Forward', inputs, outputs, 'Forward16' if spec.forward_16bit else None)}}}\n\n"
            f"{backward} {{\n{body('Backward', outputs + inputs, inputs)}}}\n\n"
            f"}}  // namespace cuda\n}}  // namespace {spec.name}\n")


# ---------------------------------------------------------------- a rowwise op's per-element functions

_O3 = ("#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)\n"
       "#pragma GCC push_options\n#pragma GCC optimize(\"O3\", \"no-trapping-math\", \"no-thread-jumps\")\n#endif\n")
_O3_END = "#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)\n#pragma GCC pop_options\n#endif\n"


def _weights(spec: OpSpec) -> list[str]:
    """A rowwise op's weights by their torch names: the fields of its Channel<T>."""
    return list(spec.torch_input_names[spec.full_inputs:])


def row_types(spec: OpSpec) -> str:
    """What kernels/<op>.h's functions take, from the declaration: Attributes (one float per attribute,
    by its torch name) and Channel<T> (one column of the weights, a field per weight)."""
    weights = _weights(spec)
    attributes = "".join(f" float {spec.torch_attribute(name)};" for name in spec.attributes)
    return (f"namespace {spec.name} {{\n"
            f"// opspec/{spec.name}.py's attributes, and one column of its weights\n"
            f"struct Attributes {{{attributes} }};\n"
            f"template <typename T>\nstruct Channel {{{''.join(f' T {w};' for w in weights)} }};\n"
            f"}}  // namespace {spec.name}\n")


def row_math(spec: OpSpec) -> str:
    """The op's math header with its types before it, compiled as the row loops need it, and the struct
    kernels/rowwise_cpu.h and rowwise_cuda.cuh read the op through (Declared)."""
    name, weights = spec.name, _weights(spec)
    k = len(weights)
    loads = ", ".join(f"static_cast<T>(cast(w[{i}][j]))" for i in range(k))
    adds = " ".join(f"dw[{i}][j] += d.{weight};" for i, weight in enumerate(weights))
    values = " ".join(f"out[{i}] = c.{weight};" for i, weight in enumerate(weights))
    # Declared inside the math's options too: GCC inlines only functions of the same options into the row
    # loops (outside, load() stayed a call per element through the PLT: LayerNorm at 57x F.layer_norm)
    return (_O3 + '#include "op_math.h"\n' + row_types(spec) + f'#include "{name}.h"\n\n'
            f"namespace {name} {{\n\n"
            f"// What the generic row loops need of kernels/{name}.h (they find its functions by their argument types).\n"
            "struct Declared {\n"
            f"  static constexpr int kWeights = {k};\n"
            f"  static constexpr bool kNormalize = {name}::kNormalize;\n"
            f"  using Attributes = {name}::Attributes;\n"
            + "".join(f"  template <typename T>\n  using {t} = {name}::{t}<T>;\n"
                      for t in ("Channel", "Sums", "GradSums", "Row")) +
            "  // column j of the weights w[k], each value through cast (storage to float on CUDA)\n"
            "  template <typename T, typename W, typename Cast>\n"
            f"  static MYOPS_HD Channel<T> load(const W& w, int64_t j, Cast cast) {{ return {{{loads}}}; }}\n"
            "  template <typename W, typename T>\n"
            f"  static MYOPS_HD void add(const W& dw, int64_t j, const Channel<T>& d) {{ {adds} }}\n"
            "  template <typename T>\n"
            f"  static MYOPS_HD void values(const Channel<T>& c, T* out) {{ {values} }}\n"
            "};\n\n"
            f"}}  // namespace {name}\n" + _O3_END)


def _row_params(spec: OpSpec, pointer: str, const_pointer: str, backward: bool, extent: str) -> list[str]:
    weights = _weights(spec)
    params = [f"{const_pointer} grad"] if backward else []
    params += [f"{const_pointer} x", *(f"{const_pointer} {w}" for w in weights)]
    params += ([f"{pointer} dx", *(f"{pointer} d{w}" for w in weights)] if backward else [f"{pointer} y"])
    return params + [extent] + [f"float {spec.torch_attribute(a)}" for a in spec.attributes]


def _attributes_value(spec: OpSpec) -> str:
    return f"Attributes{{{', '.join(spec.torch_attribute(a) for a in spec.attributes)}}}"


def row_loops(spec: OpSpec) -> str:
    """The rowwise op's CPU entry points (forward_rows, backward_rows, as an own header would write them)
    over kernels/rowwise_cpu.h."""
    name, weights = spec.name, _weights(spec)
    k = len(weights)
    rows = "int64_t rows, int64_t cols"
    forward = _row_params(spec, "T*", "const T*", False, rows)
    backward = _row_params(spec, "T*", "const T*", True, rows)
    w = f"rowwise_cpu::Weights<const T, {k}>{{{{{', '.join(weights)}}}}}"
    dw = f"rowwise_cpu::Weights<T, {k}>{{{{{', '.join(f'd{x}' for x in weights)}}}}}"
    return (f"{row_math(spec)}\n#include \"rowwise_cpu.h\"\n\nnamespace {name} {{\n\n"
            "// y[rows, cols]; float32 on the vector paths, float64 (gradcheck) in plain loops\n"
            f"template <typename T>\ninline void forward_rows({', '.join(forward)}) {{\n"
            f"  rowwise_cpu::forward_rows<Declared>(x, {w}, y, rows, cols, {_attributes_value(spec)});\n}}\n\n"
            "// dx, and each weight's gradient added (+=) into d<weight>\n"
            f"template <typename T>\ninline void backward_rows({', '.join(backward)}) {{\n"
            f"  rowwise_cpu::backward_rows<Declared>(grad, x, {w}, dx, {dw}, rows, cols, {_attributes_value(spec)});\n"
            f"}}\n\n}}  // namespace {name}\n")


def _row_launcher_signatures(spec: OpSpec) -> tuple[str, str, str]:
    tail = ["myops_cuda::DType dtype", "cudaStream_t stream"]
    forward = _row_params(spec, "void*", "const void*", False, "int64_t rows, int64_t cols") + tail
    backward = _row_params(spec, "void*", "const void*", True, "float* workspace, int64_t rows, int64_t cols") + tail
    return (f"cudaError_t forward({', '.join(forward)})", "int64_t backward_workspace_floats(int64_t rows, int64_t cols)",
            f"cudaError_t backward({', '.join(backward)})")


def _row_launchers(spec: OpSpec) -> str:
    name, weights = spec.name, _weights(spec)
    forward, workspace, backward = _row_launcher_signatures(spec)
    at = _attributes_value(spec)
    return ('#include "cuda_dtype.h"\n#include "rowwise_cuda.cuh"\n' + row_math(spec) + "\n"
            f"namespace {name} {{\nnamespace cuda {{\n\n"
            f"{forward} {{\n  const void* const weights_[{len(weights)}] = {_list(weights)};\n"
            f"  return rowwise_cuda::forward_rows<Declared>(x, weights_, y, rows, cols, {at}, dtype, stream);\n}}\n\n"
            f"{workspace} {{\n  return rowwise_cuda::backward_workspace_floats<Declared>(rows, cols);\n}}\n\n"
            f"{backward} {{\n  const void* const weights_[{len(weights)}] = {_list(weights)};\n"
            f"  void* const weight_grads_[{len(weights)}] = {_list(f'd{x}' for x in weights)};\n"
            f"  return rowwise_cuda::backward_rows<Declared>(grad, x, weights_, dx, weight_grads_, workspace, rows, cols, "
            f"{at}, dtype, stream);\n}}\n\n"
            f"}}  // namespace cuda\n}}  // namespace {name}\n")


def own_kernel_problems(kernels: Path, ops: list[OpSpec] | None = None) -> list[str]:
    """Where the math headers in `kernels` and the declarations disagree on who writes an op's CUDA
    launchers: a kernels/<op>_cuda.cu beside generated launchers would define them twice, and an op
    declaring its own without the file cannot build. One message per op, saying what to do."""
    problems = []
    for spec in plugin_ops() if ops is None else ops:
        own = (kernels / f"{spec.name}_cuda.cu").is_file()
        if own and generated(spec, "cuda"):
            problems.append(f"kernels/{spec.name}_cuda.cu exists, but opspec/{spec.name}.py does not declare "
                            f"own_kernels=(..., \"cuda\"): its CUDA launchers are written from kernels/{spec.name}.h's "
                            "functions. Remove the file, or declare its launchers your own.")
        elif not own and not generated(spec, "cuda"):
            problems.append(f"opspec/{spec.name}.py declares own_kernels=(..., \"cuda\"), but kernels/{spec.name}_cuda.cu "
                            "is missing: write its launchers there, or drop \"cuda\" from own_kernels to have them "
                            f"written from kernels/{spec.name}.h's functions.")
    return problems


class _Op:
    """What each generated function of one op needs, from its declaration."""

    def __init__(self, spec: OpSpec):
        self.spec = spec
        self.inputs = list(spec.torch_input_names)
        self.full = spec.full_inputs
        self.weights = len(self.inputs) - self.full
        self.outputs = len(spec.outputs)
        self.grads = list(spec.grad_names)
        self.attributes = [spec.torch_attribute(name) for name in spec.attributes]

    def cpu(self) -> str:
        spec, name = self.spec, self.spec.name
        values = [f"a[{k}]" for k in range(len(self.attributes))]
        attrs = _list(self.attributes)
        n_in, n_out, n_a = len(self.inputs), self.outputs, len(self.attributes)
        if generated(spec, "cpu") and spec.kind == "elementwise":
            params = f"const auto& in, const auto& out, int64_t n, const auto&{' a' if n_a else ''}"
            value_type = "std::decay_t<decltype(a[0])>"

            def call(struct: str, n_in_: int, n_out_: int) -> str:
                return (f"[]({params}) {{\n        elementwise_cpu::map<{n_in_}, {n_out_}>("
                        f"{_functor_value(spec, struct, values, value_type)}, in, out, n); }}")

            forward_call = (f"adapters::elementwise<{n_in}, {n_out}, {n_a}>(\"{name}\", {_names(self.inputs)}, 0, "
                            f"{_list(self.inputs)}, {attrs},\n      {call('Forward', n_in, n_out)})")
            backward_call = (f"adapters::elementwise<{n_out + n_in}, {n_in}, {n_a}>(\"{name}_backward\", "
                             f"{_names(self.grads + self.inputs)}, {n_out}, {_list(self.grads + self.inputs)}, {attrs},\n"
                             f"      {call('Backward', n_out + n_in, n_in)})")
        elif spec.kind == "elementwise":
            forward_call = (f"adapters::elementwise<{n_in}, {n_out}, {n_a}>(\"{name}\", {_names(self.inputs)}, 0, "
                            f"{_list(self.inputs)}, {attrs},\n      [](const auto& in, const auto& out, int64_t n, const auto& a) "
                            f"{{ {name}::forward_span({', '.join(_pointers('in', 0, n_in) + _pointers('out', 0, n_out) + ['n'] + values)}); }})")
            backward_call = (f"adapters::elementwise<{n_out + n_in}, {n_in}, {n_a}>(\"{name}_backward\", "
                             f"{_names(self.grads + self.inputs)}, {n_out}, {_list(self.grads + self.inputs)}, {attrs},\n"
                             f"      [](const auto& in, const auto& out, int64_t n, const auto& a) {{ {name}::backward_span("
                             f"{', '.join(_pointers('in', 0, n_out + n_in) + _pointers('out', 0, n_in) + ['n'] + values)}); }})")
        else:
            forward_call = (f"adapters::rowwise<{n_in}, {self.full}, {n_out}, 0, {n_a}>(\"{name}\", {_names(self.inputs)}, 0, "
                            f"{_list(self.inputs)}, {attrs},\n      [](const auto& in, const auto& out, int64_t rows, int64_t cols, "
                            f"const auto& a) {{ {name}::forward_rows("
                            f"{', '.join(_pointers('in', 0, n_in) + _pointers('out', 0, n_out) + ['rows', 'cols'] + values)}); }})")
            backward_call = (f"adapters::rowwise<{n_out + n_in}, {n_out + self.full}, {self.full}, {self.weights}, {n_a}>("
                             f"\"{name}_backward\", {_names(self.grads + self.inputs)}, {n_out}, "
                             f"{_list(self.grads + self.inputs)}, {attrs},\n      [](const auto& in, const auto& out, "
                             f"int64_t rows, int64_t cols, const auto& a) {{ {name}::backward_rows("
                             f"{', '.join(_pointers('in', 0, n_out + n_in) + _pointers('out', 0, n_in) + ['rows', 'cols'] + values)}); }})")
        forward, backward = schemas(spec)
        return (HEADER.format(name=name) +
                f'// myops::{name} ({spec.kind}) for PyTorch: its schema and CPU kernels over the math of kernels/{name}.h.\n'
                '#include <torch/library.h>\n\n'
                '#include <tuple>\n\n'
                '#include "adapters.h"\n' +
                (f'#include <type_traits>\n\n#include "elementwise_cpu.h"\n{functors(spec)}\n'
                 if generated(spec, "cpu") and spec.kind == "elementwise"
                 else f"{row_loops(spec)}\n" if generated(spec, "cpu") else f'#include "{name}.h"\n\n') +
                'namespace myops {\nnamespace {\n\n'
                f"{_signature(f'{name}_cpu', self.inputs, self.attributes, n_out)} {{\n"
                f"  const auto result = {forward_call};\n  {_result(n_out)}\n}}\n\n"
                f"{_signature(f'{name}_backward_cpu', self.grads + self.inputs, self.attributes, n_in)} {{\n"
                f"  const auto result = {backward_call};\n  {_result(n_in)}\n}}\n\n"
                '}  // namespace\n\n'
                f'TORCH_LIBRARY_FRAGMENT({DOMAIN}, m) {{\n  m.def("{forward}");\n  m.def("{backward}");\n}}\n\n'
                f'TORCH_LIBRARY_IMPL({DOMAIN}, CPU, m) {{\n  m.impl("{name}", &{name}_cpu);\n'
                f'  m.impl("{name}_backward", &{name}_backward_cpu);\n}}\n\n'
                '}  // namespace myops\n')

    def cuda(self) -> str:
        spec, name = self.spec, self.spec.name
        values = [f"static_cast<float>({attribute})" for attribute in self.attributes]
        n_in, n_out = len(self.inputs), self.outputs
        tail = ["dtype", "stream"]
        if spec.kind == "elementwise":
            params = "const auto& in, const auto& out, int64_t n, myops_cuda::DType dtype, cudaStream_t stream"
            forward_call = (f"cuda_adapters::elementwise<{n_in}, {n_out}>(\"{name}\", {_names(self.inputs)}, 0, "
                            f"{_list(self.inputs)},\n      [&]({params}) {{ return {name}::cuda::forward("
                            f"{', '.join(_pointers('in', 0, n_in) + _pointers('out', 0, n_out) + ['n'] + values + tail)}); }})")
            backward_call = (f"cuda_adapters::elementwise<{n_out + n_in}, {n_in}>(\"{name}_backward\", "
                             f"{_names(self.grads + self.inputs)}, {n_out}, {_list(self.grads + self.inputs)},\n"
                             f"      [&]({params}) {{ return {name}::cuda::backward("
                             f"{', '.join(_pointers('in', 0, n_out + n_in) + _pointers('out', 0, n_in) + ['n'] + values + tail)}); }})")
        else:
            params = ("const auto& in, const auto& out, float* workspace, int64_t rows, int64_t cols, "
                      "myops_cuda::DType dtype, cudaStream_t stream")
            forward_call = (f"cuda_adapters::rowwise<{n_in}, {self.full}, {n_out}, 0>(\"{name}\", {_names(self.inputs)}, 0, "
                            f"{_list(self.inputs)}, cuda_adapters::no_workspace,\n      [&]({params}) {{ (void)workspace; "
                            f"return {name}::cuda::forward("
                            f"{', '.join(_pointers('in', 0, n_in) + _pointers('out', 0, n_out) + ['rows', 'cols'] + values + tail)}); }})")
            backward_call = (f"cuda_adapters::rowwise<{n_out + n_in}, {n_out + self.full}, {self.full}, {self.weights}>("
                             f"\"{name}_backward\", {_names(self.grads + self.inputs)}, {n_out}, "
                             f"{_list(self.grads + self.inputs)}, {name}::cuda::backward_workspace_floats,\n"
                             f"      [&]({params}) {{ return {name}::cuda::backward("
                             f"{', '.join(_pointers('in', 0, n_out + n_in) + _pointers('out', 0, n_in) + ['workspace', 'rows', 'cols'] + values + tail)}); }})")
        return (HEADER.format(name=name) +
                f'// myops::{name} ({spec.kind}) for PyTorch on CUDA: the launchers of its math (kernels/{name}*) on\n'
                "// PyTorch's current stream.\n"
                '#include <torch/library.h>\n\n'
                '#include <tuple>\n\n'
                '#include "adapters_cuda.h"\n' +
                (launchers(spec, header=False) + "\n" if generated(spec, "cuda") else f'#include "{name}_cuda.h"\n\n') +
                'namespace myops {\n'
                f'namespace __attribute__((visibility("hidden"))) {name}_cuda_adapter {{\n\n'
                f"{_signature(f'{name}_cuda', self.inputs, self.attributes, n_out)} {{\n"
                f"  const auto result = {forward_call};\n  {_result(n_out)}\n}}\n\n"
                f"{_signature(f'{name}_backward_cuda', self.grads + self.inputs, self.attributes, n_in)} {{\n"
                f"  const auto result = {backward_call};\n  {_result(n_in)}\n}}\n\n"
                f'}}  // namespace {name}_cuda_adapter\n\n'
                f'TORCH_LIBRARY_IMPL({DOMAIN}, CUDA, m) {{\n  m.impl("{name}", &{name}_cuda_adapter::{name}_cuda);\n'
                f'  m.impl("{name}_backward", &{name}_cuda_adapter::{name}_backward_cuda);\n}}\n\n'
                '}  // namespace myops\n')


LIBRARY_TEXT = ("// Written by opspec/codegen: the myops library itself. Each op's file adds its schema\n"
                "// (TORCH_LIBRARY_FRAGMENT) and kernels.\n"
                "#include <torch/library.h>\n\n"
                f"TORCH_LIBRARY({DOMAIN}, m) {{}}\n")


def _write(path: Path, text: str) -> Path:
    """Rewritten only when its text changes: ninja and make go by modification time."""
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # two builds of one checkout may write at once
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def write_torch_sources(cpp_folder: Path, cuda_folder: Path, ops: list[OpSpec] | None = None) -> dict[str, list[Path]]:
    """The library's frame and each generic op's schema, CPU and CUDA functions, written into these
    folders (files of earlier ops that are gone are removed); returns {"cpp": [...], "cuda_ops": [...]}.
    ops: the catalogue's (default), or others (a test's)."""
    ops = generic_ops() if ops is None else ops
    cpp = [_write(cpp_folder / LIBRARY_FILE, LIBRARY_TEXT)]
    cuda = []
    for spec in ops:
        op = _Op(spec)
        cpp.append(_write(cpp_folder / f"{PREFIX}{spec.name}.cpp", op.cpu()))
        cuda.append(_write(cuda_folder / f"{PREFIX}{spec.name}_cuda.cu", op.cuda()))
    for folder, keep, pattern in ((cpp_folder, cpp, f"{PREFIX}*.cpp"), (cuda_folder, cuda, f"{PREFIX}*_cuda.cu")):
        for stale in set(folder.glob(pattern)) - set(keep):
            stale.unlink(missing_ok=True)
    return {"cpp": cpp, "cuda_ops": cuda}


# ---------------------------------------------------------------- the ORT plugin

# The element types each execution provider's kernels of a declared op take (ORT's CUDA EP: float16 too).
PLUGIN_TYPES = {"cpu": ("float32",), "cuda": ("float32", "float16")}
_ORT_TYPES = {"float32": "ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT", "float16": "ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16"}
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def plugin_ops() -> list[OpSpec]:
    """The ops whose plugin kernels are the generic ones, in name order (plugin-only ones included)."""
    return [spec for name, spec in sorted(OPS.items()) if spec.kind]


def _braced(items: str) -> str:
    """A std::array's initializer: {{a, b}}, or {} for no items."""
    return "{}" if items == "{}" else "{" + items + "}"


def _float(value) -> str:
    return f"{float(value)!r}f"


def _plugin_source(spec: OpSpec, provider: str) -> str:
    inputs, outputs, attributes = len(spec.inputs), len(spec.outputs), len(spec.attributes)
    values = [f"a[{k}]" for k in range(attributes)]
    pointers = _pointers("in", 0, inputs) + _pointers("out", 0, outputs)
    extent = ["n"] if spec.kind == "elementwise" else ["rows", "cols"]
    extent_params = ", ".join(f"int64_t {name}" for name in extent)
    a = "const A& a" if attributes else "const A&"  # unnamed where unused: -Wextra
    if provider == "cpu" and generated(spec, "cpu") and spec.kind == "elementwise":
        member = (f"  // kernels/{spec.name}.h's forward, one element, in the loops of elementwise_cpu.h\n  struct Forward {{\n"
                  f"    template <class In, class Out, class A>\n"
                  f"    void operator()(const In& in, const Out& out, {extent_params}, {a}) const {{\n"
                  f"      elementwise_cpu::map<{inputs}, {outputs}>("
                  f"{_functor_value(spec, 'Forward', values, 'float')}, in, out, n);\n    }}\n  }};\n")
        include = f'#include "elementwise_cpu.h"\n{functors(spec)}'
    elif provider == "cpu":
        call = f"{spec.name}::{'forward_span' if spec.kind == 'elementwise' else 'forward_rows'}"
        member = (f"  // the loops of kernels/{spec.name}.h\n  struct Forward {{\n"
                  f"    template <class In, class Out, class A>\n"
                  f"    void operator()(const In& in, const Out& out, {extent_params}, {a}) const {{\n"
                  f"      {call}({', '.join(pointers + extent + values)});\n    }}\n  }};\n")
        include = row_loops(spec) if generated(spec, "cpu") else f'#include "{spec.name}.h"'
    else:
        member = (f"  // the launcher of its math (kernels/{spec.name}*)\n  struct Launch {{\n"
                  f"    template <class In, class Out, class A>\n"
                  f"    cudaError_t operator()(const In& in, const Out& out, {extent_params}, {a}, "
                  "myops_cuda::DType dtype,\n                           cudaStream_t stream) const {\n"
                  f"      return {spec.name}::cuda::forward({', '.join(pointers + extent + values + ['dtype', 'stream'])});\n"
                  "    }\n  };\n")
        include = launcher_declarations(spec) if generated(spec, "cuda") else f'#include "{spec.name}_cuda.h"'
    kernel = "ElementwiseKernel" if spec.kind == "elementwise" else "RowwiseKernel"
    types = PLUGIN_TYPES[provider]
    ops = [f"  static const DeclaredOp<Decl, {kernel}{', ' + _ORT_TYPES[t] if provider == 'cuda' else ''}> op_{t};"
           for t in types]
    return (HEADER.format(name=spec.name) +
            f"// myops::{spec.onnx_type} ({spec.kind}) on {_PROVIDERS[provider]}: {', '.join(types)}.\n"
            f'#include "{provider}/declared_ops.h"\n{include}\n\n'
            f"namespace myops {{\nnamespace {provider} {{\nnamespace {{\n\n"
            "struct Decl {\n"
            f'  static constexpr const char* kName = "{spec.onnx_type}";\n'
            f"  static constexpr size_t kInputs = {inputs};\n"
            f"  static constexpr size_t kFullInputs = {spec.full_inputs};\n"
            f"  static constexpr size_t kOutputs = {outputs};\n"
            f"  static constexpr std::array<const char*, {inputs}> kInputNames{_braced(_names(spec.inputs))};\n"
            f"  static constexpr std::array<const char*, {attributes}> kAttributeNames{_braced(_names(spec.attributes))};\n"
            f"  static constexpr std::array<float, {attributes}> kAttributeDefaults"
            f"{_braced(_list(_float(v) for v in spec.attributes.values()))};\n"
            f"{member}}};\n\n"
            f'MYOPS_BUILD_INFO(kOpInfo, "myops-op: domain=" MYOPS_DOMAIN " op={spec.onnx_type} since=1 '
            f'provider={_PROVIDERS[provider]} types={",".join(types)}");\n\n'
            "void Register(Ort::CustomOpDomain& domain) {\n" + "\n".join(ops) + "\n" +
            "".join(f"  domain.Add(&op_{t});\n" for t in types) + "}\n\n"
            f"MYOPS_REGISTER_OP(k{provider.capitalize()}, Register);\n\n"
            f"}}  // namespace\n}}  // namespace {provider}\n}}  // namespace myops\n")


def write_plugin_sources(folder: Path) -> dict[str, list[Path]]:
    """Each declared op's CPU and CUDA kernel registrations over the generic kernels
    (ort_plugin/src/{cpu,cuda}/declared_ops.h), written into folder/cpu and folder/cuda (files of ops that
    are gone are removed); returns {"cpu": [...], "cuda": [...]}. The plugin's CMake build calls it
    (python -m opspec.codegen plugin FOLDER)."""
    written = {}
    for provider in ("cpu", "cuda"):
        files = [_write(folder / provider / f"{PREFIX}{spec.name}_op.cc", _plugin_source(spec, provider))
                 for spec in plugin_ops()]
        if provider == "cuda":  # the launchers of ops whose math is one element's functions (nvcc compiles them)
            files += [_write(folder / provider / f"{PREFIX}{spec.name}_launch.cu", launchers(spec))
                      for spec in plugin_ops() if generated(spec, "cuda")]
        stale = set((folder / provider).glob("*.cc")) | set((folder / provider).glob("*.cu"))
        for path in stale - set(files):  # the folder holds generated files only
            path.unlink(missing_ok=True)
        written[provider] = files
    return written
