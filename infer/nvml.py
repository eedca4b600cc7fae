"""Device memory in use and the peak DRAM bandwidth, from NVML through ctypes: the ORT GPU rows' memory figure
and the GPU rows' fraction of peak bandwidth, without torch or pynvml.

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


CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


def cuda_pci_bus_id(device_id: int) -> str | None:
    """The PCI bus id of CUDA's device `device_id`, from the CUDA runtime (the one ORT's CUDA EP loaded), or None."""
    for name in CUDART_NAMES:
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        bus_id = ctypes.create_string_buffer(64)
        if cudart.cudaDeviceGetPCIBusId(bus_id, ctypes.c_int(len(bus_id)), ctypes.c_int(device_id)) == 0:
            return bus_id.value.decode()
        # e.g. a runtime newer than the driver: another one may answer
    return None


def nvml_selector(device_id: int, visible: str | None, device_order: str | None) -> tuple[str, object]:
    """How NVML names CUDA's device `device_id` when the CUDA runtime cannot say: ("index", n) or ("uuid", id).

    NVML numbers GPUs in PCI bus order; CUDA numbers them fastest first unless CUDA_DEVICE_ORDER is
    PCI_BUS_ID, and CUDA_VISIBLE_DEVICES (indices or GPU-UUIDs) renumbers them again.
    """
    items = None if visible is None else [v.strip() for v in visible.split(",") if v.strip()]
    if items is not None:
        if device_id >= len(items):
            raise NvmlUnavailable(f"CUDA_VISIBLE_DEVICES={visible!r} has no device {device_id}")
        item = items[device_id]
        if item.startswith("GPU-"):
            return "uuid", item
        if item.startswith("MIG-"):
            raise NvmlUnavailable(f"{item} is a MIG instance: NVML's device memory would count the whole GPU")
        if not item.isdigit():
            raise NvmlUnavailable(f"CUDA_VISIBLE_DEVICES entry {item!r} is neither an index nor a GPU-UUID")
        index = int(item)
    else:
        index = device_id
    if device_order != "PCI_BUS_ID":
        raise NvmlUnavailable(f"CUDA's device {index} need not be NVML's {index} on a host with several GPUs (CUDA "
                              "counts the fastest first) and no CUDA runtime answered to ask: set "
                              "CUDA_DEVICE_ORDER=PCI_BUS_ID, or CUDA_VISIBLE_DEVICES to a GPU-UUID")
    return "index", index


NVML_CLOCK_MEM = 2  # nvmlClockType_t: NVML_CLOCK_GRAPHICS 0, NVML_CLOCK_SM 1, NVML_CLOCK_MEM 2 (nvml.h)


def peak_dram_bytes_per_s(memory_clock_mhz: int, bus_width_bits: int) -> float:
    """Peak DRAM bandwidth from NVML's figures: HBM and GDDR move data on both clock edges."""
    return 2 * memory_clock_mhz * 1e6 * bus_width_bits / 8


class DeviceMemory:
    def __init__(self, device_id: int = 0):
        try:
            self._lib = ctypes.CDLL(LIBRARY)
        except OSError as exc:
            raise NvmlUnavailable(f"{LIBRARY} cannot be loaded ({exc}): no NVIDIA driver here, or the container "
                                  "was started without --gpus") from None
        self._check(self._lib.nvmlInit_v2(), "nvmlInit_v2")
        self._handle = ctypes.c_void_p()
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        if any(v.startswith("MIG-") for v in visible):
            raise NvmlUnavailable("CUDA_VISIBLE_DEVICES names a MIG instance: NVML's device memory would count the "
                                  "whole GPU, not the instance")
        bus_id = cuda_pci_bus_id(device_id)
        if bus_id is not None:
            self.selected = f"PCI bus id {bus_id}"
            self._check(self._lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(self._handle)),
                        f"nvmlDeviceGetHandleByPciBusId_v2({bus_id})")
            return
        order = os.environ.get("CUDA_DEVICE_ORDER")
        count = ctypes.c_uint()
        self._check(self._lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        if count.value == 1:  # one GPU: no order to get wrong
            order = "PCI_BUS_ID"
        kind, value = nvml_selector(device_id, os.environ.get("CUDA_VISIBLE_DEVICES"), order)
        self.selected = f"NVML {kind} {value}"
        if kind == "uuid":
            self._check(self._lib.nvmlDeviceGetHandleByUUID(str(value).encode(), ctypes.byref(self._handle)),
                        f"nvmlDeviceGetHandleByUUID({value})")
        else:
            self._check(self._lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(value), ctypes.byref(self._handle)),
                        f"nvmlDeviceGetHandleByIndex_v2({value})")

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            self._lib.nvmlErrorString.restype = ctypes.c_char_p
            raise NvmlUnavailable(f"{call} failed: {self._lib.nvmlErrorString(status).decode()} (NVML status {status})")

    def peak_dram_bytes_per_s(self) -> float:
        """The memory's peak bandwidth: its top clock times its bus width, two transfers a clock."""
        clock_mhz, bus_bits = ctypes.c_uint(), ctypes.c_uint()
        self._check(self._lib.nvmlDeviceGetMaxClockInfo(self._handle, NVML_CLOCK_MEM, ctypes.byref(clock_mhz)),
                    "nvmlDeviceGetMaxClockInfo")
        self._check(self._lib.nvmlDeviceGetMemoryBusWidth(self._handle, ctypes.byref(bus_bits)),
                    "nvmlDeviceGetMemoryBusWidth")
        return peak_dram_bytes_per_s(clock_mhz.value, bus_bits.value)

    def used_bytes(self) -> int:
        memory = _Memory()
        self._check(self._lib.nvmlDeviceGetMemoryInfo(self._handle, ctypes.byref(memory)), "nvmlDeviceGetMemoryInfo")
        return int(memory.used)
