"""Interleaved rounds of fresh processes, as the bench (bench.run) and its size sweep (bench.sweep)
run them: the order of each round, rotated so that drift of the machine hits every row alike, and one
child process of a row module on its specs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from infer.measure import timing_child_env

REPO = Path(__file__).resolve().parent.parent
ROW_TIMEOUT_S = 1800


def run_child(module: str, spec) -> dict | list[dict]:
    """One fresh process of `module` on a row spec (its result), or on a list of specs of one workload,
    framework and CPU path (their results, in order)."""
    first = spec[0] if isinstance(spec, list) else spec
    env = timing_child_env(REPO)
    if first.get("isa"):  # kernels/cpu_isa.h reads the cap once, when a library loads
        env["MYOPS_CPU_ISA"] = first["isa"]
    result = subprocess.run([sys.executable, "-m", module, json.dumps(spec)], capture_output=True, text=True,
                            timeout=ROW_TIMEOUT_S, env=env, cwd=REPO)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        rows = ", ".join(sorted({s["row"] for s in (spec if isinstance(spec, list) else [spec])}))
        raise RuntimeError(f"row {rows} ({first.get('workload', 'sweep')}, opset {first.get('opset', '-')}) "
                           f"failed:\n{tail}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def rotation(count: int, rounds: int, round_index: int) -> list[int]:
    """The order of round `round_index`: every row once, starting a further 1/rounds of the way in."""
    shift = (round_index * count) // rounds
    return list(range(shift, count)) + list(range(shift))


def schedule(specs: list[dict], rounds: int) -> list[tuple[int, int]]:
    """(round, spec index) in the order to run: every round rotated; a spec with its own "rounds" stops there."""
    return [(r, i) for r in range(rounds) for i in rotation(len(specs), rounds, r) if r < specs[i].get("rounds", rounds)]
