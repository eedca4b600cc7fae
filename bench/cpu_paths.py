"""The CPU paths of kernels/swish.h as benchmark rows: which the host can run, and their rows' specs.

kernels/swish.h picks the widest path the CPU has when it loads, and MYOPS_CPU_ISA caps it (never
raises it). `bench.run --isa all` measures the rows that run that code once per path, each in
processes started with the cap; their `isa` column names it. Other rows keep an empty `isa`: the
widest path, as every user gets it, unless the caller's environment sets MYOPS_CPU_ISA (bench.run
then says so).
"""
from __future__ import annotations

from pathlib import Path

from opspec import PRIMARY

# MYOPS_CPU_ISA values, widest first, and the CPU flags each needs (as cpu_isa::detect() in kernels/cpu_isa.h);
# on aarch64 NEON is always there ("Features" in /proc/cpuinfo name it asimd).
PATHS = {"avx512": ("avx512f", "avx512bw", "avx512dq", "avx512vl"), "avx2": ("avx2", "fma"), "neon": ("asimd",),
         "baseline": ()}
X86_ONLY = ("avx512", "avx2")
# The rows whose work is kernels/swish.h: the PyTorch extension and the plugin's op.
KERNEL_ROWS = ("torch_extension", "ort_custom")


def runnable(cpuinfo: str | None = None) -> list[str]:
    """The paths this host can run, widest first (x86-64: `flags`, aarch64: `Features`); [] when
    /proc/cpuinfo names neither (there is nothing to cap)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    lines = cpuinfo.splitlines()
    x86 = next((line for line in lines if line.startswith("flags")), None)
    arm = next((line for line in lines if line.startswith("Features")), None)
    if x86 is None and arm is None:
        return []
    flags = set((x86 or arm).split(":", 1)[1].split())
    names = [n for n in PATHS if n == "baseline" or (n in X86_ONLY) == (x86 is not None)]
    return [name for name in names if set(PATHS[name]) <= flags]


def chosen(requested: list[str], available: list[str]) -> list[str]:
    """The paths `--isa` asks for ("all": every one this host runs); ValueError with what to ask instead."""
    if not available:
        raise ValueError("--isa: this host has no CPU paths to choose from (/proc/cpuinfo names neither x86-64 "
                         "flags nor aarch64 Features): run without --isa")
    if "all" in requested:
        return available
    missing = [p for p in requested if p not in available]
    if missing:
        raise ValueError(f"--isa: this CPU cannot run {', '.join(missing)} (it runs {', '.join(available)}); "
                         "ask for those, or `--isa all`")
    return [p for p in available if p in requested]


def capped_specs(specs: list[dict], paths: list[str]) -> list[dict]:
    """Copies of the activation's kernel rows, one per path; ORT's at the newest opset only."""
    kernel = [s for s in specs if s["workload"] == PRIMARY and s["row"] in KERNEL_ROWS]
    newest = max((s["opset"] for s in kernel if s.get("opset")), default=None)
    kernel = [s for s in kernel if s.get("opset") in (None, newest)]
    return [dict(s, isa=path) for path in paths for s in kernel]
