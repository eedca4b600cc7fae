"""CPU architectures an infer image is built for: Docker's platform name, the wheel tag's machine,
Debian's architecture and the GNU triplet of its cross compiler.

amd64 is the native one of every image; arm64 infer images are built here with the plugin
cross-compiled (Debian's g++-aarch64-linux-gnu) and run under qemu-user emulation.
"""
from __future__ import annotations

import platform as _platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    docker: str    # Docker's architecture name: linux/<docker>
    machine: str   # `uname -m` and the manylinux tag's machine
    triplet: str   # GNU triplet: <triplet>-g++ cross-compiles for it

    @property
    def os_arch(self) -> str:
        return f"linux/{self.docker}"


PLATFORMS = {p.docker: p for p in (Platform("amd64", "x86_64", "x86_64-linux-gnu"),
                                   Platform("arm64", "aarch64", "aarch64-linux-gnu"))}
BY_MACHINE = {p.machine: p for p in PLATFORMS.values()}
# The images' own architecture: train images, CUDA entries and the tags without a suffix.
PRIMARY = PLATFORMS["amd64"]


class PlatformError(ValueError):
    pass


def get(name: str) -> Platform:
    """By Docker name (arm64) or machine (aarch64)."""
    found = PLATFORMS.get(name) or BY_MACHINE.get(name)
    if found is None:
        raise PlatformError(f"unknown architecture {name!r}; known: {', '.join(PLATFORMS)}")
    return found


def host() -> Platform | None:
    """This machine's platform (None on one the lab has no images for)."""
    return BY_MACHINE.get(_platform.machine())


def infer_platforms(entry: dict) -> list[Platform]:
    """What the entry's infer image is built for, the primary first."""
    return [get(name) for name in entry.get("infer_platforms", [PRIMARY.docker])]


def tag_suffix(plat: Platform) -> str:
    """Local tags of the non-primary builds carry the architecture: infer:cpu-ort1.32.0-arm64."""
    return "" if plat == PRIMARY else f"-{plat.docker}"
