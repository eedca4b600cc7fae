"""lab.reproduce's comparison and the causes of difference it removed. The two full builds
themselves are `nox -s reproduce` (CI runs it for the cpu entry)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from lab import reproduce

REPO = Path(__file__).resolve().parent.parent


def test_npz_members_carry_no_clock(tmp_path):
    from ops.artifacts import save_npz

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_npz(tmp_path / "a.npz", x=x)
    with zipfile.ZipFile(tmp_path / "a.npz") as archive:
        assert [m.date_time for m in archive.infolist()] == [(1980, 1, 1, 0, 0, 0)]
    with np.load(tmp_path / "a.npz") as loaded:
        assert np.array_equal(loaded["x"], x)


def test_differences_are_named_and_unexplained_ones_found(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "REPORTS", tmp_path / "reports")
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "same.bin").write_bytes(b"same bytes")
    (a / "lib.so").write_bytes(b"built in /tmp/a")
    (b / "lib.so").write_bytes(b"built in /tmp/bb")
    (a / "only-a.onnx").write_bytes(b"x")
    files_a = {p.name: p for p in a.iterdir()}
    files_b = {p.name: p for p in b.iterdir()}
    rows = {r["artifact"]: r for r in reproduce.compare("cpu", files_a, files_b, "test", {"git_sha": "abc"})}
    assert rows["same.bin"]["identical"] and rows["same.bin"]["sha256_a"] == rows["same.bin"]["sha256_b"]
    assert not rows["lib.so"]["identical"] and rows["lib.so"]["cause"].startswith("unexplained: ")
    assert rows["only-a.onnx"]["cause"] == "only in build a"
    monkeypatch.setitem(reproduce.EXPLAINED, "lib.so", "the linker's own version string")
    rows = {r["artifact"]: r for r in reproduce.compare("cpu", files_a, files_b, "test", {})}
    assert rows["lib.so"]["cause"] == "the linker's own version string"


def test_one_entrys_run_replaces_only_its_own_rows(tmp_path):
    path = tmp_path / "reproducibility.csv"
    row = dict.fromkeys(reproduce.COLUMNS, "")
    reproduce.write_csv_atomic(path, [dict(row, entry="cpu", artifact="wheel myops_ort", identical=True),
                                      dict(row, entry="cuda12.1", artifact="wheel myops_ort_cu12", identical=False)],
                               reproduce.COLUMNS)
    rows = reproduce.merged(path, "cuda12.1", [dict(row, entry="cuda12.1", artifact="wheel myops_torch",
                                                    identical=True)])
    assert [(r["entry"], r["artifact"]) for r in rows] == [("cpu", "wheel myops_ort"),
                                                           ("cuda12.1", "wheel myops_torch")]
    assert reproduce.merged(tmp_path / "none.csv", "cpu", rows) == rows


def test_a_cuda_entry_takes_no_host_build_options(capsys):
    assert reproduce.main(["cuda12.1", "--images"]) == 2
    assert "cuda12.1 is a CUDA entry" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nox") is None and not (Path(sys.executable).parent / "nox").exists(),
                    reason="nox is not installed beside this Python")
def test_nox_reproduce_takes_a_cuda_entry_to_lab_reproduce():
    """`nox -s reproduce -- cuda12.1` is not refused as the local backend's sessions refuse a CUDA entry: it
    runs in the cpu entry's venv (.nox/cpu, the suite's own) and reaches lab.reproduce (here its refusal
    of a host-build option)."""
    nox = shutil.which("nox") or str(Path(sys.executable).parent / "nox")
    out = subprocess.run([nox, "-s", "reproduce", "--", "cuda12.1", "--images"],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "cuda12.1 is a CUDA entry" in said, said[-3000:]
    assert "the local backend builds only the cpu entry" not in said, said[-3000:]
