"""The ORT plugin on its own: what it exports and links, hand-made graphs, the loader's errors."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ort_plugin import PluginError, make_session, register

EDGE_VALUES = np.array([0.0, -0.0, 1e-8, -1e-8, 1e-40, -1e-40, 20.0, -20.0, 88.0, -88.0, 1e4, -1e4,
                        np.inf, -np.inf, np.nan], dtype=np.float32)


def swish_graph(*, beta=None, opset=18, domain="myops", op_type="Swish", with_neighbours=False,
                hidden=4) -> onnx.ModelProto:
    """x[batch, seq, hidden] -> (Add 1) -> myops::Swish -> (Mul 2) -> y, outputs left without shapes."""
    attrs = {} if beta is None else {"beta": beta}
    nodes, name_in, name_out = [], "x", "y"
    inits = []
    if with_neighbours:
        inits = [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]), helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])]
        nodes.append(helper.make_node("Add", ["x", "one"], ["x1"]))
        name_in, name_out = "x1", "s"
    nodes.append(helper.make_node(op_type, [name_in], [name_out], domain=domain, **attrs))
    if with_neighbours:
        nodes.append(helper.make_node("Mul", ["s", "two"], ["y"]))
    graph = helper.make_graph(
        nodes, "swish_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(domain, 1)])
    model.ir_version = 9
    return model


def numpy_swish(x: np.ndarray, beta: float) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return (x.astype(np.float64) / (1.0 + np.exp(-beta * x.astype(np.float64)))).astype(np.float32)


def test_exports_only_the_entry_point(plugin_path):
    out = subprocess.run(["nm", "-D", "--defined-only", str(plugin_path)], capture_output=True, text=True, check=True).stdout
    symbols = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert symbols == ["RegisterCustomOps"], symbols


def test_links_no_torch(plugin_path):
    out = subprocess.run(["readelf", "-d", str(plugin_path)], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    assert needed, out
    assert not [lib for lib in needed if any(bad in lib for bad in ("torch", "c10", "onnxruntime", "cudart"))], needed


def test_build_info_records_headers_and_compiler(plugin_path):
    import json

    info = json.loads((plugin_path.parent / "build_info.json").read_text())
    assert info["ort_api_version"] == 21 and info["ort_headers_version"] == "1.21.0"
    assert info["compiler"] and info["library_sha256"]
    assert ort.__version__ >= "1.21", "the plugin is built for C API 21"


@pytest.mark.parametrize("beta", [None, 1.0, 1.702, 0.5, -0.3])
def test_hand_made_graph_with_neighbours(plugin_path, beta):
    session = make_session(swish_graph(beta=beta, with_neighbours=True).SerializeToString(), library=plugin_path)
    x = np.random.default_rng(0).normal(scale=4, size=(3, 70001 // 7, 4)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    expected = 2.0 * numpy_swish(x + 1.0, 1.0 if beta is None else beta)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_large_input_on_the_thread_pool(plugin_path, threads):
    session = make_session(swish_graph(beta=1.702, hidden=768).SerializeToString(), library=plugin_path, threads=threads)
    x = np.random.default_rng(1).normal(scale=6, size=(8, 512, 768)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, numpy_swish(x, 1.702), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(0, 5, 4), (1, 1, 4), (2, 3, 4)])
def test_empty_and_tiny(plugin_path, shape):
    session = make_session(swish_graph().SerializeToString(), library=plugin_path)
    x = np.linspace(-3, 3, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    (y,) = session.run(None, {"x": x})
    assert y.shape == shape
    np.testing.assert_allclose(y, numpy_swish(x, 1.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beta", [1.0, 1.702, -0.3])
def test_edge_values_bitwise_equal_to_the_extension(plugin_path, ext, beta):
    import torch

    session = make_session(swish_graph(beta=beta).SerializeToString(), library=plugin_path)
    x = EDGE_VALUES.reshape(1, -1, 1).repeat(4, axis=2)
    (y,) = session.run(None, {"x": x})
    expected = ext.swish(torch.from_numpy(x), beta).numpy()
    # One home for the math: the same header gives the same bits in both layers.
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("with_neighbours", [False, True])
def test_output_shape_is_inferred(plugin_path, with_neighbours):
    # The graph declares y without a shape: what the session reports is what ORT inferred through
    # myops::Swish (and, with neighbours, through the Mul after it).
    model = swish_graph(with_neighbours=with_neighbours)
    model.graph.output[0].ClearField("type")
    session = make_session(model.SerializeToString(), library=plugin_path)
    assert session.get_outputs()[0].shape == ["batch", "seq", 4]
    assert session.get_outputs()[0].type == "tensor(float)"


def test_beta_of_the_wrong_type_is_named(plugin_path):
    model = swish_graph()
    model.graph.node[0].attribute.append(helper.make_attribute("beta", 2))
    with pytest.raises(Exception, match="beta"):
        make_session(model.SerializeToString(), library=plugin_path)


def test_loader_missing_file(tmp_path):
    with pytest.raises(PluginError, match="does not exist"):
        register(ort.SessionOptions(), tmp_path / "nope.so")


def test_loader_not_a_shared_library(tmp_path):
    fake = tmp_path / "libfake.so"
    fake.write_text("not a library\n")
    with pytest.raises(PluginError, match="not a shared library"):
        register(ort.SessionOptions(), fake)


def test_loader_library_without_entry_point(tmp_path):
    source = tmp_path / "other.c"
    source.write_text("int answer(void) { return 42; }\n")
    library = tmp_path / "libother.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    with pytest.raises(PluginError, match="no RegisterCustomOps"):
        register(ort.SessionOptions(), library)


def test_headers_explicit_dir_must_hold_the_header(tmp_path):
    from lab.ort_headers import HeadersNotFound, resolve

    with pytest.raises(HeadersNotFound, match="onnxruntime_c_api.h"):
        resolve(tmp_path)


@pytest.mark.nvcc
def test_cuda_build_links_the_cuda_kernels(tmp_path, monkeypatch, in_ci):
    if shutil.which("nvcc") is None:
        if in_ci:
            pytest.fail("nvcc is expected on CI machines of this kind")
        pytest.skip("nvcc not installed")
    from ort_plugin import build as plugin_build

    library = plugin_build.build(cuda="ON", log=lambda message: None)
    import json

    info = json.loads((library.parent / "build_info.json").read_text())
    assert info["with_cuda"] and info["cuda_architectures"] == "80-real;86-real;89-real;90"
    # What doctor reads from the file itself: the architectures and both providers' registrations.
    from ort_plugin.library_info import read_library

    described = read_library(library)
    assert described.cuda_archs == info["cuda_architectures"].split(";")
    assert {(o.provider, o.types) for o in described.ops} == {
        ("CPUExecutionProvider", ("float32",)), ("CUDAExecutionProvider", ("float32", "float16"))}
    # The CUDA-built plugin still serves CPU sessions on a machine without a GPU.
    session = make_session(swish_graph(beta=0.5).SerializeToString(), library=library)
    x = np.linspace(-5, 5, 24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], numpy_swish(x, 0.5), rtol=1e-5, atol=1e-6)


@pytest.mark.nvcc
def test_extension_cuda_source_compiles_with_nvcc(tmp_path, in_ci):
    """The extension's CUDA file compiles against this torch's headers (compile only: no GPU, no link).

    The shared kernels themselves are compiled for every architecture by the CUDA plugin build above.
    """
    if shutil.which("nvcc") is None:
        if in_ci:
            pytest.fail("nvcc is expected on CI machines of this kind")
        pytest.skip("nvcc not installed")
    from torch.utils.cpp_extension import include_paths

    # NOTE: CPU wheels of torch omit one header generated by its CUDA build; it only says that
    # c10_cuda is a shared library. Recreated here so the CPU wheel's headers can compile CUDA code.
    generated = tmp_path / "generated" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    generated.parent.mkdir(parents=True)
    generated.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    repo = Path(__file__).resolve().parent.parent
    includes = [f"-I{tmp_path / 'generated'}", *[f"-I{p}" for p in include_paths()], f"-I{repo / 'kernels'}",
                f"-I{repo / 'ops' / 'csrc' / 'cuda'}"]
    from opspec import codegen

    # Swish's: the generic elementwise adapter, as the build writes it from the declaration
    source = codegen.write_torch_sources(tmp_path / "ops", tmp_path / "ops" / "cuda")["cuda_ops"]
    source = next(path for path in source if path.name == "declared-swish_cuda.cu")
    result = subprocess.run(["nvcc", "-std=c++17", "-c", str(source), "-o", str(tmp_path / "swish_cuda.o"),
                             "-gencode=arch=compute_90,code=sm_90", *includes], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "swish_cuda.o").stat().st_size > 0


def test_input_of_unknown_rank_keeps_the_output_shape_open(plugin_path, capfd):
    # Zero dims from shape inference used to declare Y a scalar: ORT then warned on every run.
    model = swish_graph()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    session = make_session(model.SerializeToString(), library=plugin_path)
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], numpy_swish(x, 1.0), rtol=1e-6, atol=1e-7)
    assert "VerifyOutputSizes" not in capfd.readouterr().err


def _at_page_offset(n: int, offset_bytes: int) -> np.ndarray:
    """A float32 view of n elements starting offset_bytes after a 4096-byte boundary."""
    raw = np.zeros(n * 4 + 2 * 4096, dtype=np.uint8)
    start = (-raw.ctypes.data) % 4096 + offset_bytes
    return raw[start:start + n * 4].view(np.float32)


# The CPU kernel picks its loop by where the output sits relative to the input modulo 4096 (a
# load-ahead loop against 4K aliasing, kernels/swish.h); every loop must give the same bits.
@pytest.mark.parametrize("x_offset, y_offset", [(16, 64), (64, 16), (0, 272), (0, 300), (16, 4016)])
@pytest.mark.parametrize("n", [1, 127, 128, 129, 1000, 4099, 40000])
def test_same_bits_wherever_the_output_sits(plugin_path, x_offset, y_offset, n):
    session = make_session(swish_graph(beta=1.3, hidden=n).SerializeToString(), library=plugin_path)
    x = _at_page_offset(n, x_offset)
    x[:] = np.random.default_rng(n).normal(scale=8.0, size=n).astype(np.float32)
    edges = EDGE_VALUES[: max(1, n // 2)]
    x[: len(edges)], x[n - len(edges):] = edges, edges

    def run_into(offset):
        y = _at_page_offset(n + 1, offset)
        y[n] = 7.0  # the element after the output must stay untouched
        binding = session.io_binding()
        binding.bind_cpu_input("x", x.reshape(1, 1, n))
        binding.bind_output("y", "cpu", 0, np.float32, [1, 1, n], y.ctypes.data)
        session.run_with_iobinding(binding)
        assert y[n] == 7.0
        return y[:n]

    plain = run_into(x_offset)  # same offset as the input: the plain loop
    y = run_into(y_offset)
    assert y.tobytes() == plain.tobytes()
    np.testing.assert_allclose(y, numpy_swish(x, 1.3), rtol=1e-5, atol=1e-6)


def test_headers_offline_fail_in_seconds_with_the_fix(tmp_path, monkeypatch):
    """A host without a network: both sources refused at once (a closed port here), not after
    a download's and apt's timeouts; the message names the way out."""
    import time

    import lab.debian
    from lab import ort_headers as headers

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(lab.debian, "mirror", lambda: "http://127.0.0.1:9/debian")
    pin = headers.HeaderPin("9.99.0", "http://127.0.0.1:9/onnxruntime-9.99.0.tgz", "0" * 64,
                            "libonnxruntime-dev", "trixie", "9.99.0", "0" * 64)
    began = time.monotonic()
    with pytest.raises(headers.HeadersNotFound) as caught:
        headers.resolve(pin=pin, log=lambda m: None, timeout_s=20)
    assert time.monotonic() - began < 10
    text = str(caught.value)
    assert text.count("127.0.0.1:9 cannot be reached") == 2 and "ORT_INCLUDE_DIR" in text
    # A server that takes the connection and never answers: the whole resolve is bounded by the time given.
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setattr(lab.debian, "mirror", lambda: url + "/debian")
        began = time.monotonic()
        with pytest.raises(headers.HeadersNotFound) as caught:
            headers.resolve(pin=headers.HeaderPin("9.99.1", url + "/ort.tgz", "0" * 64, "libonnxruntime-dev", "trixie",
                                                  "9.99.1", "0" * 64), log=lambda m: None, timeout_s=3)
        assert time.monotonic() - began < 6
    assert "timed out" in str(caught.value) and "not tried, the 3 s allowed for fetching were spent" in str(caught.value)
