"""Launch constants of the CUDA kernels, read off their sources, so that the tests' sizes follow the
kernels (a tensor beyond one grid, RMSNorm's weight-gradient chunk edges) when those change."""
from __future__ import annotations

import re
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _constants(header: str, names: tuple[str, ...]) -> tuple[int, ...]:
    text = (KERNELS / header).read_text()
    values = []
    for name in names:
        match = re.search(rf"constexpr\s+\w+\s+{name}\s*=\s*(\d+)\s*;", text)
        if match is None:
            raise RuntimeError(f"kernels/{header} no longer defines {name}: update bench/gpu/kernels.py")
        values.append(int(match.group(1)))
    return tuple(values)


def launch_limits() -> tuple[int, int, int]:
    """(threads per block, most blocks, bytes per vector step) of the elementwise launcher."""
    return _constants("elementwise_cuda.cuh", ("kThreads", "kMaxBlocks")) + _constants("cuda_storage.cuh",
                                                                                      ("kVecBytes",))


def rms_norm_chunking() -> tuple[int, int]:
    """(rows per chunk, most chunks) of the RMSNorm weight gradient's first pass."""
    return _constants("rms_norm_cuda.cu", ("kChunkRows", "kMaxChunks"))


def rms_norm_packing() -> tuple[int, int, int]:
    """(the packed kernels' aim in threads, most threads, most 16-byte packs per thread) of RMSNorm's
    rows held in registers: rows of more packs than the last two allow take the scalar kernels."""
    return _constants("rms_norm_cuda.cu", ("kThreads", "kMaxThreads", "kMaxPacksPerThread"))
