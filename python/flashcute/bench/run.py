"""One point of the benchmark: make the inputs, then check and time every implementation on them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .arrays import ArrayLib, Inputs, Unsupported
from .check import check_gradients, check_output
from .grid import Point
from .impls import Impl, Runner, is_own
from .results import ERROR, FAIL, NOT_AVAILABLE, OK, ImplResult, PointResult
from .timing import Subject, Timing, input_sets_needed, time_subjects

if TYPE_CHECKING:
    from flashcute.testing import Check


def short_error(exc: BaseException) -> str:
    """The exception's type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_point(
    lib: ArrayLib, impls: Sequence[Impl], point: Point, *, seed: int, timing: Timing, l2_bytes: int | None,
    flush: Callable[[], Any] | None = None
) -> PointResult:
    """Makes the inputs, then checks and times each impl (run_impls). Under a timing that flushes L2
    (`flush`: the array library's l2_flusher) one set of inputs serves; otherwise several sets are
    rotated through when one would sit in L2."""
    scale = 1.0 / math.sqrt(point.headdim)
    try:
        first = lib.make_inputs(point, seed)
        working_set = first.nbytes + int(first.q.nbytes)  # q, k, v and the output
        n_sets = 1 if timing.flushes else input_sets_needed(working_set, l2_bytes)
        sets = [first] + [lib.make_inputs(point, seed + 3 * i) for i in range(1, n_sets)]
    except Unsupported as exc:
        return PointResult(point, {impl.name: ImplResult(NOT_AVAILABLE, note=str(exc)) for impl in impls},
                           timing=timing.kind)
    except Exception as exc:
        if not lib.is_oom(exc):
            raise
        return PointResult(
            point, {impl.name: ImplResult(NOT_AVAILABLE, note="out of memory for the inputs") for impl in impls},
            timing=timing.kind
        )
    results = run_impls(lib, impls, point, sets, scale, timing=timing, flush=flush)
    return PointResult(point, results, n_sets, working_set, timing=timing.kind)


def _failure(impl: Impl, lib: ArrayLib, exc: BaseException) -> ImplResult:
    """What an exception from an implementation makes of its result."""
    if isinstance(exc, Unsupported):
        return ImplResult(NOT_AVAILABLE, note=str(exc))
    if lib.is_oom(exc):
        return ImplResult(NOT_AVAILABLE, note="out of memory")
    under_test = is_own(impl.name) and not impl.is_unsupported_error(exc)
    return ImplResult(ERROR if under_test else NOT_AVAILABLE, note=short_error(exc))


def run_impls(
    lib: ArrayLib, impls: Sequence[Impl], point: Point, sets: Sequence[Inputs], scale: float, *, timing: Timing,
    flush: Callable[[], Any] | None = None
) -> dict[str, ImplResult]:
    """Prepares every implementation and checks its first call's output (a JIT compiles there, before
    any timing), then times all of them by `timing`'s schedule (timing.time_subjects). Never raises
    for an implementation: what goes wrong is its result's status."""
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
    timed = time_subjects(lib, [Subject(impl.name, runner.calls, runner.context) for impl, runner, *_ in ready],
                          timing, flush)
    for impl, runner, check, scope in ready:
        if impl.name in timed.errors:
            results[impl.name] = _failure(impl, lib, timed.errors[impl.name])
            continue
        status = FAIL if is_own(impl.name) and not check.ok else OK
        results[impl.name] = ImplResult(status, timed.times_ms[impl.name], note=check.message if status == FAIL else "",
                                        layout=runner.layout, check=check, check_scope=scope)
    return {impl.name: results[impl.name] for impl in impls}
