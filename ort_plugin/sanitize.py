"""Run the ORT plugin under AddressSanitizer + UndefinedBehaviorSanitizer: `python -m ort_plugin.sanitize`.

    python -m ort_plugin.sanitize                 # build (cached), run the workload, report
    python -m ort_plugin.sanitize --timeout 300   # give the workload child longer

What it does:
  1. builds the sanitized CPU plugin (ort_plugin.build with sanitize=True, under build/ort_plugin/sanitize/);
  2. starts a child Python with gcc's libasan (and libubsan) in LD_PRELOAD: the sanitizer runtime must be
     in the process before anything else, and python itself is not built with it;
  3. the child drives every op of the plugin's generic kernels (the catalogue's ops of a kind, a user's
     included) through onnxruntime: many shapes (empty, scalar, odd, beyond one ParallelFor chunk; a
     row-wise op's widths around the vector and lane sizes), 1 to 4 intra-op threads, its attributes at
     several values, inf/nan, concurrent runs, session create/destroy cycles, and the error paths (an
     attribute of the wrong type, a double input, a weight of the wrong length), checking every output
     against its declared decomposed form evaluated in float64 by numpy (NaN where it has NaN);
  4. prints "sanitizers clean" and exits 0, or exits 1 with the sanitizer's report.

Any ASan or UBSan report ends the child at once with a non-zero status (halt_on_error, and the build's
-fno-sanitize-recover=undefined). Leak checking is off: CPython and onnxruntime keep memory until exit
by design, which LeakSanitizer would report as leaks that are not ours.

Needs gcc's sanitizer runtimes: on Debian they come with libgcc-<gcc major>-dev (gcc pulls it in).
nox -s sanitize runs this in the cpu entry's pinned virtualenv; tests/test_sanitizers.py runs it in CI.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHILD_FLAG = "--child"
DONE_MARK = "workload done:"
# Lines that open a sanitizer report; one on stderr fails the run whatever the exit status says.
REPORT_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "SUMMARY: AddressSanitizer",
                "SUMMARY: UndefinedBehaviorSanitizer")
SANITIZER_EXIT = 86  # what the runtimes exit with on a report, distinct from Python's own 1

ASAN_OPTIONS = {
    "halt_on_error": 1,
    # Exit with SANITIZER_EXIT instead of abort(): no core dump, and the parent can tell it apart.
    "abort_on_error": 0,
    "exitcode": SANITIZER_EXIT,
    "detect_leaks": 0,  # CPython and ORT keep memory until exit on purpose (see the docstring)
    "print_stacktrace": 1,
    "check_initialization_order": 1,
    "detect_stack_use_after_return": 1,
    "strict_init_order": 1,
    "symbolize": 1,
}
UBSAN_OPTIONS = {"halt_on_error": 1, "abort_on_error": 0, "exitcode": SANITIZER_EXIT, "print_stacktrace": 1,
                 "symbolize": 1}


class SanitizerError(RuntimeError):
    """The sanitized run could not be set up, or it found something; the message says which."""


# ---------------------------------------------------------------- parent: build, environment, report

def _options(values: dict) -> str:
    return ":".join(f"{key}={value}" for key, value in values.items())


def runtime_libraries(compiler: str = "gcc") -> list[Path]:
    """gcc's libasan and libubsan, in preload order (ASan first: it insists on being the first DSO)."""
    if shutil.which(compiler) is None:
        raise SanitizerError(f"{compiler} is not installed: the sanitizer runtimes come with gcc (apt-get install gcc)")
    major = subprocess.run([compiler, "-dumpversion"], capture_output=True, text=True).stdout.strip().split(".")[0]
    found = []
    for name in ("libasan.so", "libubsan.so"):
        answer = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        # gcc echoes the bare name back when it has no such file.
        path = Path(answer)
        if not path.is_absolute() or not path.exists():
            raise SanitizerError(
                f"{compiler} has no {name}: install the sanitizer runtimes, on Debian/Ubuntu "
                f"`apt-get install libgcc-{major or 'N'}-dev` (the package for gcc {major or '?'})")
        found.append(path.resolve())
    return found


def sanitizer_env(libraries: list[Path], base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    preload = [str(p) for p in libraries] + [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    env["LD_PRELOAD"] = ":".join(preload)
    env["ASAN_OPTIONS"] = _options(ASAN_OPTIONS)
    env["UBSAN_OPTIONS"] = _options(UBSAN_OPTIONS)
    # The child imports ort_plugin from this checkout whatever the caller's working directory.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("MYOPS_ORT_PLUGIN", None)  # the child is told its library explicitly
    return env


def report_excerpt(stderr: str, limit: int = 80) -> str:
    """The sanitizer's report (from its first line on), else the last lines of stderr."""
    lines = stderr.splitlines()
    for index, line in enumerate(lines):
        if any(mark in line for mark in REPORT_MARKS):
            start = max(index - 2, 0)
            return "\n".join(lines[start:start + limit])
    return "\n".join(lines[-40:])


def run_workload(library: Path, *, timeout: float = 600, log=print) -> str:
    """Run the workload against `library` in a preloaded child; return its summary or raise SanitizerError."""
    env = sanitizer_env(runtime_libraries())
    cmd = [sys.executable, "-m", "ort_plugin.sanitize", CHILD_FLAG, str(library)]
    log(f"[sanitize] LD_PRELOAD={env['LD_PRELOAD']} {' '.join(cmd)}")
    try:
        result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise SanitizerError(f"the sanitized workload ran past {timeout:.0f} s") from exc
    reported = any(mark in result.stderr for mark in REPORT_MARKS)
    done = [line for line in result.stdout.splitlines() if line.startswith(DONE_MARK)]
    if result.returncode != 0 or reported or not done:
        why = ("a sanitizer report" if reported or result.returncode == SANITIZER_EXIT
               else f"exit status {result.returncode}" if result.returncode != 0
               else "the workload did not finish")
        raise SanitizerError(
            f"sanitized run failed ({why}; exit {result.returncode}):\n{report_excerpt(result.stderr)}\n"
            f"--- child stdout (tail) ---\n" + "\n".join(result.stdout.splitlines()[-10:]))
    return done[-1][len(DONE_MARK):].strip()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHILD_FLAG]:
        return _child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600, help="seconds the workload child may take")
    args = parser.parse_args(argv)

    from lab import ort_headers as headers
    from .build import BuildError, build

    started = time.monotonic()
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    try:
        library = build(cuda="OFF", sanitize=True, log=log)
        built = time.monotonic()
        summary = run_workload(library, timeout=args.timeout, log=log)
    except (BuildError, headers.HeadersNotFound, SanitizerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    done = time.monotonic()
    print(f"sanitizers clean (address, undefined): {summary}; build {built - started:.1f} s, "
          f"workload {done - built:.1f} s; {library}")
    return 0


# ---------------------------------------------------------------- child: the workload (runs under ASan)

THREADS = (1, 2, 4)
CHUNK = 32768  # the elementwise CPU kernels' ParallelFor chunk (src/cpu/spans.h)
# An elementwise op's inputs: empty, scalar, odd, around and beyond one chunk.
SHAPES = (
    (), (0,), (1,), (7,), (1, 1, 1), (3, 0, 5), (17, 31), (2, 3, 5, 7),
    (CHUNK - 1,), (CHUNK,), (CHUNK + 1,), (3, CHUNK + 5), (2, 2 * CHUNK + 1), (4, 129, 1001),
)
# A row-wise op's (a row is the last axis): widths around the vector and lane sizes, rows beyond one task.
ROW_SHAPES = ((1,), (5,), (16,), (63,), (64,), (65,), (3, 1001), (2, 0, 8), (0, 4), (2, 3, 0), (40, 1, 768),
              (9, 4096), (2, 3, 5, 7))
SPECIALS = (float("inf"), float("-inf"), float("nan"), 1e4, -1e4, 88.5, -88.5, 1e-40, -0.0)
# Every attribute of an op at once: absent from the node (its declared defaults), then at each value.
ATTRIBUTE_VALUES = (None, 1.0, 0.5, -0.3, 0.0)


def _child(argv: list[str]) -> int:
    import numpy as np

    from opspec import OPS

    if len(argv) != 1:
        print("usage: python -m ort_plugin.sanitize --child LIBRARY", file=sys.stderr)
        return 2
    library = Path(argv[0])
    rng = np.random.default_rng(2024)
    counts = {"runs": 0, "sessions": 0, "errors_checked": 0}
    for spec in (spec for _, spec in sorted(OPS.items()) if spec.kind):  # each op the plugin's generic kernels run
        for key, value in _op_workload(spec, library, rng).items():
            counts[key] += value
    print(f"{DONE_MARK} {counts['runs']} runs on {counts['sessions']} sessions, "
          f"{counts['errors_checked']} error paths", flush=True)
    return 0


def _names(spec) -> tuple[list[str], list[str], list[str]]:
    """The node's full-shaped inputs, weights and outputs as graph names (x and y first)."""
    return list(spec.graph_inputs), list(spec.inputs[spec.full_inputs:]), list(spec.graph_outputs)


def _model(spec, rank: int, attributes: dict | None, *, elem_type=None, extra_attribute=None,
           weight_dim: str | None = None) -> bytes:
    """The op's node alone: full-shaped inputs of symbolic dims of this rank, weights as graph inputs of the
    last dim (weight_dim names theirs apart). attributes None: none on the node.

    Ranked on purpose: with an unranked x the plugin's shape inference declares y a scalar, and ORT
    warns on every run: the 1.21 C API shows unranked and scalar alike. Outputs are right either way.
    """
    from onnx import TensorProto, helper

    from opspec import DOMAIN

    elem_type = TensorProto.FLOAT if elem_type is None else elem_type
    full, weights, outputs = _names(spec)
    node = helper.make_node(spec.onnx_type, full + weights, outputs, domain=DOMAIN, **(attributes or {}))
    if extra_attribute is not None:
        node.attribute.append(extra_attribute)
    dims = [f"d{i}" for i in range(rank)]
    inputs = ([helper.make_tensor_value_info(n, elem_type, dims) for n in full] +
              [helper.make_tensor_value_info(n, elem_type, [weight_dim or dims[-1]]) for n in weights])
    graph = helper.make_graph([node], spec.name, inputs, [helper.make_tensor_value_info(n, elem_type, dims)
                                                          for n in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 9
    return model.SerializeToString()


class _Float64Form:
    """The op's declared decomposed form evaluated by numpy in float64: what the plugin's outputs are checked
    against (rounded once to float32). Torch-free, as the inference side is."""

    def __init__(self):
        import math

        import numpy as np

        from opspec import forms

        erf = np.vectorize(math.erf, otypes=[np.float64])

        def softmax(a):
            e = np.exp(a - a.max(axis=-1, keepdims=True)) if a.shape[-1] else a
            return e / e.sum(axis=-1, keepdims=True) if a.shape[-1] else a

        self.functions = {
            "Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Exp": np.exp,
            "Log": np.log, "Tanh": np.tanh, "Sigmoid": lambda a: 0.5 * (1.0 + np.tanh(0.5 * a)), "Erf": erf,
            "Relu": lambda a: np.maximum(a, 0.0), "Softplus": lambda a: np.logaddexp(a, 0.0),
            "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
            "Max": np.maximum, "Min": np.minimum,
            "ReduceMean": lambda a: a.mean(axis=-1, keepdims=True), "ReduceSum": lambda a: a.sum(axis=-1, keepdims=True),
            "ReduceMax": lambda a: a.max(axis=-1, keepdims=True), "Softmax": softmax,
        }
        missing = set(forms.VOCABULARY) - set(self.functions)
        assert not missing, f"the float64 form has no {sorted(missing)}"
        self.emitter = type("Float64Emitter", (forms.Emitter,), {"node": lambda _, op_type, args: self._node(op_type, args)})()

    def _node(self, op_type, args):
        import numpy as np

        with np.errstate(all="ignore"):
            return self.functions[op_type](*(np.float64(a) if isinstance(a, (int, float)) else a for a in args))

    def __call__(self, spec, feeds: dict, attributes: dict | None) -> list:
        import numpy as np

        full, weights, _ = _names(spec)
        values = [feeds[n].astype(np.float64) for n in full + weights]
        empty_rows = spec.kind == "rowwise" and values[0].shape[-1] == 0
        if empty_rows:  # no row to reduce: nothing to compare (numpy would warn of an empty mean)
            return [np.empty(values[0].shape, np.float32) for _ in spec.graph_outputs]
        result = spec.decomposed(self.emitter, *values, *{**spec.attributes, **(attributes or {})}.values())
        results = result if isinstance(result, tuple) else (result,)
        return [np.broadcast_to(np.asarray(r, np.float64), values[0].shape).astype(np.float32) for r in results]


def _session(model: bytes, library: Path, threads: int):
    import onnxruntime as ort

    from .loader import register

    options = ort.SessionOptions()
    # ORT's arena and memory patterns carve tensors out of large blocks, where an overrun lands in a
    # neighbour's bytes unseen; without them each tensor is its own allocation with ASan red zones.
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    register(options, library)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _fresh(array):
    """A fresh exact-size buffer, so reading past its end hits ASan's red zone."""
    import numpy as np

    return np.array(array, copy=True, order="C")


def _input(rng, shape, specials: bool = True, rows_apart: bool = False):
    """Normal values with specials at both ends (where off-by-one bugs live) and at random places; rows_apart:
    in odd rows only (a special reaches its whole row in a row-wise op: the even rows stay comparable)."""
    import numpy as np

    x = rng.normal(scale=8.0, size=shape).astype(np.float32)
    eligible = np.arange(x.size)
    if rows_apart and x.size:
        eligible = eligible.reshape(-1, shape[-1])[1::2].reshape(-1)
    if specials and eligible.size:
        flat = x.reshape(-1)  # a view: x is contiguous
        positions = [eligible[0], eligible[-1], *rng.choice(eligible, size=min(eligible.size, 2 * len(SPECIALS)))]
        for position, value in zip(positions, SPECIALS * 3):
            flat[position] = value
    return _fresh(x)


def _feeds(spec, rng, shape, specials: bool = True) -> dict:
    """A feed of every graph input: the full-shaped ones with specials (a row-wise op's in its odd rows), the
    weights near 1."""
    full, weights, _ = _names(spec)
    feeds = {name: _input(rng, shape, specials, rows_apart=spec.kind == "rowwise") for name in full}
    feeds.update({name: _fresh(rng.normal(1.0, 0.2, size=shape[-1:]).astype("float32")) for name in weights})
    return feeds


def _check(spec, session, form, feeds: dict, what: str, attributes: dict | None = None) -> None:
    """The node's outputs: x's shape and type, NaN where the form's float64 value is NaN, and its value
    within the op's float32 tolerance (at least the old per-op checks' 1e-5 and 2e-6) wherever finite."""
    import numpy as np

    ys = session.run(None, feeds)
    x = feeds["x"]
    for name, y in zip(spec.graph_outputs, ys, strict=True):
        if y.shape != x.shape or y.dtype != np.float32:
            raise AssertionError(f"{spec.onnx_type} {what}, {name}: got {y.dtype}{list(y.shape)} for x {list(x.shape)}")
    if form is None:
        return
    rtol, atol = spec.tolerances.get("float32", (0.0, 0.0))
    for name, y, want in zip(spec.graph_outputs, ys, form(spec, feeds, attributes), strict=True):
        where = f"{spec.onnx_type} {what}, {name}, shape {list(x.shape)}"
        if not np.array_equal(np.isnan(y), np.isnan(want)):
            raise AssertionError(f"{where}: NaN at {int((np.isnan(y) != np.isnan(want)).sum())} places the form "
                                 "does not have it, or the reverse")
        finite = np.isfinite(want)
        np.testing.assert_allclose(y[finite], want[finite], rtol=max(rtol, 1e-5), atol=max(atol, 2e-6), err_msg=where)


def _op_workload(spec, library: Path, rng) -> dict:
    """One op under the sanitizers: every shape on 1 to 4 threads at each attribute value, one session from
    several Python threads at once, sessions made and dropped over and over, and its error paths."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    counts = {"runs": 0, "sessions": 0, "errors_checked": 0}
    shapes = SHAPES if spec.kind == "elementwise" else ROW_SHAPES
    settings = [None] + [dict.fromkeys(spec.attributes, v) for v in ATTRIBUTE_VALUES[1:] if spec.attributes]
    form = _Float64Form() if spec.decomposed is not None else None
    for attributes in settings:
        for rank in sorted({len(shape) for shape in shapes}):
            for threads in THREADS:
                session = _session(_model(spec, rank, attributes), library, threads)
                counts["sessions"] += 1
                for shape in (s for s in shapes if len(s) == rank):
                    # a row-wise op's single row: clean once (compared everywhere), with specials after
                    specials = spec.kind == "elementwise" or threads > 1 or math.prod(shape[:-1]) > 1
                    _check(spec, session, form, _feeds(spec, rng, shape, specials), f"attributes {attributes}",
                           attributes)
                    counts["runs"] += 1
                del session
    gc.collect()

    # One session on 4 threads, run from several Python threads at once (Run releases the GIL).
    rank = 3
    big = _session(_model(spec, rank, None), library, 4)
    feeds = [_feeds(spec, rng, shape) for shape in [(8, 512, 768), (3, 1, CHUNK + 7), (1, 1, 5), (0, 2, 768)] * 3]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(_check, spec, big, form, feed, "from 4 threads at once") for feed in feeds]:
            future.result()
            counts["runs"] += 1
    counts["sessions"] += 1
    del big
    gc.collect()

    # Options, registration, session, run, teardown, over and over.
    for cycle in range(6):
        session = _session(_model(spec, 2, None), library, 1 + cycle % 3)
        _check(spec, session, None, _feeds(spec, rng, (5, CHUNK + cycle)), "cycle")
        del session
        gc.collect()
        counts["runs"] += 1
        counts["sessions"] += 1

    counts["errors_checked"] = _error_paths(spec, library, rng)
    return counts


def _error_paths(spec, library: Path, rng) -> int:
    """Each bad model or input must give a clean onnxruntime error (an exception), never a crash."""
    import numpy as np
    from onnx import TensorProto, helper

    full, weights, _ = _names(spec)
    cases = [
        ("a double model input", lambda: _session(_model(spec, 2, None, elem_type=TensorProto.DOUBLE), library, 2),
         "double"),
        ("a double array fed to the float model", lambda: _session(_model(spec, 2, None), library, 2).run(
            None, {**_feeds(spec, rng, (3, 40)), "x": rng.normal(size=(3, 40))}), "double"),
    ]
    for attribute in list(spec.attributes)[:1]:
        for kind, value in (("an int", 2), ("a string", "x")):
            cases.append((f"{attribute} given as {kind}", lambda a=attribute, v=value: _session(
                _model(spec, 2, None, extra_attribute=helper.make_attribute(a, v)), library, 2), attribute))
    if weights:
        cases.append((f"a {weights[-1]} of the wrong length", lambda: _session(
            _model(spec, 2, None, weight_dim="other"), library, 2).run(
                None, {**_feeds(spec, rng, (3, 40)), weights[-1]: np.ones(39, np.float32)}),
            f"{weights[-1]} must have shape"))
    if len(full) > 1:
        cases.append((f"{full[-1]} of another shape", lambda: _session(_model(spec, 2, None), library, 2).run(
            None, {**_feeds(spec, rng, (3, 40)), full[-1]: np.ones((3, 39), np.float32)}), "must have X's shape"))
    for what, action, must_name in cases:
        try:
            action()
        except Exception as exc:  # onnxruntime's own exception types (Fail, InvalidArgument, ...)
            message = str(exc)
            if must_name not in message:
                raise AssertionError(f"{spec.onnx_type}, {what}: the error does not name {must_name!r}: {message}") from exc
            if "onnxruntime" not in type(exc).__module__:
                raise AssertionError(f"{spec.onnx_type}, {what}: expected an onnxruntime error, got "
                                     f"{type(exc).__name__}: {message}")
        else:
            raise AssertionError(f"{spec.onnx_type}, {what}: onnxruntime accepted it")
    return len(cases)


if __name__ == "__main__":
    raise SystemExit(main())
