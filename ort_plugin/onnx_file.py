"""Read what a diagnosis needs from an .onnx file, and write a one-node model, without the onnx package.

The infer image carries onnxruntime and numpy only, so this reads the protobuf wire format itself:
opset imports, every node's domain and op type (subgraphs and local functions included) and the
graph inputs' element types and dimensions. Weights are skipped, never decoded. A file cut short
or not a model at all raises ModelFileError saying so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ELEMENT_TYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string",
                 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64",
                 15: "complex128", 16: "bfloat16"}
ELEMENT_TYPE_CODES = {name: code for code, name in ELEMENT_TYPES.items()}

# Field numbers of onnx.proto that are read here.
MODEL_IR_VERSION, MODEL_OPSET_IMPORT, MODEL_GRAPH, MODEL_FUNCTIONS = 1, 8, 7, 25
OPSET_DOMAIN, OPSET_VERSION = 1, 2
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT = 1, 5, 11, 12
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 2, 3, 4, 5, 7
ATTR_NAME, ATTR_GRAPH, ATTR_GRAPHS, ATTR_TYPE = 1, 6, 11, 20
TENSOR_NAME, TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION, DATA_EXTERNAL = 8, 13, 14, 1
ENTRY_KEY, ENTRY_VALUE = 1, 2
VALUE_NAME, VALUE_TYPE = 1, 2
TYPE_TENSOR, TENSOR_ELEM_TYPE, TENSOR_SHAPE, SHAPE_DIM, DIM_VALUE, DIM_PARAM = 1, 1, 2, 1, 1, 2
FUNCTION_NAME, FUNCTION_NODE, FUNCTION_DOMAIN = 1, 7, 10
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class ModelFileError(ValueError):
    """The file is not a readable ONNX model; the message says what is wrong with it."""


@dataclass(frozen=True)
class Node:
    domain: str
    op_type: str
    name: str
    inputs: tuple[str, ...]
    where: str  # "graph", or the subgraph/function path the node sits in

    @property
    def qualified(self) -> str:
        return f"{self.domain or 'ai.onnx'}::{self.op_type}"


@dataclass(frozen=True)
class GraphInput:
    name: str
    element_type: str | None
    dims: tuple[int | str | None, ...] | None  # int: fixed, str: named dynamic axis, None: unnamed; None: no shape

    @property
    def dynamic_axes(self) -> list[int]:
        return [i for i, d in enumerate(self.dims or ()) if not isinstance(d, int)]


@dataclass
class ModelSummary:
    ir_version: int = 0
    opset_imports: dict[str, int] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    inputs: list[GraphInput] = field(default_factory=list)
    local_functions: set[tuple[str, str]] = field(default_factory=set)
    external_data: dict[str, str] = field(default_factory=dict)  # initializer -> its data file, as written


# ---------------------------------------------------------------- wire format

class _Truncated(Exception):
    pass


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise _Truncated()
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(buf: memoryview):
    """(field number, wire type, value): ints for scalars, a memoryview for length-delimited fields."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == VARINT:
            value, pos = _varint(buf, pos)
        elif wire == LENGTH:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise _Truncated()
            value, pos = buf[pos:pos + size], pos + size
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if pos + width > len(buf):
                raise _Truncated()
            value, pos = int.from_bytes(buf[pos:pos + width], "little"), pos + width
        else:
            raise ValueError(f"wire type {wire} (groups are not used by ONNX)")
        yield number, wire, value


def _text(value) -> str:
    return bytes(value).decode("utf-8", errors="replace")


# ---------------------------------------------------------------- reading

def _value_info(buf: memoryview) -> GraphInput:
    name, element_type, dims = "", None, None
    for number, _, value in _fields(buf):
        if number == VALUE_NAME:
            name = _text(value)
        elif number == VALUE_TYPE:
            for t_number, _, t_value in _fields(value):
                if t_number != TYPE_TENSOR:
                    continue
                for s_number, _, s_value in _fields(t_value):
                    if s_number == TENSOR_ELEM_TYPE:
                        element_type = ELEMENT_TYPES.get(s_value, f"type {s_value}")
                    elif s_number == TENSOR_SHAPE:
                        dims = []
                        for d_number, _, d_value in _fields(s_value):
                            if d_number != SHAPE_DIM:
                                continue
                            dim = None
                            for x_number, _, x_value in _fields(d_value):
                                dim = x_value if x_number == DIM_VALUE else _text(x_value) if x_number == DIM_PARAM else dim
                            dims.append(dim)
                        dims = tuple(dims)
    return GraphInput(name, element_type, dims)


def _node(buf: memoryview, where: str, summary: ModelSummary) -> None:
    domain = op_type = name = ""
    inputs = []
    for number, _, value in _fields(buf):
        if number == NODE_DOMAIN:
            domain = _text(value)
        elif number == NODE_OP_TYPE:
            op_type = _text(value)
        elif number == NODE_NAME:
            name = _text(value)
        elif number == NODE_INPUT:
            inputs.append(_text(value))
        elif number == NODE_ATTRIBUTE:
            for a_number, _, a_value in _fields(value):
                if a_number in (ATTR_GRAPH, ATTR_GRAPHS):
                    _graph(a_value, f"{where}/{op_type or 'node'}", summary, top=False)
    summary.nodes.append(Node(domain, op_type, name, tuple(inputs), where))


def _initializer(buf: memoryview) -> tuple[str, str | None]:
    """Its name, and where its data is when that is in another file (data_location EXTERNAL)."""
    name, entries, external = "", {}, False
    for number, _, value in _fields(buf):
        if number == TENSOR_NAME:
            name = _text(value)
        elif number == TENSOR_EXTERNAL_DATA:
            entry = {n: _text(v) for n, _, v in _fields(value)}
            entries[entry.get(ENTRY_KEY, "")] = entry.get(ENTRY_VALUE, "")
        elif number == TENSOR_DATA_LOCATION:
            external = value == DATA_EXTERNAL
    return name, entries.get("location", "") if external else None


def external_data_problems(path: str | os.PathLike, summary: ModelSummary) -> tuple[list[str], list[Path]]:
    """What onnxruntime would refuse in the model's external data (a file missing, or one outside the
    model's folder, which ORT does not read), and the data files that are fine."""
    # the folder the model is named in, and the one it is in after symlinks (a Hugging Face cache links
    # model.onnx into blobs/): ORT reads a data file from either
    folders = [Path(os.path.abspath(path)).parent, Path(path).resolve().parent]
    problems, files = [], []
    for location in sorted(set(summary.external_data.values())):
        named = sorted(n for n, where in summary.external_data.items() if where == location)
        of = f"(of {named[0]}{' and others' if len(named) > 1 else ''})"
        inside = [folder / location for folder in folders if location and not Path(location).is_absolute()
                  and (folder / location).resolve().is_relative_to(folder.resolve())]
        if not inside:
            problems.append(f"external data {location!r} {of} is outside the model's folder {folders[0]}: "
                            "onnxruntime refuses it")
        elif not any(candidate.is_file() for candidate in inside):
            problems.append(f"external data file {location!r} {of} is missing from {folders[0]}")
        else:
            files.append(next(candidate for candidate in inside if candidate.is_file()))
    return problems, files


def _graph(buf: memoryview, where: str, summary: ModelSummary, *, top: bool) -> None:
    initializers, inputs = set(), []
    for number, _, value in _fields(buf):
        if number == GRAPH_NODE:
            _node(value, where, summary)
        elif top and number == GRAPH_INPUT:
            inputs.append(_value_info(value))
        elif top and number == GRAPH_INITIALIZER:
            name, location = _initializer(value)
            initializers.add(name)
            if location is not None:
                summary.external_data[name] = location
    if top:  # before IR 4, weights were listed as inputs too: they are not what a caller feeds
        summary.inputs = [i for i in inputs if i.name not in initializers]


def read_model(source: str | os.PathLike | bytes) -> ModelSummary:
    """Summarise a model from a path or its bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, label = bytes(source), "the model bytes"
    else:
        path = Path(source)
        if not path.is_file():
            raise ModelFileError(f"{path}: no such model file")
        data, label = path.read_bytes(), str(path)
    if not data:
        raise ModelFileError(f"{label} is empty: export the model again")
    summary, has_graph = ModelSummary(), False
    try:
        for number, wire, value in _fields(memoryview(data)):
            if number == MODEL_IR_VERSION and wire == VARINT:
                summary.ir_version = value
            elif number == MODEL_OPSET_IMPORT and wire == LENGTH:
                domain, version = "", 0
                for o_number, _, o_value in _fields(value):
                    domain = _text(o_value) if o_number == OPSET_DOMAIN else domain
                    version = o_value if o_number == OPSET_VERSION else version
                summary.opset_imports["" if domain == "ai.onnx" else domain] = version
            elif number == MODEL_GRAPH and wire == LENGTH:
                has_graph = True
                _graph(value, "graph", summary, top=True)
            elif number == MODEL_FUNCTIONS and wire == LENGTH:
                name = domain = ""
                for f_number, _, f_value in _fields(value):
                    name = _text(f_value) if f_number == FUNCTION_NAME else name
                    domain = _text(f_value) if f_number == FUNCTION_DOMAIN else domain
                summary.local_functions.add((domain, name))
                for f_number, _, f_value in _fields(value):
                    if f_number == FUNCTION_NODE:
                        _node(f_value, f"function {domain}::{name}", summary)
    except _Truncated:
        raise ModelFileError(f"{label} is truncated ({len(data)} bytes end in the middle of a field): "
                             "the copy or download was cut short; copy or export it again") from None
    except (ValueError, TypeError) as exc:
        raise ModelFileError(f"{label} is not an ONNX model (protobuf decoding failed: {exc})") from None
    if not has_graph or summary.ir_version == 0:
        raise ModelFileError(f"{label} is not an ONNX model (no graph or no IR version in it)")
    return summary


# ---------------------------------------------------------------- writing (probe models)

def _key(number: int, wire: int) -> bytes:
    return _encode_varint((number << 3) | wire)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _len_field(number: int, payload: bytes | str) -> bytes:
    payload = payload.encode() if isinstance(payload, str) else payload
    return _key(number, LENGTH) + _encode_varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _key(number, VARINT) + _encode_varint(value)


def _tensor_value(name: str, element_type: str, shape) -> bytes:
    """A tensor value_info; shape: None (unknown rank), else dims as int (fixed) or str (named dynamic axis)."""
    tensor = _int_field(TENSOR_ELEM_TYPE, ELEMENT_TYPE_CODES[element_type])
    if shape is not None:
        dims = b"".join(_len_field(SHAPE_DIM, _int_field(DIM_VALUE, d) if isinstance(d, int) else _len_field(DIM_PARAM, d))
                        for d in shape)
        tensor += _len_field(TENSOR_SHAPE, dims)
    return _len_field(VALUE_NAME, name) + _len_field(VALUE_TYPE, _len_field(TYPE_TENSOR, tensor))


def one_node_model(domain: str, op_type: str, *, since: int = 1, element_type: str = "float32",
                   opset: int = 17, ir_version: int = 8, shape=("n",), inputs=("x",), outputs=("y",)) -> bytes:
    """y, ... = domain::op_type(x, ...), by default on a 1-D tensor of dynamic length.

    inputs: the graph inputs in order; the first has `shape`, the others are [shape[-1]] (a norm's
    scale, say); outputs: the graph outputs in order, each of `shape`. What doctor runs to prove an op
    registers, and (domain "", Identity) the infer image's copy floor.
    """
    node = (b"".join(_len_field(NODE_INPUT, name) for name in inputs)
            + b"".join(_len_field(NODE_OUTPUT, name) for name in outputs)
            + _len_field(NODE_NAME, "probe") + _len_field(NODE_OP_TYPE, op_type) + _len_field(NODE_DOMAIN, domain))
    values = b"".join(_len_field(GRAPH_INPUT, _tensor_value(name, element_type, shape if i == 0 else shape[-1:]))
                      for i, name in enumerate(inputs))
    graph = (_len_field(GRAPH_NODE, node) + _len_field(2, "doctor_probe") + values
             + b"".join(_len_field(GRAPH_OUTPUT, _tensor_value(name, element_type, shape)) for name in outputs))
    opsets = _len_field(MODEL_OPSET_IMPORT, _len_field(OPSET_DOMAIN, "") + _int_field(OPSET_VERSION, opset))
    if domain:
        opsets += _len_field(MODEL_OPSET_IMPORT, _len_field(OPSET_DOMAIN, domain) + _int_field(OPSET_VERSION, since))
    return _int_field(MODEL_IR_VERSION, ir_version) + opsets + _len_field(MODEL_GRAPH, graph)
