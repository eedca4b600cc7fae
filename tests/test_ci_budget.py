"""CI's budget (docs/ci.md): 45 minutes on its 2-core machines. What keeps it: every test that builds
an image, a venv or a wheelhouse is a shared fixture (session or module scope), or says in its
docstring why it builds its own; the workers' schedule reads the committed durations; .ci/run records
each stage and ends with its summary, saying when the budget is exceeded."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
# What builds an image, a venv or a wheelhouse (minutes each, and gigabytes on CI's disk): these calls,
# and a command holding `-m venv` or `docker build`. Not counted: a call inside `pytest.raises` (a
# refusal, before anything is built) and ensure_base_image (the daemon's base, made once and kept).
BUILDERS = {"build_images", "make_base_image", "build_all", "build_plugin_wheel", "build_extension_wheel", "_run_pip"}
COMMAND = re.compile(r"-m venv\b|\bdocker build\b")
OWN_BUILD = "Builds its own"  # a docstring that says so, and why
GUARD = Path(__file__).name  # this file spells the patterns it looks for


def _builds(function: ast.AST) -> list[str]:
    """What `function` builds, read off the calls and commands in its body (refusals left out)."""
    refused = {id(node) for block in ast.walk(function) if isinstance(block, ast.With)
               and any("raises" in ast.unparse(item.context_expr) for item in block.items)
               for node in ast.walk(block)}
    found = []
    for node in ast.walk(function):
        if id(node) in refused:
            continue
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in BUILDERS:
                found.append(name)
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = " ".join(e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
            if COMMAND.search(words):
                found.append(words)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and COMMAND.search(node.value):
            found.append(node.value)
    return found


def _shared_fixture(node: ast.FunctionDef) -> bool:
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("fixture"):
            scope = next((k.value for k in decorator.keywords if k.arg == "scope"), None)
            if isinstance(scope, ast.Constant) and scope.value in ("session", "module"):
                return True
    return False


def _unexplained(tree: ast.AST) -> list[str]:
    """Functions that build something, are no shared fixture and do not say why they build their own."""
    return [node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _builds(node) and not _shared_fixture(node)
            and OWN_BUILD.lower() not in " ".join((ast.get_docstring(node) or "").split()).lower()]


def test_a_test_that_builds_an_image_or_venv_shares_it_or_says_why_not():
    found = [f"{path.name}::{name}" for path in sorted(TESTS.glob("*.py")) if path.name != GUARD
             for name in _unexplained(ast.parse(path.read_text()))]
    assert not found, (f"these build an image, venv or wheelhouse of their own without saying why: {found}. Use a "
                       "shared fixture (tests/conftest.py: cpu_images, arm64_images, artifacts, ...), or say in "
                       f'the docstring "{OWN_BUILD}: <why>" (docs/ci.md)')


SAMPLE = '''
import pytest
def test_venv():
    run(["python", "-m", "venv", "v"])
def test_image():
    docker.build_images("cpu")
def test_refused():
    with pytest.raises(E):
        dist.build_all("cpu")
def test_said():
    """OWN: a clean venv is what it checks."""
    run("python -m venv v")
@pytest.fixture(scope="session")
def shared():
    return docker.build_images("cpu")
'''


def test_the_guard_names_a_build_and_leaves_a_refusal_a_reason_and_a_shared_fixture_alone():
    """The check above can fail."""
    assert _unexplained(ast.parse(SAMPLE.replace("OWN", OWN_BUILD))) == ["test_venv", "test_image"]


def test_every_scheduled_test_exists():
    """tests/durations.csv (python -m lab.ci_times --write-durations) names tests that are collected."""
    from lab.files import read_csv

    listed = [row["test"] for row in read_csv(TESTS / "durations.csv")]
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "tests"], cwd=REPO, capture_output=True, text=True, timeout=300).stdout.splitlines()
    stale = sorted(set(listed) - set(collected))
    assert not stale, f"tests/durations.csv lists tests that no longer exist: {stale[:10]}"


def test_an_interrupted_block_stops_its_jobs_and_shows_the_end_of_their_logs(tmp_path):
    """A run stopped mid-block (Ctrl-C, the runner's time limit) leaves no job running, ends with its
    summary, and shows what each stopped job had printed."""
    import signal
    import time

    marker = f"{tmp_path.name}-{time.monotonic_ns()}"  # a job's process found again by its command line
    # ($MARK expands in the job alone: this shell's own command line does not hold the marker)
    run = subprocess.Popen(["bash", "-c", f"set -euo pipefail; source {REPO / '.ci' / 'stages.sh'}; concurrently block "
                                          "sleeper 'echo begun; bash -c \"sleep 300; : $MARK\"'"],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={"PATH": "/usr/bin:/bin", "CI_BUDGET_MINUTES": "45", "MARK": marker})
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=30)
    finally:
        run.kill()
    assert "---- sleeper: stopped; the end of its log ----\nbegun" in out, out
    assert "== CI summary: " in out, out
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1, "a job's process outlived the run"


def test_ci_run_times_its_stages_and_keeps_the_test_times():
    """.ci/run sources the stage functions before its first stage and hands pytest the junit file that
    lab.ci_times and tests/durations.csv are made from."""
    run = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^source \.ci/stages\.sh$", run, re.M), "the stages are not timed"
    assert run.index("source .ci/stages.sh") < run.index("\nstage ")
    assert re.search(r"^nox -s tests -- --junitxml=build/ci/junit\.xml", run, re.M), "the test times are not kept"


def test_ci_times_counts_a_block_once_and_its_jobs_not(tmp_path):
    """The total is the stages' wall time: a block's jobs ran at once, inside the block's minutes."""
    (tmp_path / "stages.csv").write_text("stage,seconds,disk_used_gb,disk_free_gb,block\n"
                                         "bases,60,30,70,\nimages,540,40,60,both\ncompile,600,41,59,both\n"
                                         "both,600,41,59,\ntests,1200,43,57,\n")
    (tmp_path / "junit.xml").write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_one" '
                                        'time="90"/><testcase classname="tests.test_a" name="test_two[x]" '
                                        'time="30"/></testsuite></testsuites>')
    done = subprocess.run([sys.executable, "-m", "lab.ci_times", "--run", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "| **all** | **31.0** |" in done.stdout and "job of the block: compile | 10.0" in done.stdout, done.stdout
    assert "2 tests, 2.0 test-minutes" in done.stdout and "| tests/test_a.py | 2.0 |" in done.stdout, done.stdout


def _run_stages(folder: Path, script: str, budget_minutes: str) -> subprocess.CompletedProcess:
    """.ci/stages.sh's functions, sourced as .ci/run does, in a folder of its own."""
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {REPO / '.ci' / 'stages.sh'}; {script}"],
                          cwd=folder, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "CI_BUDGET_MINUTES": budget_minutes})


def test_ci_records_each_stage_and_block_and_ends_with_its_summary(tmp_path):
    done = _run_stages(tmp_path, 'stage one; sleep 1; concurrently "a, block" "fast job" "echo fast" '
                                 '"slow job" "sleep 2; echo slow"; stage two', "45")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = (tmp_path / "build" / "ci" / "stages.csv").read_text().splitlines()
    assert rows[0] == "stage,seconds,disk_used_gb,disk_free_gb,block"
    named = {row.split(",")[0]: row.split(",") for row in rows[1:]}
    # five columns in every row, whatever the names hold (a comma becomes ';')
    assert set(named) == {"one", "fast job", "slow job", "a; block", "two"} and {len(r) for r in named.values()} == {5}
    assert named["slow job"][4] == "a; block" and int(named["slow job"][1]) >= 2 and named["a; block"][4] == ""
    # each job's log shown whole after the block, and one summary line: minutes, slowest stages, peak disk
    assert "---- slow job: its log ----\nslow" in done.stdout
    summary = [line for line in done.stdout.splitlines() if line.startswith("== CI summary: ")]
    assert len(summary) == 1 and "slowest: a; block" in summary[0] and "peak disk" in summary[0], done.stdout
    assert "fast job" not in summary[0]  # a block's jobs overlap: the block counts, not its jobs
    assert "BUDGET EXCEEDED" not in done.stdout


def test_ci_says_budget_exceeded_and_a_failed_job_fails_the_run(tmp_path):
    done = _run_stages(tmp_path, 'sleep 1; concurrently block "good" "true" "bad" "echo broken; exit 3"; '
                                 'stage never', "0")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ended: bad after" in done.stdout and "(exit 3)" in done.stdout and "broken" in done.stdout
    assert "never" not in (tmp_path / "build" / "ci" / "stages.csv").read_text()  # set -e stopped the run
    assert "BUDGET EXCEEDED: 0 min against a budget of 0" in done.stdout, done.stdout


def test_the_budget_is_the_one_the_docs_state():
    docs = (REPO / "docs" / "ci.md").read_text()
    assert "CI_BUDGET_MINUTES=${CI_BUDGET_MINUTES:-45}" in (REPO / ".ci" / "stages.sh").read_text()
    assert "45 minutes" in docs and "90" in docs
