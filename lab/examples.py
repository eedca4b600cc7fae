"""`python -m lab.examples NAME [--bench] [--results DIR]`: a worked example of your own op, from the
scaffold to a measured run, in a copy of the tree (build/examples/NAME/; the checkout is not touched).

It scaffolds NAME there as `nox -s new_op` would (with the example's options), applies
docs/examples/NAME.patch (the few edits a user makes: the math in kernels/ and the declaration's form
and targets), runs the op's tests and, with --bench, measures it with
`python -m bench.run --workload NAME ...`, writing to --results (default results/examples/NAME/, where
the committed run of each example lives). Rows record this checkout's git sha and state.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import new_op, provenance

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "docs" / "examples"
WORK = REPO / "build" / "examples"
# Each example: the scaffold's options. Its edits are docs/examples/<name>.patch.
EXAMPLES = {
    "mish": {"native": "F.mish(x)"},  # x tanh(softplus(x)): an exp-based activation the lab does not ship
    # LayerNorm with bias: the row-wise kind, two weights and an attribute
    "layer_norm": {"kind": "rowwise", "weights": ("weight", "bias"), "attributes": {"epsilon": 1e-5},
                   "native": "F.layer_norm(x, x.shape[-1:], weight, bias, epsilon)"},
    # softmax(x + bias): a row-wise op whose row value merges by a rule of its own (a running maximum),
    # its outputs normalised over the row (kNormalize)
    "bias_softmax": {"kind": "rowwise", "weights": ("bias",), "attributes": {}},
}
# The workloads its bench runs beside its own: the ops its targets compare it with.
BENCH_PEERS = {"layer_norm": ("rms_norm",)}


class ExampleError(RuntimeError):
    pass


def example_tests(name: str) -> list[str]:
    """pytest's arguments for an example's tests: every declared op's (tests/test_declared_ops.py), run for it."""
    return ["tests/test_declared_ops.py", "-k", name]


def compiler_cache_env(copy: Path) -> dict[str, str]:
    """The environment that compiles in a tree copy through ccache, where it is installed ({} where not).
    Every copy holds the lab's own ops byte for byte, so only the op made there is compiled anew; the
    base dir makes the copy's paths relative, so one copy's objects serve the next."""
    ccache = shutil.which("ccache")
    if ccache is None:
        return {}
    shims = REPO / "build" / "ccache" / "bin"  # c++, g++, cc, gcc as ccache: what torch's build and CMake call
    shims.mkdir(parents=True, exist_ok=True)
    for name in ("c++", "g++", "cc", "gcc"):
        try:
            (shims / name).symlink_to(ccache)
        except FileExistsError:
            pass
    return {"PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}", "CCACHE_DIR": str(REPO / "build" / "ccache" / "cache"),
            "CCACHE_BASEDIR": str(copy.resolve()), "CCACHE_MAXSIZE": "2G", "CMAKE_CUDA_COMPILER_LAUNCHER": ccache}


def tree_copy(dest: Path) -> Path:
    """The checkout's files as a clone would have them (tracked, and untracked but not ignored), without
    results/ and without .git, so that nothing done there reaches the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    if dest.exists():
        shutil.rmtree(dest)
    for name in filter(None, listed):
        source = REPO / name
        if name.startswith("results/") or not source.is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name)
    return dest


def _run(copy: Path, *args: str, log=print) -> None:
    state = provenance.git_state()
    env = {k: v for k, v in os.environ.items() if k not in ("MYOPS_ORT_PLUGIN", "MYOPS_BUILD_DIR", "PYTHONPATH")}
    # The copy has no .git: its rows carry the checkout's sha and state.
    env.update(MYOPS_GIT_SHA=state["git_sha"] or "", MYOPS_GIT_DIRTY=str(state["git_dirty"]), GIT_DIR="/nonexistent")
    env.update(compiler_cache_env(copy))
    log(f"[examples] {' '.join(args)}")
    result = subprocess.run([sys.executable, *args], cwd=copy, env=env)
    if result.returncode != 0:
        raise ExampleError(f"`python {' '.join(args)}` failed in {copy} (exit {result.returncode}); see above")


def prepare(name: str, dest: Path, log=print) -> Path:
    """dest: a copy of the tree with the example scaffolded and its patch applied."""
    copy = tree_copy(dest)
    new_op.scaffold(name, repo=copy, log=lambda line: None, **EXAMPLES[name])
    patch = PATCHES / f"{name}.patch"
    # The copy lies inside the checkout (build/): git must not find the checkout's repository from there
    # (nor one an inherited GIT_DIR names).
    applied = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=copy, capture_output=True,
                             text=True, env={**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
                                             "GIT_CEILING_DIRECTORIES": str(copy.parent)})
    if applied.returncode != 0:
        raise ExampleError(f"{patch.relative_to(REPO)} no longer applies to what the scaffold writes "
                           f"({applied.stderr.strip()}): update it from a fresh scaffold")
    log(f"[examples] {name}: scaffolded and patched in {copy}")
    return copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.examples", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(EXAMPLES))
    parser.add_argument("--bench", action="store_true", help="measure it after its tests pass")
    parser.add_argument("--results", type=Path,
                        help="where --bench writes <entry>/ (default: results/examples/NAME/)")
    args = parser.parse_args(argv)
    try:
        copy = prepare(args.name, WORK / args.name)
        _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", *example_tests(args.name))
        if args.bench:
            results = args.results or REPO / "results" / "examples" / args.name
            _run(copy, "-m", "bench.run", "--workload", args.name, *BENCH_PEERS.get(args.name, ()),
                 "--results", str(results.resolve()))
    except (ExampleError, new_op.ScaffoldError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
