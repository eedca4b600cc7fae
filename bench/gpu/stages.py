"""bench.gpu_check's bookkeeping: its log lines, the checks' outcomes, and the stages' time budgets."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass


def log(message: str) -> None:
    print(f"[gpu_check] {message}", flush=True)


class HostError(Exception):
    """This host cannot run the check at all (exit 2)."""


class Skip(Exception):
    """A check that cannot run here; says why."""


@dataclass
class Check:
    stage: str
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str = ""


class Run:
    def __init__(self, limit_s: float, budgets_s: dict[str, float]):
        self.started = time.monotonic()
        self.limit_s = limit_s
        self.budgets_s = budgets_s
        self.deadline = self.started + limit_s
        self.checks: list[Check] = []
        self.notes: list[str] = []

    @contextlib.contextmanager
    def stage(self, name: str):
        budget = self.budgets_s[name]
        number = list(self.budgets_s).index(name) + 1
        left = self.limit_s - (time.monotonic() - self.started)
        log(f"stage {number}/{len(self.budgets_s)} {name} (budget {budget} s, {left:.0f} s of {self.limit_s:.0f} s left)")
        began = time.monotonic()
        self.deadline = began + max(min(budget, left), 0)
        try:
            yield
        finally:
            took = time.monotonic() - began
            log(f"stage {number} {name}: {took:.1f} s" + (f" (over its {budget} s budget)" if took > budget else ""))

    def left(self) -> float:
        """Seconds left in the current stage's budget."""
        return self.deadline - time.monotonic()

    def check(self, stage: str, name: str, body) -> bool:
        """Run one correctness check: PASS when `body` returns, SKIP on Skip, FAIL on any other exception."""
        try:
            detail = body() or ""
            status = "PASS"
        except Skip as exc:
            status, detail = "SKIP", str(exc)
        except Exception as exc:  # a failed assertion, or the op raising: both are failures
            status = "FAIL"
            detail = f"{type(exc).__name__}: {exc}" if not isinstance(exc, AssertionError) else str(exc)
        self.record(Check(stage, name, status, detail))
        return status != "FAIL"

    def record(self, check: Check) -> None:
        """Keep a check's outcome and log it (a failure's whole detail, shortened in the middle)."""
        self.checks.append(check)
        detail = check.detail
        short = detail.strip().splitlines()[0][:160] if detail.strip() else ""
        log(f"  {check.status} {check.name}" + (f": {short}" if short else ""))
        lines = detail.splitlines()
        if check.status == "FAIL" and len(lines) > 1:
            # Compiler errors end with the useful part, assertion messages start with it.
            shown = lines if len(lines) <= 40 else [*lines[:10], "...", *lines[-30:]]
            print("\n".join("      " + line for line in shown), flush=True)

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks)
