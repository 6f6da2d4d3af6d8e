"""CPU tests of the benchmark's timer and its two schedules (flashcute.bench.timing): what is called,
in which order, between which events, with a recording clock instead of CUDA events.

No GPU, torch, CuPy or NumPy needed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import flashcute.bench.timing as timing
import pytest
from flashcute.bench.timing import STANDARD, TURNS, Subject, Timing, flush_bytes, time_calls, time_subjects

MIB = 1 << 20


class Recorder:
    """A clock and a log: every event record, call, flush and synchronisation appends to `log`;
    event i of a batch measures i + 1 ms, so the times say which events were paired."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.made = 0

    def event(self) -> Any:
        recorder = self
        recorder.made += 1
        index = recorder.made

        class Event:
            def record(self) -> None:
                recorder.log.append(f"record{index}")

        ev = Event()
        ev.index = index  # type: ignore[attr-defined]
        return ev

    def elapsed_ms(self, start: Any, end: Any) -> float:
        assert end.index > start.index
        return float(end.index - start.index)

    def synchronize(self) -> None:
        self.log.append("sync")

    def call(self, name: str, fail_at: int | None = None) -> Callable[[], Any]:
        def fn() -> Any:
            self.log.append(name)
            if fail_at is not None and self.log.count(name) >= fail_at:
                raise RuntimeError(f"{name} failed")
            return name

        return fn

    def flush(self) -> None:
        self.log.append("flush")


def simplify(log: list[str]) -> list[str]:
    """record<N> -> "start"/"end" by the order they come in within a batch: the first record after a
    call or a flush opens a timed region, the next one closes it."""
    out, open_ = [], False
    for item in log:
        if item.startswith("record"):
            out.append("end" if open_ else "start")
            open_ = not open_
        else:
            out.append(item)
    assert not open_
    return out


# ---------------------------------------------------------------------------------------- the timer


def test_time_calls_flushes_before_every_timed_call_outside_its_events():
    clock = Recorder()
    times = time_calls(clock, [clock.call("a0"), clock.call("a1")], warmup=3, iters=4, flush=clock.flush)
    log = simplify(clock.log)
    # Warm-up without flushes or events (rotating through the input sets), then per timed call:
    # flush, start event, the call, end event; one synchronisation at the end.
    assert log == ["a0", "a1", "a0"] + ["flush", "start", "a0", "end", "flush", "start", "a1", "end"] * 2 + ["sync"]
    # Every timed call has its own pair of events: the 4 starts are made first, then the 4 ends.
    assert times == [4.0] * 4


def test_time_calls_without_flush_is_back_to_back():
    clock = Recorder()
    time_calls(clock, [clock.call("a")], warmup=1, iters=2)
    assert simplify(clock.log) == ["a", "start", "a", "end", "start", "a", "end", "sync"]


def test_flush_bytes_covers_twice_the_l2_and_at_least_256_mib():
    assert flush_bytes(50 * MIB) == 256 * MIB  # H100
    assert flush_bytes(60 * MIB) == 256 * MIB  # H200
    assert flush_bytes(200 * MIB) == 400 * MIB
    assert flush_bytes(None) == 256 * MIB  # unknown L2: the assumed 128 MiB, doubled


# ------------------------------------------------------------------------------------ the schedules


def test_timing_plans():
    assert Timing().kind == STANDARD and Timing().flushes
    assert Timing(STANDARD, iters=30).plan() == (2, 15)
    assert Timing(STANDARD, iters=7).plan() == (2, 4)  # 8 timed calls: the same number in each pass
    assert Timing(STANDARD, iters=1).plan() == (1, 1)
    assert Timing(TURNS, iters=30, rounds=5).plan() == (5, 6)
    assert Timing(TURNS, iters=7, rounds=3).plan() == (3, 3)
    assert Timing(TURNS, iters=2, rounds=5).plan() == (2, 1)  # no round without a timed call
    assert Timing(TURNS, iters=20, rounds=1).plan() == (1, 20)
    assert Timing(TURNS, iters=7, rounds=3).timed_calls == 9
    assert not Timing(TURNS).flushes
    with pytest.raises(ValueError, match="standard, turns"):
        Timing("fast")


def test_methods_name_their_timing():
    std = Timing(STANDARD, warmup=10, iters=30).method(256 * MIB)
    assert std.startswith("standard timing: ")
    assert "10 warm-up calls" in std and "15 timed calls" in std and "256 MiB" in std and "reverse" in std
    assert "median of the 30 timed calls of both passes" in std
    turns = Timing(TURNS, warmup=10, iters=30, rounds=30).method()
    assert turns.startswith("turns timing: ") and "30 rounds of 1 timed calls" in turns and "no L2 flush" in turns
    assert Timing(TURNS).summary == "turns timing" and Timing().summary == "standard timing"


@contextlib.contextmanager
def logged_context(clock: Recorder, name: str):
    clock.log.append(f"enter {name}")
    yield
    clock.log.append(f"exit {name}")


def test_standard_schedule_in_order_then_reverse():
    """Each implementation alone, warm-up then iters/2 flushed timed calls, under its context;
    the listed order, then the reverse; every implementation's times from both passes."""
    clock = Recorder()
    subjects = [Subject(n, [clock.call(n)], lambda n=n: logged_context(clock, n)) for n in ("a", "b", "c")]
    timed = time_subjects(clock, subjects, Timing(STANDARD, warmup=2, iters=4), flush=clock.flush)
    assert not timed.errors
    assert {n: len(t) for n, t in timed.times_ms.items()} == {"a": 4, "b": 4, "c": 4}

    def batch(n: str) -> list[str]:
        return [f"enter {n}", n, n] + ["flush", "start", n, "end"] * 2 + ["sync", f"exit {n}"]

    assert simplify(clock.log) == batch("a") + batch("b") + batch("c") + batch("c") + batch("b") + batch("a")
    # No event pair encloses a flush: every flush comes before its start event.
    log = simplify(clock.log)
    assert log.count("flush") == 12 and all(log[i + 1] == "start" for i, x in enumerate(log) if x == "flush")


def test_standard_schedule_needs_a_flush():
    clock = Recorder()
    with pytest.raises(ValueError, match="flush"):
        time_subjects(clock, [Subject("a", [clock.call("a")])], Timing(STANDARD))


def test_turns_schedule_alternates_and_never_flushes():
    clock = Recorder()
    subjects = [Subject(n, [clock.call(n)]) for n in ("a", "b")]
    timed = time_subjects(clock, subjects, Timing(TURNS, warmup=3, iters=3, rounds=3), flush=clock.flush)
    log = simplify(clock.log)
    assert "flush" not in log
    w = timing.ROUND_WARMUP

    def turn(n: str, warmup: int) -> list[str]:
        return [n] * warmup + ["start", n, "end", "sync"]

    assert log == turn("a", 3) + turn("b", 3) + turn("b", w) + turn("a", w) + turn("a", w) + turn("b", w)
    assert timed.times_ms == {"a": [1.0] * 3, "b": [1.0] * 3}


def test_a_subject_that_raises_is_dropped_and_the_others_go_on():
    clock = Recorder()
    subjects = [Subject("a", [clock.call("a")]), Subject("bad", [clock.call("bad", fail_at=3)])]
    timed = time_subjects(clock, subjects, Timing(STANDARD, warmup=1, iters=4), flush=clock.flush)
    assert list(timed.errors) == ["bad"] and str(timed.errors["bad"]) == "bad failed"
    assert len(timed.times_ms["a"]) == 4
    # "bad" failed in the first pass (its third call: one warm-up, two timed) and was not called in
    # the second, which timed "a" alone.
    calls = [x for x in clock.log if x in ("a", "bad")]
    assert calls == ["a"] * 3 + ["bad"] * 3 + ["a"] * 3
