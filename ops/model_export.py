"""Export any model that holds myops ops (a user's, patched with ops.apply) to ONNX, and check it.

    ops.export_model(model, {"input_ids": ids}, "model.onnx", exporter="dynamo", lowering="custom",
                     opset=18, dynamic_shapes={"input_ids": {0: "batch", 1: "seq"}})

Every registered op is translated (dynamo: custom_translation_table; TorchScript: every symbolic).
Before the file is moved into place: onnx.checker, the opset imports, the requested dynamic axes,
and the myops nodes counted against the myops calls one eager forward of the example makes (with
the decomposed lowering: no myops node at all). A failed check leaves no file behind.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opspec import DOMAIN, DOMAIN_VERSION

from .export import (EXPORTERS, LOWERINGS, ExportError, _dynamo_save, _quiet, check_dynamo_usable, save,
                     check_torchscript_usable, describe, register_onnx_schemas, torchscript_choice,
                     torchscript_symbolics)
from .registry import OPS


@dataclass
class ModelExport:
    path: str
    exporter: str
    lowering: str
    opset: int
    sha256: str
    inputs: list[str]
    outputs: list[str]
    myops_nodes: dict            # myops node type -> count in the file
    graph: str                   # node counts and opset imports (ops.export.describe)
    external_data: str | None = None  # the weights' file beside the model, where they are kept apart
    torch: str = torch.__version__
    onnx: str = onnx.__version__
    warnings: list[str] = field(default_factory=list)


class _CountMyopsCalls(TorchDispatchMode):
    """Counts the myops ops a forward calls, below autograd: what a custom export must turn into nodes."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == DOMAIN:
            self.calls[func._schema.name.split("::", 1)[1]] += 1
        return func(*args, **(kwargs or {}))


def myops_calls(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[Counter, object]:
    """(op name -> how many times one eager forward of the example calls it, that forward's output)."""
    counter = _CountMyopsCalls()
    with torch.no_grad(), counter:
        output = model(*args, **kwargs)
    return counter.calls, output


def _output_names(output) -> list[str]:
    """Names for the graph outputs, one per tensor the exporters flatten the output into: a Hugging Face
    ModelOutput's (or a dict's) fields ("logits"; a field holding several tensors: name_0, name_1 ...),
    else "output" or output_0, output_1 ... (None and other non-tensors are not outputs)."""
    from torch.utils._pytree import tree_leaves

    def tensors(value) -> int:
        return sum(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(value))

    if isinstance(output, torch.Tensor):
        return ["output"]
    if isinstance(output, dict):  # ModelOutput is an OrderedDict of its set fields
        names = []
        for key, value in output.items():
            count = tensors(value)
            names += [key] if count == 1 else [f"{key}_{i}" for i in range(count)]
        return names
    return [f"output_{i}" for i in range(tensors(output))]


def _split(example_inputs) -> tuple[tuple, dict]:
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise ExportError(f"example_inputs must be a tensor, a tuple of positional inputs or a dict of keyword inputs; "
                      f"got {type(example_inputs).__name__}")


def _known_traps(model: torch.nn.Module, kwargs: dict) -> None:
    """Exporter failures with a known cause, said before a long trace fails obscurely."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False) and kwargs.get("use_cache") is not False:
        # Measured with transformers 5 and torch 2.13: with the KV cache torch.export fails at step 1/3.
        raise ExportError(f"{type(model).__name__} returns a KV cache (config.use_cache=True), which torch.export "
                          "cannot trace: set model.config.use_cache = False, or pass use_cache=False among the "
                          "example's keyword inputs")


def _input_names(model: torch.nn.Module, args: tuple, kwargs: dict, given) -> list[str]:
    if given:
        return list(given)
    import inspect

    parameters = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p, arg in zip(parameters, args) if isinstance(arg, torch.Tensor)]
    return names + [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]


def _dims_of(dynamic_shapes: dict | None) -> dict:
    """{input: {axis: name}} from the caller's form, where names may be strings or torch.export.Dim."""
    return {name: {int(axis): getattr(dim, "__name__", dim) for axis, dim in axes.items()}
            for name, axes in (dynamic_shapes or {}).items()}


def export_model(model: torch.nn.Module, example_inputs, path: str | os.PathLike, *, exporter: str = "dynamo",
                 lowering: str = "custom", opset: int = 18, dynamic_shapes: dict | None = None,
                 input_names=None, output_names=None, external_data: bool | None = None) -> ModelExport:
    """Export `model` called on `example_inputs` (a tensor, a tuple, or a dict of keyword inputs such as
    {"input_ids": ids, "use_cache": False}) to `path`, check it, and write it atomically.

    dynamic_shapes: {input name: {axis: axis name}} (the same names across inputs are one dimension);
    torch.export.Dim objects are taken as they are by the dynamo exporter. Non-tensor keyword inputs
    (use_cache=False) are passed to the model, not made graph inputs.

    external_data: the weights in `<path>.data` beside the file (True), in the file (False), or apart
    only where the model is past 2 GB, which a single ONNX file cannot hold (None).
    """
    from . import load

    if exporter not in EXPORTERS:
        raise ExportError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    if lowering not in LOWERINGS:
        raise ExportError(f"unknown lowering {lowering!r}; choose one of {', '.join(LOWERINGS)}")
    (check_dynamo_usable if exporter == "dynamo" else check_torchscript_usable)(opset)
    load()
    args, kwargs = _split(example_inputs)
    _known_traps(model, kwargs)
    signature = _input_names(model, args, kwargs, None)  # torch.export keys dynamic shapes by these
    names = list(input_names) if input_names else signature
    if len(names) != len(signature):
        raise ExportError(f"input_names has {len(names)} names for {len(signature)} tensor inputs ({signature})")
    dims = _dims_of(dynamic_shapes)
    unknown = sorted(set(dims) - set(names))
    if unknown:
        raise ExportError(f"dynamic_shapes names {unknown} match no tensor input; the inputs are {names}")
    model.eval()
    expected, output = myops_calls(model, args, kwargs)
    output_names = list(output_names) if output_names else _output_names(output)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as tmp:
        tmp_path = Path(tmp) / path.name
        with warnings.catch_warnings(record=True) as caught, _quiet():
            warnings.simplefilter("always")
            if exporter == "dynamo":
                _dynamo_save(model, args, kwargs, tmp_path, lowering=lowering, opset=opset, ops=OPS.values(),
                             input_names=names, output_names=output_names, external_data=external_data,
                             dynamic_shapes=_dynamo_shapes(
                                 {signature[names.index(k)]: v for k, v in (dynamic_shapes or {}).items()},
                                 signature + [k for k in kwargs if k not in signature]))
            else:
                _torchscript_save(model, args, kwargs, tmp_path, lowering=lowering, opset=opset, input_names=names,
                                  output_names=output_names, dynamic_axes=dims)
                # past 2 GB the TorchScript exporter writes a file per tensor; under, none: one data file either way
                past_2_gb = len(list(Path(tmp).iterdir())) > 1
                if past_2_gb and external_data is False:
                    raise ExportError("the model is past 2 GB, which one ONNX file cannot hold: export it with its "
                                      "weights in a data file beside it (external_data=True, or None to decide by size)")
                if external_data or past_2_gb:
                    save(onnx.load(str(tmp_path)), tmp_path, external_data=True)
        proto = onnx.load(str(tmp_path), load_external_data=False)
        nodes = check_model_graph(proto, lowering=lowering, opset=opset, expected=expected, dynamic=dims,
                                  path=tmp_path)
        digest = hashlib.sha256(tmp_path.read_bytes()).hexdigest()
        data = tmp_path.with_name(f"{tmp_path.name}.data")
        kept_apart = data.exists()
        if kept_apart:  # an earlier model goes first, then the data, the model last (as ops.fuse writes them)
            path.unlink(missing_ok=True)
            os.replace(data, path.with_name(data.name))
        os.replace(tmp_path, path)
        if not kept_apart:  # an earlier export's weights would only mislead
            path.with_name(f"{path.name}.data").unlink(missing_ok=True)
    return ModelExport(path=str(path), exporter=exporter, lowering=lowering, opset=opset, sha256=digest,
                       inputs=[i.name for i in proto.graph.input], outputs=[o.name for o in proto.graph.output],
                       myops_nodes=dict(nodes), graph=describe(proto),
                       external_data=str(path.with_name(f"{path.name}.data")) if kept_apart else None,
                       warnings=sorted({str(w.message).splitlines()[0] for w in caught}))


def _dynamo_shapes(dynamic_shapes: dict | None, names: list[str]):
    """torch.export's form: every argument by its name (non-tensor keyword inputs such as use_cache too,
    as None), each tensor's dynamic axes as Dim (one Dim per axis name, so that inputs sharing a name
    share the dimension)."""
    if not dynamic_shapes:
        return None
    from torch.export import Dim

    made: dict[str, object] = {}

    def dim(value):
        return made.setdefault(value, Dim(value)) if isinstance(value, str) else value

    return {name: {int(axis): dim(d) for axis, d in dynamic_shapes[name].items()} if name in dynamic_shapes else None
            for name in names}


def _torchscript_save(model, args: tuple, kwargs: dict, path: Path, *, lowering: str, opset: int, input_names,
                      output_names, dynamic_axes: dict) -> None:
    try:
        with torchscript_symbolics(OPS.values(), lowering):
            torch.onnx.export(
                model, args + ((kwargs,) if kwargs else ()), str(path), **torchscript_choice(), opset_version=opset,
                input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes or None,
                custom_opsets={DOMAIN: DOMAIN_VERSION} if lowering == "custom" else None,
            )
    except torch.onnx.errors.UnsupportedOperatorError as exc:
        # Its message goes on with the whole TorchScript graph (thousands of lines for a transformer).
        raise ExportError(f"the TorchScript exporter cannot export this model: {str(exc).splitlines()[0]} "
                          "(Hugging Face models build their attention masks with such ops): "
                          "use exporter='dynamo'") from None


def check_model_graph(proto: onnx.ModelProto, *, lowering: str, opset: int, expected: Counter,
                      dynamic: dict, path: Path | None = None) -> Counter:
    """Raise ExportError, naming each problem, unless the file is valid and holds one myops node per call;
    returns the myops node counts. path: the file, whose data file the checker reads beside it."""
    register_onnx_schemas()
    try:
        onnx.checker.check_model(str(path) if path else proto)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"onnx.checker rejected the export: {exc}") from exc
    problems = []
    nodes = Counter(n.op_type for n in _all_nodes(proto) if n.domain == DOMAIN)
    wanted = Counter({OPS[name].spec.onnx_type: count for name, count in expected.items()}) \
        if lowering == "custom" else Counter()
    if nodes != wanted:
        calls = ", ".join(f"{n} x myops::{name}" for name, n in sorted(expected.items())) or "no myops op"
        problems.append(f"myops nodes {dict(nodes)} != {dict(wanted)} (one eager forward calls {calls}"
                        + ("; the decomposed lowering must leave none)" if lowering == "decomposed" else ")"))
    imports = {o.domain: o.version for o in proto.opset_import}
    if imports.get("", imports.get("ai.onnx")) != opset:
        problems.append(f"default-domain opset {imports.get('', imports.get('ai.onnx'))} != requested {opset}")
    if nodes and imports.get(DOMAIN) != DOMAIN_VERSION:
        problems.append(f"myops nodes without the opset import {DOMAIN}:{DOMAIN_VERSION}")
    inputs = {value.name: value for value in proto.graph.input}
    for name, axes in dynamic.items():
        if name not in inputs:
            problems.append(f"input {name!r} is not in the graph (its inputs: {list(inputs)})")
            continue
        dims = inputs[name].type.tensor_type.shape.dim
        fixed = sorted(axis for axis in axes if axis >= len(dims) or not dims[axis].dim_param)
        if fixed:
            problems.append(f"{name}: axes {fixed} not dynamic (dims {[d.dim_param or d.dim_value for d in dims]})")
    if problems:
        raise ExportError("exported graph is not what was asked for: " + "; ".join(problems)
                          + f"\n  graph holds: {describe(proto)}")
    return nodes


def _all_nodes(proto: onnx.ModelProto):
    """Every node of the graph and of its local functions (the dynamo exporter may keep a module as a function)."""
    yield from proto.graph.node
    for function in proto.functions:
        yield from function.node
