"""One point of the benchmark: make the inputs, then check and time every implementation on them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .arrays import ArrayLib, Inputs, Unsupported
from .check import check_gradients, check_output
from .grid import Point
from .impls import SUBJECT, Impl, Runner
from .results import ERROR, FAIL, NOT_AVAILABLE, OK, ImplResult, PointResult
from .timing import input_sets_needed, time_calls

if TYPE_CHECKING:
    from flashcute.testing import Check

# Untimed calls before each round's timed ones after the first round (which takes the full
# --warmup): the GPU is warm by then; these take the switch from another implementation.
ROUND_WARMUP = 2


def short_error(exc: BaseException) -> str:
    """The exception's type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_point(
    lib: ArrayLib, impls: Sequence[Impl], point: Point, *, seed: int, warmup: int, iters: int, l2_bytes: int | None,
    rounds: int = 1
) -> PointResult:
    """Makes the inputs (several sets when one would sit in L2), then checks and times each impl
    (run_impls: in `rounds` turns)."""
    scale = 1.0 / math.sqrt(point.headdim)
    try:
        first = lib.make_inputs(point, seed)
        working_set = first.nbytes + int(first.q.nbytes)  # q, k, v and the output
        n_sets = input_sets_needed(working_set, l2_bytes)
        sets = [first] + [lib.make_inputs(point, seed + 3 * i) for i in range(1, n_sets)]
    except Unsupported as exc:
        return PointResult(point, {impl.name: ImplResult(NOT_AVAILABLE, note=str(exc)) for impl in impls})
    except Exception as exc:
        if not lib.is_oom(exc):
            raise
        return PointResult(
            point, {impl.name: ImplResult(NOT_AVAILABLE, note="out of memory for the inputs") for impl in impls}
        )
    results = run_impls(lib, impls, point, sets, scale, warmup=warmup, iters=iters, rounds=rounds)
    return PointResult(point, results, n_sets, working_set)


def _failure(impl: Impl, lib: ArrayLib, exc: BaseException) -> ImplResult:
    """What an exception from an implementation makes of its result."""
    if isinstance(exc, Unsupported):
        return ImplResult(NOT_AVAILABLE, note=str(exc))
    if lib.is_oom(exc):
        return ImplResult(NOT_AVAILABLE, note="out of memory")
    under_test = impl.name == SUBJECT and not impl.is_unsupported_error(exc)
    return ImplResult(ERROR if under_test else NOT_AVAILABLE, note=short_error(exc))


def rounds_plan(iters: int, rounds: int) -> tuple[int, int]:
    """(rounds, timed calls per round) for `iters` timed calls in `rounds` turns: every round times
    the same number, so the total is iters rounded up to a multiple of the rounds."""
    rounds = max(1, min(rounds, iters))
    return rounds, math.ceil(iters / rounds)


def run_impls(
    lib: ArrayLib, impls: Sequence[Impl], point: Point, sets: Sequence[Inputs], scale: float, *, warmup: int,
    iters: int, rounds: int = 1
) -> dict[str, ImplResult]:
    """Prepares every implementation and checks its first call's output, then times them in turns:
    `rounds` rounds, each timing every implementation's share of the calls after a short warm-up,
    in the listed order in even rounds and the reverse in odd ones. The GPU's clocks move with its
    power and temperature over a run; taken in turns, every implementation sees the same moments,
    and none is favoured by going first or last. Never raises for an implementation: what goes
    wrong is its result's status."""
    results: dict[str, ImplResult] = {}
    ready: list[tuple[Impl, Runner, Check, str]] = []
    for impl in impls:
        try:
            runner = impl.prepare(point, sets, scale)
            with runner.context():
                out = runner.calls[0]()
                if runner.douts is not None:
                    check, scope = check_gradients(out, sets[0], runner.douts[0], point, scale)
                else:
                    check, scope = check_output(runner.to_bshd(out), sets[0], point, scale)
                del out
        except Exception as exc:
            results[impl.name] = _failure(impl, lib, exc)
            continue
        ready.append((impl, runner, check, scope))
    rounds, per_round = rounds_plan(iters, rounds)
    times: dict[str, list[float]] = {impl.name: [] for impl, *_ in ready}
    for r in range(rounds):
        turn = ready if r % 2 == 0 else ready[::-1]
        for impl, runner, _, _ in turn:
            if impl.name in results:  # failed in an earlier round
                continue
            try:
                with runner.context():
                    times[impl.name] += time_calls(lib, runner.calls, warmup if r == 0 else min(warmup, ROUND_WARMUP),
                                                   per_round)
            except Exception as exc:
                results[impl.name] = _failure(impl, lib, exc)
    for impl, runner, check, scope in ready:
        if impl.name in results:
            continue
        status = FAIL if impl.name == SUBJECT and not check.ok else OK
        results[impl.name] = ImplResult(status, times[impl.name], note=check.message if status == FAIL else "",
                                        layout=runner.layout, check=check, check_scope=scope)
    return {impl.name: results[impl.name] for impl in impls}
