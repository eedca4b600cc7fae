"""Export every op's models (ops.registry: swish, its FFN, rms_norm...) to ONNX with either exporter
and either lowering, then check them.

    python -m ops.export --model ffn --exporter dynamo --lowering custom --opset 18 -o out.onnx

Exporters:  torchscript (dynamo=False, register_custom_op_symbolic + custom_opsets)
            dynamo      (torch.export, custom_translation_table with onnxscript)
Lowerings:  custom      one myops node (myops::Swish, myops::RMSNorm...), opset import myops:1
            decomposed  standard ops only (the op's declared form, ops/onnx_parts.py, and the
                        opset from which a standard node replaces them)
Every file is checked (onnx.checker, exact activation nodes, opset imports, dynamic batch/seq
axes) before it is moved into place; a failed check leaves no file behind.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import json
import logging
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx
import onnx.version_converter
import torch

from opspec import DOMAIN, DOMAIN_VERSION, PRIMARY, model_inputs, model_outputs

from . import load as load_extension
from .declaration import TorchOp
from .registry import MODEL_OP, OPS

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO / "build" / "onnx"
EXPORTERS = ("torchscript", "dynamo")
LOWERINGS = ("custom", "decomposed")
DTYPES = ("float32", "float16")
# Every op's models (the op alone, named like it, then any others: swish's ffn); MODEL_OP names the op each holds.
MODELS = tuple(MODEL_OP)
# Default-domain opsets each exporter can emit with this torch (TorchScript stops at 20; the
# dynamo exporter builds at 18 and converts with onnxscript, whose converter spans 18..its max).
TORCHSCRIPT_MAX_OPSET = 20
# protobuf serialises no message of 2 GiB or more: a model past this keeps its weights in a data file
# beside it (<file>.data), as torch.onnx.export and ORT read them; the margin is the graph itself.
EXTERNAL_DATA_OVER = 2**31 - 2**26
DYNAMO_MIN_OPSET = 18
INPUT_NAME, OUTPUT_NAME = "x", "y"
DYNAMIC_AXES = {0: "batch", 1: "seq"}
# Nodes the FFN's two Linear layers may lower to; everything else must be the op's.
LINEAR_OPS = {"MatMul", "Add", "Gemm", "Transpose", "Reshape"}


class _WithoutTorchvisionNotice(logging.Filter):
    """torch's dynamo exporter warns at every export that torchvision is absent (it would register
    torchvision's ops); no model here has one, and 30 such lines an export bury what a user needs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torchvision is not installed" not in record.getMessage()


logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(_WithoutTorchvisionNotice())


class ExportError(RuntimeError):
    """Export impossible or the exported graph is not what was asked for; says which and why."""


# ---------------------------------------------------------------- models

def build_model(name: str, *, hidden: int = 768, seed: int = 0, activation=None, **attributes) -> torch.nn.Module:
    """The model `name` of its op (ops.registry), deterministic for a seed. `activation` replaces the
    fused op (same signature: the benchmarks swap in the composite or F.silu); `attributes` (beta=,
    eps=, ... by ONNX or torch name) override the op's defaults, and ones the op lacks are ignored."""
    if name not in MODEL_OP:
        raise ExportError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return OPS[MODEL_OP[name]].build_model(name, hidden=hidden, seed=seed, function=activation, attributes=attributes)


def sample_input(batch: int = 2, seq: int = 16, hidden: int = 768, *, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, hidden, generator=generator)


def sample_inputs(name: str, batch: int = 2, seq: int = 16, hidden: int = 768, *, seed: int = 1) -> tuple:
    """One tensor per input of the model: x as sample_input(seed), the k-th other from seed + k."""
    return tuple(sample_input(batch, seq, hidden, seed=seed + k) for k in range(len(model_inputs(name))))


# ---------------------------------------------------------------- onnxruntime facts

def ort_runs(opset: int, op_type: str = "Relu", **attributes) -> bool:
    """Whether the installed onnxruntime loads and runs `op_type` at `opset` (a tiny probe graph)."""
    from .onnx_parts import probe_runs

    return probe_runs(opset, op_type, attributes=tuple(sorted(attributes.items())))


def dynamo_max_opset() -> int:
    try:
        from onnxscript.version_converter._version_converter import SUPPORTED_MAX_ONNX_OPSET
    except ImportError:
        from torch.onnx._constants import ONNX_MAX_OPSET as SUPPORTED_MAX_ONNX_OPSET
    return SUPPORTED_MAX_ONNX_OPSET


def newest_opset(exporter: str) -> int:
    """The newest opset that this exporter, the installed onnx and onnxruntime all support."""
    top = onnx.defs.onnx_opset_version()
    top = min(top, TORCHSCRIPT_MAX_OPSET if exporter == "torchscript" else dynamo_max_opset())
    for opset in range(top, 16, -1):
        if ort_runs(opset):
            return opset
    raise ExportError("the installed onnxruntime runs no opset >= 17")


def default_opsets(exporter: str) -> list[int]:
    return sorted({17, 18, newest_opset(exporter)})


# ---------------------------------------------------------------- TorchScript exporter

def _default_dynamic_axes(inputs: tuple[str, ...], outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> dict:
    return {name: DYNAMIC_AXES for name in (*inputs, *outputs)}


def _check_dynamic_axes(dynamic_axes: dict, inputs: tuple[str, ...] = (INPUT_NAME,),
                        outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> None:
    # torch.onnx.export only warns about names that match no input or output, then exports fixed shapes.
    unknown = sorted(set(dynamic_axes) - {*inputs, *outputs})
    if unknown:
        raise ExportError(f"dynamic_axes names {unknown} match no input or output: this model's inputs are "
                          f"{', '.join(repr(i) for i in inputs)} and its outputs {', '.join(repr(o) for o in outputs)}; "
                          "key dynamic_axes by those names")
    for name, axes in dynamic_axes.items():
        if not isinstance(axes, dict) or not all(isinstance(a, int) and 0 <= a < 3 for a in axes):
            raise ExportError(f"dynamic_axes['{name}'] must map axis numbers 0..2 to names, e.g. {DYNAMIC_AXES}; got {axes!r}")


def available_exporters() -> list[str]:
    """The exporters this torch runs with the myops translation: TorchScript where it still exists,
    dynamo where torch.onnx.export takes custom_translation_table (torch >= 2.6)."""
    found = ["torchscript"] if hasattr(torch.onnx, "register_custom_op_symbolic") else []
    if "custom_translation_table" in inspect.signature(torch.onnx.export).parameters:
        found.append("dynamo")
    return found


def check_torchscript_usable(opset: int) -> None:
    """Raise ExportError, saying what to do, where this torch's TorchScript exporter cannot export at `opset`."""
    if not hasattr(torch.onnx, "register_custom_op_symbolic"):
        raise ExportError(f"torch {torch.__version__} has no TorchScript ONNX exporter (dynamo=False): use --exporter dynamo")
    if opset > TORCHSCRIPT_MAX_OPSET:
        raise ExportError(f"the TorchScript exporter stops at opset {TORCHSCRIPT_MAX_OPSET}; got {opset}: use --exporter dynamo")


@contextlib.contextmanager
def torchscript_symbolics(ops, lowering: str, symbolic_opset: int = 1):
    """Every op of `ops` registered with the TorchScript exporter for the duration, then unregistered."""
    # NOTE: the symbolic's own opset (1 here) must be <= the export opset, and it is looked up by
    # the exact schema name of TORCH_LIBRARY ("myops::swish", "myops::rms_norm").
    for op in ops:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unregistering a name never registered warns
            torch.onnx.unregister_custom_op_symbolic(op.torch_name, 1)
        torch.onnx.register_custom_op_symbolic(op.torch_name, op.onnx.torchscript_symbolic(lowering), symbolic_opset)
    try:
        yield
    finally:
        for op in ops:
            torch.onnx.unregister_custom_op_symbolic(op.torch_name, symbolic_opset)


# torch < 2.4 has no dynamo= keyword (TorchScript is its only exporter); 2.9+ defaults it to True.
def torchscript_choice() -> dict:
    return {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}


def _export_torchscript(model, examples: tuple, path: Path, *, lowering: str, opset: int, symbolic_opset: int = 1,
                        dynamic_axes: dict | None = None, op: TorchOp, inputs: tuple[str, ...] = (INPUT_NAME,),
                        outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> None:
    check_torchscript_usable(opset)
    try:
        with torchscript_symbolics((op,), lowering, symbolic_opset):
            torch.onnx.export(
                model, examples, str(path), **torchscript_choice(), opset_version=opset,
                input_names=list(inputs), output_names=list(outputs),
                dynamic_axes=dynamic_axes if dynamic_axes is not None else _default_dynamic_axes(inputs, outputs),
                custom_opsets={DOMAIN: DOMAIN_VERSION} if lowering == "custom" else None,
            )
    except torch.onnx.errors.UnsupportedOperatorError as exc:
        if symbolic_opset > opset:
            raise ExportError(f"the symbolic for {op.torch_name} is registered from opset {symbolic_opset} but the export "
                              f"asks for opset {opset}, and a symbolic only applies from its own opset up: register it "
                              f"with opset_version <= {opset} (ops.export uses 1), or export at opset >= {symbolic_opset}") from exc
        raise


# ---------------------------------------------------------------- torch.export (dynamo) exporter

def _export_dynamo(model, examples: tuple, path: Path, *, lowering: str, opset: int, dynamic_axes: dict | None = None,
                   op: TorchOp, inputs: tuple[str, ...] = (INPUT_NAME,), outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> None:
    check_dynamo_usable(opset)
    from torch.export import Dim

    # A float16 export relies on the optimiser folding Casts of initializers (ops/onnx_parts.py);
    # torch 2.6's exporter does not run it unless asked. float32 exports stay as each torch makes them.
    # One Dim per axis name, shared by every input that names it: torch.export then knows a gated op's
    # x and gate have the same batch and sequence.
    axes = dynamic_axes or _default_dynamic_axes(inputs, outputs)
    dims = {axis_name: Dim(axis_name) for name in inputs for axis_name in axes.get(name, {}).values()}
    shapes = [{axis: dims[axis_name] for axis, axis_name in axes.get(name, {}).items()} for name in inputs]
    _dynamo_save(model, examples, {}, path, lowering=lowering, opset=opset, ops=(op,),
                 input_names=list(inputs), output_names=list(outputs),
                 # an op alone's model takes the inputs after x as *others: torch.export sees them as one tuple
                 dynamic_shapes={INPUT_NAME: shapes[0]} if len(inputs) == 1 else (shapes[0], tuple(shapes[1:])),
                 optimize=examples[0].dtype != torch.float32)


def check_dynamo_usable(opset: int) -> None:
    """Raise ExportError, saying what to do, where this torch's dynamo exporter cannot emit myops nodes at `opset`."""
    try:
        import onnxscript
    except ImportError as exc:
        raise ExportError("the dynamo exporter needs onnxscript: pip install onnxscript (or use --exporter torchscript)") from exc
    try:
        import torch.export  # noqa: F401
    except ImportError as exc:
        raise ExportError(f"torch {torch.__version__} has no torch.export: use --exporter torchscript") from exc
    if "custom_translation_table" not in inspect.signature(torch.onnx.export).parameters:
        # torch 2.4/2.5 accept dynamo=True but drop the table without a word: no myops node would be emitted
        raise ExportError(f"torch {torch.__version__}'s dynamo exporter cannot take the myops translation "
                          "(custom_translation_table needs torch >= 2.6): use --exporter torchscript")
    if opset > dynamo_max_opset():
        raise ExportError(f"the dynamo exporter (onnxscript {onnxscript.__version__}) stops at opset {dynamo_max_opset()}; got {opset}")


def _dynamo_save(model, args: tuple, kwargs: dict, path: Path, *, lowering: str, opset: int, ops, input_names,
                 output_names, dynamic_shapes, optimize: bool = False, external_data: bool | None = None) -> None:
    """torch.onnx.export(dynamo=True) with every op of `ops` translated, at `opset` (built at >= 18 and
    converted down), source paths normalised, saved to `path`: its weights in `<path>.data` where
    external_data is True, or is None and the model is past EXTERNAL_DATA_OVER."""
    build_opset = max(opset, DYNAMO_MIN_OPSET)
    optimize_arg = {"optimize": True} if optimize and "optimize" in inspect.signature(torch.onnx.export).parameters else {}
    program = torch.onnx.export(
        model, args, kwargs=kwargs or None, dynamo=True, opset_version=build_opset,
        input_names=input_names, output_names=output_names, dynamic_shapes=dynamic_shapes,
        custom_translation_table={op.overload(): op.onnx.dynamo_translation(lowering, build_opset) for op in ops},
        verbose=False, **optimize_arg,
    )
    proto = program.model_proto
    large = tensor_bytes(proto) > EXTERNAL_DATA_OVER
    built = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if large and external_data is False:
        raise ExportError("the model is past 2 GB, which one ONNX file cannot hold: export it with its weights "
                          "in a data file beside it (external_data=True, or None to decide by size)")
    if built != opset and large:
        raise ExportError(f"a model past 2 GB is exported at opset {built} or above only (onnx's version converter "
                          f"takes a model under 2 GB): ask for opset {built}")
    if built != opset:
        # Below 18 the dynamo exporter has no implementations, and torch 2.6 builds at 18 whatever
        # opset it is asked for; onnx's own converter (which keeps custom-domain nodes) moves it.
        warnings.warn(f"exported at opset {built}, converted to {opset} with onnx.version_converter")
        proto = onnx.version_converter.convert_version(proto, opset)
        _drop_attributes_the_converter_left(proto, opset)
    normalise_source_paths(proto)
    save(proto, path, external_data=large if external_data is None else external_data)


def tensor_bytes(proto: onnx.ModelProto) -> int:
    """The bytes of the model's initializers and Constant tensors, counted without serialising it:
    protobuf's upb backend measures a message (ByteSize) by encoding it, which fails past 2 GB."""
    def size(tensor: onnx.TensorProto) -> int:
        if tensor.HasField("raw_data"):
            return len(tensor.raw_data)
        count = 1
        for dim in tensor.dims:
            count *= dim
        return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize

    constants = [a.t for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute if a.HasField("t")]
    return sum(size(t) for t in [*proto.graph.initializer, *constants])


def save(proto: onnx.ModelProto, path: Path, *, external_data: bool) -> None:
    """The model at `path`; with external_data, every tensor of 1 KB or more in one file beside it,
    `<name>.data`, which the model names by its bare file name (as ORT and torch.onnx.export expect)."""
    if not external_data:
        onnx.save(proto, str(path))
        return
    onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{path.name}.data", size_threshold=1024)


def _drop_attributes_the_converter_left(proto: onnx.ModelProto, opset: int) -> None:
    """onnx's 18 -> 17 adapter moves ReduceMean's axes input into an attribute but keeps
    noop_with_empty_axes, which only exists from opset 18 (the checker then rejects the file). With
    axes given, the attribute changes nothing: drop it."""
    if opset >= 18:
        return
    for node in proto.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type.startswith("Reduce"):
            kept = [a for a in node.attribute if a.name != "noop_with_empty_axes"]
            del node.attribute[:]
            node.attribute.extend(kept)


SITE_PACKAGES = re.compile(r"[^\s\"']*/site-packages/")


def normalise_source_paths(proto: onnx.ModelProto) -> None:
    """Stack traces in node metadata (the dynamo exporter's pkg.torch.onnx.stack_trace) with the
    checkout's folder and the environment's site-packages taken out: the same export in another
    folder, venv or image gives the same bytes, and the trace still names the file and line."""
    prefix = str(REPO) + os.sep

    def clean(text: str) -> str:
        return SITE_PACKAGES.sub("site-packages/", text.replace(prefix, ""))

    def graphs(graph):
        yield graph
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    yield from graphs(attribute.g)
                for sub in attribute.graphs:
                    yield from graphs(sub)

    nodes = [node for graph in graphs(proto.graph) for node in graph.node]
    nodes += [node for function in proto.functions for node in function.node]
    for node in nodes:
        for entry in node.metadata_props:
            entry.value = clean(entry.value)
        node.doc_string = clean(node.doc_string)


# ---------------------------------------------------------------- checks

def describe(model: onnx.ModelProto) -> str:
    nodes = Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    imports = ", ".join(f"{o.domain or 'ai.onnx'}:{o.version}" for o in model.opset_import)
    return f"nodes {dict(sorted(nodes.items()))}; opset imports {imports}"


def register_onnx_schemas() -> None:
    for op in OPS.values():
        op.onnx.register_schema()


def check_graph(model: onnx.ModelProto, *, model_name: str, lowering: str, opset: int, exporter: str,
                attributes: dict | None = None, dynamic_axes: dict | None = None, dtype: str = "float32") -> None:
    """Raise ExportError, printing what the graph holds, unless it is exactly what was asked for."""
    register_onnx_schemas()
    op = OPS[MODEL_OP[model_name]]
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"onnx.checker rejected the export: {exc}") from exc
    problems = []
    nodes = [f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node if n.op_type != "Constant"]
    activation = Counter(n for n in nodes if n.startswith(DOMAIN + "::") or n in op.onnx.NODE_TYPES)
    expected = op.onnx.expected_nodes(lowering, opset, exporter, op.attributes(**(attributes or {})), dtype=dtype)
    if activation != expected:
        problems.append(f"{MODEL_OP[model_name]} nodes {dict(activation)} != expected {dict(expected)}")
    allowed_rest = LINEAR_OPS if model_name != MODEL_OP[model_name] else set()  # a model around the op (an FFN)
    stray = sorted({n for n in nodes if n not in activation and n not in allowed_rest})
    if stray:
        problems.append(f"unexpected nodes {stray}")
    imports = {o.domain: o.version for o in model.opset_import}
    if imports.get("", imports.get("ai.onnx")) != opset:
        problems.append(f"default-domain opset {imports.get('')} != requested {opset}")
    if lowering == "custom" and imports.get(DOMAIN) != DOMAIN_VERSION:
        problems.append(f"missing opset import {DOMAIN}:{DOMAIN_VERSION}")
    if lowering == "decomposed" and DOMAIN in imports and any(n.startswith(DOMAIN) for n in nodes):
        problems.append(f"decomposed graph still uses the {DOMAIN} domain")
    wanted_dynamic = dynamic_axes if dynamic_axes is not None else _default_dynamic_axes(model_inputs(model_name),
                                                                                         model_outputs(model_name))
    if [value.name for value in model.graph.output] != list(model_outputs(model_name)):
        problems.append(f"graph outputs {[value.name for value in model.graph.output]} != "
                        f"{list(model_outputs(model_name))}")
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        dynamic = {i for i, d in enumerate(dims) if d.dim_param}
        missing = sorted(set(wanted_dynamic.get(value.name, {})) - dynamic)
        if missing:
            problems.append(f"{value.name}: axes {missing} not dynamic (dims {[d.dim_param or d.dim_value for d in dims]})")
    if problems:
        raise ExportError("exported graph is not what was asked for: " + "; ".join(problems) + f"\n  graph holds: {describe(model)}")


# ---------------------------------------------------------------- entry point

@dataclass
class ExportResult:
    path: str
    model: str
    op: str
    exporter: str
    lowering: str
    opset: int
    attributes: dict            # the op's ONNX attributes in the file (Swish's beta, RMSNorm's epsilon...)
    dtype: str                  # of X, Y and the weights
    sha256: str
    export_shape: list[int]
    graph: str
    torch: str = torch.__version__
    onnx: str = onnx.__version__
    warnings: list[str] = field(default_factory=list)


def default_path(model_name: str, exporter: str, lowering: str, opset: int, out_dir: Path = DEFAULT_OUT_DIR,
                 dtype: str = "float32") -> Path:
    suffix = "" if dtype == "float32" else f"-{dtype}"
    return Path(out_dir) / f"{model_name}-{lowering}-{exporter}-opset{opset}{suffix}.onnx"


def export(model_name: str, *, exporter: str = "dynamo", lowering: str = "custom", opset: int = 18,
           beta: float | None = None, eps: float | None = None, attributes: dict | None = None,
           path: str | os.PathLike | None = None, export_shape=(2, 16, 768), seed: int = 0,
           dynamic_axes: dict | None = None, symbolic_opset: int = 1, dtype: str = "float32") -> ExportResult:
    """Export, check, and atomically write one model; returns what was written and how.

    dynamic_axes: {name: {axis: axis name}} for the inputs (model_inputs: 'x', and an op alone's other
    full-shaped inputs) and the outputs (model_outputs: 'y', and an op alone's others) (default: batch
    and seq of each). symbolic_opset: the opset the TorchScript symbolic is registered from.
    The op's attributes default to its declaration's; beta (swish), eps (rms_norm) and `attributes`
    (any op, by ONNX or torch name) override them. dtype: float32, or float16 (the model's weights
    and input; dynamo only: the TorchScript exporter runs the model while tracing, and the CPU
    kernels are float32).
    """
    if model_name not in MODELS:
        raise ExportError(f"unknown model {model_name!r}; choose one of {', '.join(MODELS)}")
    if exporter not in EXPORTERS:
        raise ExportError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    if lowering not in LOWERINGS:
        raise ExportError(f"unknown lowering {lowering!r}; choose one of {', '.join(LOWERINGS)}")
    if dynamic_axes is not None:
        _check_dynamic_axes(dynamic_axes, model_inputs(model_name), model_outputs(model_name))
    if dtype not in DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    op = OPS[MODEL_OP[model_name]]
    if dtype != "float32" and exporter == "torchscript":
        raise ExportError(f"a {dtype} export with the TorchScript exporter would run the CPU kernels (float32 only) "
                          "while tracing: use --exporter dynamo, which traces with fake tensors")
    load_extension()
    path = Path(path) if path else default_path(model_name, exporter, lowering, opset, dtype=dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    attributes = op.attributes(**{"beta": beta, "eps": eps, **(attributes or {})})
    model = build_model(model_name, hidden=export_shape[-1], seed=seed, **attributes).to(getattr(torch, dtype))
    examples = tuple(t.to(getattr(torch, dtype)) for t in sample_inputs(model_name, *export_shape))
    inputs, outputs = model_inputs(model_name), model_outputs(model_name)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as tmp:
        tmp_path = Path(tmp) / path.name
        with warnings.catch_warnings(record=True) as caught, _quiet():
            warnings.simplefilter("always")
            if exporter == "torchscript":
                _export_torchscript(model, examples, tmp_path, lowering=lowering, opset=opset,
                                    symbolic_opset=symbolic_opset, dynamic_axes=dynamic_axes, op=op, inputs=inputs,
                                    outputs=outputs)
            else:
                _export_dynamo(model, examples, tmp_path, lowering=lowering, opset=opset, dynamic_axes=dynamic_axes,
                               op=op, inputs=inputs, outputs=outputs)
        proto = onnx.load(str(tmp_path))
        check_graph(proto, model_name=model_name, lowering=lowering, opset=opset, exporter=exporter,
                    attributes=attributes, dynamic_axes=dynamic_axes, dtype=dtype)
        digest = hashlib.sha256(tmp_path.read_bytes()).hexdigest()
        os.replace(tmp_path, path)
    return ExportResult(
        path=str(path), model=model_name, op=op.name, exporter=exporter, lowering=lowering, opset=opset,
        attributes=attributes, dtype=dtype, sha256=digest, export_shape=list(export_shape), graph=describe(proto),
        warnings=sorted({str(w.message).splitlines()[0] for w in caught}),
    )


@contextlib.contextmanager
def _quiet():
    """The dynamo exporter narrates every step on stdout; keep the caller's output readable."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a myops model to ONNX and check it.")
    parser.add_argument("--model", choices=(*MODELS, "all"), default=PRIMARY)
    parser.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    parser.add_argument("--lowering", choices=LOWERINGS, default="custom")
    parser.add_argument("--opset", type=int, help="default: every opset of default_opsets(exporter)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="of the model and its input (float16: dynamo)")
    flags = {}  # each op's attributes by their torch names (--beta, --eps ...), as their declarations say
    for op in OPS.values():
        for onnx_name, default in op.spec.attributes.items():
            flags.setdefault(op.spec.torch_attribute(onnx_name), []).append(f"{', '.join(op.models)} (default {default:g})")
    own = {"model", "exporter", "lowering", "opset", "dtype", "attribute", "output", "help"}
    flags = {name: uses for name, uses in flags.items() if name not in own}  # those: --attribute NAME=VALUE
    for name, uses in flags.items():
        parser.add_argument(f"--{name}", type=float, help="; ".join(uses))
    parser.add_argument("--attribute", action="append", default=[], metavar="NAME=VALUE",
                        help="any op's float attribute, by its ONNX name (repeatable)")
    parser.add_argument("-o", "--output", help="output file (only with --opset)")
    args = parser.parse_args(argv)
    opsets = [args.opset] if args.opset else default_opsets(args.exporter)
    models = MODELS if args.model == "all" else (args.model,)
    if args.output and (len(models) > 1 or not args.opset):
        parser.error("-o/--output names one file: give one --model and an --opset")
    try:
        pairs = dict(item.split("=", 1) for item in args.attribute)
        attributes = {name: float(value) for name, value in pairs.items()}
    except ValueError:
        parser.error(f"--attribute takes NAME=VALUE with a float value; got {args.attribute}")
    try:
        for model in models:
            for opset in opsets:
                given = {name: getattr(args, name) for name in flags if getattr(args, name) is not None}
                result = export(model, exporter=args.exporter, lowering=args.lowering, opset=opset,
                                attributes={**given, **attributes}, dtype=args.dtype, path=args.output)
                print(json.dumps(asdict(result)))
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
