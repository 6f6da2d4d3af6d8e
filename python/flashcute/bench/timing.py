"""The one timer every benchmark of the package measures with, and the two ways of scheduling it.

Every timed call sits between its own pair of CUDA events on the current stream, after untimed
warm-up calls; the median of the individually timed calls is reported. The calls of one batch
(:func:`time_calls`) are queued back to back before a single synchronisation, so the host stays
ahead of the GPU for all but the tiniest problems.

Two schedules (``--timing``) take several implementations through that timer, in one process:

- ``standard`` (the default): each implementation in turn takes --warmup untimed calls, then
  iters/2 timed calls, each after the L2 cache was flushed by writing a buffer of
  max(256 MiB, 2 x L2) *outside* its events; all implementations in the listed order, then all of
  them again in the reverse order; the median of the iters timed calls of both passes. This is the
  timing of ``triton.testing.do_bench`` and FlashAttention's benchmarks (L2 flushed, one library
  after the other), so the numbers compare with theirs.
- ``turns``: the implementations take turns of iters/--rounds timed calls (the first turn after
  --warmup untimed calls, later ones after ROUND_WARMUP), the order reversed every other round, with
  no flush: inputs rotate only when one set would sit in L2. All implementations see the GPU's
  clocks, which move with its power and temperature, at the same moments. At the long points it
  favours a kernel whose neighbours in the turn are slower (the GPU runs cooler between its calls).

Numbers from the two are not interchangeable: every report names the one that produced it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

STANDARD, TURNS = "standard", "turns"
TIMINGS = (STANDARD, TURNS)
DEFAULT_TURN_ROUNDS = 30  # --timing turns without --rounds: one timed call of each per round at 30 iters
ROUND_WARMUP = 2  # turns: untimed calls before every round's timed ones after the first round
STANDARD_PASSES = 2  # standard: the listed order, then the reverse

# The L2 flush of the standard timing writes a buffer of at least this size and twice the L2 (the
# H100's L2 is 50 MB, the H200's 60 MB): every line the previous call left in L2 is evicted.
L2_FLUSH_MIN_BYTES = 256 << 20

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
    """How many input sets to rotate through so that timed calls do not start with a warm L2 when
    nothing flushes it (the turns timing; the standard one flushes and uses one set).

    The FA grid's working sets (q, k, v and out: 4 x 64 MiB at 16k tokens and hidden 2048) are far
    larger than any L2, so this is 1 there; it matters only for small explicit --batch/--nheads.
    """
    l2 = l2_bytes or ASSUMED_L2_BYTES
    if working_set_bytes >= ROTATE_BELOW_L2_MULTIPLE * l2:
        return 1
    return min(MAX_INPUT_SETS, math.ceil(3 * l2 / max(1, working_set_bytes)))


def flush_bytes(l2_bytes: int | None) -> int:
    """Size of the buffer the standard timing writes between timed calls: max(256 MiB, 2 x L2)."""
    return max(L2_FLUSH_MIN_BYTES, 2 * (l2_bytes or ASSUMED_L2_BYTES))


def time_calls(
    clock: EventClock, calls: Sequence[Callable[[], Any]], warmup: int, iters: int,
    flush: Callable[[], Any] | None = None,
) -> list[float]:
    """Milliseconds of `iters` individually timed calls after `warmup` untimed ones. Call i is
    calls[i % len(calls)]: one call per input set. With `flush`, it runs before every timed call,
    outside that call's events (the events time the call alone, on an L2 the flush evicted)."""
    for i in range(warmup):
        calls[i % len(calls)]()
    starts = [clock.event() for _ in range(iters)]
    ends = [clock.event() for _ in range(iters)]
    for i in range(iters):
        if flush is not None:
            flush()
        starts[i].record()
        calls[i % len(calls)]()
        ends[i].record()
    clock.synchronize()
    return [clock.elapsed_ms(s, e) for s, e in zip(starts, ends)]


@dataclass(frozen=True)
class Timing:
    """How a run times its implementations: the schedule (STANDARD or TURNS) and its counts."""

    kind: str = STANDARD
    warmup: int = 10  # untimed calls before each pass (standard) or the first round (turns)
    iters: int = 30  # timed calls of each implementation in all (rounded up to fill every pass/round)
    rounds: int = DEFAULT_TURN_ROUNDS  # turns only

    def __post_init__(self) -> None:
        if self.kind not in TIMINGS:
            raise ValueError(f"timing {self.kind!r}: expected one of {', '.join(TIMINGS)}")

    @property
    def flushes(self) -> bool:
        """Whether L2 is flushed before every timed call (else inputs rotate when they fit in L2)."""
        return self.kind == STANDARD

    def plan(self) -> tuple[int, int]:
        """(passes or rounds, timed calls of each implementation in each): every one times the same
        number, so the total is iters rounded up to a multiple of them."""
        n = STANDARD_PASSES if self.kind == STANDARD else self.rounds
        n = max(1, min(n, self.iters))
        return n, math.ceil(self.iters / n)

    @property
    def timed_calls(self) -> int:
        n, per = self.plan()
        return n * per

    def warmup_of(self, index: int) -> int:
        """Untimed calls before pass or round `index`."""
        if self.kind == STANDARD or index == 0:
            return self.warmup
        return min(self.warmup, ROUND_WARMUP)

    def method(self, flush_nbytes: int | None = None, clean: bool = False) -> str:
        """What the numbers are: the sentence the reports carry (the JSON's "timing", the log)."""
        n, per = self.plan()
        if self.kind == STANDARD:
            flush = f"{flush_nbytes >> 20} MiB" if flush_nbytes else "max(256 MiB, 2 x L2)"
            return (
                f"standard timing: CUDA events around each call; per implementation {self.warmup} warm-up calls, "
                f"then {per} timed calls, each after an L2 flush (a {flush} buffer written"
                + (", then another read" if clean else "") + " outside the events); "
                f"the implementations one after the other in the listed order, then again in reverse; the median "
                f"of the {n * per} timed calls of both passes"
            )
        return (
            f"turns timing: CUDA events around each call; the implementations timed in turns, {n} rounds of "
            f"{per} timed calls each ({self.warmup} warm-up calls before the first round, "
            f"{min(self.warmup, ROUND_WARMUP)} before later ones), the order reversed every other round; no L2 "
            f"flush (inputs rotate only if one set would fit in L2); the median of the {n * per} timed calls"
        )

    @property
    def summary(self) -> str:
        """Short name for titles and the summary line: "standard timing" or "turns timing"."""
        return f"{self.kind} timing"


@dataclass
class Subject:
    """One implementation as the schedules see it: its calls (one per input set), entered under
    `context` (a backend selection, an environment variable)."""

    name: str
    calls: Sequence[Callable[[], Any]]
    context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext


@dataclass
class Timed:
    """What the schedule measured: every subject's timed calls, in the order they ran, and the
    exception of any subject that raised (it is timed no further)."""

    times_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)


def time_subjects(
    clock: EventClock, subjects: Sequence[Subject], timing: Timing, flush: Callable[[], Any] | None = None
) -> Timed:
    """Times every subject by `timing`'s schedule: pass or round i takes the subjects in the listed
    order when i is even and in reverse when odd, each through time_calls (with `flush` before every
    timed call when the timing flushes; the standard timing needs one). Never raises for a subject:
    one that raises is recorded in `errors` and left out of later passes."""
    if timing.flushes and flush is None:
        raise ValueError("the standard timing flushes L2 between timed calls: pass `flush`")
    n, per = timing.plan()
    out = Timed({s.name: [] for s in subjects})
    for i in range(n):
        for s in subjects if i % 2 == 0 else subjects[::-1]:
            if s.name in out.errors:
                continue
            try:
                with s.context():
                    out.times_ms[s.name] += time_calls(clock, s.calls, timing.warmup_of(i), per,
                                                       flush if timing.flushes else None)
            except Exception as exc:
                out.errors[s.name] = exc
    return out
