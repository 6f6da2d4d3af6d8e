"""What a benchmark run produces: per implementation, per point."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .grid import Point, tflops
from .impls import SUBJECT, is_own

if TYPE_CHECKING:
    from flashcute.testing import Check

# ImplResult.status values. "error" and "fail" are given to the implementation under test only: a
# peer that raises is "n/a", and a peer's wrong output is recorded in its check but stays "ok".
OK, NOT_AVAILABLE, ERROR, FAIL = "ok", "n/a", "error", "fail"


@dataclass
class ImplResult:
    """One implementation at one point."""

    status: str  # OK | NOT_AVAILABLE | ERROR (it raised) | FAIL (wrong output)
    times_ms: list[float] = field(default_factory=list)  # every timed call
    note: str = ""  # why it is n/a, the error, or why the check failed
    layout: str = ""  # Runner.layout
    check: Check | None = None  # flashcute.testing.check_attention's verdict on the first call's output
    check_scope: str = ""  # the part of the output that was checked: "full" or e.g. "b0 h[0, 15]"

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.times_ms else None


@dataclass
class PointResult:
    """Every implementation at one point, and the inputs they shared."""

    point: Point
    impls: dict[str, ImplResult]
    input_sets: int = 1  # input sets rotated through (timing.input_sets_needed)
    working_set_bytes: int = 0  # q, k, v and the output of one set
    timing: str = ""  # the schedule that produced the times: timing.STANDARD or timing.TURNS

    def tflops(self, impl: str) -> float | None:
        r = self.impls.get(impl)
        ms = r.median_ms if r is not None else None
        return tflops(self.point.flops, ms) if ms else None

    def ratio(self, impl: str, base: str) -> float | None:
        """TFLOP/s of `impl` over `base`'s, when both ran."""
        a, b = self.tflops(impl), self.tflops(base)
        return a / b if a and b else None

    @property
    def subject(self) -> ImplResult | None:
        """flashcute's result, when it was run; else that of the first of its variants that was
        ("flashcute-sm90bwd" timed alone), whose check the report then shows."""
        if SUBJECT in self.impls:
            return self.impls[SUBJECT]
        return next((r for name, r in self.impls.items() if is_own(name)), None)

    @property
    def failed(self) -> bool:
        """flashcute (or a variant of it) raised or gave a wrong result here: the run's exit code is 3."""
        return any(r.status in (ERROR, FAIL) for name, r in self.impls.items() if is_own(name))
