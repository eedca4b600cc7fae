"""An op's decomposed form, declared once as a Python function over ONNX op names, and the nodes that
stand for the whole op (ai.onnx Swish, ORT's QuickGelu). Torch-free: the declaration only states the
math; each world reads it through its own emitter (ops/onnx_parts.py: the torch reference, both
exporters' lowerings, the fuse rules; here: the node count an export must hold, the form's text).

    def decomposed(op, x, beta):
        return op.Mul(x, op.Sigmoid(op.Mul(x, beta)))

The function takes the op's inputs, then its attributes, in the declaration's order, and returns its
output (a tuple for several). Numbers are constants. Every emitter folds the same identities
(x*1, x/1, x+0, x-0, x^1) and constant arithmetic, so that an attribute at its identity value leaves no
node in any world: Swish at beta 1 is x*Sigmoid(x) in the lowering, the reference and the fuse rule alike.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

NAN, INF = float("nan"), float("inf")


def _ieee(function):
    """function with IEEE float results where Python's math raises (sqrt(-1) is NaN, 1/0 is inf, exp(1000)
    inf), as ONNX computes them: folding a constant never fails where the graph would run."""
    def folded(*args):
        try:
            value = function(*args)
        except OverflowError:
            return INF
        except (ValueError, ZeroDivisionError):
            return NAN
        return value.real if isinstance(value, complex) and not value.imag else (NAN if isinstance(value, complex)
                                                                                 else float(value))
    return folded


def _divide(a: float, b: float) -> float:
    if b:
        return a / b
    return NAN if a == 0 or math.isnan(a) else math.copysign(INF, a) * math.copysign(1.0, b)


def _log(a: float) -> float:
    return math.log(a) if a > 0 else (-INF if a == 0 else NAN)


# The ONNX ops a decomposed form may use, each with one meaning in every world. Reductions run over the
# last axis and keep it (the row of a rowwise op).
UNARY = {name: _ieee(f) for name, f in {
    "Neg": lambda a: -a, "Abs": abs, "Sqrt": lambda a: math.sqrt(a) if a >= 0 else NAN,
    "Reciprocal": lambda a: _divide(1.0, a), "Exp": math.exp, "Log": _log, "Tanh": math.tanh,
    "Sigmoid": lambda a: 1.0 / (1.0 + math.exp(-a)) if a > -700 else 0.0, "Erf": math.erf,
    "Relu": lambda a: max(a, 0.0), "Softplus": lambda a: math.log1p(math.exp(a)) if a < 700 else a,
}.items()}
BINARY = {name: _ieee(f) for name, f in {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b, "Div": _divide,
    "Pow": lambda a, b: a ** b, "Max": max, "Min": min,
}.items()}
REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax")
# Ops over the whole row that keep its shape (Softmax over the last axis, as torch exports softmax(z, -1)).
ROW_OPS = ("Softmax",)
OVER_THE_ROW = (*REDUCTIONS, *ROW_OPS)
VOCABULARY = (*UNARY, *BINARY, *OVER_THE_ROW)
# (op, which operand, value): that operand at that value makes the node its other operand
IDENTITIES = {("Mul", 0, 1.0), ("Mul", 1, 1.0), ("Div", 1, 1.0), ("Add", 0, 0.0), ("Add", 1, 0.0), ("Sub", 1, 0.0),
              ("Pow", 1, 1.0)}


# the names a fuse rule's functions take besides the op's inputs and attributes (onnxscript's rewriter)
FORM_RESERVED = frozenset({"op", "context"})


class FormError(ValueError):
    """A decomposed form that uses what the emitters do not know, or takes other arguments than the op."""


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Emitter:
    """Calls as `op.Mul(a, b)`: numbers are folded, identities dropped, the rest goes to node(op_type, args)."""

    def node(self, op_type: str, args: tuple):
        raise NotImplementedError

    def __getattr__(self, op_type: str) -> Callable:
        if not op_type[:1].isupper():  # not an ONNX op's name: hasattr() and copies see a plain object
            raise AttributeError(op_type)
        if op_type not in VOCABULARY:
            raise FormError(f"op.{op_type}: a decomposed form may use {', '.join(VOCABULARY)} (one meaning in every "
                            "world: the torch reference, both exporters and the fuse rules)")
        arity = 1 if op_type in UNARY or op_type in OVER_THE_ROW else 2

        def call(*args):
            if len(args) != arity:
                raise FormError(f"op.{op_type} takes {arity} argument{'s' * (arity > 1)}, got {len(args)}")
            if all(is_number(a) for a in args) and op_type not in OVER_THE_ROW:
                return float((UNARY.get(op_type) or BINARY[op_type])(*args))
            for operand, value in enumerate(args):
                if is_number(value) and (op_type, operand, float(value)) in IDENTITIES:
                    return args[1 - operand]
            return self.node(op_type, args)
        return call


class _Counted:
    """A value of the counting emitter: an input or a node's result (the check tells them from numbers)."""


class NodeCounter(Emitter):
    """Counts the nodes a form writes (what an export of its decomposed lowering must hold)."""

    def __init__(self):
        self.nodes = Counter()

    def node(self, op_type, args):
        self.nodes[op_type] += 1
        return _Counted()


class Term:
    """A value of the text emitter: its formula, how tightly it binds (0 sum, 1 product, 2 atom), and
    whether it is made of attributes and numbers only (a constant in an exported file)."""

    def __init__(self, text: str, binding: int = 2, constant: bool = False):
        self.text, self.binding, self.constant = text, binding, constant

    def within(self, binding: int) -> str:
        return self.text if self.binding >= binding else f"({self.text})"


class Text(Emitter):
    """The form as a formula: x*Sigmoid(x*beta). `choices` picks, where the fuse rule matched one of two
    spellings of a node (Div or Mul by Reciprocal, Pow 2 or x*x), the one that was matched, in call order."""

    NAMES = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max"}

    def __init__(self, choices: list[int] | None = None):
        self.choices = list(choices or [])

    def _choice(self) -> int:
        return self.choices.pop(0) if self.choices else 0

    def node(self, op_type, args):
        terms = [arg if isinstance(arg, Term) else Term(f"{float(arg):g}", constant=True) for arg in args]
        term = self._node(op_type, args, *terms, None)
        term.constant = all(t.constant for t in terms)
        return term

    def _node(self, op_type, args, a, b, *_):
        # the fuse rule matches two spellings only where the node is one in the file, not a folded constant
        spelled = not all(t.constant for t in (a, b) if t is not None)
        if op_type == "Div" and spelled and self._choice() == 1:
            return Term(f"{a.within(1)}*Reciprocal({b.text})", 1)
        if op_type == "Pow" and is_number(args[1]) and float(args[1]) == 2.0 and spelled and self._choice() == 1:
            return Term(f"{a.within(2)}*{a.within(2)}", 1)
        if op_type in ("Add", "Sub"):
            return Term(f"{a.text}{'+' if op_type == 'Add' else '-'}{b.within(0 if op_type == 'Add' else 1)}", 0)
        if op_type in ("Mul", "Div"):
            return Term(f"{a.within(1)}{'*' if op_type == 'Mul' else '/'}{b.within(1 if op_type == 'Mul' else 2)}", 1)
        if op_type == "Pow":
            return Term(f"{a.within(2)}^{b.within(2)}")
        return Term(f"{self.NAMES.get(op_type, op_type)}({', '.join(t.text for t in (a, b) if t is not None)})")

    def formula(self, decomposed: Callable, inputs: tuple, attributes: tuple) -> str:
        result = decomposed(self, *(Term(n.lower()) for n in inputs),
                            *(Term(a, constant=True) if isinstance(a, str) else a for a in attributes))
        results = result if isinstance(result, tuple) else (result,)
        return ", ".join(r.text if isinstance(r, Term) else f"{r:g}" for r in results)


@dataclass(frozen=True)
class FusedNode:
    """A node that computes the whole op, written by an exporter or by ONNX Runtime's optimiser: ops.fuse
    replaces it by the op; one in the default domain with an `opset` is what the decomposed lowering writes
    from that opset on, where the installed onnxruntime runs it (the dynamo exporter only)."""
    op_type: str
    domain: str = ""                    # "" is the default domain (ORT writes its contrib fusions in it too)
    attributes: dict = field(default_factory=dict)  # the op's attribute -> the node's attribute
    defaults: dict = field(default_factory=dict)    # the node's attributes' values where absent (cite the schema)
    requires: dict = field(default_factory=dict)    # the node's attribute -> the value it must have to be the op
    opset: int | None = None            # the first default-domain opset that has it, where the lowering writes it

    def __post_init__(self):
        unknown = set(self.requires) - set(self.defaults)
        if unknown:
            raise ValueError(f"FusedNode {self.op_type}: requires {sorted(unknown)} without a default (what the node "
                             "means where the attribute is absent): add them to defaults=")
        missing = set(self.attributes.values()) - set(self.defaults)
        if missing:
            raise ValueError(f"FusedNode {self.op_type}: attributes {sorted(missing)} have no default: add them to "
                             "defaults=")

    @property
    def qualified(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type


def check_form(name: str, decomposed: Callable, inputs: tuple, attributes: dict, outputs: tuple,
               kind: str | None) -> None:
    """FormError, naming the op, where its form is not one the emitters can read (run at its defaults)."""
    taken = sorted({n.lower() for n in inputs} & FORM_RESERVED | set(attributes) & FORM_RESERVED)
    if taken or any(n.lower().startswith("form_") for n in (*inputs, *attributes)):
        raise FormError(f"OpSpec {name!r}: inputs and attributes named {taken or 'form_...'} would meet the fuse "
                        f"rules' own names ({', '.join(sorted(FORM_RESERVED))}, form_*): rename them")
    counter = NodeCounter()
    values = [_Counted() for _ in inputs]
    try:
        result = decomposed(counter, *values, *attributes.values())
    except FormError as exc:
        raise FormError(f"OpSpec {name!r}: its decomposed form: {exc}") from None
    except TypeError as exc:
        raise FormError(f"OpSpec {name!r}: its decomposed form is called as decomposed(op, "
                        f"{', '.join([n.lower() for n in inputs] + list(attributes))}) (inputs, then attributes): "
                        f"{exc}") from None
    results = result if isinstance(result, tuple) else (result,)
    if len(results) != len(outputs) or not all(isinstance(r, _Counted) for r in results):
        raise FormError(f"OpSpec {name!r}: its decomposed form returns {len(results)} value(s); the op has "
                        f"{len(outputs)} output(s) {list(outputs)}, each the result of an op.<Node>(...) call, not a "
                        "number")
    unused = _unused_attributes(decomposed, len(inputs), attributes)
    if unused:
        raise FormError(f"OpSpec {name!r}: its decomposed form does not use the attribute(s) {', '.join(unused)}: "
                        "the reference would ignore them and no fuse rule could read them off a graph; use them in "
                        "the form, or drop them from the declaration")
    reduced = [t for t in counter.nodes if t in OVER_THE_ROW]
    if reduced and kind != "rowwise":
        raise FormError(f"OpSpec {name!r}: its decomposed form works over the last axis ({', '.join(reduced)}), "
                        "which only a rowwise op does: declare kind='rowwise'")


class _ArgumentRecorder(NodeCounter):
    """A NodeCounter that also keeps which values reached a node."""

    def __init__(self):
        super().__init__()
        self.reached = set()

    def node(self, op_type, args):
        self.reached.update(id(a) for a in args)
        return super().node(op_type, args)


def _unused_attributes(decomposed: Callable, inputs: int, attributes: dict) -> list[str]:
    """The attributes whose value reaches no node of the form (each passed as a value of its own)."""
    recorder = _ArgumentRecorder()
    markers = {name: _Counted() for name in attributes}
    try:
        decomposed(recorder, *(_Counted() for _ in range(inputs)), *markers.values())
    except (TypeError, FormError):  # Python arithmetic on an attribute: it is used
        return []
    return [name for name, marker in markers.items() if id(marker) not in recorder.reached]


class OnnxNodes(Emitter):
    """The form as onnx.helper NodeProtos at opset 18 (numbers and axes as initializers): the decomposed
    graph without torch. Values are tensor names; inputs are passed by name."""

    def __init__(self, prefix: str = "form"):
        self.prefix = prefix
        self.nodes, self.initializers = [], []

    def _constant(self, value, integer: bool = False) -> str:
        from onnx import TensorProto, helper

        name = f"{self.prefix}_constant{len(self.initializers)}"
        dims = [len(value)] if isinstance(value, list) else []
        self.initializers.append(helper.make_tensor(name, TensorProto.INT64 if integer else TensorProto.FLOAT, dims,
                                                    value if isinstance(value, list) else [value]))
        return name

    def node(self, op_type, args):
        from onnx import helper

        names = [self._constant(float(a)) if is_number(a) else a for a in args]
        output = f"{self.prefix}{len(self.nodes)}"
        if op_type in REDUCTIONS:
            self.nodes.append(helper.make_node(op_type, [names[0], self._constant([-1], integer=True)], [output],
                                               keepdims=1))
        elif op_type in ROW_OPS:
            self.nodes.append(helper.make_node(op_type, names, [output], axis=-1))
        else:
            self.nodes.append(helper.make_node(op_type, names, [output]))
        return output
