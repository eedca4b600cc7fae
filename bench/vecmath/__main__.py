"""`python -m bench.vecmath`: build bench/vecmath/choice.cc and print, for each CPU path this machine
runs, Swish's float32 forward on the hand-written kernels, on Highway (its contrib Exp, and the lab's
vm::Exp of kernels/vec_math-inl.h) and on SLEEF where libsleef-dev is installed, at two sizes: one that
stays in L2 (the arithmetic shows) and the bench's 8x512x768. One thread; ratios to the hand path."""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lab import highway

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent.parent / "kernels"
SIZES = {"in L2 (192K floats)": (196608, 300), "8x512x768": (8 * 512 * 768, 30)}


def sleef_installed() -> bool:
    probe = subprocess.run(["g++", "-x", "c++", "-", "-fsyntax-only"], input="#include <sleef.h>\n",
                           capture_output=True, text=True)
    return probe.returncode == 0


def build(out: Path, with_sleef: bool) -> Path:
    binary = out / "choice"
    command = ["g++", "-O3", "-std=c++17", f"-I{KERNELS}", f"-I{HERE}", f"-I{highway.resolve().include_dir}",
               str(HERE / "choice.cc"), "-o", str(binary)]
    command += ["-DMYOPS_VECMATH_SLEEF=1", "-lsleef"] if with_sleef else []
    subprocess.run(command, check=True)
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vecmath", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    if shutil.which("g++") is None:
        print("error: g++ is needed to build bench/vecmath/choice.cc", file=sys.stderr)
        return 2
    with_sleef = sleef_installed()
    if not with_sleef:
        print("[vecmath] SLEEF is not installed (Debian: libsleef-dev): its column is left out", flush=True)
    with tempfile.TemporaryDirectory(prefix="vecmath-") as tmp:
        binary = build(Path(tmp), with_sleef)
        print("| size | path | library | ns per element (median of 5 rounds) | vs hand |\n|---|---|---|---|---|")
        for label, (n, passes) in SIZES.items():
            lines = subprocess.run([str(binary), str(n), str(passes)], check=True, capture_output=True,
                                   text=True).stdout.split("\n")
            figures = [line.split() for line in lines if line.strip()]
            hand = {path: float(median) for path, library, _, median, _ in figures if library == "hand"}
            for path, library, low, median, high in figures:
                print(f"| {label} | {path} | {library} | {float(median):.3f} ({float(low):.3f}-{float(high):.3f}) "
                      f"| {float(median) / hand[path]:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
