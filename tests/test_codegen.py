"""The generic adapters for what the lab's own ops do not exercise: an elementwise op of two inputs and
two outputs with an attribute, and a rowwise op of two weights and two outputs. Their declarations and
math live here; opspec.codegen writes their few lines, and the extension's generic CPU adapters
(ops/csrc/adapters.h) run them in a fresh process, against torch's own arithmetic."""
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
                torch_attributes={"epsilon": "eps"}, outputs=("Y", "S"))

# y = alpha x g, z = x + g;  rowwise: y = x w + b, s = eps x (per row, w and b of the last axis)
MATH = {
    "gated_mix.h": """
        #pragma once
        #include <cstdint>
        namespace gated_mix {
        template <typename T>
        inline void forward_span(const T* x, const T* g, T* y, T* z, int64_t n, T alpha) {
          for (int64_t i = 0; i < n; ++i) { y[i] = alpha * x[i] * g[i]; z[i] = x[i] + g[i]; }
        }
        template <typename T>
        inline void backward_span(const T* gy, const T* gz, const T* x, const T* g, T* dx, T* dg, int64_t n, T alpha) {
          for (int64_t i = 0; i < n; ++i) { dx[i] = gy[i] * alpha * g[i] + gz[i]; dg[i] = gy[i] * alpha * x[i] + gz[i]; }
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
}

CHECKS = """
import sys, torch
from torch.utils import cpp_extension
folder, adapters, openmp = sys.argv[1], sys.argv[2], sys.argv[3:]
sources = [line for line in open(folder + "/sources.txt").read().split()]
library = cpp_extension.load(name="codegen_probe", sources=sources, extra_include_paths=[folder, adapters],
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
    with pytest.raises(ValueError, match="need a number"):
        OpSpec("clash", "Clash", ("X",), {"mode": "fast"}, kind="elementwise")


def test_generic_cpu_adapters_run_several_inputs_outputs_and_weights(tmp_path):
    for name, text in MATH.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    written = write_torch_sources(tmp_path, tmp_path / "cuda", [GATED, SCALES])
    (tmp_path / "sources.txt").write_text("\n".join(map(str, written["cpp"])))
    from ops.build import _openmp_flags

    # as the extension is built: at::parallel_for splits work only in code compiled with OpenMP
    result = subprocess.run([sys.executable, "-c", CHECKS, str(tmp_path), str(REPO / "ops" / "csrc"), *_openmp_flags()],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (result.stdout + result.stderr)[-4000:]
