"""The infer image's content manifest (ort_plugin.contents), on a folder laid out as /opt/myops is."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ort_plugin import contents

REPO = Path(__file__).resolve().parent.parent


def _layout(root: Path) -> Path:
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libmyops_ort.so").write_bytes(b"\x7fELF plugin")
    (root / "artifacts").mkdir()
    (root / "artifacts" / "swish.onnx").write_bytes(b"model")
    (root / "app" / "__pycache__").mkdir(parents=True)
    (root / "app" / "__pycache__" / "x.pyc").write_bytes(b"cache")  # left out: written by whoever runs it
    return root


def test_same_contents_same_digest_anywhere(tmp_path):
    a, b = _layout(tmp_path / "a"), _layout(tmp_path / "b" / "deeper")
    assert contents.write(a) == contents.write(b)
    value, files = contents.check(a)
    assert files == 2 and value == contents.digest(contents.manifest_lines(b))
    assert "lib/libmyops_ort.so" in (a / contents.MANIFEST).read_text()


@pytest.mark.parametrize("change, named", [
    (lambda root: (root / "artifacts" / "swish.onnx").write_bytes(b"other"), "changed: artifacts/swish.onnx"),
    (lambda root: os.chmod(root / "lib" / "libmyops_ort.so", 0o600), "changed: lib/libmyops_ort.so"),
    (lambda root: (root / "artifacts" / "extra.onnx").write_bytes(b"x"), "added: artifacts/extra.onnx"),
    (lambda root: (root / "artifacts" / "swish.onnx").unlink(), "removed: artifacts/swish.onnx"),
], ids=["content", "mode", "added", "removed"])
def test_any_change_after_the_build_is_named(tmp_path, change, named):
    root = _layout(tmp_path / "opt")
    contents.write(root)
    change(root)
    with pytest.raises(contents.ContentsError, match=named):
        contents.check(root)


def test_verify_checks_the_manifest_first(tmp_path):
    root = _layout(tmp_path / "opt")
    contents.write(root)
    (root / "lib" / "libmyops_ort.so").write_bytes(b"swapped")
    env = dict(os.environ, PYTHONPATH=str(REPO), MYOPS_CONTENTS=str(root / contents.MANIFEST))
    result = subprocess.run([sys.executable, "-m", "infer.runner", "verify", "--artifacts", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1 and "changed: lib/libmyops_ort.so" in result.stderr and "pull or build it again" in result.stderr
