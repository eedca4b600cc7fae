"""Why a model would not run with the plugin, named precisely (no torch, no onnx package).

ONNX Runtime answers most mistakes with "<domain>:<op>(-1) is not a registered function/op". The
causes behind it differ and so do the fixes: the library was never registered, the domain's case
differs, the op name differs, the model lacks the custom opset import, or the domain version is
too old. `diagnose_model` compares a model's nodes with what a plugin file registers and says
which; `check_feed` does the same for inputs a model cannot take.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from .library_info import LibraryInfo
from .onnx_file import ModelSummary

# Domains ONNX Runtime implements itself: their nodes never need a plugin.
BUILTIN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training", "com.microsoft",
                   "com.microsoft.nchwc", "com.microsoft.experimental", "com.ms.internal.nhwc", "com.microsoft.dml"}
ORT_TYPE_NAMES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
                  "tensor(bfloat16)": "bfloat16", "tensor(int64)": "int64", "tensor(int32)": "int32",
                  "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(bool)": "bool"}
REGISTER_HINT = ("register the plugin before creating the session: SessionOptions.register_custom_ops_library"
                 "(path to libmyops_ort.so), or ort_plugin.make_session(model), which does it")


@dataclass(frozen=True)
class Finding:
    level: str  # "ok", "info", "warn", "fail"
    subject: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}" + (f"; fix: {self.fix}" if self.fix else "")


def _near(name: str, candidates) -> str | None:
    lowered = {c.lower(): c for c in candidates}
    if name.lower() in lowered:
        return lowered[name.lower()]
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def custom_nodes(model: ModelSummary):
    """(domain, op) -> nodes, for nodes no built-in ORT domain or model-local function serves."""
    found: dict[tuple[str, str], list] = {}
    for node in model.nodes:
        key = (node.domain, node.op_type)
        if node.domain in BUILTIN_DOMAINS or key in model.local_functions:
            continue
        found.setdefault(key, []).append(node)
    return found


def diagnose_model(model: ModelSummary, plugin: LibraryInfo | None, providers=None) -> list[Finding]:
    """One finding per custom op the model uses, plus its inputs' dynamic axes.

    providers: the execution providers a session will have; kernels of other providers cannot serve it.
    """
    findings = []
    for (domain, op), nodes in sorted(custom_nodes(model).items()):
        subject = f"{domain}::{op} ({len(nodes)} node{'s' if len(nodes) > 1 else ''})"
        findings.append(_diagnose_op(model, plugin, domain, op, nodes, subject, providers))
    for value in model.inputs:
        findings.append(_describe_input(value))
    return findings


def _diagnose_op(model, plugin, domain, op, nodes, subject, providers) -> Finding:
    if plugin is None:
        return Finding("fail", subject, "the model uses this custom op but no plugin library is loaded, so ORT "
                       "reports it as 'not a registered function/op'", REGISTER_HINT)
    registered = [r for r in plugin.ops if r.domain == domain and r.op == op]
    if not registered:
        if domain not in plugin.domains:
            near = _near(domain, plugin.domains)
            if near is not None and near.lower() == domain.lower():
                return Finding("fail", subject, f"domain case differs: the node says '{domain}', the plugin registers "
                               f"'{near}' (domains are case-sensitive)",
                               f"export with the domain spelled '{near}' (node domain and opset import)")
            return Finding("fail", subject, f"the plugin registers no domain '{domain}' (it registers "
                           f"{sorted(plugin.domains)})", f"use one of its domains, or load the plugin that provides '{domain}'")
        ops = sorted(plugin.domains[domain])
        near = _near(op, ops)
        hint = f" (did you mean '{near}'? op names are case-sensitive)" if near else ""
        fix = (f"export the node as {domain}::{near}" if near else
               f"export the node as one of {', '.join(f'{domain}::{o}' for o in ops)}, or load the plugin that "
               f"provides {domain}::{op}")
        return Finding("fail", subject, f"op name differs: the plugin registers {ops} in '{domain}', not '{op}'{hint}", fix)
    since = min(r.since for r in registered)
    if domain not in model.opset_imports:
        near = _near(domain, model.opset_imports)
        extra = f" (it imports '{near}', which differs in case)" if near else ""
        return Finding("fail", subject, f"missing custom opset import: the model has no opset_import for domain "
                       f"'{domain}'{extra}; the ONNX checker and stricter runtimes refuse such a model",
                       f"export with custom_opsets={{'{domain}': {since}}} (TorchScript) or an onnxscript "
                       f"Opset('{domain}', {since}), or add the opset import to the model")
    imported = model.opset_imports[domain]
    if imported < since:
        return Finding("fail", subject, f"domain version missing: the model imports '{domain}' version {imported}, "
                       f"the plugin registers {op} from version {since}", f"import '{domain}' version {since} or newer")
    usable = [r for r in registered if providers is None or r.provider in providers]
    if not usable:
        return Finding("fail", subject, f"the plugin has kernels for {op} only on {sorted({r.provider for r in registered})}, "
                       f"not on the session's providers {list(providers)}", "add one of those execution providers")
    types = _input_type_problem(model, nodes, usable)
    if types:
        return types
    providers = ", ".join(f"{r.provider} [{', '.join(r.types)}]" for r in registered)
    return Finding("ok", subject, f"registered by the plugin (domain version {imported}); kernels: {providers}")


def _input_type_problem(model, nodes, registered) -> Finding | None:
    by_name = {i.name: i for i in model.inputs}
    accepted = sorted({t for r in registered for t in r.types}, key=lambda t: (t != "float32", t))
    on = ", ".join(sorted({r.provider for r in registered}))
    for node in nodes:
        source = by_name.get(node.inputs[0]) if node.inputs else None
        if source is not None and source.element_type and source.element_type not in accepted:
            return Finding("fail", f"{node.domain}::{node.op_type}",
                           f"input '{source.name}' is {source.element_type} but the plugin's kernels take {accepted} (on {on})",
                           f"export the model with {accepted[0]} inputs (cast before the op) or add a kernel for "
                           f"{source.element_type}")
    return None


def _describe_input(value) -> Finding:
    subject = f"input '{value.name}'"
    if value.dims is None:
        return Finding("info", subject, f"{value.element_type}, no shape recorded: any shape is accepted")
    dims = "[" + ", ".join(str(d) if d is not None else "?" for d in value.dims) + "]"
    dynamic = value.dynamic_axes
    if not dynamic:
        return Finding("info", subject, f"{value.element_type} {dims}: every axis is fixed, only this exact shape runs")
    named = ", ".join(f"{i} ({value.dims[i] or 'unnamed'})" for i in dynamic)
    return Finding("info", subject, f"{value.element_type} {dims}: dynamic axes {named}")


def failures(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "fail"]


# ---------------------------------------------------------------- feeds

class FeedError(ValueError):
    """An input the model cannot take; the message names the input and what the model expects."""


def check_feed(session, feed: dict) -> None:
    """Raise FeedError for a missing/unknown input or a dtype, rank or fixed dimension the model refuses."""
    expected = {i.name: i for i in session.get_inputs()}
    missing = [name for name in expected if name not in feed]
    unknown = [name for name in feed if name not in expected]
    if missing or unknown:
        raise FeedError(f"the model takes inputs {list(expected)}; missing {missing}, unknown {unknown}")
    for name, value in feed.items():
        spec = expected[name]
        want_type = ORT_TYPE_NAMES.get(spec.type, spec.type)
        have_type = str(getattr(value, "dtype", type(value).__name__))
        shown = "[" + ", ".join(str(d) for d in spec.shape) + "]"
        if have_type != want_type:
            raise FeedError(f"input '{name}' is {have_type} but the model takes {want_type} {shown}: "
                            f"convert it with .astype('{want_type}')")
        shape = tuple(getattr(value, "shape", ()))
        if len(shape) != len(spec.shape):
            raise FeedError(f"input '{name}' has shape {shape} (rank {len(shape)}) but the model takes rank "
                            f"{len(spec.shape)} {shown}: reshape the input, or export the model for this rank")
        fixed = [(i, want, got) for i, (want, got) in enumerate(zip(spec.shape, shape)) if isinstance(want, int) and want != got]
        if fixed:
            axis, want, got = fixed[0]
            raise FeedError(f"input '{name}' has shape {shape} but axis {axis} is fixed at {want} in the model "
                            f"{shown}: feed {want} there, or re-export with that axis dynamic")
