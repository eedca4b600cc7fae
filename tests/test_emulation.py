"""lab.emulation: what makes a binfmt_misc handler fit for the lab's arm64 images, read from real
files laid out as the kernel shows them, with real emulator stand-ins that print a version."""
from __future__ import annotations

import stat

import pytest

from lab import emulation, platforms

ARM64 = platforms.get("arm64")


def _emulator(path, version: str):
    path.write_text(f"#!/bin/sh\necho 'qemu-aarch64 version {version} (Debian)'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _binfmt(tmp_path, monkeypatch, *, status=None, mounted=True):
    root = tmp_path / "binfmt_misc"
    root.mkdir()
    if mounted:
        (root / "register").write_text("")
    if status is not None:
        (root / "qemu-aarch64").write_text(status)
    monkeypatch.setattr(emulation, "BINFMT", root)
    monkeypatch.setattr(platforms, "host", lambda: platforms.get("amd64"))
    return root


def _status(interpreter, flags="POF", enabled=True) -> str:
    return (f"{'enabled' if enabled else 'disabled'}\ninterpreter {interpreter}\nflags: {flags}\noffset 0\n"
            "magic 7f454c460201010000000000000000000200b700\n")


def test_a_new_enough_emulator_with_the_f_flag_is_accepted(tmp_path, monkeypatch):
    qemu = _emulator(tmp_path / "qemu-aarch64", "10.0.13")
    _binfmt(tmp_path, monkeypatch, status=_status(qemu))
    assert emulation.registered(ARM64) == {"enabled": True, "interpreter": str(qemu), "flags": "POF"}
    assert emulation.problem(ARM64) is None


@pytest.mark.parametrize("case,expected", [
    ("not-mounted", "binfmt_misc is not mounted"),
    ("no-handler", "no qemu-aarch64 handler is registered"),
    ("disabled", "handler is disabled"),
    ("no-f-flag", "lacks the F flag, so containers cannot reach its emulator"),
    ("old", "is qemu 7.2.0, older than 10.0"),
    ("silent", "qemu of an unknown version"),
])
def test_each_unfit_setup_names_its_fix(tmp_path, monkeypatch, case, expected):
    qemu = _emulator(tmp_path / "qemu-aarch64", "7.2.0" if case == "old" else "10.0.13")
    if case == "silent":
        qemu.write_text("#!/bin/sh\nexit 1\n")
    status = {"no-handler": None, "disabled": _status(qemu, enabled=False), "no-f-flag": _status(qemu, flags="OP")}
    _binfmt(tmp_path, monkeypatch, status=status.get(case, _status(qemu)), mounted=case != "not-mounted")
    why = emulation.problem(ARM64)
    assert why and expected in why, why
    assert "python -m lab.emulation install arm64" in why


def test_the_native_platform_needs_nothing(monkeypatch):
    monkeypatch.setattr(platforms, "host", lambda: ARM64)
    assert emulation.problem(ARM64) is None
    said = []
    assert emulation.install(ARM64, log=said.append) is None and "natively" in said[0]
