"""Shared fixtures: the extension and the plugin are built once per test session (cached builds)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def pytest_configure(config):
    config.addinivalue_line("markers", "bigmem: needs ~18 GB of free memory (tensors beyond 2^31 elements)")
    config.addinivalue_line("markers", "nvcc: compiles CUDA sources; needs nvcc")


@pytest.fixture(scope="session")
def ext():
    """The myops extension, built (or reused) and loaded into torch."""
    import ops

    ops.load()
    return ops


@pytest.fixture(scope="session")
def plugin_path() -> Path:
    """The ORT plugin library, built (or reused) with CMake against the pinned headers."""
    from ort_plugin.build import build

    return build(log=lambda message: None)


@pytest.fixture(scope="session")
def in_ci() -> bool:
    return os.environ.get("CI") == "true"
