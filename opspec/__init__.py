"""The myops ops as ONNX and the benchmark see them: one torch-free declaration per op.

Each op declares itself in opspec/<name>.py (`SPEC = OpSpec(...)`); this package finds them, so adding
an op adds a file and edits none. Both sides read the catalogue: the training side (ops/) for names,
defaults and models, the inference side (infer/, ort_plugin/, shipped without torch) for the inputs a
probe must feed and the workloads a benchmark runs. An op's decomposed form (`decomposed=`, in ONNX ops:
opspec/_forms.py) gives its torch reference, both ONNX lowerings and its fuse rules (ops/onnx_parts.py);
its tolerances, targets and native function are declared here too, and what ops.apply swaps for it and
the models that hold it (ops.declaration builds both from these data). Its math is kernels/<name>.h: an
elementwise op's one-element forward and backward, around which opspec/codegen writes the CPU loops and
CUDA launchers (unless `own_kernels` says the header writes them). An op of a kind (`kind=`) gets the
extension's and the plugin's adapters from its declaration (opspec/codegen); a torch op needs one (its
fakes and autograd are its kind's).
"""
from __future__ import annotations

import importlib
import math
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

from . import _forms as forms  # noqa: F401  (the emitters that read a decomposed form: `from opspec import forms`)
from ._forms import FormError, FusedNode, Text, check_form  # noqa: F401  (the declarations' vocabulary)

DOMAIN = "myops"
DOMAIN_VERSION = 1
KINDS = (None, "elementwise", "rowwise")
# Names the generated adapters (opspec.codegen) use for their own values, and C++ keywords a torch name
# could be: an op's inputs and attributes may not be called so.
GENERATED_RESERVED = frozenset({
    "a", "in", "out", "n", "rows", "cols", "workspace", "dtype", "stream", "result", "m", "at", "std", "myops",
    "T", "weights_", "weight_grads_",
    "auto", "bool", "char", "class", "const", "default", "delete", "do", "double", "enum", "float", "int", "long",
    "new", "operator", "private", "public", "register", "short", "signed", "static", "struct", "switch", "template",
    "this", "typename", "union", "unsigned", "using", "virtual", "void", "volatile",
})


@dataclass(frozen=True)
class WorkloadSpec:
    """A benchmark shape of an op: float32 [batch, seq, hidden] into one of the op's models."""
    name: str
    title: str                  # what the report's headings call it
    batch: int = 8
    seq: int = 512
    hidden: int = 768
    model: str = ""             # the exported model that runs it (default: the op alone, named like the op)
    gpu_only: bool = False      # too large to be worth a CPU run


# The ops package's own public names (ops.apply ...), beside which each op's function is ops.<name>.
TORCH_PACKAGE_NAMES = frozenset({"OPS", "apply", "export_model", "load", "reference"})
# The models an op may declare besides the op alone (OpSpec.models): name -> what each is, built by ops
# (ops.declaration) around the op's function.
MODEL_FORMS = {"feed_forward": "Linear(h -> 4h), the op, Linear(4h -> h): a transformer's feed-forward block"}


@dataclass(frozen=True)
class Replaces:
    """How ops.apply reads the op's arguments off an instance of a module class it swaps (OpSpec.replaces)."""
    # the op's attribute (torch name) -> the module's attribute that holds it (a str), or a constant (a number)
    attributes: dict = field(default_factory=dict)
    # the op's weight (torch name) -> the module's attribute that holds it, where the names differ
    weights: dict = field(default_factory=dict)
    # the op's weight -> c, for a module that scales by its parameter + c (Gemma's RMSNorm: 1 + weight)
    offsets: dict = field(default_factory=dict)
    # the op's attributes whose None on the module means its input dtype's machine epsilon (torch.nn.RMSNorm's
    # eps=None): float32's, for a module whose weight is float32
    none_is_epsilon: tuple = ()


@dataclass(frozen=True)
class OpSpec:
    name: str                   # the torch name: torch.ops.myops.<name>
    onnx_type: str              # the ONNX node's op_type in the myops domain
    inputs: tuple[str, ...]     # ONNX inputs: the first `full_inputs` have X's shape, the rest are [X.shape[-1]]
    attributes: dict = field(default_factory=dict)  # ONNX float attributes and their defaults
    torch_attributes: dict = field(default_factory=dict)  # ONNX attribute -> the torch schema's argument, where they differ
    workloads: tuple[WorkloadSpec, ...] = ()
    native_row: str | None = None  # the bench row of PyTorch's own function for the op (F.silu ...), if any
    plugin_only: bool = False   # a plugin kernel with no torch op (the benchmark's Copy floor)
    full_inputs: int = 1        # how many inputs, X first, have X's full shape (a gated op's X and gate: 2)
    outputs: tuple[str, ...] = ("Y",)  # ONNX outputs, each of X's shape (a fused add + norm: Y and the sum)
    # How its kernels walk the data: "elementwise" (every input X's shape) or "rowwise" (whole rows of the
    # last axis; inputs after the full-shaped ones are weights of shape [X.shape[-1]]). The generic adapters
    # (ops/csrc, ort_plugin/src, called by the few lines opspec/codegen writes) serve an op of a kind;
    # None: its adapters are written by hand.
    kind: str | None = None
    torch_inputs: dict = field(default_factory=dict)  # ONNX input -> the torch schema's argument, where they differ
    # The op as standard ONNX ops (opspec/_forms.py): decomposed(op, *inputs, *attributes). It is the torch
    # reference, the decomposed lowering of both exporters and the first fuse rule (a torch op needs one).
    decomposed: Callable | None = None
    # Nodes that compute the whole op (ai.onnx Swish, ORT's QuickGelu): fused into it; one with an opset is
    # the decomposed lowering from that opset on, where ORT runs it.
    fused_nodes: tuple = ()
    # What an op's math header writes itself, per device: "cpu", its own loops (an elementwise op's
    # forward_span and backward_span, a rowwise op's forward_rows and backward_rows); "cuda", its own
    # launchers (kernels/<name>_cuda.cu). Elsewhere opspec/codegen writes them around its math: an
    # elementwise op's one-element forward and backward, a rowwise op's per-element functions
    # (accumulate, merge, finish, forward, ...: kernels/rowwise_cpu.h).
    own_kernels: tuple[str, ...] = ()
    # An elementwise op whose math header also defines forward_16bit (forward's arguments), a faster form for
    # float16 and bfloat16 storage on CUDA whose error stays below one ulp of the 16-bit result (Swish's
    # fast exp and division): the generated launchers use it for those types, forward for float32.
    forward_16bit: bool = False
    # The torch side (ops.declaration makes the op's TorchOp from these and the fields below): PyTorch's
    # own function as an expression in the torch inputs and attributes, torch and F (its bench row is
    # native_row, default torch_native_<name>); layer 1's tolerances, dtype -> (rtol, atol); the bench
    # targets, (name, numerator row, denominator rows, limit) each.
    native: str = ""
    # Where the native function is the op (an expression in the attributes' torch names, torch and F;
    # F.silu is Swish at beta 1 only: "beta == 1.0"; F.rms_norm exists from torch 2.4: 'hasattr(F, "rms_norm")')
    native_when: str = ""
    tolerances: dict = field(default_factory=lambda: {"float32": (1.3e-6, 1e-6)})
    targets: tuple = ()
    # The catalogue's first op: the one the lab's tools take where none is named (the seed's Swish). One op
    # declares it.
    primary: bool = False
    # What ops.apply swaps for the op in a user's model: module classes by import path (nothing is imported to
    # declare them), each with how its arguments are read off it; functions held as module attributes
    # (F.silu) with the attributes they mean; classes that look alike but compute something else, with why;
    # class-name fragments whose undeclared classes are reported as left alone.
    replaces: dict = field(default_factory=dict)
    replaces_functions: dict = field(default_factory=dict)
    refuses: dict = field(default_factory=dict)
    looks_like: tuple = ()
    # Models that hold the op besides the op alone: name -> one of MODEL_FORMS (Swish's "ffn": "feed_forward")
    models: dict = field(default_factory=dict)
    # The artifacts' fixed inputs and attributes, per model (default: a seed from the model's name, the
    # declared attributes)
    artifact_seeds: dict = field(default_factory=dict)
    artifact_attributes: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.own_kernels, tuple):
            raise ValueError(f"OpSpec {self.name!r}: own_kernels={self.own_kernels!r} must be a tuple, e.g. (\"cpu\",)")
        if self.own_kernels and not self.kind:
            raise ValueError(f"OpSpec {self.name!r}: own_kernels is for an op of a kind (kind=\"elementwise\" or "
                             "\"rowwise\"); an op without one writes all of its adapters and kernels")
        unknown = sorted(set(self.own_kernels) - {"cpu", "cuda"})
        if unknown:
            raise ValueError(f"OpSpec {self.name!r}: own_kernels={self.own_kernels!r} names {unknown}; it lists "
                             "\"cpu\" and/or \"cuda\", the devices whose loops its math header writes itself")
        if self.native_when and not self.native:
            raise ValueError(f"OpSpec {self.name!r}: native_when says where the native function is the op; declare "
                             "that function too (native=)")
        if self.native and not self.native_row:
            object.__setattr__(self, "native_row", f"torch_native_{self.name}")
        if self.kind not in KINDS:
            raise ValueError(f"OpSpec {self.name!r}: kind={self.kind!r} must be one of {sorted(k for k in KINDS if k)} "
                             "(or None for an op whose adapters are written by hand)")
        if self.kind == "elementwise" and self.full_inputs != len(self.inputs):
            raise ValueError(f"OpSpec {self.name!r}: an elementwise op's inputs all have X's shape: full_inputs="
                             f"{self.full_inputs} but it has {len(self.inputs)} inputs")
        if self.kind:
            self._check_generated_names()
        if self.kind == "rowwise" and len(self.own_kernels) == 1:
            raise ValueError(f"OpSpec {self.name!r}: a rowwise op's math header writes its row loops and launchers "
                             f"both or neither: declare own_kernels=(\"cpu\", \"cuda\") or none (it declares "
                             f"{self.own_kernels!r})")
        if self.kind == "rowwise" and set(self.own_kernels) != {"cpu", "cuda"} and (
                self.full_inputs != 1 or len(self.outputs) != 1 or len(self.inputs) == 1):
            raise ValueError(f"OpSpec {self.name!r}: the row loops written from a rowwise op's math take X, one or more "
                             f"weights and give one output (it has inputs {self.inputs}, full_inputs={self.full_inputs}, "
                             f"outputs {self.outputs}); declare own_kernels=(\"cpu\", \"cuda\") and write them in "
                             f"kernels/{self.name}.h and kernels/{self.name}_cuda.cu")
        if self.forward_16bit and (self.kind != "elementwise" or "cuda" in self.own_kernels):
            raise ValueError(f"OpSpec {self.name!r}: forward_16bit is read by the CUDA launchers written from an "
                             "elementwise op's math; an op of another kind, or one with its own launchers "
                             "(own_kernels=(..., \"cuda\")), picks its 16-bit forms itself")
        if not 1 <= self.full_inputs <= len(self.inputs):
            raise ValueError(f"OpSpec {self.name!r}: full_inputs={self.full_inputs} must be 1 to {len(self.inputs)}, "
                             "the count of its inputs that have X's shape")
        if not self.outputs:
            raise ValueError(f"OpSpec {self.name!r}: an op has at least one output")
        if self.decomposed is not None:
            check_form(self.name, self.decomposed, self.inputs, self.attributes, self.outputs, self.kind)
        self._check_swaps()
        unknown_forms = {name: form for name, form in self.models.items() if form not in MODEL_FORMS}
        if unknown_forms:
            raise ValueError(f"OpSpec {self.name!r}: models={unknown_forms} names forms the lab does not build; "
                             f"each is one of {sorted(MODEL_FORMS)}")
        if self.models and (len(self.inputs) != 1 or len(self.outputs) != 1):
            raise ValueError(f"OpSpec {self.name!r}: a model form (models=) holds an op of one input and one output "
                             f"between its layers; it has inputs {self.inputs} and outputs {self.outputs}")
        if self.name in TORCH_PACKAGE_NAMES:
            raise ValueError(f"OpSpec {self.name!r}: the ops package has its own {self.name!r} (ops.{self.name}), "
                             "beside which each op's function is found by its name: choose another name")
        stray = sorted((set(self.artifact_seeds) | set(self.artifact_attributes)) - {self.name, *self.models})
        if stray:
            raise ValueError(f"OpSpec {self.name!r}: artifact_seeds/artifact_attributes name {stray}, which are not "
                             f"its models ({[self.name, *self.models]})")
        if sum(node.opset is not None for node in self.fused_nodes) > 1:
            raise ValueError(f"OpSpec {self.name!r}: one fused node at most is the lowering's standard form (opset=)")
        # the names the graphs use: x and y first, the others lower-cased (weights are inputs of a probe)
        names = ["x", *(name.lower() for name in self.inputs[1:]), "y", *(name.lower() for name in self.outputs[1:])]
        if len(set(names)) != len(names):
            raise ValueError(f"OpSpec {self.name!r}: its inputs {self.inputs} and outputs {self.outputs} must have "
                             "distinct names (case aside; 'x' and 'y' are the first input's and output's graph names)")

    def _check_swaps(self) -> None:
        """replaces: import paths, each with a Replaces that names the op's own weights and attributes."""
        attributes = {self.torch_attribute(a) for a in self.attributes}
        weights = set(self.torch_input_names[self.full_inputs:])
        for path, swap in self.replaces.items():
            if not isinstance(swap, Replaces) or "." not in path:
                raise ValueError(f"OpSpec {self.name!r}: replaces={{{path!r}: {swap!r}}} must map a class's import path "
                                 "(module.Class) to a Replaces(...)")
            wrong = sorted((set(swap.attributes) | set(swap.none_is_epsilon)) - attributes) + sorted(
                (set(swap.weights) | set(swap.offsets)) - weights)
            if wrong:
                raise ValueError(f"OpSpec {self.name!r}: replaces[{path!r}] names {wrong}, which are not among its "
                                 f"attributes {sorted(attributes)} or weights {sorted(weights)} (torch names)")
            unread = sorted(attributes - set(swap.attributes) - set(swap.none_is_epsilon))
            if unread:  # a default where the module holds its own value would swap in another function
                raise ValueError(f"OpSpec {self.name!r}: replaces[{path!r}] does not say where {unread} come from: "
                                 "name the module's attribute, or give the constant, in Replaces(attributes=...)")
        for path, given in self.replaces_functions.items():
            wrong = sorted(set(given) - attributes)
            if wrong:
                raise ValueError(f"OpSpec {self.name!r}: replaces_functions[{path!r}] names {wrong}, which are not "
                                 f"among its attributes {sorted(attributes)} (torch names)")

    def _check_generated_names(self) -> None:
        """The names opspec.codegen writes into C++: identifiers, apart, none it uses itself."""
        unknown = set(self.torch_inputs) - set(self.inputs[1:])
        if unknown:
            raise ValueError(f"OpSpec {self.name!r}: torch_inputs names {sorted(unknown)}, which are not among its "
                             f"inputs after X {list(self.inputs[1:])}")
        not_float = [name for name, value in self.attributes.items()
                     if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)]
        if not_float:
            raise ValueError(f"OpSpec {self.name!r}: attributes {not_float} need a finite number as their default (an "
                             "op of a kind takes float attributes)")
        grads = list(self.grad_names)
        names = [*self.torch_input_names, *(self.torch_attribute(a) for a in self.attributes)]
        bad = [n for n in names if not n.isidentifier() or n in GENERATED_RESERVED or n.startswith("grad")]
        if bad or len(set(names + grads)) != len(names + grads):
            raise ValueError(f"OpSpec {self.name!r}: its torch input and attribute names {names} must be distinct "
                             f"identifiers, none starting with 'grad' and none of {sorted(GENERATED_RESERVED)} "
                             f"(the generated adapters use those); rename {bad or names} with torch_inputs= or "
                             "torch_attributes=")
        if self.kind == "rowwise" and not self.own_kernels:  # its generated row loops name weight gradients d<weight>
            weights = names[self.full_inputs:len(self.torch_input_names)]
            clash = [n for n in names if n.startswith("d") and n[1:] in weights]
            if clash:
                raise ValueError(f"OpSpec {self.name!r}: {', '.join(clash)} would be named as the gradient of the "
                                 f"weight {clash[0][1:]} (d<weight>) in the generated row loops: rename it")

    @property
    def graph_inputs(self) -> tuple[str, ...]:
        """The graph inputs of the op-alone model (its weights are initialisers): "x", then each other
        full-shaped input by its name in lower case."""
        return ("x",) + tuple(name.lower() for name in self.inputs[1:self.full_inputs])

    @property
    def graph_outputs(self) -> tuple[str, ...]:
        """The graph outputs of the op-alone model: "y", then each other output by its name in lower case."""
        return ("y",) + tuple(name.lower() for name in self.outputs[1:])

    @property
    def native_function(self) -> str:
        """The native function's name as the declaration writes it ("F.silu"), for titles."""
        return self.native.split("(", 1)[0]

    @property
    def qualified(self) -> str:
        return f"{DOMAIN}::{self.onnx_type}"

    def torch_attribute(self, onnx_name: str) -> str:
        return self.torch_attributes.get(onnx_name, onnx_name)

    @property
    def standard_node(self) -> FusedNode | None:
        """The default-domain node that is the whole op from its opset on (ai.onnx Swish-24), if any."""
        return next((node for node in self.fused_nodes if node.opset is not None), None)

    @property
    def formula(self) -> str:
        """The decomposed form as text: x*Sigmoid(x*beta)."""
        return Text().formula(self.decomposed, self.inputs, tuple(self.attributes)) if self.decomposed else ""

    @property
    def grad_names(self) -> tuple[str, ...]:
        """The backward op's gradient arguments, one per output: "grad", then "grad_<output>"."""
        return ("grad",) + tuple(f"grad_{name.lower()}" for name in self.outputs[1:])

    @property
    def torch_input_names(self) -> tuple[str, ...]:
        """The torch schema's tensor arguments: "x", then each other input by its torch name."""
        return ("x",) + tuple(self.torch_inputs.get(name, name.lower()) for name in self.inputs[1:])


def _discover() -> dict[str, OpSpec]:
    found = {}
    # each module is one op's declaration; subpackages (codegen) are tools over them
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and not m.ispkg):
        spec = importlib.import_module(f"{__name__}.{module}").SPEC
        if spec.name != module:
            raise ImportError(f"opspec/{module}.py declares the op {spec.name!r}: an op's file is named after it")
        found[spec.name] = spec
    primary = [spec.name for spec in found.values() if spec.primary]
    if len(primary) > 1:
        raise ImportError(f"ops {primary} each declare primary=True (opspec/): one op is the lab's first")
    workloads = [w.name for spec in found.values() for w in spec.workloads]
    repeated = sorted({w for w in workloads if workloads.count(w) > 1})
    if repeated:
        raise ImportError(f"workload names {repeated} are declared by more than one op (opspec/): rename one")
    return found


OPS: dict[str, OpSpec] = _discover()
TORCH_OPS = {name: spec for name, spec in OPS.items() if not spec.plugin_only}
# The op the lab's tools take where none is named: the one declaring primary=True, else the first torch op.
PRIMARY: str = next((name for name, spec in TORCH_OPS.items() if spec.primary), next(iter(TORCH_OPS), ""))


def by_onnx_type(op_type: str) -> OpSpec | None:
    return next((spec for spec in OPS.values() if spec.onnx_type == op_type), None)


def model_inputs(model: str) -> tuple[str, ...]:
    """The graph inputs of an exported model, in order: a model named like an op is that op alone and
    takes each of its full-shaped inputs; every other model (ffn...) takes x alone."""
    return OPS[model].graph_inputs if model in OPS else ("x",)


def model_outputs(model: str) -> tuple[str, ...]:
    """The graph outputs of an exported model, in order: an op alone gives each of its outputs; every
    other model gives y alone."""
    return OPS[model].graph_outputs if model in OPS else ("y",)


def probe_input_names(op_type: str) -> tuple[str, ...]:
    """The graph input names of a one-node probe: "x" first, then the op's other inputs by name
    (lower case). An op this catalogue does not know is probed with one input."""
    spec = by_onnx_type(op_type)
    return ("x",) + tuple(name.lower() for name in (spec.inputs[1:] if spec else ()))


def probe_output_names(op_type: str) -> tuple[str, ...]:
    """The graph output names of a one-node probe: "y", then the op's other outputs by name (lower
    case). An op this catalogue does not know is probed with one output."""
    spec = by_onnx_type(op_type)
    return spec.graph_outputs if spec else ("y",)
