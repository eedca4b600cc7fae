"""A folder's content manifest: every file's sha256, mode and owner, and one digest over them all.

    python -m ort_plugin.contents write /opt/myops [FOLDER ...]   the infer image's build records CONTENTS
    python -m ort_plugin.contents check /opt/myops                 `verify` checks it before running anything

Further folders (the plugin's installed package and its .dist-info) are recorded by absolute path, and
the manifest names them, so `check` covers them too.

Docker's image IDs differ between two builds of the same commit (layer dates), the manifest does
not: two images hold the same plugin, artifacts and runner exactly when their digests agree.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

MANIFEST = "CONTENTS"
HEADER = "# sha256  mode  uid:gid  path (python -m ort_plugin.contents check <folder>)"
ALSO = "# also: "  # the manifest's line naming the further folders it covers


class ContentsError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_lines(root: Path, also: list[Path] = ()) -> list[str]:
    """One line per file under root (by its path relative to root), sorted, then one per file under each
    folder of `also` (by absolute path); bytecode caches and the manifest itself left out."""
    lines = []
    for folder, absolute in [(Path(root), False), *((Path(a), True) for a in also)]:
        if absolute and not folder.is_dir():
            raise ContentsError(f"{folder} is not a folder: the manifest cannot cover it")
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if (not absolute and relative.as_posix() == MANIFEST) or "__pycache__" in relative.parts \
                    or not path.is_file():
                continue
            stat = path.stat()
            name = path.as_posix() if absolute else relative.as_posix()
            lines.append(f"{_sha256(path)}  {stat.st_mode & 0o7777:04o}  {stat.st_uid}:{stat.st_gid}  {name}")
    return lines


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def write(root: Path, also: list[Path] = ()) -> str:
    also = [Path(a).resolve() for a in also]
    lines = manifest_lines(root, also)
    tmp = Path(root) / (MANIFEST + ".tmp")
    header = [HEADER] + ([ALSO + " ".join(a.as_posix() for a in also)] if also else [])
    tmp.write_text("\n".join([*header, *lines]) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, Path(root) / MANIFEST)
    return digest(lines)


def check(root: Path) -> tuple[str, int]:
    """(digest, files) of root when it matches its recorded manifest; ContentsError naming what differs."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise ContentsError(f"{path} is missing: this folder's contents were never recorded")
    text = path.read_text().splitlines()
    recorded = [line for line in text if line and not line.startswith("#")]
    also = [Path(a) for line in text if line.startswith(ALSO) for a in line[len(ALSO):].split()]
    try:
        actual = manifest_lines(root, also)
    except ContentsError as exc:
        raise ContentsError(f"{exc}, which {path} covers: the image was modified after its build; pull or build "
                            "it again") from None
    if actual != recorded:
        by_path = {line.split("  ")[-1]: line for line in recorded}
        now = {line.split("  ")[-1]: line for line in actual}
        changed = sorted(p for p in by_path.keys() & now.keys() if by_path[p] != now[p])
        added, removed = sorted(now.keys() - by_path.keys()), sorted(by_path.keys() - now.keys())
        parts = [f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                 for label, names in (("changed", changed), ("added", added), ("removed", removed)) if names]
        raise ContentsError(f"{root} no longer matches {path} ({'; '.join(parts)}): the image was modified after "
                            "its build; pull or build it again")
    return digest(actual), len(actual)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in ("write", "check") or (argv[0] == "check" and len(argv) != 2):
        print("usage: python -m ort_plugin.contents write FOLDER [FURTHER_FOLDER ...] | check FOLDER", file=sys.stderr)
        return 2
    try:
        if argv[0] == "write":
            also = [Path(a) for a in argv[2:]]
            print(f"contents of {' '.join(argv[1:])}: sha256 {write(Path(argv[1]), also)}")
        else:
            value, files = check(Path(argv[1]))
            print(f"contents of {argv[1]}: sha256 {value} ({files} files, as recorded at build)")
    except ContentsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
