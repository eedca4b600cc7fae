"""What a plugin library file says about itself, read without loading it (no binutils needed).

From the ELF dynamic section: the exported symbols and the NEEDED libraries. From the build-info
strings the plugin's sources embed (MYOPS_BUILD_INFO in ort_plugin/src/common.h): the ORT C API
version it was built for, the CUDA architectures compiled in, and every (domain, op, provider,
types) it registers.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

SHT_DYNAMIC, SHT_DYNSYM, DT_NEEDED = 6, 11, 1
STB_GLOBAL, STB_WEAK = 1, 2
OP_MARKER, PLUGIN_MARKER = b"myops-op: ", b"myops-plugin: "


class LibraryInfoError(ValueError):
    pass


@dataclass(frozen=True)
class RegisteredOp:
    domain: str
    op: str
    since: int
    provider: str
    types: tuple[str, ...]


@dataclass
class LibraryInfo:
    path: Path
    exported: list[str] = field(default_factory=list)
    needed: list[str] = field(default_factory=list)
    api_version: int | None = None
    cuda_archs: list[str] = field(default_factory=list)  # CMake form: "80-real" (SASS), "90" (SASS + PTX)
    ops: list[RegisteredOp] = field(default_factory=list)

    @property
    def domains(self) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for op in self.ops:
            found.setdefault(op.domain, set()).add(op.op)
        return found


def _sections(data: bytes):
    if data[:4] != b"\x7fELF":
        raise LibraryInfoError("no ELF header")
    if data[4] != 2 or data[5] != 1:
        raise LibraryInfoError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for index in range(shnum):
        name, kind, _flags, _addr, offset, size, link, _info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + index * shentsize)
        yield index, kind, offset, size, link, entsize


def _string(data: bytes, table_offset: int, index: int) -> str:
    end = data.index(b"\0", table_offset + index)
    return data[table_offset + index:end].decode(errors="replace")


def _dynamic_symbols(data: bytes) -> tuple[list[str], list[str]]:
    sections = {index: (kind, offset, size, link, entsize) for index, kind, offset, size, link, entsize in _sections(data)}
    exported, needed = [], []
    for kind, offset, size, link, entsize in sections.values():
        strtab = sections[link][1] if link in sections else None
        if kind == SHT_DYNSYM and strtab is not None:
            for pos in range(offset, offset + size, entsize or 24):
                st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", data, pos)
                visible = (st_other & 3) in (0, 3)  # default or protected
                if st_shndx != 0 and (st_info >> 4) in (STB_GLOBAL, STB_WEAK) and visible and st_name:
                    exported.append(_string(data, strtab, st_name))
        elif kind == SHT_DYNAMIC and strtab is not None:
            for pos in range(offset, offset + size, entsize or 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == DT_NEEDED:
                    needed.append(_string(data, strtab, value))
    return sorted(exported), needed


def _markers(data: bytes, prefix: bytes) -> list[dict[str, str]]:
    found = []
    for match in re.finditer(re.escape(prefix) + rb"([^\0]*)\0", data):
        found.append(dict(item.split("=", 1) for item in match.group(1).decode().split() if "=" in item))
    return found


def read_library(path: str | Path) -> LibraryInfo:
    path = Path(path)
    data = path.read_bytes()
    info = LibraryInfo(path=path)
    info.exported, info.needed = _dynamic_symbols(data)
    for plugin in _markers(data, PLUGIN_MARKER):
        info.api_version = int(plugin["api"]) if plugin.get("api", "").isdigit() else None
        archs = plugin.get("cuda_archs", "none")
        info.cuda_archs = [] if archs == "none" else archs.split(",")
    for op in _markers(data, OP_MARKER):
        info.ops.append(RegisteredOp(op["domain"], op["op"], int(op.get("since", 1)), op["provider"],
                                     tuple(op.get("types", "").split(","))))
    return info


# ---------------------------------------------------------------- CUDA architectures

def parse_archs(items) -> tuple[set[int], set[int]]:
    """SASS and PTX architectures as numbers (86), from CMake ('86-real', '90', '90-virtual'),
    TORCH_CUDA_ARCH_LIST ('8.6', '9.0+PTX') or cuobjdump ('sm_86', 'compute_90') spellings."""
    sass, ptx = set(), set()
    for item in items:
        item = item.strip()
        if not item:
            continue
        if item.startswith(("sm_", "compute_")):
            number = int(re.sub(r"\D", "", item.split("_", 1)[1]))
            (sass if item.startswith("sm_") else ptx).add(number)
        elif "." in item:
            number = int(item.replace("+PTX", "").replace(".", ""))
            sass.add(number)
            if item.endswith("+PTX"):
                ptx.add(number)
        else:
            number = int(re.sub(r"\D", "", item.split("-")[0]))
            if not item.endswith("-virtual"):
                sass.add(number)
            if not item.endswith("-real"):
                ptx.add(number)
    return sass, ptx


def covers(items, capability: tuple[int, int]) -> tuple[str, str]:
    """Whether binaries for `items` run on a GPU of `capability`: ('native'|'jit'|'missing', detail).

    A cubin runs on GPUs of the same major version and an equal or higher minor; PTX is compiled
    by the driver for any equal or newer GPU, at the cost of a JIT step at first launch.
    """
    sass, ptx = parse_archs(items)
    major, minor = capability
    wanted = major * 10 + minor
    native = [s for s in sass if s // 10 == major and s % 10 <= minor]
    if native:
        return "native", f"sm_{max(native)} runs natively on sm_{wanted}"
    jit = [p for p in ptx if p <= wanted]
    if jit:
        return "jit", f"only PTX compute_{max(jit)}: the driver JIT-compiles it at first launch"
    have = ", ".join([f"sm_{s}" for s in sorted(sass)] + [f"compute_{p}" for p in sorted(ptx)]) or "nothing"
    return "missing", f"compiled for {have}; nothing runs on sm_{wanted}"
