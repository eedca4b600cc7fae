"""Google Highway's headers, which the CPU kernels of a scaffolded op (and kernels/vec_targets.h) build
on: portable vectors, its contrib math (Exp, Log1p, Tanh, ...) and one compiled copy per CPU target.

The lab uses Highway header-only (the per-target namespaces, picked by kernels/vec_targets.h from
cpu_isa.h's choice), so nothing links against libhwy: the plugin stays one self-contained file. The
headers are pinned to Debian bookworm's libhwy-dev 1.0.3 (bench/vecmath measured it against SLEEF
3.5.1 and the hand-written kernels: docs/your-op.md) and resolved in this order:
  1. MYOPS_HWY_INCLUDE_DIR (a directory holding hwy/highway.h);
  2. the cache, <XDG_CACHE_HOME or ~/.cache>/myops-lab/highway/<version>/include;
  3. the pinned .deb fetched with a throw-away apt configuration from the Debian mirror this machine
     is configured with (lab.debian), checked against its sha256 and unpacked into the cache.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .ort_headers import _install_into_cache, _sha256, unreachable

VERSION = "1.0.3"
# Debian bookworm's package and its sha256, as its Packages index lists them (apt-cache show).
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGE = "libhwy-dev"
DEBIAN_VERSION = "1.0.3-3+deb12u1"
DEBIAN_SHA256 = {"amd64": "7db65cd6c5b43b523136f92589ce373f625ca10d569bd0201b5a0d521d8fae4d",
                 "arm64": "37291571976999378098950b37bca3cddacc8cec282a102e83ad298fe7dda5bc"}
HEADER = Path("hwy") / "highway.h"


class HighwayNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class Headers:
    include_dir: Path
    source: str


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "myops-lab" / "highway" / VERSION


def _from_debian(dest: Path, work: Path, timeout_s: float) -> Path:
    from .debian import Apt, DebianError, extract, mirror

    try:
        why = unreachable(mirror(), min(timeout_s, 10))
        if why:
            raise HighwayNotFound(why)
        with Apt(DEBIAN_SUITE, timeout_s=timeout_s) as apt:
            deb = apt.download(DEBIAN_PACKAGE, DEBIAN_VERSION, work)
        arch = deb.name.rsplit("_", 1)[-1].removesuffix(".deb")
        if _sha256(deb) != DEBIAN_SHA256.get(arch):
            raise HighwayNotFound(f"{deb.name}: its sha256 is not the one pinned in lab/highway.py for {arch}")
        extract(deb, work / "x", ["./usr/include/hwy/*"])
    except DebianError as exc:
        raise HighwayNotFound(str(exc)) from exc
    return _install_into_cache(work / "x" / "usr" / "include", dest)


def resolve(*, log=print, timeout_s: float = 600) -> Headers:
    """The Highway include directory to build against, fetched into the cache when missing."""
    explicit = os.environ.get("MYOPS_HWY_INCLUDE_DIR")
    if explicit:
        if not (Path(explicit) / HEADER).is_file():
            raise HighwayNotFound(f"MYOPS_HWY_INCLUDE_DIR={explicit} holds no {HEADER}")
        return Headers(Path(explicit), f"explicit: {explicit}")
    dest = cache_dir()
    if (dest / "include" / HEADER).is_file():
        return Headers(dest / "include", f"cache: {dest}")
    log(f"[highway] fetching Highway {VERSION}'s headers ({DEBIAN_PACKAGE} {DEBIAN_VERSION}, Debian {DEBIAN_SUITE}) ...")
    with tempfile.TemporaryDirectory(prefix="highway-") as work:
        try:
            include = _from_debian(dest, Path(work), timeout_s)
        except (HighwayNotFound, OSError) as exc:
            raise HighwayNotFound(
                f"Highway {VERSION}'s headers could not be fetched ({exc}). Install them (Debian/Ubuntu: "
                f"libhwy-dev {VERSION}, or Highway's release {VERSION} from its project) and set "
                "MYOPS_HWY_INCLUDE_DIR to the directory that holds hwy/highway.h") from exc
    return Headers(include, f"{DEBIAN_PACKAGE} {DEBIAN_VERSION}")


def needed(repo: Path) -> bool:
    """Whether any op's CPU kernels build on Highway (a kernels/<op>_vec-inl.h): the lab's own ops do
    not, so a checkout without a scaffolded op never fetches the headers."""
    return any((repo / "kernels").glob("*_vec-inl.h"))


def include_dirs(repo: Path, *, log=print) -> list[Path]:
    """[the Highway include directory] where an op needs it, else []."""
    return [resolve(log=log).include_dir] if needed(repo) else []
