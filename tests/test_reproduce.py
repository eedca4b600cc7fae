"""lab.reproduce's comparison and the causes of difference it removed. The two full builds
themselves are `nox -s reproduce` (CI runs it for the cpu entry)."""
from __future__ import annotations

import zipfile

import numpy as np

from lab import reproduce


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
