"""Debian packages fetched without installing them: a throw-away apt configuration that reuses the
Debian mirror this machine is configured with (any suite, any component), so apt checks the
archive's signatures; the .deb files are then unpacked where they are needed (no root, no dpkg db).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class DebianError(RuntimeError):
    pass


def mirror() -> str:
    """The Debian mirror this machine already uses (deb822 or one-line format)."""
    candidates = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
    candidates += sorted(Path("/etc/apt/sources.list.d").glob("*.list"))
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for uri in re.findall(r"^URIs:\s*(\S+)", text, flags=re.M) + re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, flags=re.M):
            if uri.rstrip("/").endswith("/debian"):
                return uri
    raise DebianError("no Debian mirror is configured in /etc/apt: add one (a Debian machine has it) to fetch packages")


class Apt:
    """apt-get and apt-cache against one suite, in a scratch directory; use as a context manager."""

    def __init__(self, suite: str, components: tuple[str, ...] = ("main",), timeout_s: float | None = None):
        """timeout_s: for all of this object's apt calls together (default: 900 s for each)."""
        if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
            raise DebianError("apt-get and dpkg-deb are needed to fetch Debian packages (a Debian-like host)")
        self.suite, self.components = suite, components
        self.work = Path(tempfile.mkdtemp(prefix=f"apt-{suite}-"))
        (self.work / "lists" / "partial").mkdir(parents=True)
        (self.work / "cache" / "archives" / "partial").mkdir(parents=True)
        (self.work / "sources.list").write_text(
            f"deb [signed-by={KEYRING}] {mirror()} {suite} {' '.join(components)}\n")
        self._updated = False
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s if timeout_s else None

    def __enter__(self) -> "Apt":
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def _options(self) -> list[str]:
        # apt's own connection timeout within ours, and no retries: a dead mirror fails once, fast.
        network = [f"-o=Acquire::http::Timeout={max(int(self.timeout_s) // 3, 5)}", "-o=Acquire::Retries=0"] \
            if self.timeout_s else []
        return ["-q", *network, f"-o=Dir::Etc::SourceList={self.work / 'sources.list'}", "-o=Dir::Etc::SourceParts=/dev/null",
                f"-o=Dir::State::Lists={self.work / 'lists'}", f"-o=Dir::Cache={self.work / 'cache'}",
                "-o=Debug::NoLocking=1", "-o=APT::Sandbox::User=root"]

    def _time_left(self) -> float:
        return max(self.deadline - time.monotonic(), 1) if self.deadline else 900

    def _run(self, tool: str, *args: str, cwd: Path | None = None, timeout: float | None = None) -> str:
        if not self._updated and args[0] != "update":
            self._updated = True
            self._run("apt-get", "update")
        result = subprocess.run([tool, *self._options(), *args], cwd=cwd or self.work, capture_output=True,
                                text=True, timeout=timeout or self._time_left())
        if result.returncode != 0:
            tail = [line for line in result.stderr.strip().splitlines() if line.strip()][-2:]
            raise DebianError(f"{tool} {args[0]} ({self.suite} {'/'.join(self.components)}) failed: {' | '.join(tail)}")
        return result.stdout

    def show(self, package: str, version: str | None = None) -> dict:
        """The control fields of package=version, or of the suite's newest (Version, Depends, ...)."""
        text = self._run("apt-cache", "show", f"{package}={version}" if version else package)
        fields, key = {}, None
        for line in text.split("\n\n")[0].splitlines():
            if line[:1].isspace() and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        return fields

    def depends_on(self, package: str, version: str, prefix: str) -> tuple[str, str]:
        """The exact (=) dependency of package=version whose name starts with `prefix`."""
        for name, wanted in re.findall(r"([a-z0-9.+-]+) \(= ([^)]+)\)", self.show(package, version).get("Depends", "")):
            if name.startswith(prefix):
                return name, wanted
        raise DebianError(f"{package} {version} ({self.suite}) has no exact dependency named {prefix}*")

    def download(self, package: str, version: str, dest: Path) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        self._run("apt-get", "download", f"{package}={version}", cwd=dest)
        found = [p for p in dest.glob(f"{package}_*.deb")]
        if not found:
            raise DebianError(f"apt-get download produced no {package} package")
        return found[0]


def extract(deb: Path, dest: Path, members: list[str] | None = None) -> None:
    """Unpack a .deb's files (all, or the given ./paths and globs) under dest."""
    dest.mkdir(parents=True, exist_ok=True)
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as tar_stream:
        result = subprocess.run(["tar", "-x", "-C", str(dest), "--wildcards", *(members or [])],
                                stdin=tar_stream.stdout, capture_output=True, text=True)
    if tar_stream.returncode != 0 or result.returncode != 0:
        raise DebianError(f"unpacking {deb.name} failed: {result.stderr.strip()[-300:]}")
