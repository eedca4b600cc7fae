"""What a CI run's minutes went to, from the files `.ci/run` leaves in build/ci/: its stages
(stages.csv) and pytest's per-test times (junit.xml).

    python -m lab.ci_times                   # the stage table and the slowest modules, as markdown
    python -m lab.ci_times --write-durations # also tests/durations.csv: what the test workers schedule by

docs/ci.md holds the tables of the fresh-clone run the budget is measured against.
"""
from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from .files import read_csv, write_csv_atomic

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "build" / "ci"
DURATIONS = REPO / "tests" / "durations.csv"
LISTED_FROM_SECONDS = 2.0  # shorter tests are scheduled at a default (tests/conftest.py)


def test_times(junit: Path) -> dict[str, float]:
    """{pytest node id: seconds, setup and teardown included}."""
    times: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module, *classes = case.get("classname").split(".")[1:] if case.get("classname").startswith("tests.") \
            else (case.get("classname"), )
        parts = [f"tests/{module}.py", *classes, case.get("name")]
        times["::".join(parts)] = times.get("::".join(parts), 0.0) + float(case.get("time") or 0)
    return times


def module_minutes(times: dict[str, float]) -> list[tuple[str, float]]:
    per = collections.Counter()
    for test, seconds in times.items():
        per[test.split("::")[0]] += seconds
    return [(module, seconds / 60) for module, seconds in per.most_common()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.ci_times", description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=RUN, help="the folder .ci/run wrote (default build/ci)")
    parser.add_argument("--write-durations", action="store_true", help=f"write {DURATIONS.relative_to(REPO)}")
    args = parser.parse_args(argv)
    stages, junit = args.run / "stages.csv", args.run / "junit.xml"
    if not stages.exists() or not junit.exists():
        print(f"error: {args.run} holds no finished CI run (stages.csv and junit.xml): run .ci/run first",
              file=sys.stderr)
        return 2
    rows = read_csv(stages)
    total = sum(int(r["seconds"]) for r in rows if not r.get("block"))  # a block's jobs overlap: the block counts
    print("| stage | minutes | disk used after (GB) |\n|---|---|---|")
    for r in rows:
        name = f"&nbsp;&nbsp;job of the block: {r['stage']}" if r.get("block") else r["stage"]
        print(f"| {name} | {int(r['seconds']) / 60:.1f} | {r['disk_used_gb']} |")
    print(f"| **all** | **{total / 60:.1f}** | |\n")
    times = test_times(junit)
    print(f"pytest: {len(times)} tests, {sum(times.values()) / 60:.1f} test-minutes\n")
    print("| module | test-minutes |\n|---|---|")
    for module, minutes in module_minutes(times)[:12]:
        print(f"| {module} | {minutes:.1f} |")
    if args.write_durations:
        listed = sorted((t, s) for t, s in times.items() if s >= LISTED_FROM_SECONDS)
        write_csv_atomic(DURATIONS, [{"test": t, "seconds": f"{s:.1f}"} for t, s in listed], ["test", "seconds"])
        print(f"\nwrote {DURATIONS.relative_to(REPO)} ({len(listed)} tests of {LISTED_FROM_SECONDS:g} s or more)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
