"""The inference side's doctor (no torch): `python -m ort_plugin.doctor [MODEL.onnx ...]`.

Also the infer image's `doctor` subcommand. Prints, at a glance, onnxruntime and its execution
providers, the plugin (path, exported symbols, C API version, what it registers, proven by running
each op), the GPU against the CUDA architectures in the plugin, and for each model given: opset
imports, custom ops against the plugin (naming the exact cause of a would-be "not a registered
function/op") and dynamic axes. Exit status 1 when anything is flagged as a problem.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from opspec import probe_input_names, probe_output_names

from .diagnose import Finding, custom_nodes, diagnose_model
from .library_info import LibraryInfo, covers, read_library
from .loader import PluginError, check_library, default_library
from .onnx_file import ModelFileError, external_data_problems, one_node_model, read_model

MARKS = {"ok": "ok  ", "info": "    ", "warn": "WARN", "fail": "FAIL"}
FORBIDDEN_NEEDED = ("libtorch", "libc10", "libonnxruntime")


def onnxruntime_section() -> tuple[list[Finding], dict]:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return [Finding("fail", "onnxruntime", f"cannot be imported ({exc})", "pip install onnxruntime (or onnxruntime-gpu)")], {}
    providers = ort.get_available_providers()
    minor = int(ort.__version__.split(".")[1])
    facts = {"version": ort.__version__, "api_max": minor, "providers": providers}
    return [Finding("ok", "onnxruntime", f"{ort.__version__} (C API versions up to {minor})"),
            Finding("info", "execution providers", ", ".join(providers))], facts


def plugin_section(library, ort_facts: dict) -> tuple[list[Finding], LibraryInfo | None]:
    try:
        path = check_library(library if library is not None else default_library())
    except PluginError as exc:
        return [Finding("fail", "plugin", str(exc))], None
    info = read_library(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()  # whole: what result rows and reproducibility.csv name
    findings = [Finding("ok", "plugin", f"{path} ({path.stat().st_size // 1024} KiB, sha256 {digest})")]
    extra = [s for s in info.exported if s != "RegisterCustomOps"]
    findings.append(Finding("warn" if extra else "ok", "exported symbols", ", ".join(info.exported),
                            "build with ort_plugin/exports.map so only RegisterCustomOps is visible" if extra else ""))
    bad = [n for n in info.needed if n.startswith(FORBIDDEN_NEEDED)]
    findings.append(Finding("fail" if bad else "ok", "links against", ", ".join(info.needed) or "nothing",
                            f"{bad} must not be linked: rebuild with ort_plugin/CMakeLists.txt" if bad else ""))
    if info.api_version is None:
        findings.append(Finding("warn", "C API version", "not recorded in the library (built from other sources?)",
                                "rebuild with `python -m ort_plugin.build`"))
    elif ort_facts and info.api_version > ort_facts["api_max"]:
        findings.append(Finding("fail", "C API version", f"the plugin needs C API {info.api_version} "
                                f"(onnxruntime >= 1.{info.api_version}) but this onnxruntime {ort_facts['version']} "
                                f"serves up to {ort_facts['api_max']}",
                                f"upgrade onnxruntime to >= 1.{info.api_version}, or rebuild the plugin against "
                                f"the headers of {ort_facts['version']}"))
    else:
        findings.append(Finding("ok", "C API version", f"built for {info.api_version}, served by this onnxruntime"))
    if not info.ops:
        findings.append(Finding("fail", "registered ops", "none recorded in the library", "rebuild with `python -m ort_plugin.build`"))
    findings.extend(_probe_ops(path, info, ort_facts))
    return findings, info


def _probe_ops(path: Path, info: LibraryInfo, ort_facts: dict) -> list[Finding]:
    """Run every registered (op, provider, type) once on a tiny input: registration proven, not assumed."""
    findings = []
    for op in info.ops:
        subject = f"{op.domain}::{op.op} v{op.since}+ on {op.provider}"
        if op.provider not in ort_facts.get("providers", []):
            findings.append(Finding("info", subject, f"[{', '.join(op.types)}] not run: onnxruntime has no {op.provider} here"))
            continue
        ran = []
        for element_type in op.types:
            try:
                from .loader import make_session

                names = probe_input_names(op.op)
                model = one_node_model(op.domain, op.op, since=op.since, element_type=element_type, inputs=names,
                                       outputs=probe_output_names(op.op))
                session = make_session(model, library=path, providers=[op.provider])
                x = np.linspace(-4, 4, 17).astype(element_type)
                outputs = session.run(None, {"x": x, **{name: np.ones_like(x) for name in names[1:]}})
                shapes = [y.shape for y in outputs if y.shape != x.shape]
                if shapes:
                    raise RuntimeError(f"output shapes {shapes} for input shape {x.shape}")
                ran.append(element_type)
            except Exception as exc:  # report every failure as a finding, keep probing the rest
                findings.append(Finding("fail", subject, f"{element_type} is registered but does not run: {exc}",
                                        "rebuild the plugin against this onnxruntime's headers"))
        if ran:
            findings.append(Finding("ok", subject, f"registered and runs [{', '.join(ran)}]"))
    return findings


def gpu_section(info: LibraryInfo | None, ort_facts: dict) -> list[Finding]:
    if shutil.which("nvidia-smi") is None:
        return [Finding("info", "GPU", "no NVIDIA driver tools (nvidia-smi) here: CUDA checks skipped")]
    query = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60)
    gpus = [line.split(", ") for line in query.stdout.strip().splitlines() if line.count(", ") == 2]
    if query.returncode != 0 or not gpus:
        return [Finding("warn", "GPU", f"nvidia-smi found no usable GPU: {(query.stderr or query.stdout).strip()[:200]}",
                        "with Docker, run the container with --gpus all")]
    findings = []
    if "CUDAExecutionProvider" not in ort_facts.get("providers", []):
        findings.append(Finding("warn", "CUDA provider", "a GPU is present but onnxruntime has no CUDAExecutionProvider",
                                "install onnxruntime-gpu matching the CUDA major of this host"))
    for name, capability, driver in gpus:
        major, minor = (int(p) for p in capability.split("."))
        findings.append(Finding("info", "GPU", f"{name}, compute capability {capability}, driver {driver}"))
        findings.append(plugin_arch_finding(info, (major, minor)))
    return findings


def plugin_arch_finding(info: LibraryInfo | None, capability: tuple[int, int]) -> Finding:
    wanted = f"{capability[0]}{capability[1]}"
    if info is None:
        return Finding("info", "plugin CUDA architectures", "no plugin to check")
    if not info.cuda_archs:
        return Finding("warn", "plugin CUDA architectures", "the plugin has no CUDA kernels: myops ops run on the CPU "
                       "and ORT copies tensors across", "build it with `python -m ort_plugin.build --cuda ON`")
    verdict, detail = covers(info.cuda_archs, capability)
    level = {"native": "ok", "jit": "warn", "missing": "fail"}[verdict]
    return Finding(level, "plugin CUDA architectures", f"{','.join(info.cuda_archs)}: {detail}",
                   "" if level == "ok" else f"rebuild with CMAKE_CUDA_ARCHITECTURES including {wanted}-real "
                   f"(lab: add '{capability[0]}.{capability[1]}' to the entry's torch_cuda_arch_list)")


def model_section(path: Path, info: LibraryInfo | None) -> list[Finding]:
    try:
        summary = read_model(path)
    except ModelFileError as exc:
        return [Finding("fail", "model", str(exc))]
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(summary.opset_imports.items()))
    findings = [Finding("info", "model", f"{path} (sha256 {hashlib.sha256(Path(path).read_bytes()).hexdigest()})"),
                Finding("info", "opset imports", f"{opsets} (IR version {summary.ir_version})")]
    problems, data_files = external_data_problems(path, summary)
    findings.extend(Finding("fail", "external data", problem, "put the data file beside the model, as it was "
                            "exported (or export again)") for problem in problems)
    if data_files:
        findings.append(Finding("ok", "external data", f"{len(summary.external_data)} weights in "
                                f"{', '.join(f.name for f in data_files)}, beside the model"))
    findings.extend(diagnose_model(summary, info))
    if not custom_nodes(summary):
        findings.append(Finding("info", "custom ops", "none: the model runs on onnxruntime's built-in ops alone"))
    if not any(f.subject.startswith("input") for f in findings):
        findings.append(Finding("info", "inputs", "none: the model takes no inputs"))
    if not any(f.level == "fail" for f in findings):
        findings.append(_loads(path, info))
    return findings


def _loads(path: Path, info: LibraryInfo | None) -> Finding:
    """A doctor that has not loaded the model has not checked it: a session opens, or ORT's reason."""
    try:
        import onnxruntime as ort
    except ImportError:
        return Finding("warn", "loads in onnxruntime", "not tried: onnxruntime cannot be imported")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # loading is the question
    if info is not None:
        options.register_custom_ops_library(str(info.path))
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own reasons: a bad graph, a type it cannot serve, unreadable weights
        return Finding("fail", "loads in onnxruntime", str(exc).strip().splitlines()[0][:500],
                       "the model as written does not load: fix what onnxruntime names")
    return Finding("ok", "loads in onnxruntime", "a CPU session opens" + (" with the plugin" if info else ""))


def report(sections: list[tuple[str, list[Finding]]], *, as_json: bool = False, out=sys.stdout) -> int:
    counts = {"ok": 0, "info": 0, "warn": 0, "fail": 0}
    for _, findings in sections:
        for finding in findings:
            counts[finding.level] += 1
    if as_json:
        out.write(json.dumps({"sections": [{"title": t, "findings": [f.__dict__ for f in fs]} for t, fs in sections],
                              "counts": counts}, indent=2) + "\n")
    else:
        for title, findings in sections:
            out.write(f"== {title}\n")
            for f in findings:
                out.write(f"  {MARKS[f.level]}  {f.subject}: {f.message}\n")
                if f.fix:
                    out.write(f"        fix: {f.fix}\n")
        verdict = "all green" if not counts["fail"] and not counts["warn"] else (
            f"{counts['fail']} problem(s), {counts['warn']} warning(s)")
        out.write(f"doctor: {verdict} ({counts['ok']} ok)\n")
    return 1 if counts["fail"] else 0


def ort_sections(library=None, models=()) -> list[tuple[str, list[Finding]]]:
    ort_findings, ort_facts = onnxruntime_section()
    plugin_findings, info = plugin_section(library, ort_facts)
    sections = [("onnxruntime", ort_findings), ("plugin", plugin_findings), ("GPU (plugin)", gpu_section(info, ort_facts))]
    for model in models:
        sections.append((f"model {model}", model_section(Path(model), info)))
    return sections


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", type=Path, help="ONNX files to check against the plugin")
    parser.add_argument("--plugin", type=Path, help="plugin library (default: $MYOPS_ORT_PLUGIN or the built one)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="doctor", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return report(ort_sections(args.plugin, args.models), as_json=args.json)


if __name__ == "__main__":
    raise SystemExit(main())
