"""An op's ONNX parts and torch reference, read from its declaration (opspec: decomposed=, fused_nodes=):
the schema onnx checks against, both exporters' lowerings, the nodes each lowering must hold, the fuse
rules, and the reference its kernels are tested against. Written once for every op.

custom      one myops node (float attributes), opset import myops:1
decomposed  the declared form in standard ops; a float16 input is cast to float first and each output
            back, so that sums run in float32 as the ops' contract says (a weight's Cast meets an
            initializer, which the exporter's optimiser folds). From the opset of a declared standard
            node (ai.onnx Swish-24, RMSNormalization-23), that node instead, where the installed
            onnxruntime runs it (dynamo only: the TorchScript exporter stops at opset 20).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
from collections import Counter

from opspec import DOMAIN, DOMAIN_VERSION, FormError, OpSpec, Text, forms

SCHEMA_TYPES = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
# The element types the plugin's ops take, which a fuse rule's input must have.
FLOAT_TYPES = ("FLOAT", "FLOAT16")
# The 16-bit float types a decomposed lowering computes in float32 (TorchScript's scalar type name ->
# ONNX element type: onnx.TensorProto.FLOAT16, BFLOAT16).
NARROW_TYPES = {"Half": 10, "BFloat16": 16}
# ReduceSum took its axes as an input from opset 13, ReduceMean and ReduceMax from 18 (onnx/defs/reduction)
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18}


def _signature(names: list[str], defaults: dict) -> inspect.Signature:
    """Positional parameters, the ones in `defaults` keyword-able with their default and annotated float
    (what torch's dynamo exporter reads to tell attributes from inputs)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter(n, kind, default=defaults[n], annotation=float) if n in defaults
                              else inspect.Parameter(n, kind) for n in names])


def _with_signature(function, name: str, names: list[str], defaults: dict):
    function.__signature__ = _signature(names, defaults)
    function.__annotations__ = {n: float for n in defaults}
    function.__name__ = function.__qualname__ = name
    return function


# ---------------------------------------------------------------- the torch reference

_TORCH_UNARY = {"Neg": "torch.neg", "Abs": "torch.abs", "Sqrt": "torch.sqrt", "Reciprocal": "torch.reciprocal",
                "Exp": "torch.exp", "Log": "torch.log", "Tanh": "torch.tanh", "Sigmoid": "torch.sigmoid",
                "Erf": "torch.erf", "Relu": "torch.relu", "Softplus": "torch.nn.functional.softplus"}
_TORCH_OPERATORS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Pow": "**"}
_TORCH_REDUCTIONS = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "amax"}
assert set(_TORCH_UNARY) == set(forms.UNARY) and set(_TORCH_OPERATORS) | {"Max", "Min"} == set(forms.BINARY)


class _TorchSource(forms.Emitter):
    """Writes the form as lines of torch code, one per node: what the reference's function runs. The
    attributes are Python numbers at run time: a node of numbers only is computed by the same functions
    that fold constants (opspec/_forms.py), a number beside a tensor is its operand or a clamp's bound."""

    def __init__(self, scalars: set[str]):
        self.lines = []
        self.scalars = set(scalars)

    def node(self, op_type, args):
        text = [repr(float(a)) if forms.is_number(a) else a for a in args]
        scalar = [forms.is_number(a) or a in self.scalars for a in args]
        name = f"v{len(self.lines)}"
        if all(scalar):
            code = f"{'UNARY' if op_type in forms.UNARY else 'BINARY'}[{op_type!r}]({', '.join(text)})"
            self.scalars.add(name)
        elif op_type in _TORCH_UNARY:
            code = f"{_TORCH_UNARY[op_type]}({text[0]})"
        elif op_type in _TORCH_OPERATORS:
            code = f"{text[0]} {_TORCH_OPERATORS[op_type]} {text[1]}"
        elif op_type in _TORCH_REDUCTIONS:
            code = f"{text[0]}.{_TORCH_REDUCTIONS[op_type]}(-1, keepdim=True)"
        elif op_type == "Softmax":
            code = f"torch.softmax({text[0]}, -1)"
        elif any(scalar):  # Max, Min of a tensor and a number: a clamp's bound
            tensor, bound = (text[1], text[0]) if scalar[0] else (text[0], text[1])
            code = f"torch.clamp({tensor}, {'min' if op_type == 'Max' else 'max'}={bound})"
        else:
            code = f"torch.{'maximum' if op_type == 'Max' else 'minimum'}({text[0]}, {text[1]})"
        self.lines.append(f"    {name} = {code}")
        return name


def torch_reference(spec: OpSpec):
    """The declared form as a torch function reference(x, *other inputs, *attributes) with the torch
    schema's names, as a user writes the composite: in x's dtype, and a form that sums over rows (a
    reduction) in float32 or wider (float64 stays float64: the second derivatives are checked in it),
    each output rounded once to x's dtype, as the ops' contract says. Its source is generated once, so
    a call costs what the composite written by hand costs (the bench's composite rows time it)."""
    import torch

    inputs = list(spec.torch_input_names)
    attributes = [spec.torch_attribute(a) for a in spec.attributes]
    emitter = _TorchSource(set(attributes))
    result = spec.decomposed(emitter, *(f"{n}_wide" for n in inputs), *attributes)
    results = result if isinstance(result, tuple) else (result,)
    parameters = ", ".join(inputs + [f"{a}={spec.attributes[o]!r}" for a, o in zip(attributes, spec.attributes)])
    sums = any(node in forms.OVER_THE_ROW for node in _counted(spec, None))
    source = "\n".join([
        f"def reference({parameters}):",
        *(["    wide = torch.promote_types(x.dtype, torch.float32)"] if sums else []),
        *(f"    {n}_wide = {n}.to(wide)" if sums else f"    {n}_wide = {n}" for n in inputs),
        *emitter.lines,
        "    return " + ", ".join(f"{r}.to(x.dtype)" if sums else r for r in results),
    ])
    scope = {"torch": torch, "UNARY": forms.UNARY, "BINARY": forms.BINARY}
    exec(compile(source, f"<{spec.name} reference: {spec.formula}>", "exec"), scope)  # noqa: S102  (our own source)
    reference = scope["reference"]
    reference.__doc__ = f"{spec.formula}, the composite {DOMAIN}::{spec.name} replaces.\n\n{source}"
    return reference


# ---------------------------------------------------------------- the exporters' emitters

class _TorchScriptEmitter(forms.Emitter):
    """Nodes of a TorchScript symbolic (g.op), numbers as float32 Constants."""

    def __init__(self, g):
        self.g = g

    def _constant(self, value, dtype=None):
        import torch

        return self.g.op("Constant", value_t=torch.tensor(value, dtype=dtype or torch.float32))

    def node(self, op_type, args):
        import torch

        values = [self._constant(float(a)) if forms.is_number(a) else a for a in args]
        if op_type in forms.REDUCTIONS:
            if self.g.opset >= AXES_INPUT_SINCE[op_type]:
                return self.g.op(op_type, values[0], self._constant([-1], torch.int64), keepdims_i=1)
            return self.g.op(op_type, values[0], axes_i=[-1], keepdims_i=1)
        if op_type in forms.ROW_OPS:
            return self.g.op(op_type, values[0], axis_i=-1)
        return self.g.op(op_type, *values)


class _OnnxscriptEmitter(forms.Emitter):
    """Nodes of a dynamo translation (onnxscript, opset 18: the exporter builds there and converts)."""

    def __init__(self):
        from onnxscript import opset18

        self.op = opset18

    def node(self, op_type, args):
        values = [self.op.Constant(value_float=float(a)) if forms.is_number(a) else a for a in args]
        if op_type in forms.REDUCTIONS:
            return getattr(self.op, op_type)(values[0], self.op.Constant(value_ints=[-1]), keepdims=1)
        if op_type in forms.ROW_OPS:
            return getattr(self.op, op_type)(values[0], axis=-1)
        return getattr(self.op, op_type)(*values)


_UNKNOWN = object()  # an attribute's value not known: no node of it folds away


def _counted(spec: OpSpec, attributes: dict | None) -> Counter:
    """The nodes the decomposed form writes with these attributes (None: attributes as unknown values, so
    that no node folds away: every node type the form can write)."""
    counter = forms.NodeCounter()
    values = [object() for _ in spec.inputs]
    given = [object() for _ in spec.attributes] if attributes is None else \
        [attributes.get(a, attributes.get(spec.torch_attribute(a), default)) for a, default in spec.attributes.items()]
    spec.decomposed(counter, *values, *given)
    return counter.nodes


@functools.lru_cache(maxsize=None)
def probe_runs(opset: int, op_type: str, inputs: tuple = (("x", (2,)),), attributes: tuple = ()) -> bool:
    """Whether the installed onnxruntime loads and runs one `op_type` node at `opset` on float inputs of
    these (name, shape) pairs, with these (name, value) attributes: a tiny probe graph."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    names = [name for name, _ in inputs]
    node = helper.make_node(op_type, names, ["y"], **dict(attributes))
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                                                for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(inputs[0][1]))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, {n: np.ones(s, np.float32) for n, s in inputs})
    except Exception:  # onnxruntime's own exception types; a failure is the answer
        return False
    return True


def _standard_runs(spec: OpSpec, opset: int) -> bool:
    """Whether the installed onnxruntime runs the op's standard node at `opset` ([2, 4] inputs, [4] weights)."""
    node = spec.standard_node
    inputs = tuple((n.lower(), (2, 4) if i < spec.full_inputs else (4,)) for i, n in enumerate(spec.inputs))
    attributes = {**node.requires, **{a: node.defaults[a] for a in node.attributes.values()}}
    return probe_runs(opset, node.op_type, inputs, tuple(sorted(attributes.items())))


class DeclaredOnnx:
    """An op's ONNX parts, from its declared decomposed form (TorchOp.onnx)."""

    FUSE_BY_DEFAULT = True

    def __init__(self, spec: OpSpec):
        if spec.decomposed is None:
            raise FormError(f"opspec/{spec.name}.py declares no decomposed form")
        self.spec = spec
        self.standard = spec.standard_node
        self.NODE_TYPES = {spec.qualified, "Cast", *_counted(spec, None), *(n.qualified for n in spec.fused_nodes)}

    # ------------------------------------------------------------ schema and checks

    def register_schema(self) -> None:
        """Teach onnx (checker, onnxscript) the op: its inputs and outputs of one float type, its float
        attributes with their defaults."""
        import onnx

        spec = self.spec
        if onnx.defs.has(spec.onnx_type, DOMAIN):
            return
        # NOTE: onnx.reference indexes all schemas by bare name when first imported and refuses two of one
        # name (ai.onnx Swish-24 and ours); onnxscript's optimizer imports it, so index before we register.
        importlib.import_module("onnx.reference")
        from onnx.defs import OpSchema

        schema = OpSchema(
            spec.onnx_type, DOMAIN, DOMAIN_VERSION,
            doc=f"{', '.join(spec.outputs)} = {spec.formula}" + (", summed in float32" if spec.kind == "rowwise" else ""),
            inputs=[OpSchema.FormalParameter(name, "T") for name in spec.inputs],
            outputs=[OpSchema.FormalParameter(name, "T") for name in spec.outputs],
            type_constraints=[("T", SCHEMA_TYPES, "floating tensors")],
            attributes=[OpSchema.Attribute(name, onnx.helper.make_attribute(name, float(value)), f"default {value:g}")
                        for name, value in spec.attributes.items()],
        )
        onnx.defs.register_schema(schema)

    def uses_standard(self, opset: int, exporter: str = "dynamo") -> bool:
        return (self.standard is not None and exporter == "dynamo" and opset >= self.standard.opset
                and _standard_runs(self.spec, opset))

    def expected_nodes(self, lowering: str, opset: int, exporter: str, attributes: dict | None = None,
                       dtype: str = "float32") -> Counter:
        if lowering == "custom":
            return Counter({self.spec.qualified: 1})
        if self.uses_standard(opset, exporter):
            return Counter({self.standard.qualified: 1})
        nodes = _counted(self.spec, attributes or {})  # by ONNX or torch name; the declared defaults elsewhere
        # float16: each full-shaped input cast in and each output out; a weight's Cast is folded into it
        return nodes + (Counter({"Cast": self.spec.full_inputs + len(self.spec.outputs)}) if dtype != "float32"
                        else Counter())

    # ------------------------------------------------------------ lowerings

    def _standard_attributes(self, values: list) -> dict:
        named = dict(zip(self.spec.attributes, values))
        return {**self.standard.requires, **{node: float(named[ours]) for ours, node in self.standard.attributes.items()}}

    def torchscript_symbolic(self, lowering: str):
        from torch.onnx import symbolic_helper

        spec = self.spec
        tensors, outputs = len(spec.inputs), len(spec.outputs)

        def typed(results, x):
            results = results if isinstance(results, tuple) else (results,)
            for result in results:
                result.setType(x.type())  # each output has x's type and shape: no "shape inference missing" warning
            return results if outputs > 1 else results[0]

        def custom(g, *args):
            attributes = {f"{name}_f": value for name, value in zip(spec.attributes, args[tensors:])}
            return typed(g.op(spec.qualified, *args[:tensors], **attributes, outputs=outputs), args[0])

        def decomposed(g, *args):
            # a 16-bit x (a CUDA model; model_export takes them) is summed in float32, as the contract says:
            # each tensor cast in, computed, each output cast back
            x = args[0]
            stored = x.type().scalarType() if x.type().kind() == "TensorType" else None
            if stored not in NARROW_TYPES:
                return typed(spec.decomposed(_TorchScriptEmitter(g), *args), x)
            wide = [g.op("Cast", t, to_i=1) for t in args[:tensors]]  # 1: onnx.TensorProto.FLOAT
            results = spec.decomposed(_TorchScriptEmitter(g), *wide, *args[tensors:])
            results = results if isinstance(results, tuple) else (results,)
            narrowed = tuple(g.op("Cast", r, to_i=NARROW_TYPES[stored]) for r in results)
            return typed(narrowed if outputs > 1 else narrowed[0], x)

        # parse_args reads the parameters' names off the signature: one per argument of the torch schema
        names = ["g", *spec.torch_input_names, *(spec.torch_attribute(a) for a in spec.attributes)]
        chosen = _with_signature(custom if lowering == "custom" else decomposed, f"{spec.name}_{lowering}", names, {})
        return symbolic_helper.parse_args(*("v" * tensors), *("f" * len(spec.attributes)))(chosen)

    def dynamo_translation(self, lowering: str, opset: int):
        import onnx
        import onnxscript

        spec = self.spec
        names = [*spec.torch_input_names, *(spec.torch_attribute(a) for a in spec.attributes)]
        defaults = {spec.torch_attribute(a): float(v) for a, v in spec.attributes.items()}
        signature = _signature(names, defaults)
        tensors = len(spec.inputs)

        def arguments(args, kwargs) -> list:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return list(bound.arguments.values())

        if lowering == "custom":
            self.register_schema()
            myops = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)

            def custom(*args, **kwargs):
                values = arguments(args, kwargs)
                attributes = {name: float(value) for name, value in zip(spec.attributes, values[tensors:])}
                return getattr(myops, spec.onnx_type)(*values[:tensors], **attributes)

            return _with_signature(custom, f"{spec.name}_custom", names, defaults)

        if self.uses_standard(opset, "dynamo"):
            standard = onnxscript.values.Opset("", opset)

            def standard_node(*args, **kwargs):
                values = arguments(args, kwargs)
                return getattr(standard, self.standard.op_type)(*values[:tensors],
                                                                **self._standard_attributes(values[tensors:]))

            return _with_signature(standard_node, f"{spec.name}_standard", names, defaults)

        def decomposed(*args, **kwargs):
            values = arguments(args, kwargs)
            emitter = _OnnxscriptEmitter()
            # The exporter's values carry their element type (onnx_ir DataType, an int enum): a narrow
            # input is summed in float32, as the contract says: cast in, compute, cast back.
            stored = getattr(values[0], "dtype", None)
            narrow = stored is not None and int(stored) in NARROW_TYPES.values()

            def wide(value):
                kind = getattr(value, "dtype", None)
                return emitter.op.Cast(value, to=onnx.TensorProto.FLOAT) if kind is not None and \
                    int(kind) in NARROW_TYPES.values() else value

            tensors_in = [wide(v) for v in values[:tensors]] if narrow else values[:tensors]
            result = spec.decomposed(emitter, *tensors_in, *(float(v) for v in values[tensors:]))
            results = result if isinstance(result, tuple) else (result,)
            if narrow:
                results = tuple(emitter.op.Cast(r, to=int(stored)) for r in results)
            return results if len(results) > 1 else results[0]

        return _with_signature(decomposed, f"{spec.name}_decomposed", names, defaults)

    # ------------------------------------------------------------ fuse rules

    def fuse_rules(self, report) -> list:
        """ops.fuse's onnxscript rules: the declared form (with Div also as Mul by Reciprocal, Pow 2 also as
        x*x, an attribute at a value that makes its node an identity also as that node left out, as every
        lowering writes it: x*Sigmoid(x) for Swish at beta 1, no Add for RMSNorm at epsilon 0), and each
        declared fused node. Constants must be one-element constants, reductions over the last axis keeping
        it, weights one value per channel; where not, refused with the reason."""
        rules = [self._form_rule(report, fixed={})]
        unknown = dict.fromkeys(self.spec.attributes, _UNKNOWN)
        every_node = sum(_counted(self.spec, None).values())
        for name in self.spec.attributes:
            for value in sorted({v for _, _, v in forms.IDENTITIES}):
                if sum(_counted(self.spec, {**unknown, name: value}).values()) < every_node:
                    rules.append(self._form_rule(report, fixed={name: value}))
        rules += [self._fused_node_rule(report, node) for node in self.spec.fused_nodes]
        return rules

    def _input_names(self) -> list[str]:
        return [n.lower() for n in self.spec.inputs]

    def _checks(self, report, form: str, values: list, node=None):
        """The checks every form shares: float input, shapes as the op's kind takes them. False, or a
        failed MatchResult, where refused."""
        from onnxscript.rewriter import pattern

        spec = self.spec
        x = values[0]
        if not float_input(report, spec.name, form, x):
            return False
        if not same_shapes(report, spec.name, form, *values[:spec.full_inputs]):
            return False
        for name, weight in zip(spec.inputs[spec.full_inputs:], values[spec.full_inputs:]):
            if not _per_channel(x, weight):
                reason = (f"the {name.lower()} ({weight.name}) is not one value per channel of x (shapes "
                          f"{_shape_of(weight)} and {_shape_of(x)})")
                report.refuse(spec.name, form, where(node.outputs[0] if node is not None else weight), reason)
                return pattern.MatchResult().fail(reason)
        return True

    def _form_rule(self, report, fixed: dict):
        from onnxscript.rewriter import pattern

        spec = self.spec
        inputs = self._input_names()
        variable = [a for a in spec.attributes if a not in fixed]
        built = {}

        def target(op, *values):
            emitter = _PatternEmitter(op, dict(zip(variable, values[len(inputs):])))
            attributes = [fixed[a] if a in fixed else values[len(inputs) + variable.index(a)] for a in spec.attributes]
            result = spec.decomposed(emitter, *values[:len(inputs)], *attributes)
            built["emitter"] = emitter
            return result

        _with_signature(target, f"{spec.name}_form", ["op", *inputs, *variable], {})
        pending = {}
        shown = [fixed.get(a, a) for a in spec.attributes]

        def check(context, **bound):
            emitter = built["emitter"]
            choices = [bound.get(tag) or 0 for tag in emitter.alternatives]
            form = Text(choices).formula(spec.decomposed, spec.inputs, tuple(shown))
            for name, want in emitter.constants.items():
                value = bound.get(name)
                if value is not None and (scalar(value) is None or not math.isclose(scalar(value), want, rel_tol=1e-6)):
                    return pattern.MatchResult().fail(f"a constant is not {want}")
            values = [bound[n] for n in inputs]
            done = self._checks(report, form, values)
            if done is not True:
                return done
            x = values[0]
            for name in emitter.reductions:
                reduced = bound[name].producer()
                axes = _axes(reduced)
                if axes is None and reduced.op_type in forms.ROW_OPS:
                    return _refuse(report, spec.name, form, bound[name], f"the {reduced.op_type} has no axis before "
                                   "opset 13, where it works over the input flattened from axis 1, not the last one")
                if axes is None or not _last_axis(axes, _rank(x)):
                    return _refuse(report, spec.name, form, bound[name], f"the {reduced.op_type} is over axes {axes}, "
                                                                         "not the last one")
                keepdims = reduced.attributes.get("keepdims")
                if keepdims is not None and keepdims.as_int() != 1:
                    return _refuse(report, spec.name, form, bound[name], f"the {reduced.op_type} drops its axis "
                                                                         "(keepdims 0)")
            attributes = dict(fixed)
            for name in variable:
                if bound.get(name) is None:  # used only inside a node of attributes: known through it alone
                    return pattern.MatchResult().fail(f"{name} is not read directly")
                value = scalar(bound[name])
                if value is None:
                    return _refuse(report, spec.name, form, bound[name], f"{name} ({bound[name].name}) is not a "
                                   "one-element constant, so it is not a value known before run time")
                attributes[name] = value
            for name, expression in emitter.derived.items():
                want, got = _evaluate(expression, attributes, emitter.derived), scalar(bound[name])
                if got is None or not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
                    return pattern.MatchResult().fail(f"a constant is not the one the attributes give ({want})")
            pending["call"] = (form, attributes)
            return True

        def rewrite(op, **bound):
            form, attributes = pending.pop("call")
            report.replace(spec.name, form)
            return self._fused(op, [bound[n] for n in inputs], attributes)

        rule = pattern.RewriteRule(target, rewrite, check, name=f"{spec.name} {spec.formula}"
                                   + "".join(f" {a}={v:g}" for a, v in fixed.items()))
        # a form without an identity node is part of the whole one (x*w without its +eps): ops.fuse tries
        # these rules only after every whole form has had its turn
        rule.myops_identity_variant = bool(fixed)
        return rule

    def _fused(self, op, inputs: list, attributes: dict):
        spec = self.spec
        outputs = len(spec.outputs)
        ordered = {name: float(attributes[name]) for name in spec.attributes}
        return getattr(op, spec.onnx_type)(*inputs, **ordered, _domain=DOMAIN,
                                           **({"_outputs": outputs} if outputs > 1 else {}))

    def _fused_node_rule(self, report, node):
        from onnxscript.rewriter import pattern

        spec = self.spec
        inputs = self._input_names()
        form = f"{node.domain} {node.op_type}" if node.domain else \
            (f"ai.onnx {node.op_type}" if node.opset is not None else node.op_type)
        pending = {}

        def target(op, *values):
            return getattr(op, node.op_type)(*values, _domain=node.domain, _allow_other_attributes=True,
                                             **({"_outputs": len(spec.outputs)} if len(spec.outputs) > 1 else {}))

        _with_signature(target, f"{spec.name}_{node.op_type}", ["op", *inputs], {})

        def check(context, **bound):
            matched = context.root
            values = [bound[n] for n in inputs]
            done = self._checks(report, form, values, matched)
            if done is not True:
                return done
            given = {k: matched.attributes[k].value if k in matched.attributes else v for k, v in node.defaults.items()}
            types = {v.dtype for v in values if v.dtype is not None}
            if len(types) > 1:
                return _refuse(report, spec.name, form, matched.outputs[0],
                               f"its inputs are {sorted(t.name for t in types)}; {spec.qualified} takes one type for all")
            for name, want in node.requires.items():
                value = given[name]
                rank = _rank(values[0])
                if value != want and not (isinstance(want, int) and want < 0 and rank is not None and value == rank + want):
                    return _refuse(report, spec.name, form, matched.outputs[0], f"its {name} is {value}, not {want}")
            if any(out.uses() for out in matched.outputs[len(spec.outputs):]):
                return _refuse(report, spec.name, form, matched.outputs[0], "an output the op does not have is used")
            pending["attributes"] = {**spec.attributes, **{ours: float(given[theirs])
                                                            for ours, theirs in node.attributes.items()}}
            return True

        def rewrite(op, **bound):
            report.replace(spec.name, form)
            return self._fused(op, [bound[n] for n in inputs], pending.pop("attributes"))

        return pattern.RewriteRule(target, rewrite, check, name=f"{spec.name} {form}")


class _PatternEmitter(forms.Emitter):
    """Pattern nodes of a fuse rule. A number becomes a variable checked against it (exporters write 2 as
    an int or a float); Div matches Div or Mul by Reciprocal, Pow 2 matches Pow or x*x; a reduction matches
    with any axes and keepdims, checked after."""

    def __init__(self, op, attributes: dict):
        self.op = op
        self.constants = {}      # variable -> the number it must be
        self.reductions = []     # variables of the reductions' outputs
        self.alternatives = []   # tag variables of the two-spelling nodes, in call order (Text's choices)
        # A node of attributes and numbers only (Neg(limit)) is a constant in an exported file: a variable
        # whose value the check computes from the attributes read elsewhere. variable -> (op, operands).
        self.derived = {}
        self._symbolic = {id(var): ("attribute", name) for name, var in attributes.items()}

    def _expression(self, value):
        if forms.is_number(value):
            return ("number", float(value))
        return self._symbolic.get(id(value))

    def _value(self, value):
        from onnxscript.rewriter import pattern

        if not forms.is_number(value):
            return value
        name = f"form_constant{len(self.constants)}"
        self.constants[name] = float(value)
        return pattern.Var(name)

    def _either(self, first, second):
        from onnxscript.rewriter import pattern

        tag = f"form_spelling{len(self.alternatives)}"
        self.alternatives.append(tag)
        return pattern.OrValue([first, second], tag_var=tag, tag_values=(0, 1))

    def node(self, op_type, args):
        from onnxscript.rewriter import pattern

        op = self.op
        expressions = [self._expression(a) for a in args]
        if all(e is not None for e in expressions) and op_type not in forms.OVER_THE_ROW:
            name = f"form_derived{len(self.derived)}"
            self.derived[name] = (op_type, expressions)
            var = pattern.Var(name)
            self._symbolic[id(var)] = ("derived", name)
            return var
        if op_type == "Pow" and forms.is_number(args[1]) and float(args[1]) == 2.0:
            a = args[0]
            return self._either(op.Pow(a, self._value(args[1])), op.Mul(a, a))
        values = [self._value(a) for a in args]
        if op_type == "Div":
            return self._either(op.Div(*values), op.Mul(values[0], op.Reciprocal(values[1])))
        if op_type in forms.OVER_THE_ROW:
            name = f"form_reduced{len(self.reductions)}"
            self.reductions.append(name)
            return getattr(op, op_type)(values[0], _allow_other_inputs=True, _allow_other_attributes=True,
                                        _outputs=[name])
        return getattr(op, op_type)(*values)


def _evaluate(expression, attributes: dict, derived: dict) -> float:
    """The value of a node of attributes and numbers (the pattern emitter's derived constants)."""
    op_type, operands = expression
    values = []
    for kind, value in operands:
        values.append(value if kind == "number" else attributes[value] if kind == "attribute"
                      else _evaluate(derived[value], attributes, derived))
    return float((forms.UNARY.get(op_type) or forms.BINARY[op_type])(*values))


# ---------------------------------------------------------------- what a rule's check reads of a match

def scalar(value) -> float | None:
    """The float of a one-element constant (an initializer or a Constant node's output), else None."""
    import numpy as np

    const = getattr(value, "const_value", None)
    if const is None:
        return None
    array = np.asarray(const.numpy())
    return float(array.reshape(())) if array.size == 1 else None


def where(value) -> str:
    """A node's name for the report: the producer of `value`, or the value's own name."""
    producer = value.producer() if hasattr(value, "producer") else None
    return (producer.name if producer is not None and producer.name else None) or getattr(value, "name", None) or "?"


def float_input(report, op: str, form: str, x) -> bool:
    """Whether x's element type is one the op takes (unknown: yes, and the proof decides); refused else."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or dtype.name in FLOAT_TYPES:
        return True
    report.refuse(op, form, where(x), f"its input is {dtype.name}; {DOMAIN}::{op} takes float and float16")
    return False


def _may_broadcast(a, b) -> bool:
    """Whether two known shapes can differ: other ranks, two fixed sizes that differ, or a fixed 1
    against a symbolic size (which broadcasts)."""
    if len(a) != len(b):
        return True
    for p, q in zip(a, b):
        fixed_p, fixed_q = isinstance(p, int), isinstance(q, int)
        if (fixed_p and fixed_q and p != q) or (fixed_p != fixed_q and 1 in (p, q)):
            return True
    return False


def same_shapes(report, op: str, form: str, x, *others) -> bool:
    """Whether each other input has x's shape (the fused op does not broadcast as the decomposed graph's
    Mul or Add may): refused where known shapes tell they may differ; unknown: yes, and the proof decides."""
    shape = getattr(x, "shape", None)
    for other in others:
        theirs = getattr(other, "shape", None)
        if shape is not None and theirs is not None and _may_broadcast(tuple(shape), tuple(theirs)):
            report.refuse(op, form, where(other), f"its inputs broadcast ({list(shape)} and {list(theirs)}); "
                          f"{DOMAIN}::{op} takes inputs of one shape")
            return False
    return True


def _refuse(report, op: str, form: str, value, reason: str):
    from onnxscript.rewriter import pattern

    report.refuse(op, form, where(value), reason)
    return pattern.MatchResult().fail(reason)


def _rank(value) -> int | None:
    return len(value.shape) if value.shape is not None else None


def _shape_of(value):
    return None if value.shape is None else [str(d) for d in value.shape]


def _last_axis(axes, rank) -> bool:
    return len(axes) == 1 and (axes[0] == -1 or (rank is not None and axes[0] == rank - 1))


def _axes(node) -> list | None:
    """A reduction's axes: its second input (a constant) from opset 18 (13 for ReduceSum), else its attribute.
    Softmax's: its axis, which is -1 where absent from opset 13 (before, 1 over a flattened input)."""
    if node.op_type in forms.ROW_OPS:
        if "axis" in node.attributes:
            return [node.attributes["axis"].as_int()]
        imports = node.graph.opset_imports if node.graph is not None else {}
        opset = imports.get("", imports.get("ai.onnx"))
        return [-1] if opset is not None and opset >= 13 else None
    axes_input = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_input is not None:
        return axes_input.const_value.numpy().tolist() if axes_input.const_value is not None else None
    return list(node.attributes["axes"].as_ints()) if "axes" in node.attributes else None


def _per_channel(x, weight) -> bool:
    """weight is [C] where x is [..., C] (C unknown on either side: the proof decides)."""
    if weight.shape is None or len(weight.shape) != 1:
        return False
    channels = x.shape[-1] if x.shape is not None and len(x.shape) else None
    return not (isinstance(channels, int) and isinstance(weight.shape[0], int) and channels != weight.shape[0])
