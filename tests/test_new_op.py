"""`nox -s new_op -- NAME` (lab.new_op): its refusals write nothing, and a scaffolded op, in a
temporary copy of the tree, builds (CPU, and CUDA where nvcc is) and passes its generated tests."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab import examples, new_op

REPO = Path(__file__).resolve().parent.parent
NAME = "fast_gelu"


def _tree_copy(dest: Path) -> Path:
    return examples.tree_copy(dest)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MYOPS_ORT_PLUGIN", "MYOPS_BUILD_DIR", "PYTHONPATH")}
    env["MYOPS_NO_CUDA"] = "1"  # as nox -s tests builds it: the CPU kernels of the extension
    return env


def _run(copy: Path, *args, timeout=1200, **env) -> subprocess.CompletedProcess:
    # no terminal: the scaffold would otherwise ask for --native under `pytest -s`
    return subprocess.run([sys.executable, *args], cwd=copy, env={**_env(), **examples.compiler_cache_env(copy), **env},
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name,message", [
    ("FastGelu", "snake_case"), ("2x", "snake_case"), ("class", "snake_case"), ("x__y", "snake_case"),
    ("swish", "exists already"), ("gelu_backward", "_backward"), ("tanh", "C\\+\\+ keyword"), ("cuda", "namespace"),
    ("int", "C\\+\\+ keyword"), ("ffn", "workload or model"), ("swish_large", "workload or model"),
])
def test_bad_names_are_refused_and_write_nothing(tmp_path, name, message):
    (tmp_path / "opspec").mkdir()
    (tmp_path / "opspec" / "swish.py").write_text('SPEC = OpSpec(\n    "swish", "Swish", ("X",), workloads=(\n'
                                                  '    WorkloadSpec("swish_large", "t", model="swish"),\n'
                                                  '    WorkloadSpec("ffn", "t", model="ffn")))\n')
    with pytest.raises(new_op.ScaffoldError, match=message):
        new_op.scaffold(name, repo=tmp_path, log=lambda line: None)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["opspec", "swish.py"]


@pytest.mark.parametrize("expression,message", [
    ("np.tanh(x)", "it names np"), ("F.gelu(y)", "it names y"), ("F.gelu(", "not a Python expression"),
    ("__import__('os').system('x')", "it names __import__"), ("torch.ones(3)", "function of x"),
    ("(lambda x: x)(x)", "holds Lambda"), ("(yield x)", "holds Yield"), ("await F.gelu(x)", "holds Await"),
    ("(x := F.gelu(x))", "holds NamedExpr"),
])
def test_a_native_expression_that_is_not_a_function_of_x_is_refused(tmp_path, expression, message):
    (tmp_path / "opspec").mkdir()
    with pytest.raises(new_op.ScaffoldError, match=message):
        new_op.scaffold(NAME, repo=tmp_path, log=lambda line: None, native=expression)
    assert [p.name for p in tmp_path.rglob("*")] == ["opspec"]


@pytest.mark.parametrize("text,expected", [
    ("1", ("x",)), ("3", ("x", "x2", "x3")), ("x,gate", ("x", "gate")), ("x,gate,up", ("x", "gate", "up")),
])
def test_inputs_by_count_or_by_name(text, expected):
    assert new_op.parse_inputs(text) == expected


@pytest.mark.parametrize("text,message", [
    ("0", "1 to 8 inputs"), ("9", "1 to 8 inputs"), ("x,Gate", "snake_case"), ("x,gate,gate", "given twice"),
    ("x,grad", "name the generated code uses"), ("x,gate,dgate", "name two things"), ("x,out", "generated code uses"),
    ("gate,up", "the first input is always x.*--inputs x,gate,up"), ("x,x", "x is given twice"),
    ("x,forward", "generated code uses"), ("x,int64_t", "generated code uses"), ("x,tuple", "generated code uses"),
    ("x,static_cast", "generated code uses"),
])
def test_bad_inputs_are_refused(tmp_path, text, message):
    with pytest.raises(new_op.ScaffoldError, match=message):
        new_op.parse_inputs(text)


def test_inputs_belong_to_the_elementwise_kind(capsys):
    assert new_op.main(["gated", "--kind", "rowwise", "--inputs", "2"]) == 2
    assert "--inputs describes an elementwise op" in capsys.readouterr().err


@pytest.mark.parametrize("text,expected", [("1", ("y",)), ("3", ("y", "y2", "y3")), ("y,total", ("y", "total"))])
def test_outputs_by_count_or_by_name(text, expected):
    assert new_op.parse_outputs(text) == expected


@pytest.mark.parametrize("text,message", [
    ("0", "1 to 8 outputs"), ("9", "1 to 8 outputs"), ("total", "the first output is always y.*--outputs y,total"),
    ("y,y", "y is given twice"), ("y,Total", "snake_case"), ("y,out", "generated code uses"),
    ("y,x", "generated code uses"), ("y,sum", "generated code uses"), ("y,total,total", "given twice"),
])
def test_bad_outputs_are_refused(text, message):
    with pytest.raises(new_op.ScaffoldError, match=message):
        new_op.parse_outputs(text)


@pytest.mark.parametrize("inputs,outputs,clash", [
    (("x", "gate"), ("y", "gate"), "gate"),   # an output named as an input
    (("x", "gate"), ("y", "dgate"), "dgate"),  # an output named as an input's gradient
    (("x", "grad_total"), ("y", "total"), "grad_total"),  # an input named as an output's gradient
])
def test_outputs_whose_names_meet_the_inputs_generated_names_are_refused(tmp_path, inputs, outputs, clash):
    (tmp_path / "opspec").mkdir()
    with pytest.raises(new_op.ScaffoldError, match=f"name two things.*{clash}"):
        new_op.scaffold(NAME, repo=tmp_path, log=lambda line: None, inputs=inputs, outputs=outputs)
    assert [p.name for p in tmp_path.rglob("*")] == ["opspec"]


def test_outputs_belong_to_the_elementwise_kind(capsys):
    assert new_op.main(["normed", "--kind", "rowwise", "--outputs", "2"]) == 2
    assert "--outputs describes an elementwise op" in capsys.readouterr().err


def _declared(path: Path):
    """The OpSpec a scaffolded declaration makes (it imports from the opspec package it is written into)."""
    from opspec import OpSpec, WorkloadSpec

    text = path.read_text().replace("from . import OpSpec, WorkloadSpec\n", "")
    scope = {"OpSpec": OpSpec, "WorkloadSpec": WorkloadSpec}
    exec(compile(text, str(path), "exec"), scope)
    return scope["SPEC"]


def test_a_scaffold_of_several_outputs_declares_and_returns_each(tmp_path):
    """Two files, and each names every output: the declaration (and so the schemas and the form), the math's
    forward and backward."""
    from opspec.codegen import schemas

    (tmp_path / "opspec").mkdir()
    written = new_op.scaffold(NAME, repo=tmp_path, log=lambda line: None, inputs=("x", "gate"), outputs=("y", "total"))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [f"kernels/{NAME}.h", f"opspec/{NAME}.py"]
    spec = _declared(tmp_path / "opspec" / f"{NAME}.py")
    assert spec.outputs == ("Y", "total") and spec.inputs == ("X", "gate") and spec.kind == "elementwise"
    assert schemas(spec) == (f"{NAME}(Tensor x, Tensor gate) -> (Tensor, Tensor)",
                             f"{NAME}_backward(Tensor grad, Tensor grad_total, Tensor x, Tensor gate) -> (Tensor, Tensor)")
    assert spec.formula == "x*gate, x*gate+x*gate"
    header = (tmp_path / "kernels" / f"{NAME}.h").read_text()
    assert "MYOPS_HD void forward(T x, T gate, T& y, T& total) {\n  y = x * gate;\n  total = y + y;\n}" in header
    assert "MYOPS_HD void backward(T grad, T grad_total, T x, T gate, T& dx, T& dgate) {" in header


def test_one_input_of_several_outputs_gathers_their_gradients(tmp_path):
    """The placeholder's further outputs each double the one before: y's gradient gathers theirs, 2 and 4
    times, in the math as in the declared form."""
    (tmp_path / "opspec").mkdir()
    new_op.scaffold(NAME, repo=tmp_path, log=lambda line: None, outputs=("y", "y2", "y3"))
    declaration = (tmp_path / "opspec" / f"{NAME}.py").read_text()
    assert "    y = op.Mul(x, x)\n    y2 = op.Add(y, y)\n    y3 = op.Add(y2, y2)\n    return y, y2, y3\n" in declaration
    header = (tmp_path / "kernels" / f"{NAME}.h").read_text()
    assert "grad = grad + T(2) * grad_y2;\n  grad = grad + T(4) * grad_y3;\n  dx = grad * x + grad * x;" in header
    assert _declared(tmp_path / "opspec" / f"{NAME}.py").outputs == ("Y", "y2", "y3")


def test_a_native_expression_becomes_the_op_s_native_row(tmp_path):
    (tmp_path / "opspec").mkdir()
    new_op.scaffold(NAME, repo=tmp_path, log=lambda line: None, native="torch.nn.functional.gelu(x, approximate=\"tanh\")")
    spec = _declared(tmp_path / "opspec" / f"{NAME}.py")
    assert spec.native == "torch.nn.functional.gelu(x, approximate='tanh')"
    assert spec.native_row == f"torch_native_{NAME}"


@pytest.mark.parametrize("options,message", [
    (["--weights", "scale"], "describe a row-wise op"), (["--attributes", "eps=1"], "describe a row-wise op"),
    (["--kind", "rowwise", "--weights", ""], "at least one per-channel weight"),
    (["--kind", "rowwise", "--weights", "scale,scale"], "given twice"),
    (["--kind", "rowwise", "--attributes", "weight=1e-5"], "given twice"),
    (["--kind", "rowwise", "--weights", "axes"], "name the generated code uses"),
    (["--kind", "rowwise", "--weights", "Scale"], "snake_case"),
    (["--kind", "rowwise", "--attributes", "epsilon"], "NAME=DEFAULT"),
    (["--kind", "rowwise", "--attributes", "epsilon=small"], "NAME=DEFAULT"),
    (["--kind", "rowwise", "--attributes", "epsilon=inf"], "finite"),
    (["--kind", "rowwise", "--attributes", "alpha=1,alpha=2"], "given twice"),
    (["--kind", "rowwise", "--weights", "x32"], "name the generated code uses"),
    (["--kind", "rowwise", "--attributes", "beta=1"], "name the generated code uses"),  # the bench sets every op's beta
    (["--kind", "rowwise", "--native", "F.layer_norm(x, x.shape[-1:], w)"], "it names w"),
])
def test_row_wise_options_that_cannot_be_scaffolded_are_refused(tmp_path, capsys, monkeypatch, options, message):
    (tmp_path / "opspec").mkdir()
    monkeypatch.setattr(new_op, "REPO", tmp_path)
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    assert new_op.main([NAME, *options]) == 2
    assert message in capsys.readouterr().err
    assert [p.name for p in tmp_path.rglob("*")] == ["opspec"]


def test_a_row_wise_scaffold_is_two_files_and_generates_one_signature_per_weight_and_attribute(tmp_path):
    """A row-wise op is its declaration and its math too; the schemas the builds write from the declaration
    take each weight and attribute, and the placeholder math uses every one of them."""
    from opspec.codegen import row_types, schemas

    (tmp_path / "opspec").mkdir()
    written = new_op.scaffold("my_norm", repo=tmp_path, log=lambda line: None, kind="rowwise", weights=("gamma", "shift"),
                              attributes={"epsilon": 1e-5, "alpha": 0.5}, native="F.layer_norm(x, x.shape[-1:], gamma, shift, epsilon)")
    texts = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in written}
    assert sorted(texts) == ["kernels/my_norm.h", "opspec/my_norm.py"]
    assert '"my_norm", "MyNorm", ("X", "gamma", "shift"), {"epsilon": 1e-05, "alpha": 0.5}' in texts["opspec/my_norm.py"]
    assert "native='F.layer_norm(x, x.shape[-1:], gamma, shift, epsilon)'," in texts["opspec/my_norm.py"]
    spec = _declared(tmp_path / "opspec" / "my_norm.py")
    assert schemas(spec) == ("my_norm(Tensor x, Tensor gamma, Tensor shift, float epsilon=1e-05, float alpha=0.5) -> Tensor",
                             "my_norm_backward(Tensor grad, Tensor x, Tensor gamma, Tensor shift, float epsilon, "
                             "float alpha) -> (Tensor, Tensor, Tensor)")
    assert "struct Attributes { float epsilon; float alpha; };" in row_types(spec)
    assert "struct Channel { T gamma; T shift; };" in row_types(spec)
    assert "return (x - row.mean) * c.gamma * c.shift + at.epsilon + at.alpha;" in texts["kernels/my_norm.h"]


def test_a_taken_onnx_type_or_an_existing_file_is_refused(tmp_path):
    (tmp_path / "opspec").mkdir()
    (tmp_path / "opspec" / "swish.py").write_text('SPEC = OpSpec("swish", "Swish", ("X",))\n')
    with pytest.raises(new_op.ScaffoldError, match="belongs to another op"):
        new_op.scaffold("my_swish", onnx_type="Swish", repo=tmp_path, log=lambda line: None)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "fast_gelu.h").write_text("// mine\n")
    with pytest.raises(new_op.ScaffoldError, match="kernels/fast_gelu.h"):
        new_op.scaffold(NAME, repo=tmp_path, log=lambda line: None)
    assert (tmp_path / "kernels" / "fast_gelu.h").read_text() == "// mine\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["fast_gelu.h", "kernels", "opspec", "swish.py"]


def test_the_scaffold_touches_only_new_files(tmp_path):
    copy = _tree_copy(tmp_path / "tree")
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    written = new_op.scaffold(NAME, repo=copy, log=lambda line: None)
    assert all(p not in before for p in written)
    assert all(p.read_bytes() == data for p, data in before.items())  # no existing file edited
    # an elementwise op is two files: its declaration and its math
    assert sorted(p.relative_to(copy).as_posix() for p in written) == [f"kernels/{NAME}.h", f"opspec/{NAME}.py"]


ROWWISE = ["--kind", "rowwise", "--weights", "weight,bias", "--attributes", "eps=1e-5"]  # as the issue spells it


# Elementwise with two inputs (a gated op) and two outputs: one input and one output is what the Mish
# example builds (test below).
GATED = ["--inputs", "x,gate", "--outputs", "y,total"]


@pytest.mark.parametrize("name,options,onnx_type", [(NAME, GATED, "FastGelu"), ("row_scale", ROWWISE, "RowScale")],
                         ids=["elementwise-2-inputs-2-outputs", "rowwise"])
def test_a_scaffolded_op_builds_and_passes_its_generated_tests(tmp_path, in_ci, name, options, onnx_type):
    """Each kind, as written: the extension and plugin build, its generated tests pass (an elementwise
    op's with two inputs and two outputs, a row-wise op's with two weights and an attribute), a quick bench measures it,
    the doctor finds it, its CUDA compiles."""
    NAME = name
    copy = _tree_copy(tmp_path / "tree")
    scaffolded = _run(copy, "-m", "lab.new_op", NAME, *options)
    assert scaffolded.returncode == 0, scaffolded.stderr
    # The registries pick it up with no other edit: export's models, the bench's workloads, the plugin.
    listed = _run(copy, "-c", "from ops.export import MODELS; from infer.workloads import WORKLOADS; "
                              "print(' '.join(MODELS), '|', ' '.join(WORKLOADS))")
    assert listed.returncode == 0 and NAME in listed.stdout.split("|")[0].split() and NAME in listed.stdout.split("|")[1], listed
    tests = ["tests/test_declared_ops.py", "-k", NAME]  # every declared op's tests, of either kind
    generated = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests)
    assert generated.returncode == 0, generated.stdout[-4000:] + generated.stderr[-2000:]
    assert " passed" in generated.stdout and "failed" not in generated.stdout, generated.stdout[-2000:]
    # A first bench of it: a quick run in the copy writes to its scratch folder, and results/ stays absent;
    # the op declares no targets yet, so there is no targets step.
    quick = _run(copy, "-m", "bench.run", "--workload", NAME, "--quick", "--opsets", "18")
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-2000:]
    assert "build/results" in quick.stdout and not (copy / "results").exists(), quick.stdout[-2000:]
    rows = (copy / "build" / "results" / "cpu" / "bench.csv").read_text()
    assert rows.count(f",{NAME},") >= 5 and "paired target ratios" not in quick.stdout
    # The inference side's doctor finds the op in the plugin and proves it by running it.
    built = _run(copy, "-c", "from ort_plugin.build import build; print(build(log=lambda m: None))")
    assert built.returncode == 0, built.stderr
    doctor = _run(copy, "-m", "ort_plugin.doctor", "--plugin", built.stdout.strip().splitlines()[-1])
    assert doctor.returncode == 0 and onnx_type in doctor.stdout, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    # The plugin holding the op still links only the C and C++ runtimes.
    from ort_plugin.library_info import read_library
    from tests.test_dist import SYSTEM_LIBRARIES
    needed = set(read_library(built.stdout.strip().splitlines()[-1]).needed)
    assert needed <= SYSTEM_LIBRARIES, needed

    if shutil.which("nvcc") is None:
        if in_ci:
            pytest.fail("nvcc is expected on CI machines of this kind")
        pytest.skip("nvcc not installed: the scaffold's CUDA files were not compiled")
    # Its CUDA files compile too: the plugin's CUDA build, and the extension's CUDA adapter and kernels.
    cuda_plugin = _run(copy, "-m", "ort_plugin.build", "--cuda", "ON", "--cuda-architectures", "90-real")
    assert cuda_plugin.returncode == 0, cuda_plugin.stdout[-3000:] + cuda_plugin.stderr[-3000:]
    cuda_extension = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_gpu_check.py::test_direct_build_cuda_objects_compile", MYOPS_CUDA_OBJECTS_OF=NAME)
    assert cuda_extension.returncode == 0 and " passed" in cuda_extension.stdout, cuda_extension.stdout[-4000:]


def test_the_registries_refuse_a_name_declared_twice():
    """What the scaffold's checks keep out, the registries refuse too: a model or workload of two ops."""
    from ops.declaration import TorchOp
    from ops.registry import OPS, _model_ops

    swish = OPS["swish"]
    clash = TorchOp(spec=OPS["rms_norm"].spec, function=swish.function, reference=swish.reference, reference_text="",
                    register_python_parts=lambda: None, extra_models={"ffn": swish.extra_models["ffn"]})
    with pytest.raises(ImportError, match="'ffn' is declared by opspec/swish.py and opspec/rms_norm.py"):
        _model_ops({"swish": swish, "rms_norm": clash})


def test_the_mish_example_applies_to_the_scaffold_and_passes_its_tests(tmp_path):
    """docs/examples/mish.patch (the edits of docs/your-op.md's worked example: its two files) still applies
    to what the scaffold writes, and the op it makes passes every declared op's tests, F.mish as its native
    row included."""
    copy = examples.prepare("mish", tmp_path / "tree", log=lambda line: None)
    generated = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *examples.example_tests("mish"))
    assert generated.returncode == 0, generated.stdout[-4000:] + generated.stderr[-2000:]
    assert "failed" not in generated.stdout and "declares no PyTorch function" not in generated.stdout


def test_the_layer_norm_example_applies_to_the_row_wise_scaffold_and_passes_its_tests(tmp_path):
    """docs/examples/layer_norm.patch (the row-wise worked example: LayerNorm with a bias) still applies to
    what `--kind rowwise --weights weight,bias --attributes epsilon=1e-5` writes, and the op passes its
    generated tests: F.layer_norm as its native row, and the fuse rule reading epsilon off the file."""
    copy = examples.prepare("layer_norm", tmp_path / "tree", log=lambda line: None)
    generated = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *examples.example_tests("layer_norm"))
    assert generated.returncode == 0, generated.stdout[-4000:] + generated.stderr[-2000:]
    assert "failed" not in generated.stdout and "declares no PyTorch function" not in generated.stdout


def test_the_bias_softmax_example_merges_row_sums_by_its_own_rule_and_passes_its_tests(tmp_path):
    """docs/examples/bias_softmax.patch (softmax(x + bias): a running maximum merged by the op's own
    merge(), the outputs divided by their row sum through kNormalize) applies to what `--kind rowwise
    --weights bias` writes, and the op
    passes its generated tests; then a bias of -inf masks columns out as torch's softmax does, on every
    CPU path, rows that overflow exp without the maximum stay finite, and a NaN reaches its whole row."""
    copy = examples.prepare("bias_softmax", tmp_path / "tree", log=lambda line: None)
    generated = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *examples.example_tests("bias_softmax"))
    assert generated.returncode == 0, generated.stdout[-4000:] + generated.stderr[-2000:]
    assert "failed" not in generated.stdout
    check = (
        "import sys, torch, ops\n"
        "from ops.registry import OPS\n"
        "ops.load()\n"
        "op = OPS['bias_softmax']\n"
        "g = torch.Generator().manual_seed(3)\n"
        "x = torch.randn(5, 300, generator=g) * 40 + 200\n"  # exp(x) alone overflows float32
        "bias = torch.randn(300, generator=g)\n"
        "bias[::7] = float('-inf')\n"
        "y = op.function(x, bias)\n"
        "want = torch.softmax(x.double() + bias.double(), -1).float()\n"
        "assert torch.isfinite(y).all() and (y[:, ::7] == 0).all(), y\n"
        # exp(z - max) down to about -250 here: row_math::exp's error grows with |z - max| (2^-23.6 each)
        "torch.testing.assert_close(y, want, rtol=5e-5, atol=1e-7)\n"
        # a NaN makes its whole row NaN, as torch's softmax, whichever lane or partial holds it
        "for cols in (3, 70, 300):\n"
        "    xn = torch.zeros(2, cols); xn[0, 1] = float('nan'); xn[1, cols - 1] = float('nan')\n"
        "    assert torch.isnan(op.function(xn, torch.zeros(cols))).all(), cols\n"
        "print('masked', sys.argv[1])\n")
    from bench.cpu_paths import runnable
    for path in runnable() or ["baseline"]:
        ran = subprocess.run([sys.executable, "-c", check, path], cwd=copy, capture_output=True, text=True, timeout=600,
                             stdin=subprocess.DEVNULL, env=dict(_env(), MYOPS_CPU_ISA=path))
        assert ran.returncode == 0 and f"masked {path}" in ran.stdout, ran.stdout[-2000:] + ran.stderr[-3000:]


def test_tree_copies_share_their_compiled_objects(tmp_path, in_ci):
    """What makes test_new_op's copies affordable: the same source compiled in two copies through
    lab.examples.compiler_cache_env is compiled once (the second is a ccache hit)."""
    if shutil.which("ccache") is None:
        if in_ci:
            pytest.fail("ccache is expected on CI machines (.ci/run installs it)")
        pytest.skip("ccache not installed: tree copies compile everything")
    for copy in (tmp_path / "a", tmp_path / "b"):
        copy.mkdir()
        (copy / "op.cc").write_text("int twice(int x) { return 2 * x; }\n")
        env = {**os.environ, **examples.compiler_cache_env(copy), "CCACHE_DIR": str(tmp_path / "cache")}
        subprocess.run(["c++", "-O2", "-c", str(copy / "op.cc"), "-o", str(copy / "op.o")], cwd=copy, env=env, check=True)
    stats = subprocess.run(["ccache", "--print-stats"], env=env, capture_output=True, text=True, check=True).stdout
    counts = dict(line.split("\t") for line in stats.splitlines() if "\t" in line)
    assert int(counts["direct_cache_hit"]) + int(counts["preprocessed_cache_hit"]) == 1, stats
    assert (tmp_path / "a" / "op.o").read_bytes() == (tmp_path / "b" / "op.o").read_bytes()
