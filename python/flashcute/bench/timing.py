"""The one timer every implementation is measured with.

CUDA events on the current stream around each call, after untimed warm-up calls; the median of the
individually timed calls is reported. The calls of one turn (time_calls) are queued before a single
synchronisation, so the host stays ahead of the GPU for all but the tiniest problems; run.py takes
the implementations in turns of such calls. When one set of inputs would sit in
L2, the calls rotate through several sets so that no timed call starts with a warm cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable, Protocol

METHOD = (
    "CUDA events around each call after a warm-up; the implementations timed in turns (--rounds), order reversed "
    "every other round; median of all timed calls; inputs rotate only if they would fit in L2"
)

# Inputs are rotated between timed calls only when one set would sit in L2: below this many L2s.
ROTATE_BELOW_L2_MULTIPLE = 2
MAX_INPUT_SETS = 64
ASSUMED_L2_BYTES = 128 << 20  # used only when the runtime does not report the L2 size


class EventClock(Protocol):
    """CUDA events of an array library (arrays.ArrayLib is one)."""

    def event(self) -> Any: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    def synchronize(self) -> None: ...


def input_sets_needed(working_set_bytes: int, l2_bytes: int | None) -> int:
    """How many input sets to rotate through so that timed calls do not start with a warm L2.

    The FA grid's working sets (q, k, v and out: 4 x 64 MiB at 16k tokens and hidden 2048) are far
    larger than any L2, so this is 1 there; it matters only for small explicit --batch/--nheads.
    """
    l2 = l2_bytes or ASSUMED_L2_BYTES
    if working_set_bytes >= ROTATE_BELOW_L2_MULTIPLE * l2:
        return 1
    return min(MAX_INPUT_SETS, math.ceil(3 * l2 / max(1, working_set_bytes)))


def time_calls(clock: EventClock, calls: Sequence[Callable[[], Any]], warmup: int, iters: int) -> list[float]:
    """Milliseconds of `iters` individually timed calls after `warmup` untimed ones. Call i is
    calls[i % len(calls)]: one call per input set."""
    for i in range(warmup):
        calls[i % len(calls)]()
    starts = [clock.event() for _ in range(iters)]
    ends = [clock.event() for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        calls[i % len(calls)]()
        ends[i].record()
    clock.synchronize()
    return [clock.elapsed_ms(s, e) for s, e in zip(starts, ends)]
