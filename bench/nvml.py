"""Device memory in use, from NVML through ctypes: the ORT GPU rows' memory figure without torch or pynvml.

ONNX Runtime's Python API exposes no arena statistics, and its CUDA arena never returns blocks to
the device while a session lives, so the device's used memory after the timed runs minus before the
first run is the row's peak (its arena growth). NVML counts the whole device: other processes on
the same GPU would add to it, which the memory method column says.
"""
from __future__ import annotations

import ctypes
import os

LIBRARY = "libnvidia-ml.so.1"  # what the NVIDIA container toolkit mounts with --gpus


class NvmlUnavailable(RuntimeError):
    pass


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _visible_index(device_id: int) -> int:
    """NVML counts physical devices; CUDA_VISIBLE_DEVICES renumbers them for CUDA."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device_id < len(visible) and visible[device_id].isdigit():
        return int(visible[device_id])
    return device_id


class DeviceMemory:
    def __init__(self, device_id: int = 0):
        try:
            self._lib = ctypes.CDLL(LIBRARY)
        except OSError as exc:
            raise NvmlUnavailable(f"{LIBRARY} cannot be loaded ({exc}): no NVIDIA driver here, or the container "
                                  "was started without --gpus") from None
        self._check(self._lib.nvmlInit_v2(), "nvmlInit_v2")
        self._handle = ctypes.c_void_p()
        index = _visible_index(device_id)
        self._check(self._lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self._handle)),
                    f"nvmlDeviceGetHandleByIndex_v2({index})")

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            self._lib.nvmlErrorString.restype = ctypes.c_char_p
            raise NvmlUnavailable(f"{call} failed: {self._lib.nvmlErrorString(status).decode()} (NVML status {status})")

    def used_bytes(self) -> int:
        memory = _Memory()
        self._check(self._lib.nvmlDeviceGetMemoryInfo(self._handle, ctypes.byref(memory)), "nvmlDeviceGetMemoryInfo")
        return int(memory.used)
