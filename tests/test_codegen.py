"""The generic adapters for what the lab's own ops do not exercise: an elementwise op of two inputs and
two outputs with an attribute, a rowwise op of two weights and two outputs with its own row loops, and a
rowwise op of two weights whose row loops are generated from its per-element functions. Their declarations and
math live here; opspec.codegen writes their few lines, and the extension's generic CPU adapters
(ops/csrc/adapters.h) run them in a fresh process against torch's own arithmetic, the plugin's
(ort_plugin/src/cpu/declared_ops.h) in onnxruntime against numpy: for the plugin, adding the two
files of each op (its declaration and its math) to a copy of the tree is all it takes."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opspec import OpSpec
from opspec.codegen import schemas, write_torch_sources

REPO = Path(__file__).resolve().parent.parent

GATED = OpSpec("gated_mix", "GatedMix", ("X", "gate"), {"alpha": 0.5}, kind="elementwise", full_inputs=2,
               outputs=("Y", "Z"))
SCALES = OpSpec("two_scales", "TwoScales", ("X", "w", "b"), {"epsilon": 0.25}, kind="rowwise",
                torch_attributes={"epsilon": "eps"}, outputs=("Y", "S"), own_kernels=("cpu", "cuda"))

SHIFT = OpSpec("shift_rows", "ShiftRows", ("X", "w", "b"), {"gain": 2.0}, kind="rowwise")

# y = alpha x g, z = x + g;  rowwise: y = x w + b, s = eps x (per row, w and b of the last axis);
# generated rows: y = (x - mean(x)) w + b gain
MATH = {
    # one element's functions: the CPU loops and CUDA launchers are generated around them
    "gated_mix.h": """
        #pragma once
        #include "op_math.h"
        namespace gated_mix {
        template <typename T>
        MYOPS_HD void forward(T x, T g, T alpha, T& y, T& z) { y = alpha * x * g; z = x + g; }
        template <typename T>
        MYOPS_HD void backward(T gy, T gz, T x, T g, T alpha, T& dx, T& dg) {
          dx = gy * alpha * g + gz;
          dg = gy * alpha * x + gz;
        }
        }  // namespace gated_mix
        """,
    "two_scales.h": """
        #pragma once
        #include <cstdint>
        namespace two_scales {
        template <typename T>
        inline void forward_rows(const T* x, const T* w, const T* b, T* y, T* s, int64_t rows, int64_t cols, T eps) {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
              y[r * cols + c] = x[r * cols + c] * w[c] + b[c];
              s[r * cols + c] = eps * x[r * cols + c];
            }
        }
        template <typename T>
        inline void backward_rows(const T* gy, const T* gs, const T* x, const T* w, const T* b, T* dx, T* dw, T* db,
                                  int64_t rows, int64_t cols, T eps) {
          (void)b;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
              const int64_t i = r * cols + c;
              dx[i] = gy[i] * w[c] + gs[i] * eps;
              dw[c] += gy[i] * x[i];
              db[c] += gy[i];
            }
        }
        }  // namespace two_scales
        """,
    # seven functions of one element and its row's sums: the generic row loops (kernels/rowwise_cpu.h,
    # rowwise_cuda.cuh) around them; Channel (c.w, c.b) and Attributes (at.gain) come from the declaration
    "shift_rows.h": """
        #pragma once
        #include <cstdint>
        #include "op_math.h"
        namespace shift_rows {
        template <typename T> struct Sums { T a = T(0); T b = T(0); };
        template <typename T> struct GradSums { T a = T(0); T b = T(0); };
        template <typename T> struct Row { T mean; };
        template <typename T>
        MYOPS_HD void accumulate(Sums<T>& s, T x, const Channel<T>&, const Attributes&) { s.a += x; }
        template <typename T>
        MYOPS_HD void merge(Sums<T>& s, const Sums<T>& o) { s.a += o.a; s.b += o.b; }
        template <typename T>
        MYOPS_HD Row<T> finish(const Sums<T>& s, int64_t cols, const Attributes&) { return {s.a / T(cols)}; }
        template <typename T>
        MYOPS_HD T forward(T x, const Row<T>& row, const Channel<T>& c, const Attributes& at) {
          return (x - row.mean) * c.w + c.b * T(at.gain);
        }
        inline constexpr bool kNormalize = false;
        template <typename T>
        MYOPS_HD Row<T> with_output_sum(Row<T> row, T) { return row; }
        template <typename T>
        MYOPS_HD void accumulate_grad(GradSums<T>& s, T grad, T, const Row<T>&, const Channel<T>& c, const Attributes&) {
          s.a += grad * c.w;
        }
        template <typename T>
        MYOPS_HD T backward(T grad, T, const Row<T>&, const GradSums<T>& gs, const Channel<T>& c, int64_t cols,
                            const Attributes&) {
          return grad * c.w - gs.a / T(cols);
        }
        template <typename T>
        MYOPS_HD Channel<T> weight_grads(T grad, T x, const Row<T>& row, const GradSums<T>&, const Channel<T>&,
                                         const Attributes& at) {
          return {grad * (x - row.mean), grad * T(at.gain)};
        }
        }  // namespace shift_rows
        """,
}

CHECKS = """
import sys, torch
from torch.utils import cpp_extension
folder, adapters, openmp = sys.argv[1], sys.argv[2], sys.argv[3:]
sources = [line for line in open(folder + "/sources.txt").read().split()]
library = cpp_extension.load(name="codegen_probe", sources=sources,
                             extra_include_paths=[folder, adapters, adapters + "/../../kernels"],
                             extra_cflags=openmp, extra_ldflags=openmp, build_directory=folder,
                             is_python_module=False, verbose=False)
torch.ops.load_library(library)
torch.set_num_threads(2)  # chunks on two threads: each must see its own part of every input
ops = torch.ops.myops
x, g = torch.randn(3, 70001, dtype=torch.float64), torch.randn(3, 70001, dtype=torch.float64)
y, z = ops.gated_mix(x, g)  # the default alpha, 0.5; several threads' chunks
torch.testing.assert_close(y, 0.5 * x * g, rtol=0, atol=0)
torch.testing.assert_close(z, x + g, rtol=0, atol=0)
gy, gz = torch.randn_like(x), torch.randn_like(x)
dx, dg = ops.gated_mix_backward(gy, gz, x, g, 2.0)
torch.testing.assert_close(dx, gy * 2.0 * g + gz, rtol=0, atol=0)
torch.testing.assert_close(dg, gy * 2.0 * x + gz, rtol=0, atol=0)
y, z = ops.gated_mix(x.float(), g.float())  # float32: the vectorised loop of this CPU's path
torch.testing.assert_close(y, 0.5 * x.float() * g.float(), rtol=0, atol=0)
torch.testing.assert_close(z, x.float() + g.float(), rtol=0, atol=0)
try:
    ops.gated_mix(x.float(), g[:, :5].float())
    raise SystemExit("a gate of another shape was taken")
except RuntimeError as error:
    assert "myops::gated_mix: gate must have x's shape" in str(error), error
x, w, b = torch.randn(300, 257), torch.randn(257), torch.randn(257)
y, s = ops.two_scales(x, w, b)  # the default eps, 0.25
torch.testing.assert_close(y, x * w + b)
torch.testing.assert_close(s, 0.25 * x)
gy, gs = torch.randn_like(x), torch.randn_like(x)
dx, dw, db = ops.two_scales_backward(gy, gs, x, w, b, 0.5)
torch.testing.assert_close(dx, gy * w + 0.5 * gs)
torch.testing.assert_close(dw, (gy * x).sum(0), rtol=1e-5, atol=1e-4)
torch.testing.assert_close(db, gy.sum(0), rtol=1e-5, atol=1e-4)
try:
    ops.two_scales(x, w, b[:3])
    raise SystemExit("a b of another length was taken")
except RuntimeError as error:
    assert "myops::two_scales: b must have shape [x.shape[-1]] = [257]" in str(error), error
def shifted(x, w, b, gain=2.0):
    return (x - x.mean(-1, keepdim=True)) * w + b * gain
for dtype in (torch.float32, torch.float64):  # the vector rows of this CPU's path, and the plain ones
    x = torch.randn(300, 257, dtype=dtype, requires_grad=True)  # a tail after 4 lanes of 64, rows over threads
    w, b = (torch.randn(257, dtype=dtype, requires_grad=True) for _ in range(2))
    y, want = ops.shift_rows(x, w, b, 3.0), shifted(x, w, b, 3.0)
    torch.testing.assert_close(y, want)
    gy = torch.randn_like(x)
    got = ops.shift_rows_backward(gy, x, w, b, 3.0)
    for g, e in zip(got, torch.autograd.grad(want, (x, w, b), gy)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-4)
print("ok")
"""


def test_schemas_of_several_inputs_outputs_and_weights():
    assert schemas(GATED) == ("gated_mix(Tensor x, Tensor gate, float alpha=0.5) -> (Tensor, Tensor)",
                              "gated_mix_backward(Tensor grad, Tensor grad_z, Tensor x, Tensor gate, float alpha) "
                              "-> (Tensor, Tensor)")
    assert schemas(SCALES)[1] == ("two_scales_backward(Tensor grad, Tensor grad_s, Tensor x, Tensor w, Tensor b, "
                                  "float eps) -> (Tensor, Tensor, Tensor)")


def test_names_the_adapters_use_are_refused():
    with pytest.raises(ValueError, match="distinct identifiers"):
        OpSpec("clash", "Clash", ("X", "out"), kind="elementwise", full_inputs=2)
    with pytest.raises(ValueError, match="not among its inputs"):
        OpSpec("clash", "Clash", ("X",), kind="elementwise", torch_inputs={"scale": "weight"})
    for default in ("fast", float("inf")):  # C++ gets a float literal
        with pytest.raises(ValueError, match="need a finite number"):
            OpSpec("clash", "Clash", ("X",), {"mode": default}, kind="elementwise")


def test_generic_cpu_adapters_run_several_inputs_outputs_and_weights(tmp_path):
    for name, text in MATH.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    written = write_torch_sources(tmp_path, tmp_path / "cuda", [GATED, SCALES, SHIFT])
    (tmp_path / "sources.txt").write_text("\n".join(map(str, written["cpp"])))
    from ops.build import _openmp_flags

    # as the extension is built: at::parallel_for splits work only in code compiled with OpenMP
    result = subprocess.run([sys.executable, "-c", CHECKS, str(tmp_path), str(REPO / "ops" / "csrc"), *_openmp_flags()],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (result.stdout + result.stderr)[-4000:]


DECLARATIONS = {
    "gated_mix.py": 'from . import OpSpec\nSPEC = OpSpec("gated_mix", "GatedMix", ("X", "gate"), {"alpha": 0.5}, '
                    'kind="elementwise", full_inputs=2, outputs=("Y", "Z"))\n',
    "two_scales.py": 'from . import OpSpec\nSPEC = OpSpec("two_scales", "TwoScales", ("X", "w", "b"), {"epsilon": 0.25}, '
                     'kind="rowwise", torch_attributes={"epsilon": "eps"}, outputs=("Y", "S"), '
                     'own_kernels=("cpu", "cuda"))\n',
    "shift_rows.py": 'from . import OpSpec\nSPEC = OpSpec("shift_rows", "ShiftRows", ("X", "w", "b"), {"gain": 2.0}, '
                     'kind="rowwise")\n',
}


def _graph(op_type: str, inputs: list[str], shapes: dict, outputs: list[str], **attributes) -> bytes:
    from onnx import TensorProto, helper

    node = helper.make_node(op_type, inputs, outputs, domain="myops", **attributes)
    graph = helper.make_graph([node], op_type, [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n])
                                                for n in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("myops", 1)])
    model.ir_version = 8
    return model.SerializeToString()


def test_plugin_builds_and_runs_ops_that_are_a_declaration_and_a_math_header(tmp_path):
    import shutil

    import numpy as np

    from lab.ort_headers import resolve
    from ort_plugin.loader import make_session

    tree = tmp_path / "tree"
    for folder in ("ort_plugin", "kernels", "opspec"):
        shutil.copytree(REPO / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in DECLARATIONS.items():  # the two files of each op, nothing else
        (tree / "opspec" / name).write_text(text)
    for name, text in MATH.items():
        (tree / "kernels" / name).write_text(textwrap.dedent(text))
    include = resolve(log=lambda m: None).include_dir
    for command in (["cmake", "-S", str(tree / "ort_plugin"), "-B", str(tree / "build"), f"-DORT_INCLUDE_DIR={include}",
                     "-DMYOPS_CUDA=OFF", f"-DPython3_EXECUTABLE={sys.executable}"],
                    ["cmake", "--build", str(tree / "build"), "-j", "2"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    library = tree / "build" / "libmyops_ort.so"
    rng = np.random.default_rng(0)

    x, g = rng.standard_normal((3, 70001), dtype=np.float32), rng.standard_normal((3, 70001), dtype=np.float32)
    session = make_session(_graph("GatedMix", ["x", "gate"], {"x": ["n", "c"], "gate": ["n", "c"]}, ["y", "z"], alpha=2.0),
                           library=library)
    y, z = session.run(None, {"x": x, "gate": g})  # several chunks on ORT's pool
    np.testing.assert_array_equal(y, 2.0 * x * g)
    np.testing.assert_array_equal(z, x + g)
    with pytest.raises(Exception, match="input 1 must have X's shape"):
        session.run(None, {"x": x, "gate": g[:, :5]})

    x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in ((300, 257), (257,), (257,)))
    session = make_session(_graph("TwoScales", ["x", "w", "b"], {"x": ["n", "c"], "w": ["c"], "b": ["c"]}, ["y", "s"]),
                           library=library)
    y, s = session.run(None, {"x": x, "w": w, "b": b})  # the default epsilon, 0.25
    np.testing.assert_allclose(y, x * w + b, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(s, np.float32(0.25) * x)
    with pytest.raises(Exception, match=r"b must have shape \[X.shape\[-1\]\] = \[257\]"):
        session.run(None, {"x": x, "w": w, "b": b[:3]})
    session = make_session(_graph("ShiftRows", ["x", "w", "b"], {"x": ["n", "c"], "w": ["c"], "b": ["c"]}, ["y"],
                                  gain=3.0), library=library)
    (y,) = session.run(None, {"x": x, "w": w, "b": b})  # the generated row loops, rows over ORT's pool
    np.testing.assert_allclose(y, (x - x.mean(-1, keepdims=True)) * w + b * np.float32(3.0), rtol=1e-5, atol=1e-5)
    from ort_plugin.library_info import read_library

    registered = {(o.op, o.provider, o.types) for o in read_library(library).ops}
    assert {("GatedMix", "CPUExecutionProvider", ("float32",)), ("TwoScales", "CPUExecutionProvider", ("float32",)),
            ("ShiftRows", "CPUExecutionProvider", ("float32",))} <= registered, registered

    # A declaration that changes or goes: the next build writes the registrations again (CMake re-runs the
    # writing), so the plugin never keeps a default or an op the catalogue no longer has.
    (tree / "opspec" / "gated_mix.py").write_text(DECLARATIONS["gated_mix.py"].replace('"alpha": 0.5', '"alpha": 3.0'))
    (tree / "opspec" / "two_scales.py").unlink()
    (tree / "opspec" / "shift_rows.py").unlink()
    done = subprocess.run(["cmake", "--build", str(tree / "build"), "-j", "2"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rebuilt = shutil.copy(library, tmp_path / "rebuilt.so")  # another path: the loaded one stays as it was
    assert {o.op for o in read_library(rebuilt).ops} == {"GatedMix", "Swish", "RMSNorm", "Copy"}
    session = make_session(_graph("GatedMix", ["x", "gate"], {"x": ["n", "c"], "gate": ["n", "c"]}, ["y", "z"]),
                           library=rebuilt)
    a = np.ascontiguousarray(x[:, :8])
    y, _ = session.run(None, {"x": a, "gate": a})  # no alpha on the node: the new default
    np.testing.assert_array_equal(y, np.float32(3.0) * a * a)


def test_each_device_s_loops_are_the_op_s_own_or_generated_from_its_functions(tmp_path):
    """own_kernels per device: an op writing its own CPU loops (forward_span) still gets its CUDA
    launchers from forward/backward, and the other way round; the plugin's launcher file comes with them."""
    from opspec import codegen

    cpu_own = OpSpec("cpu_own", "CpuOwn", ("X",), {"alpha": 1.5}, kind="elementwise", own_kernels=("cpu",))
    cuda_own = OpSpec("cuda_own", "CudaOwn", ("X",), kind="elementwise", own_kernels=("cuda",))
    torch_cpu, torch_cuda = codegen._Op(cpu_own).cpu(), codegen._Op(cpu_own).cuda()
    assert "cpu_own::forward_span(in[0], out[0], n, a[0])" in torch_cpu and "elementwise_cpu::map" not in torch_cpu
    assert "myops_cuda::dispatch_many(dtype, myops_declared_cpu_own::Forward<float>{a0}" in torch_cuda
    assert '#include "cpu_own_cuda.h"' not in torch_cuda
    torch_cpu, torch_cuda = codegen._Op(cuda_own).cpu(), codegen._Op(cuda_own).cuda()
    assert "elementwise_cpu::map<1, 1>(myops_declared_cuda_own::Forward{}, in, out, n)" in torch_cpu
    assert '#include "cuda_own_cuda.h"' in torch_cuda and "dispatch_many" not in torch_cuda
    plugin = codegen._plugin_source(cpu_own, "cuda")
    assert "cudaError_t forward(const void* in0, void* out0, int64_t n, float a0" in plugin  # declared, made elsewhere
    with pytest.raises(ValueError, match="own_kernels=.*names \\['tpu'\\]"):
        OpSpec("odd", "Odd", ("X",), kind="elementwise", own_kernels=("tpu",))


def test_the_launchers_of_an_op_with_inputs_outputs_and_an_attribute_compile(tmp_path, in_ci):
    """launchers() for GATED (two inputs, two outputs, alpha), compiled by nvcc for one architecture: the
    functors' attribute members, the pointer arrays and dispatch_many's deduction; and SHIFT's, the generic
    row kernels (kernels/rowwise_cuda.cuh) around its per-element functions."""
    import shutil

    from opspec.codegen import launchers

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if in_ci:
            pytest.fail("nvcc is expected on CI machines of this kind")
        pytest.skip("nvcc not installed")
    (tmp_path / "gated_mix.h").write_text(textwrap.dedent(MATH["gated_mix.h"]))
    (tmp_path / "launch.cu").write_text(launchers(GATED))
    built = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", f"-I{REPO / 'kernels'}", f"-I{tmp_path}", "-c",
                            str(tmp_path / "launch.cu"), "-o", str(tmp_path / "launch.o")],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    symbols = subprocess.run(["nm", "-C", str(tmp_path / "launch.o")], capture_output=True, text=True, check=True).stdout
    assert "gated_mix::cuda::forward(void const*, void const*, void*, void*, long, float, myops_cuda::DType" in symbols
    assert "gated_mix::cuda::backward(void const*, void const*, void const*, void const*, void*, void*, long, float" \
        in symbols
    (tmp_path / "shift_rows.h").write_text(textwrap.dedent(MATH["shift_rows.h"]))
    (tmp_path / "rows.cu").write_text(launchers(SHIFT))
    built = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", f"-I{REPO / 'kernels'}", f"-I{tmp_path}", "-c",
                            str(tmp_path / "rows.cu"), "-o", str(tmp_path / "rows.o")],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    symbols = subprocess.run(["nm", "-C", str(tmp_path / "rows.o")], capture_output=True, text=True, check=True).stdout
    assert "shift_rows::cuda::forward(void const*, void const*, void const*, void*, long, long, float" in symbols
    assert "shift_rows::cuda::backward_workspace_floats(long, long)" in symbols


def test_a_declared_16bit_forward_serves_16bit_storage_only(tmp_path, in_ci):
    """forward_16bit=True (Swish's): the generated launchers call the math's forward_16bit for float16 and
    bfloat16 storage and forward for float32, read off nvcc's PTX (the approximate division in the 16-bit
    kernels only); an op whose launchers are not generated from element functions cannot declare it."""
    import re
    import shutil

    from opspec import OPS
    from opspec.codegen import launchers

    with pytest.raises(ValueError, match="forward_16bit is read by the CUDA launchers"):
        OpSpec("own16", "Own16", ("X",), kind="elementwise", own_kernels=("cuda",), forward_16bit=True)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if in_ci:
            pytest.fail("nvcc is expected on CI machines of this kind")
        pytest.skip("nvcc not installed")
    (tmp_path / "launch.cu").write_text(launchers(OPS["swish"]))
    built = subprocess.run([nvcc, "-std=c++17", "-O3", "-ptx", "-arch=compute_90", f"-I{REPO / 'kernels'}",
                            str(tmp_path / "launch.cu"), "-o", str(tmp_path / "launch.ptx")],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    kernels = {}
    for body in re.split(r"// \.globl\s+", (tmp_path / "launch.ptx").read_text())[1:]:
        name = body.split()[0]
        storage = "half" if "6__half" in name else "bfloat16" if "nv_bfloat16" in name else "float"
        kernels[(storage, "Forward16" if "Forward16" in name else "Forward" if "Forward" in name else "Backward")] = body
    assert sorted(kernels) == [("bfloat16", "Backward"), ("bfloat16", "Forward16"), ("float", "Backward"),
                               ("float", "Forward"), ("half", "Backward"), ("half", "Forward16")]
    assert "div.approx" in kernels[("half", "Forward16")] and "div.approx" in kernels[("bfloat16", "Forward16")]
    assert "div.rn" in kernels[("float", "Forward")] and "div.approx" not in kernels[("float", "Forward")]


def test_a_cuda_file_and_the_declaration_that_disagree_are_named(tmp_path):
    """kernels/<op>_cuda.cu beside generated launchers would link twice; own launchers declared without the
    file cannot build: each is one message saying what to do, and the lab's own catalogue has none."""
    from opspec.codegen import own_kernel_problems

    generated_cuda = OpSpec("gen_op", "GenOp", ("X",), kind="elementwise")
    own_cuda = OpSpec("own_op", "OwnOp", ("X",), kind="elementwise", own_kernels=("cuda",))
    assert own_kernel_problems(tmp_path, [generated_cuda, own_cuda]) == [
        'opspec/own_op.py declares own_kernels=(..., "cuda"), but kernels/own_op_cuda.cu is missing: write its '
        'launchers there, or drop "cuda" from own_kernels to have them written from kernels/own_op.h\'s functions.']
    (tmp_path / "gen_op_cuda.cu").write_text("// mine\n")
    (tmp_path / "own_op_cuda.cu").write_text("// mine\n")
    assert own_kernel_problems(tmp_path, [generated_cuda, own_cuda]) == [
        'kernels/gen_op_cuda.cu exists, but opspec/gen_op.py does not declare own_kernels=(..., "cuda"): its CUDA '
        "launchers are written from kernels/gen_op.h's functions. Remove the file, or declare its launchers your "
        "own."]
    assert own_kernel_problems(REPO / "kernels") == []


def test_the_generated_row_loops_vectorise(tmp_path):
    """kernels/rowwise_cpu.h's AVX-512 clone around SHIFT's functions, as the generated sources write it and
    compiled as the libraries are (-O3 -fPIC), runs on 16 lanes with every function inlined: the row sums and
    the outputs in zmm registers, and no call (the glue outside the math's options was called through the
    PLT once per element, and the LayerNorm example ran at 57x F.layer_norm)."""
    import platform
    import shutil

    from opspec.codegen import row_loops

    if shutil.which("g++") is None or shutil.which("objdump") is None:
        pytest.skip("no g++ or objdump here")
    if platform.machine() != "x86_64":
        pytest.skip(f"the AVX-512 clone is x86-64's; this is {platform.machine()}")
    (tmp_path / "shift_rows.h").write_text(textwrap.dedent(MATH["shift_rows.h"]))
    source = tmp_path / "rows.cc"
    source.write_text(row_loops(SHIFT) + "void run(const float* x, const float* w, const float* b, float* y, long rows, "
                      "long cols) {\n  shift_rows::forward_rows(x, w, b, y, rows, cols, 2.0f);\n}\n")
    built = subprocess.run(["g++", "-O3", "-fPIC", "-std=c++17", f"-I{REPO / 'kernels'}", f"-I{tmp_path}", "-c",
                            str(source), "-o", str(tmp_path / "rows.o")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(tmp_path / "rows.o")],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    clone = listing.split("forward_rows_avx512<", 1)[1].split("\n\n", 1)[0]
    vector = [line for line in clone.splitlines() if "zmm" in line and ("vadd" in line or "vsub" in line or "vfmadd" in line)]
    assert len(vector) >= 4, clone[-4000:]
    assert not [line for line in clone.splitlines() if "call" in line], clone[-4000:]
