"""The infer image's content manifest (ort_plugin.contents), on folders laid out as the image's are:
/opt/myops, and the plugin's package and .dist-info as pip installed them into the venv."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ort_plugin import contents

REPO = Path(__file__).resolve().parent.parent


def _layout(root: Path) -> Path:
    (root / "wheels").mkdir(parents=True)
    (root / "wheels" / "myops_ort-0.1.0-py3-none-linux_x86_64.whl").write_bytes(b"PK wheel")
    (root / "artifacts").mkdir()
    (root / "artifacts" / "swish.onnx").write_bytes(b"model")
    (root / "app" / "__pycache__").mkdir(parents=True)
    (root / "app" / "__pycache__" / "x.pyc").write_bytes(b"cache")  # left out: written by whoever runs it
    return root


def _installed(site: Path) -> list[Path]:
    """The plugin's package and .dist-info, as pip installs them into site-packages."""
    (site / "myops_ort").mkdir(parents=True)
    (site / "myops_ort" / "libmyops_ort.so").write_bytes(b"\x7fELF plugin")
    (site / "myops_ort" / "__pycache__").mkdir()
    (site / "myops_ort" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"cache")
    (site / "myops_ort-0.1.0.dist-info").mkdir()
    (site / "myops_ort-0.1.0.dist-info" / "RECORD").write_text("myops_ort/libmyops_ort.so,sha256=...,12\n")
    return [site / "myops_ort", site / "myops_ort-0.1.0.dist-info"]


def test_same_contents_same_digest_anywhere(tmp_path):
    a, b = _layout(tmp_path / "a"), _layout(tmp_path / "b" / "deeper")
    assert contents.write(a) == contents.write(b)
    value, files = contents.check(a)
    assert files == 2 and value == contents.digest(contents.manifest_lines(b))
    assert "wheels/myops_ort-0.1.0-py3-none-linux_x86_64.whl" in (a / contents.MANIFEST).read_text()


def test_the_installed_package_is_covered_by_absolute_path(tmp_path):
    root, package = _layout(tmp_path / "opt"), _installed(tmp_path / "site-packages")
    contents.write(root, package)
    value, files = contents.check(root)  # the manifest names the further folders itself
    assert files == 4, (root / contents.MANIFEST).read_text()
    library = (tmp_path / "site-packages" / "myops_ort" / "libmyops_ort.so").resolve()
    assert f"  {library.as_posix()}" in (root / contents.MANIFEST).read_text()
    library.write_bytes(b"swapped")
    with pytest.raises(contents.ContentsError, match=f"changed: {library.as_posix()}"):
        contents.check(root)


def test_an_installed_package_that_is_gone_is_named(tmp_path):
    import shutil

    root, package = _layout(tmp_path / "opt"), _installed(tmp_path / "site-packages")
    contents.write(root, package)
    shutil.rmtree(package[1])
    with pytest.raises(contents.ContentsError, match="myops_ort-0.1.0.dist-info is not a folder.*pull or build it again"):
        contents.check(root)


def test_the_command_line_writes_the_further_folders(tmp_path):
    root, package = _layout(tmp_path / "opt"), _installed(tmp_path / "site-packages")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = [sys.executable, "-m", "ort_plugin.contents"]
    written = subprocess.run([*run, "write", str(root), *map(str, package)], capture_output=True, text=True, env=env)
    assert written.returncode == 0, written.stderr
    checked = subprocess.run([*run, "check", str(root)], capture_output=True, text=True, env=env)
    assert checked.returncode == 0 and "(4 files, as recorded at build)" in checked.stdout, checked.stdout + checked.stderr


@pytest.mark.parametrize("change, named", [
    (lambda root: (root / "artifacts" / "swish.onnx").write_bytes(b"other"), "changed: artifacts/swish.onnx"),
    (lambda root: os.chmod(root / "artifacts" / "swish.onnx", 0o600), "changed: artifacts/swish.onnx"),
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
    (root / "artifacts" / "swish.onnx").write_bytes(b"swapped")
    env = dict(os.environ, PYTHONPATH=str(REPO), MYOPS_CONTENTS=str(root / contents.MANIFEST))
    result = subprocess.run([sys.executable, "-m", "infer.runner", "verify", "--artifacts", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1 and "changed: artifacts/swish.onnx" in result.stderr and "pull or build it again" in result.stderr
