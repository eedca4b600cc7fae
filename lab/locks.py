"""`nox -s lock -- ENTRY`: every lock of a matrix entry resolved anew: its images' wheel locks
(lab.wheels) for each platform, and a CUDA entry's toolkit lock (lab.toolkit, which builds on
lab.wheels)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import matrix, platforms, toolkit, wheels


def relock(entry_id: str, *, log=print) -> list[Path]:
    """Resolve an entry's image locks anew (train, infer and the wheels' build backends', then the
    infer image's other architectures), and a CUDA entry's toolkit lock, and rewrite them; the old lock
    stays until its new one is complete."""
    entry = matrix.entry(entry_id)
    written = []
    for plat in platforms.infer_platforms(entry):
        for kind in wheels.KINDS if plat == platforms.PRIMARY else ("infer",):
            lock = wheels.resolve(entry, kind, wheels.wheelhouse_dir(entry, plat), plat=plat, log=log)
            log(f"[wheels] rewrote {wheels.shown(lock)}: review and commit it")
            written.append(lock)
    if entry["device"] == "cuda":
        written.append(toolkit.relock(entry, log=log))
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.locks", description="Resolve an entry's image locks anew.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("lock", help="resolve the entry from its indexes and rewrite docker/locks/<entry>-*.txt").add_argument(
        "entry", help="a matrix entry id (nox -s list)")
    args = parser.parse_args(argv)
    try:
        relock(args.entry)
    except (wheels.WheelError, matrix.MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
