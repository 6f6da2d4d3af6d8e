"""One point of the benchmark: make the inputs, then check and time every implementation on them."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .arrays import ArrayLib, Inputs, Unsupported
from .check import check_gradients, check_output
from .grid import Point
from .impls import SUBJECT, Impl
from .results import ERROR, FAIL, NOT_AVAILABLE, OK, ImplResult, PointResult
from .timing import input_sets_needed, time_calls


def short_error(exc: BaseException) -> str:
    """The exception's type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_point(
    lib: ArrayLib, impls: Sequence[Impl], point: Point, *, seed: int, warmup: int, iters: int, l2_bytes: int | None
) -> PointResult:
    """Makes the inputs (several sets when one would sit in L2), then checks and times each impl."""
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
    results = {impl.name: run_impl(lib, impl, point, sets, scale, warmup=warmup, iters=iters) for impl in impls}
    return PointResult(point, results, n_sets, working_set)


def run_impl(
    lib: ArrayLib, impl: Impl, point: Point, sets: Sequence[Inputs], scale: float, *, warmup: int, iters: int
) -> ImplResult:
    """Prepares one implementation, checks its first call's output, then times it. Never raises for
    the implementation: what goes wrong is its result's status."""
    try:
        runner = impl.prepare(point, sets, scale)
        with runner.context():
            out = runner.calls[0]()
            if runner.douts is not None:
                check, scope = check_gradients(out, sets[0], runner.douts[0], point, scale)
            else:
                check, scope = check_output(runner.to_bshd(out), sets[0], point, scale)
            del out
            times = time_calls(lib, runner.calls, warmup, iters)
    except Unsupported as exc:
        return ImplResult(NOT_AVAILABLE, note=str(exc))
    except Exception as exc:
        if lib.is_oom(exc):
            return ImplResult(NOT_AVAILABLE, note="out of memory")
        under_test = impl.name == SUBJECT and not impl.is_unsupported_error(exc)
        return ImplResult(ERROR if under_test else NOT_AVAILABLE, note=short_error(exc))
    if impl.name == SUBJECT and not check.ok:
        return ImplResult(FAIL, times, note=check.message, layout=runner.layout, check=check, check_scope=scope)
    return ImplResult(OK, times, layout=runner.layout, check=check, check_scope=scope)
