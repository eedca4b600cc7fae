"""Print the lib directories of NVIDIA's wheels in this virtualenv, one per line (for ld.so.conf.d).

nvidia/<component>/lib for CUDA 11/12 wheels, nvidia/cu13/lib for CUDA 13's; nothing for a CPU entry.
"""
import sysconfig
from pathlib import Path

nvidia = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
for lib in sorted(nvidia.glob("*/lib")):
    if any(lib.glob("lib*.so*")):
        print(lib)
