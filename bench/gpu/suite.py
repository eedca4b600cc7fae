"""The suite's CUDA tests as bench.gpu_check's correctness stage: the same files a developer runs with
`pytest -m cuda` (tests/test_<op>.py for every registered op, tests/test_plugin_cuda.py), in a child
pytest that loads the extension and the harness this run built, read back from its JUnit XML as one
check per test function."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from .stages import Check, log

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# A GPU in exclusive-process compute mode refuses a second process: the child cannot run there.
EXCLUSIVE_MODE_SIGNS = ("cudaErrorDevicesUnavailable", "busy or unavailable")


def test_files() -> list[Path]:
    """tests/test_<op>.py of every registered op that has one, every elementwise and row-wise op's from its declaration
    (tests/test_declared_ops.py: a scaffolded op has no file of its own), and the plugin's CUDA kernel tests."""
    from opspec import TORCH_OPS

    files = [TESTS / f"test_{op}.py" for op in TORCH_OPS]
    return [path for path in files if path.is_file()] + [TESTS / "test_declared_ops.py", TESTS / "test_plugin_cuda.py"]


def command(files: list[Path], junit: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
            f"--junitxml={junit}", *map(str, files)]


def read_junit(junit: Path) -> list[Check]:
    """One check per test function: FAIL when a case failed or errored, SKIP when every case was skipped
    (with the first reason), else PASS; the detail counts the cases."""
    cases: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name', '').split('[', 1)[0]}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", f"{case.get('name')}: {child.get('message') or ''}\n{child.text or ''}"
            elif child.tag == "skipped" and outcome == "passed":
                outcome, message = "skipped", child.get("message") or ""
        cases[name].append((outcome, message))
    checks = []
    for name, outcomes in cases.items():
        count = {kind: sum(1 for o, _ in outcomes if o == kind) for kind in ("passed", "failed", "skipped")}
        counted = ", ".join(f"{n} {kind}" for kind, n in count.items() if n)
        if count["failed"]:
            first = next(m for o, m in outcomes if o == "failed")
            checks.append(Check("suite", name, "FAIL", f"{counted}; first: {first.strip()}"))
        elif count["skipped"] == len(outcomes):
            checks.append(Check("suite", name, "SKIP", outcomes[0][1]))
        else:
            checks.append(Check("suite", name, "PASS", counted))
    return checks


def run_suite(env: dict[str, str], timeout: float, files: list[Path] | None = None) -> list[Check]:
    """The child pytest with `env` added (MYOPS_EXTENSION_LIBRARY, MYOPS_PLUGIN_HARNESS), its output
    streamed as it comes (by a reader thread, so that the timeout holds even while it prints nothing);
    MYOPS_REQUIRE_CUDA=1 makes its cuda tests fail rather than skip where it sees no GPU. Its checks,
    or one FAIL that says why it gave none."""
    files = files or test_files()
    with tempfile.TemporaryDirectory(prefix="gpu-check-suite-") as tmp:
        junit = Path(tmp) / "suite.xml"
        child_env = dict(os.environ, MYOPS_REQUIRE_CUDA="1", **env)
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), child_env.get("PYTHONPATH")]))
        shown = [str(f.relative_to(REPO)) if f.is_relative_to(REPO) else str(f) for f in files]
        log(f"  pytest -m cuda {' '.join(shown)}")
        process = subprocess.Popen(command(files, junit), cwd=REPO, env=child_env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []

        def read() -> None:
            for line in process.stdout:
                print(f"    | {line.rstrip()}", flush=True)
                tail.append(line.rstrip())
                del tail[:-40]

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return [Check("suite", "pytest -m cuda", "FAIL", f"did not finish within {timeout:.0f} s\n" + "\n".join(tail))]
        finally:
            reader.join(timeout=10)
            process.stdout.close()
        text = "\n".join(tail)
        if any(sign in text for sign in EXCLUSIVE_MODE_SIGNS):
            return [Check("suite", "pytest -m cuda", "FAIL",
                          "the GPU refused the test process: it is in exclusive-process compute mode, and this check "
                          "runs its tests in a second process (set the default mode: nvidia-smi -c DEFAULT)\n" + text)]
        if process.returncode == 5:
            return [Check("suite", "pytest -m cuda", "FAIL", "no cuda tests were collected\n" + text)]
        if not junit.is_file():
            return [Check("suite", "pytest -m cuda", "FAIL", f"pytest exited {process.returncode} with no report\n{text}")]
        checks = read_junit(junit)
        if process.returncode not in (0, 1) or not checks:
            checks.append(Check("suite", "pytest -m cuda", "FAIL", f"pytest exited {process.returncode}\n{text}"))
        return checks
