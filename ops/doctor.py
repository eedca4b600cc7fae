"""The lab's doctor: `nox -s doctor [-- MODEL.onnx ...]` or `python -m ops.doctor [MODEL.onnx ...]`.

It lives on the training side, which may use the inference side (ort_plugin); the reverse never
happens, and lab, the base package, uses neither.

The training side first (torch, its CUDA, nvcc, the CXX11 ABI and CUDA major the extension was
built with, the GPU against the extension's architectures), then everything the inference side's
doctor reports (ort_plugin/doctor.py: onnxruntime, the plugin, models). Exit status 1 on any problem.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from ort_plugin.diagnose import Finding
from ort_plugin.doctor import add_arguments, ort_sections, report
from ort_plugin.library_info import covers

from lab.provenance import nvcc_version

REBUILD = "rebuild it for this environment: python -m ops.build (or nox -s build -- --backend local)"


def _major(version: str | None) -> str | None:
    return version.split(".")[0] if version else None


def torch_section() -> tuple[list[Finding], dict]:
    try:
        import torch
    except ImportError:
        return [Finding("fail", "torch", "not importable here", "run the lab's sessions (nox -s doctor) or pip install torch")], {}
    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
             "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI)}
    findings = [Finding("ok", "torch", f"{torch.__version__}; CUDA {torch.version.cuda or 'none (CPU build)'}; "
                        f"_GLIBCXX_USE_CXX11_ABI={facts['cxx11_abi']}")]
    nvcc = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if os.environ.get("CUDA_HOME") else shutil.which("nvcc")
    facts["nvcc"] = nvcc_version(nvcc) if nvcc else None
    findings.append(nvcc_finding(facts["nvcc"], facts["torch_cuda"]))
    return findings, facts


def nvcc_finding(nvcc: str | None, torch_cuda: str | None) -> Finding:
    if torch_cuda is None:
        return Finding("info", "nvcc", f"{nvcc or 'not found'}; torch is a CPU build, so the extension needs no nvcc")
    if nvcc is None:
        return Finding("warn", "nvcc", f"not found, but torch is a CUDA {torch_cuda} build: the extension builds "
                       "without its CUDA kernels", f"install the CUDA {_major(torch_cuda)}.x toolkit and set CUDA_HOME")
    if _major(nvcc) != _major(torch_cuda):
        return Finding("fail", "nvcc", f"CUDA {nvcc}, but torch was built with CUDA {torch_cuda}: the extension will not "
                       "build or load", f"point CUDA_HOME at a CUDA {_major(torch_cuda)}.x toolkit, or install the torch "
                       f"build for CUDA {_major(nvcc)}")
    return Finding("ok", "nvcc", f"CUDA {nvcc}, same major as torch's CUDA {torch_cuda}")


def extension_findings(info: dict, facts: dict) -> list[Finding]:
    """Compare what the extension's build recorded (build_info.json) with the running environment."""
    if not info:
        return [Finding("fail", "extension", "not built for this torch", REBUILD)]
    findings = [Finding("ok", "extension", f"{info['library']} (torch {info['torch']}, "
                        f"{'CPU+CUDA' if info.get('with_cuda') else 'CPU'})")]
    if info.get("cxx11_abi") != facts.get("cxx11_abi"):
        findings.append(Finding("fail", "CXX11 ABI", f"the extension was built with _GLIBCXX_USE_CXX11_ABI="
                                f"{info.get('cxx11_abi')} but this torch uses {facts.get('cxx11_abi')}: loading fails with "
                                "undefined symbols (std::__cxx11 names)", REBUILD))
    else:
        findings.append(Finding("ok", "CXX11 ABI", f"{facts['cxx11_abi']} in both torch and the extension"))
    if info.get("torch") != facts.get("torch"):
        findings.append(Finding("fail", "torch version", f"the extension was built against torch {info.get('torch')}, "
                                f"this is torch {facts.get('torch')}: C++ symbols differ between releases", REBUILD))
    built_cuda, running_cuda = info.get("nvcc"), facts.get("torch_cuda")
    if info.get("with_cuda") and _major(built_cuda) != _major(running_cuda):
        findings.append(Finding("fail", "CUDA major", f"the extension's CUDA kernels were compiled by nvcc {built_cuda} "
                                f"but this torch runs CUDA {running_cuda or 'none (CPU build)'}", REBUILD))
    elif info.get("with_cuda"):
        findings.append(Finding("ok", "CUDA major", f"compiled by nvcc {built_cuda}, torch runs CUDA {running_cuda}"))
    elif running_cuda:
        findings.append(Finding("warn", "CUDA kernels", f"torch is a CUDA {running_cuda} build but the extension has "
                                "only CPU kernels (built without nvcc or with MYOPS_NO_CUDA=1)", REBUILD))
    return findings


def extension_archs(info: dict) -> list[str]:
    """What the binary holds when the arch check recorded it, else what the build asked for."""
    found = info.get("cuda_archs_found")
    if found:
        return list(found)
    return (info.get("torch_cuda_arch_list") or "").replace(";", " ").split()


def gpu_findings(info: dict) -> list[Finding]:
    import torch

    if not torch.cuda.is_available():
        return [Finding("info", "GPU", "no CUDA device visible to torch: GPU checks skipped")]
    findings = []
    for index in range(torch.cuda.device_count()):
        capability = torch.cuda.get_device_capability(index)
        findings.append(Finding("info", f"GPU {index}", f"{torch.cuda.get_device_name(index)}, compute capability "
                                f"{capability[0]}.{capability[1]}"))
        findings.append(extension_arch_finding(info, capability))
    return findings


def extension_arch_finding(info: dict, capability: tuple[int, int]) -> Finding:
    wanted = f"{capability[0]}.{capability[1]}"
    if not info.get("with_cuda"):
        return Finding("warn", "extension CUDA architectures", "no CUDA kernels in the extension", REBUILD)
    archs = extension_archs(info)
    verdict, detail = covers(archs, capability)
    level = {"native": "ok", "jit": "warn", "missing": "fail"}[verdict]
    return Finding(level, "extension CUDA architectures", f"{' '.join(archs) or 'unrecorded'}: {detail}",
                   "" if level == "ok" else f'TORCH_CUDA_ARCH_LIST="{wanted}" python -m ops.build')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nox -s doctor --", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    torch_findings, facts = torch_section()
    sections = [("torch", torch_findings)]
    if facts:
        from .build import build_info

        info = build_info()
        sections.append(("extension", extension_findings(info, facts)))
        sections.append(("GPU (extension)", gpu_findings(info)))
    sections.extend(ort_sections(args.plugin, args.models))
    return report(sections, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
