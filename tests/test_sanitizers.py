"""The plugin under AddressSanitizer + UndefinedBehaviorSanitizer (`python -m ort_plugin.sanitize`).

CI runs these through `nox -s tests`; `pytest -m sanitizers` selects them. They are never skipped:
a machine without gcc's sanitizer runtimes fails with the package to install.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ort_plugin.sanitize import REPORT_MARKS, SANITIZER_EXIT, SanitizerError, runtime_libraries, sanitizer_env

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.sanitizers


@pytest.fixture(scope="module")
def runtimes() -> list[Path]:
    try:
        return runtime_libraries()
    except SanitizerError as exc:
        pytest.fail(str(exc))


def test_the_setup_catches_a_planted_bug(runtimes, tmp_path):
    """The preload and options really turn a report into a failing exit, for ASan and for UBSan."""
    source = tmp_path / "planted.c"
    source.write_text(
        "#include <stdlib.h>\n"
        "int overrun(int n) { int *p = malloc(n * sizeof(int)); p[n] = 1; int r = p[0]; free(p); return r; }\n"
        "int overflow(int n) { return n * 100000; }\n")
    library = tmp_path / "libplanted.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=undefined", str(source), "-o", str(library)], check=True)
    for call, expected in (("overrun(3)", "heap-buffer-overflow"), ("overflow(1 << 20)", "signed integer overflow")):
        code = f"import ctypes; ctypes.CDLL({str(library)!r}).{call}; print('survived')"
        result = subprocess.run([sys.executable, "-c", code], env=sanitizer_env(runtimes), capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == SANITIZER_EXIT, (call, result.returncode, result.stderr[-3000:])
        assert expected in result.stderr and any(mark in result.stderr for mark in REPORT_MARKS)
        assert "survived" not in result.stdout


def test_plugin_is_clean_under_asan_and_ubsan(runtimes):
    result = subprocess.run([sys.executable, "-m", "ort_plugin.sanitize"], cwd=REPO, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, f"python -m ort_plugin.sanitize failed:\n{result.stderr[-8000:]}"
    assert "sanitizers clean" in result.stdout, result.stdout
    library = Path(result.stdout.strip().split()[-1])
    info = json.loads((library.parent / "build_info.json").read_text())
    assert info["sanitize"] == "address;undefined" and not info["with_cuda"]
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "libasan" in needed and "libubsan" in needed
