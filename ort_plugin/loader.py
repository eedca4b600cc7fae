"""Register the plugin into onnxruntime SessionOptions, with one clear error per way it can fail."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

PLUGIN_ENV = "MYOPS_ORT_PLUGIN"
ELF_MAGIC = b"\x7fELF"


class PluginError(RuntimeError):
    """The plugin could not be loaded; the message says why and what to do."""


def default_library() -> Path:
    """$MYOPS_ORT_PLUGIN, else the newest library built by `python -m ort_plugin.build`."""
    if os.environ.get(PLUGIN_ENV):
        return Path(os.environ[PLUGIN_ENV])
    from .build import BUILD_ROOT, LIBRARY_NAME

    built = sorted(BUILD_ROOT.glob(f"*/{LIBRARY_NAME}"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not built:
        raise PluginError(
            f"no plugin library found under {BUILD_ROOT}: build it with `python -m ort_plugin.build` "
            f"(or `nox -s build`), or point {PLUGIN_ENV} at a built libmyops_ort.so"
        )
    return built[0]


def check_library(path: str | os.PathLike) -> Path:
    """Fail early, with a precise message, on the usual ways a plugin path is wrong."""
    path = Path(path)
    if not path.exists():
        raise PluginError(f"plugin library {path} does not exist: build it with `python -m ort_plugin.build` or fix the path")
    if not path.is_file():
        raise PluginError(f"plugin library {path} is not a file")
    with open(path, "rb") as handle:
        if handle.read(4) != ELF_MAGIC:
            raise PluginError(f"{path} is not a shared library (no ELF header): pass the built libmyops_ort.so")
    try:
        library = ctypes.CDLL(str(path.resolve()), mode=os.RTLD_LOCAL)
    except OSError as exc:
        raise PluginError(
            f"{path} cannot be loaded by the dynamic linker: {exc}. A missing dependency shows as "
            "'cannot open shared object file'; check `ldd` on the library"
        ) from exc
    if not hasattr(library, "RegisterCustomOps"):
        raise PluginError(f"{path} exports no RegisterCustomOps symbol: it is not an ONNX Runtime custom-op library")
    return path


def register(session_options, library: str | os.PathLike | None = None) -> Path:
    """Register the plugin (default: default_library()) into an onnxruntime.SessionOptions."""
    path = check_library(library if library is not None else default_library())
    try:
        session_options.register_custom_ops_library(str(path.resolve()))
    except Exception as exc:  # onnxruntime raises its own Fail/RuntimeException types
        raise PluginError(f"onnxruntime refused to register {path}: {exc}") from exc
    return path


def exact_providers(names, ort_version: str) -> list:
    """Provider names -> InferenceSession's providers argument, with float32 kept float32 on the CUDA EP.

    Sessions made here check numbers against float32 PyTorch; TF32 MatMuls (the CUDA EP's default on
    Ampere and later) differ from those by about 1e-4, beyond every alignment tolerance.
    """
    from lab.compat import ort_fp32_exact

    arguments = []
    for name in names:
        if name == "CUDAExecutionProvider":
            options, environment = ort_fp32_exact(ort_version)
            os.environ.update(environment)  # read when the CUDA EP creates its cuBLAS handle
            arguments.append((name, options) if options else name)
        else:
            arguments.append(name)
    return arguments


def make_session(model, *, library: str | os.PathLike | None = None, providers=("CPUExecutionProvider",),
                 threads: int | None = None, optimization_level=None, profile_prefix: str | None = None):
    """An InferenceSession for `model` (path or bytes) with the plugin registered.

    The model is read and compared with what the plugin registers first, so a damaged file or a
    custom node the plugin cannot serve fails with its exact cause (ModelFileError, PluginError)
    instead of ORT's generic "not a registered function/op".
    """
    import onnxruntime as ort

    from .diagnose import diagnose_model, failures
    from .library_info import read_library
    from .onnx_file import read_model

    summary = read_model(model)  # raises ModelFileError naming a truncated or foreign file
    path = check_library(library if library is not None else default_library())
    problems = failures(diagnose_model(summary, read_library(path), providers=list(providers)))
    if problems:
        where = f"{model}" if isinstance(model, (str, os.PathLike)) else "the model"
        raise PluginError(f"{where} cannot run with {path.name}: " + "; ".join(map(str, problems)))
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if optimization_level is not None:
        options.graph_optimization_level = optimization_level
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    register(options, path)
    model_arg = str(model) if isinstance(model, os.PathLike) else model
    try:
        return ort.InferenceSession(model_arg, options, providers=exact_providers(providers, ort.__version__))
    except Exception as exc:  # onnxruntime's own exception types
        raise PluginError(f"onnxruntime could not create a session for {'the model' if isinstance(model, bytes) else model} "
                          f"with {path.name} and providers {list(providers)}: {exc}") from exc
