"""Run the ORT plugin under AddressSanitizer + UndefinedBehaviorSanitizer: `python -m ort_plugin.sanitize`.

    python -m ort_plugin.sanitize                 # build (cached), run the workload, report
    python -m ort_plugin.sanitize --timeout 300   # give the workload child longer

What it does:
  1. builds the sanitized CPU plugin (ort_plugin.build with sanitize=True, under build/ort_plugin/sanitize/);
  2. starts a child Python with gcc's libasan (and libubsan) in LD_PRELOAD: the sanitizer runtime must be
     in the process before anything else, and python itself is not built with it;
  3. the child drives the plugin through onnxruntime: many shapes (empty, scalar, odd, beyond one
     ParallelFor chunk), 1 to 4 intra-op threads, several betas, inf/nan, concurrent runs, session
     create/destroy cycles, and the error paths (beta of the wrong type, a double input), checking
     every output against numpy; then myops::RMSNorm: widths around the vector and lane sizes, rows
     beyond one task, several epsilons, concurrent runs, and its errors (a scale of the wrong length,
     epsilon of the wrong type);
  4. prints "sanitizers clean" and exits 0, or exits 1 with the sanitizer's report.

Any ASan or UBSan report ends the child at once with a non-zero status (halt_on_error, and the build's
-fno-sanitize-recover=undefined). Leak checking is off: CPython and onnxruntime keep memory until exit
by design, which LeakSanitizer would report as leaks that are not ours.

Needs gcc's sanitizer runtimes: on Debian they come with libgcc-<gcc major>-dev (gcc pulls it in).
nox -s sanitize runs this in the cpu entry's pinned virtualenv; tests/test_sanitizers.py runs it in CI.
"""
from __future__ import annotations

import argparse
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

BETAS = (None, 1.0, 1.702, 0.5, -0.3, 0.0)
THREADS = (1, 2, 4)
CHUNK = 32768  # the CPU kernel's ParallelFor chunk (src/cpu/spans.h)
SHAPES = (
    (), (0,), (1,), (7,), (1, 1, 1), (3, 0, 5), (17, 31), (2, 3, 5, 7),
    (CHUNK - 1,), (CHUNK,), (CHUNK + 1,), (3, CHUNK + 5), (2, 2 * CHUNK + 1), (4, 129, 1001),
)
SPECIALS = (float("inf"), float("-inf"), float("nan"), 1e4, -1e4, 88.5, -88.5, 1e-40, -0.0)


def _child(argv: list[str]) -> int:
    import gc

    import numpy as np

    if len(argv) != 1:
        print("usage: python -m ort_plugin.sanitize --child LIBRARY", file=sys.stderr)
        return 2
    library = Path(argv[0])
    rng = np.random.default_rng(2024)
    counts = {"runs": 0, "sessions": 0, "errors_checked": 0}

    sessions = {}
    for beta in BETAS:
        for threads in THREADS:
            for rank in sorted({len(shape) for shape in SHAPES}):
                sessions[beta, threads, rank] = _session(_model(beta, rank), library, threads)
                counts["sessions"] += 1
    for (beta, threads, rank), session in sessions.items():
        for shape in SHAPES:
            if len(shape) == rank:
                _check(session, _input(rng, shape), beta)
                counts["runs"] += 1
    del sessions
    gc.collect()

    # One larger tensor on 4 threads: many chunks in flight at once.
    big = _session(_model(1.702, 3), library, 4)
    _check(big, _input(rng, (8, 512, 768)), 1.702)
    counts["runs"] += 1
    counts["sessions"] += 1

    # The same session from several Python threads at once (Run releases the GIL).
    from concurrent.futures import ThreadPoolExecutor

    inputs = [_input(rng, shape) for shape in [(3, 1, CHUNK + 7), (1, 1, 5), (2, 3, 2 * CHUNK), (0, 1, 1)] * 4]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(_check, big, x, 1.702) for x in inputs]:
            future.result()
            counts["runs"] += 1
    del big
    gc.collect()

    # Options, registration, session, run, teardown, over and over.
    for cycle in range(12):
        session = _session(_model(0.5 + cycle, 2), library, 1 + cycle % 3)
        _check(session, _input(rng, (5, CHUNK + cycle)), 0.5 + cycle)
        del session
        gc.collect()
        counts["runs"] += 1
        counts["sessions"] += 1

    counts["errors_checked"] = _error_paths(library, rng)
    runs, made, errors = _rms_norm(library, rng)
    counts["runs"] += runs
    counts["sessions"] += made
    counts["errors_checked"] += errors
    print(f"{DONE_MARK} {counts['runs']} runs on {counts['sessions']} sessions, "
          f"{counts['errors_checked']} error paths", flush=True)
    return 0


RMS_NORM_SHAPES = ((1,), (5,), (16,), (63,), (64,), (65,), (3, 1001), (2, 0, 8), (0, 4), (2, 3, 0), (40, 1, 768),
                   (9, 4096), (2, 3, 5, 7))
EPSILONS = (None, 1e-6, 1e-5, 0.5)


def _rms_norm_model(epsilon, rank: int, *, epsilon_attribute=None, scale_dim: str | None = None) -> bytes:
    """x -> myops::RMSNorm(x, scale) -> y, symbolic dims; scale's length named apart with scale_dim."""
    from onnx import TensorProto, helper

    node = helper.make_node("RMSNorm", ["x", "scale"], ["y"], domain="myops",
                            **({} if epsilon is None else {"epsilon": epsilon}))
    if epsilon_attribute is not None:
        node.attribute.append(epsilon_attribute)
    dims = [f"d{i}" for i in range(rank)]
    graph = helper.make_graph([node], "rms_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
                                                   helper.make_tensor_value_info("scale", TensorProto.FLOAT,
                                                                                 [scale_dim or dims[-1]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("myops", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def _check_rms_norm(session, x, scale, epsilon) -> None:
    import numpy as np

    (y,) = session.run(None, {"x": x, "scale": scale})
    eps = 1e-6 if epsilon is None else epsilon
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        mean = (x64 * x64).mean(axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,))
        expected = (x64 / np.sqrt(mean + eps) * scale.astype(np.float64)).astype(np.float32)
    if y.shape != x.shape or y.dtype != np.float32:
        raise AssertionError(f"RMSNorm shape {x.shape}, epsilon {epsilon}: got {y.dtype}{list(y.shape)}")
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=2e-6, equal_nan=True,
                               err_msg=f"RMSNorm shape {x.shape}, epsilon {epsilon}")


def _rms_norm(library: Path, rng) -> tuple[int, int, int]:
    """myops::RMSNorm under the sanitizers: (runs, sessions, error paths checked)."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from onnx import helper

    runs = made = 0
    for epsilon in EPSILONS:
        for threads in THREADS:
            for rank in sorted({len(shape) for shape in RMS_NORM_SHAPES}):
                session = _session(_rms_norm_model(epsilon, rank), library, threads)
                made += 1
                for shape in (s for s in RMS_NORM_SHAPES if len(s) == rank):
                    x = np.array(rng.normal(scale=4.0, size=shape).astype(np.float32), copy=True)
                    scale = np.array(rng.normal(1.0, 0.2, size=shape[-1]).astype(np.float32), copy=True)
                    _check_rms_norm(session, x, scale, epsilon)
                    runs += 1
                del session
    gc.collect()
    big = _session(_rms_norm_model(1e-5, 3), library, 4)
    made += 1
    scale = np.array(rng.normal(1.0, 0.2, size=768).astype(np.float32), copy=True)
    inputs = [np.array(rng.normal(size=shape).astype(np.float32), copy=True)
              for shape in [(8, 512, 768), (1, 1, 768), (3, 43, 768), (0, 2, 768)] * 3]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(_check_rms_norm, big, x, scale, 1e-5) for x in inputs]:
            future.result()
            runs += 1
    del big
    gc.collect()
    cases = [
        ("epsilon given as an int", lambda: _session(_rms_norm_model(
            None, 2, epsilon_attribute=helper.make_attribute("epsilon", 2)), library, 2), "epsilon"),
        ("a scale of the wrong length", lambda: _session(_rms_norm_model(None, 2, scale_dim="other"), library, 2).run(
            None, {"x": rng.normal(size=(3, 40)).astype(np.float32), "scale": np.ones(39, np.float32)}),
         "scale must have shape"),
    ]
    for what, action, must_name in cases:
        try:
            action()
        except Exception as exc:  # onnxruntime's own exception types
            if must_name not in str(exc) or "onnxruntime" not in type(exc).__module__:
                raise AssertionError(f"RMSNorm, {what}: not the expected onnxruntime error: {exc}") from exc
        else:
            raise AssertionError(f"RMSNorm, {what}: onnxruntime accepted it")
    return runs, made, len(cases)


def _model(beta, rank: int, *, elem_type=None, beta_attribute=None) -> bytes:
    """x -> myops::Swish -> y with symbolic dims of the given rank.

    Ranked on purpose: with an unranked x the plugin's shape inference declares y a scalar, and ORT
    warns on every run: the 1.21 C API shows unranked and scalar alike. Outputs are right either way.
    """
    from onnx import TensorProto, helper

    elem_type = TensorProto.FLOAT if elem_type is None else elem_type
    node = helper.make_node("Swish", ["x"], ["y"], domain="myops", **({} if beta is None else {"beta": beta}))
    if beta_attribute is not None:
        node.attribute.append(beta_attribute)
    dims = [f"d{i}" for i in range(rank)]
    graph = helper.make_graph([node], "swish", [helper.make_tensor_value_info("x", elem_type, dims)],
                              [helper.make_tensor_value_info("y", elem_type, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("myops", 1)])
    model.ir_version = 9
    return model.SerializeToString()


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


def _input(rng, shape):
    import numpy as np

    x = rng.normal(scale=8.0, size=shape).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size:
        # Specials at both ends (where off-by-one bugs live) and at random places.
        positions = [0, flat.size - 1, *rng.integers(0, flat.size, size=min(flat.size, 2 * len(SPECIALS)))]
        for position, value in zip(positions, SPECIALS * 3):
            flat[position] = value
    # A fresh exact-size buffer, so reading past its end hits ASan's red zone.
    return np.array(x, copy=True, order="C")


def _check(session, x, beta) -> None:
    import numpy as np

    (y,) = session.run(None, {"x": x})
    b = 1.0 if beta is None else beta
    with np.errstate(over="ignore", invalid="ignore"):
        expected = (x.astype(np.float64) / (1.0 + np.exp(-(b * x.astype(np.float64))))).astype(np.float32)
    if y.shape != x.shape or y.dtype != np.float32:
        raise AssertionError(f"shape {x.shape}, beta {beta}: got {y.dtype}{list(y.shape)}")
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6, equal_nan=True,
                               err_msg=f"shape {x.shape}, beta {beta}")


def _error_paths(library: Path, rng) -> int:
    """Each bad model or input must give a clean onnxruntime error (an exception), never a crash."""
    from onnx import TensorProto, helper

    cases = [
        ("beta given as an int", lambda: _session(_model(None, 2, beta_attribute=helper.make_attribute("beta", 2)),
                                                  library, 2), "beta"),
        ("beta given as a string", lambda: _session(_model(None, 2, beta_attribute=helper.make_attribute("beta", "x")),
                                                    library, 1), "beta"),
        ("a double model input", lambda: _session(_model(1.0, 2, elem_type=TensorProto.DOUBLE), library, 2),
         "double"),
        ("a double array fed to the float model",
         lambda: _session(_model(1.0, 2), library, 2).run(None, {"x": rng.normal(size=(3, CHUNK + 1))}), "double"),
    ]
    for what, action, must_name in cases:
        try:
            action()
        except Exception as exc:  # onnxruntime's own exception types (Fail, InvalidArgument, ...)
            message = str(exc)
            if must_name and must_name not in message:
                raise AssertionError(f"{what}: the error does not name {must_name!r}: {message}") from exc
            if "onnxruntime" not in type(exc).__module__:
                raise AssertionError(f"{what}: expected an onnxruntime error, got {type(exc).__name__}: {message}")
        else:
            raise AssertionError(f"{what}: onnxruntime accepted it")
    return len(cases)


if __name__ == "__main__":
    raise SystemExit(main())
