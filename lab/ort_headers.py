"""Find the pinned ONNX Runtime C/C++ headers the plugin compiles against.

ORT's Python wheels ship no headers, so they are resolved in this order:
  1. an explicit include dir (argument or ORT_INCLUDE_DIR),
  2. the local cache (~/.cache/myops-lab/ort-headers/<version>),
     with the version and checksums pinned per entry in matrix.yaml (ort_headers),
  3. the official release archive, only when its sha256 is pinned below,
  4. Debian's libonnxruntime-dev package, fetched with a throw-away apt configuration that reuses
     the Debian mirror this machine is already configured with (lab.debian: no install, no root).
Every download is checked against its pinned sha256 and lands in the cache atomically.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .files import held

# The pins come from matrix.yaml (entry -> ort_headers); see pin_from_matrix().
HEADER = "onnxruntime_c_api.h"


class HeadersNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class HeaderPin:
    version: str
    archive_url: str
    archive_sha256: str | None
    debian_package: str | None = None
    debian_suite: str | None = None
    debian_version: str | None = None
    debian_sha256: str | None = None


def pin_from_matrix(entry_id: str | None = None) -> HeaderPin:
    """The ort_headers pin of a matrix entry ($MYOPS_MATRIX_ENTRY, default cpu)."""
    from lab.matrix import DEFAULT_ENTRY, entry

    spec = entry(entry_id or os.environ.get("MYOPS_MATRIX_ENTRY", DEFAULT_ENTRY))["ort_headers"]
    debian = spec.get("debian") or {}
    return HeaderPin(spec["version"], spec["archive"]["url"], spec["archive"]["sha256"], debian.get("package"),
                     debian.get("suite"), debian.get("version"), debian.get("sha256"))


@dataclass
class Headers:
    include_dir: Path
    version: str
    api_version: int
    source: str


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "myops-lab" / "ort-headers"


def api_version_of(include_dir: Path) -> int:
    text = (include_dir / HEADER).read_text(errors="replace")
    match = re.search(r"#define\s+ORT_API_VERSION\s+(\d+)", text)
    if not match:
        raise HeadersNotFound(f"{include_dir / HEADER} has no ORT_API_VERSION: not an onnxruntime header")
    return int(match.group(1))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _install_into_cache(found_include: Path, cache_dir: Path) -> Path:
    """Copy a found include dir into the cache atomically (a half-copied cache is never visible), one
    process at a time: one that fetched the same headers meanwhile leaves the other's copy in place (a
    build may be reading it)."""
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    with held(cache_dir.parent / f".{cache_dir.name}.lock", what=f"filling {cache_dir}", log=lambda m: None):
        if (cache_dir / "include").is_dir() and _listing(cache_dir / "include") == _listing(found_include):
            return cache_dir / "include"
        staging = Path(tempfile.mkdtemp(dir=cache_dir.parent, prefix=".staging-"))
        try:
            shutil.copytree(found_include, staging / "include")
            if cache_dir.exists():
                shutil.rmtree(cache_dir)
            os.replace(staging, cache_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return cache_dir / "include"


def _listing(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


def unreachable(url: str, timeout_s: float) -> str | None:
    """Why no connection to the host of `url` (or its proxy) opens within timeout_s, or None when one does.

    A host without a network then fails in seconds, not after a download's and apt's own timeouts.
    The name lookup is inside the bound too (socket timeouts do not cover it).
    """
    parsed = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parsed.scheme)
    target = urllib.parse.urlsplit(proxy) if proxy and not urllib.request.proxy_bypass(parsed.hostname or "") else parsed
    port = target.port or (443 if target.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect():
        try:
            with socket.create_connection((target.hostname, port), timeout=timeout_s):
                outcome.append(None)
        except OSError as exc:
            outcome.append(str(exc) or "timed out")

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout_s)
    if not outcome:
        return f"{target.hostname}:{port} gave no answer within {timeout_s:.0f} s: is this host offline?"
    if outcome[0] is not None:
        return f"{target.hostname}:{port} cannot be reached ({outcome[0]}): is this host offline?"
    return None


def _download(url: str, dest: Path, timeout_s: float) -> None:
    """url to dest within timeout_s in all (urlopen's timeout is per socket operation)."""
    deadline = time.monotonic() + timeout_s
    with urllib.request.urlopen(url, timeout=timeout_s) as response, open(dest, "wb") as out:
        while block := response.read(1 << 20):
            out.write(block)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish downloading within {timeout_s:.0f} s")


def _from_release_archive(pin: HeaderPin, cache_dir: Path, work: Path, timeout_s: float = 30) -> Path:
    if not pin.archive_sha256:
        raise HeadersNotFound(f"no sha256 pinned for {pin.archive_url}; an unverified archive is not used")
    why = unreachable(pin.archive_url, min(timeout_s, 10))
    if why:
        raise HeadersNotFound(why)
    archive = work / "ort.tgz"
    try:
        _download(pin.archive_url, archive, timeout_s)
    except OSError as exc:
        raise HeadersNotFound(f"could not download {pin.archive_url}: {exc}") from exc
    if _sha256(archive) != pin.archive_sha256:
        raise HeadersNotFound(f"{pin.archive_url}: sha256 mismatch (expected {pin.archive_sha256})")
    with tarfile.open(archive) as tar:
        tar.extractall(work / "x", filter="data")
    return _install_into_cache(next((work / "x").glob("*/include")), cache_dir)


def _from_debian(pin: HeaderPin, cache_dir: Path, work: Path, timeout_s: float = 900) -> Path:
    from lab.debian import Apt, DebianError, extract, mirror

    if not (pin.debian_package and pin.debian_sha256):
        raise HeadersNotFound("no Debian package pinned for these headers")
    try:
        why = unreachable(mirror(), min(timeout_s, 10))
        if why:
            raise HeadersNotFound(why)
        with Apt(pin.debian_suite, timeout_s=timeout_s) as apt:
            deb = apt.download(pin.debian_package, pin.debian_version, work)
        if _sha256(deb) != pin.debian_sha256:
            raise HeadersNotFound(f"{deb.name}: sha256 mismatch (expected {pin.debian_sha256})")
        extract(deb, work / "x")
    except DebianError as exc:
        raise HeadersNotFound(str(exc)) from exc
    return _install_into_cache(work / "x" / "usr" / "include" / "onnxruntime", cache_dir)


def resolve(include_dir: str | os.PathLike | None = None, *, pin: HeaderPin | None = None, log=print,
            timeout_s: float | None = None) -> Headers:
    """Return the headers to build against, fetching them into the cache when needed (within
    timeout_s seconds in all, when given)."""
    explicit = include_dir or os.environ.get("ORT_INCLUDE_DIR")
    if explicit:
        path = Path(explicit)
        if not (path / HEADER).is_file():
            raise HeadersNotFound(f"{path} (given explicitly) holds no {HEADER}")
        return Headers(path, "explicit", api_version_of(path), f"explicit: {path}")

    pin = pin or pin_from_matrix()
    cache_dir = cache_root() / pin.version
    if (cache_dir / "include" / HEADER).is_file():
        return Headers(cache_dir / "include", pin.version, api_version_of(cache_dir / "include"), f"cache: {cache_dir}")

    failures = []
    deadline = time.monotonic() + timeout_s if timeout_s else None
    for name, fetch, default_s in (("release archive", _from_release_archive, 30), ("Debian package", _from_debian, 900)):
        left = deadline - time.monotonic() if deadline else default_s
        if left < 1:
            failures.append(f"  - {name}: not tried, the {timeout_s:.0f} s allowed for fetching were spent")
            continue
        log(f"[ort_plugin] fetching onnxruntime {pin.version} headers from the {name} ...")
        with tempfile.TemporaryDirectory(prefix="ort-headers-") as work:
            try:
                found = fetch(pin, cache_dir, Path(work), min(left, default_s))
            except (HeadersNotFound, OSError, subprocess.SubprocessError) as exc:
                failures.append(f"  - {name}: {exc}")
                continue
        return Headers(found, pin.version, api_version_of(found), name)
    raise HeadersNotFound(
        f"no onnxruntime {pin.version} headers found:\n"
        + "\n".join(failures)
        + f"\nFix: unpack the onnxruntime {pin.version} release archive and set ORT_INCLUDE_DIR=<its include dir>, "
        f"or place the headers in {cache_dir / 'include'}."
    )
