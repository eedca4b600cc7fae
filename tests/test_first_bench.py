"""A user's first bench leaves the committed results alone: `nox -s bench -- --help` prints at once,
a --quick run or a run of an op whose files are not committed goes to the scratch folder, untracked
files of an op make the tree dirty, and the summary's header is read off the rows it shows."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run_args

REPO = Path(__file__).resolve().parent.parent


def _args(*argv: str):
    return run_args.parser().parse_args(list(argv))


def test_help_imports_nothing_heavy():
    """What `nox -s bench -- --help` prints comes from bench.run_args, importable with the standard
    library alone (the nox venv has no numpy or torch), so it prints at once (no wall-clock bound here:
    a loaded CI machine would make one flaky)."""
    probe = ("import sys; from bench import run_args; run_args.parser().format_help(); "
             "print(sorted(m for m in ('numpy', 'torch', 'onnx', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.skipif(shutil.which("nox") is None and not (Path(sys.executable).parent / "nox").exists(),
                    reason="nox is not installed beside this Python")
def test_nox_bench_help_prints_at_once_without_building_anything(tmp_path):
    nox = shutil.which("nox") or str(Path(sys.executable).parent / "nox")
    # --no-venv: the help must not need the session's environment either; DOCKER_HOST at nothing, so a
    # build would fail loudly rather than run.
    out = subprocess.run([nox, "--no-venv", "-s", "bench", "--", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, DOCKER_HOST="unix:///nonexistent.sock"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "--backend" in out.stdout and "--workload" in out.stdout and "--results" in out.stdout, out.stdout
    assert "docker" not in out.stderr.lower().replace("--backend {docker,local}", ""), out.stderr[-2000:]


def test_destination(monkeypatch):
    monkeypatch.setattr(run_args.provenance, "uncommitted_op_files", lambda op: [])
    assert run_args.destination(_args()) == (run_args.RESULTS, "the default")
    assert run_args.destination(_args("--quick"))[0] == run_args.SCRATCH
    assert run_args.destination(_args("--quick", "--results", "/tmp/x")) == (Path("/tmp/x"), "--results")
    monkeypatch.setattr(run_args.provenance, "uncommitted_op_files",
                        lambda op: ["kernels/rms_norm.h"] if op == "rms_norm" else [])
    where, why = run_args.destination(_args("--workload", "rms_norm"))
    assert where == run_args.SCRATCH and "rms_norm" in why and "kernels/rms_norm.h" in why
    assert run_args.destination(_args("--workload", "swish"))[0] == run_args.RESULTS


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def test_untracked_files_of_an_op_make_the_tree_dirty_and_others_do_not(tmp_path):
    """In a checkout of lab/ and the op folders: a note at the top is not part of what runs; a new op's
    kernel is."""
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "lab", clone / "lab", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("kernels", "tests"):
        (clone / folder).mkdir()
        (clone / folder / "README").write_text("tracked\n")
    _git(clone, "init", "-q")
    _git(clone, "add", "-A")
    _git(clone, "commit", "-q", "-m", "base")
    probe = ("from lab import provenance as p; import json; "
             "print(json.dumps([p.git_state()['git_dirty'], p.uncommitted_op_files('my_op')]))")

    def state():
        out = subprocess.run([sys.executable, "-c", probe], cwd=clone, capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=str(clone)))
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert state() == "[false, []]"
    # An unstaged edit of a tracked op file, the only change: dirty, and named in full.
    (clone / "kernels" / "my_op_cuda.h").write_text("// tracked\n")
    _git(clone, "add", "kernels/my_op_cuda.h")
    _git(clone, "commit", "-q", "-m", "op file")
    (clone / "kernels" / "my_op_cuda.h").write_text("// edited\n")
    assert state() == '[true, ["kernels/my_op_cuda.h"]]'
    _git(clone, "checkout", "-q", "--", "kernels/my_op_cuda.h")
    assert state() == "[false, []]"
    # Another op whose name starts with this one's: dirty, but none of my_op's files.
    (clone / "kernels" / "my_op_gated.h").write_text("// new\n")
    (clone / "kernels" / "my_op_gated_vec-inl.h").write_text("// new\n")
    assert state() == "[true, []]"
    (clone / "kernels" / "my_op_gated.h").unlink()
    (clone / "kernels" / "my_op_gated_vec-inl.h").unlink()
    (clone / "notes.txt").write_text("mine\n")
    assert state() == "[false, []]"
    (clone / "kernels" / "my_op.h").write_text("// new\n")
    (clone / "tests" / "test_my_op.py").write_text("")
    assert state() == '[true, ["kernels/my_op.h", "tests/test_my_op.py"]]'


def test_the_summary_header_is_read_off_the_rows_it_shows():
    from bench.report import provenance_line

    row = {"device": "CPU A", "host": "a", "torch": "2.13.0", "onnx": "1.23", "onnxruntime": "1.32", "threads": "2",
           "git_sha": "1" * 40, "git_dirty": "False", "timestamp": "2026-12-01T08:00:00+00:00"}
    one = provenance_line([row, dict(row)])
    assert "CPU A (host a)" in one and "measured 2026-12-01T08:00:00+00:00." in one and "dirty" not in one
    other = dict(row, device="CPU B", host="b", git_sha="2" * 40, git_dirty="True", timestamp="2026-12-02T08:00:00+00:00")
    mixed = provenance_line([row, row, other])
    assert "CPU A (2 rows); CPU B (1 rows)" in mixed and "111111111111 (2 rows); 222222222222 (1 rows) (dirty)" in mixed
    assert "from 2026-12-01T08:00:00+00:00 to 2026-12-02T08:00:00+00:00" in mixed


def test_a_run_has_a_targets_step_only_where_targets_are_declared():
    from bench.run import has_targets

    assert has_targets(["swish"]) and has_targets(["rms_norm"])  # Swish's own, RMSNorm's declared
    assert not has_targets(["ffn"])  # the FFN (Swish inside a model) has none


def test_the_op_file_suffixes_are_those_the_scaffold_writes():
    from lab import new_op, provenance
    written = {p.name.removesuffix(".tmpl") for p in new_op.TEMPLATES.rglob("NAME*.tmpl")}
    assert {name.removeprefix("NAME") for name in written} == {".h", ".py"}  # the declaration and the math
    assert {name.removeprefix("NAME") for name in written} <= set(provenance.OP_FILE_SUFFIXES)
    # and the lab's own ops' kernels of their own (own_kernels) are known as theirs
    from opspec import OPS

    own = [p.name.removeprefix(op) for op in OPS for p in (provenance.REPO / "kernels").glob(f"{op}_cuda.*")]
    assert own and set(own) <= set(provenance.OP_FILE_SUFFIXES), own
