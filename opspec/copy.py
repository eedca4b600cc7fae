"""myops::Copy: the plugin's copy kernel, the ORT side's copy floor in the benchmark (no torch op)."""
from . import OpSpec

SPEC = OpSpec("copy", "Copy", ("X",), plugin_only=True, kind="elementwise", own_kernels=("cpu", "cuda"))
