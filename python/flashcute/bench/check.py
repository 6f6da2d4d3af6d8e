"""The correctness check run before timing, with the project's shared reference and rule
(:func:`flashcute.testing.check_attention`, and ``check_gradients`` for the backward passes), on the
whole output when the problem is small and otherwise on batch 0 and two heads: the first and the
last, so two different KV heads under GQA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .arrays import Inputs
from .grid import Point

if TYPE_CHECKING:
    from flashcute.testing import Check

# The whole problem is checked when it has at most this many scores and (batch, head) pairs.
FULL_CHECK_MAX_SCORES = 1 << 27
FULL_CHECK_MAX_HEADS = 64


@dataclass(frozen=True)
class CheckSlice:
    """The part of a point's output that is checked."""

    scope: str  # "full" or e.g. "b0 h[0, 15]"
    batches: slice
    heads: list[int]  # query heads


def check_slice(point: Point) -> CheckSlice:
    """Everything when small, else batch 0 and heads {0, last}."""
    pairs = point.batch * point.nheads
    if pairs <= FULL_CHECK_MAX_HEADS and pairs * point.seqlen * point.seqlen <= FULL_CHECK_MAX_SCORES:
        return CheckSlice("full", slice(0, point.batch), list(range(point.nheads)))
    heads = sorted({0, point.nheads - 1})
    return CheckSlice(f"b0 h{heads}", slice(0, 1), heads)


def check_gradients(grads: Any, inputs: Inputs, dout: Any, point: Point, softmax_scale: float) -> tuple[Check, str]:
    """(verdict, scope) for (dq, dk, dv) in (b, s, h, d) layout. On a slice of heads, dk and dv of a
    KV head shared by query heads outside the slice (GQA) are partial: then only dq is checked."""
    from flashcute.testing import check_gradients as check

    sl = check_slice(point)
    group = point.nheads // point.nheads_k
    kv_heads = [h // group for h in sl.heads]
    b, h = sl.batches, sl.heads
    parts = ("dq", "dk", "dv") if sl.scope == "full" or group == 1 else ("dq",)
    dq, dk, dv = grads
    result = check((dq[b][:, :, h], dk[b][:, :, kv_heads], dv[b][:, :, kv_heads]), dout[b][:, :, h],
                   inputs.q[b][:, :, h], inputs.k[b][:, :, kv_heads], inputs.v[b][:, :, kv_heads],
                   causal=point.causal, softmax_scale=softmax_scale, parts=parts)
    return result, sl.scope + ("" if len(parts) == 3 else " (dq)")


def check_output(out: Any, inputs: Inputs, point: Point, softmax_scale: float) -> tuple[Check, str]:
    """(verdict, scope) for an output in (b, s, h, d) layout computed from `inputs`."""
    from flashcute.testing import check_attention

    sl = check_slice(point)
    group = point.nheads // point.nheads_k
    kv_heads = [h // group for h in sl.heads]  # query head h reads KV head h // group
    check = check_attention(
        out[sl.batches][:, :, sl.heads],
        inputs.q[sl.batches][:, :, sl.heads],
        inputs.k[sl.batches][:, :, kv_heads],
        inputs.v[sl.batches][:, :, kv_heads],
        causal=point.causal,
        softmax_scale=softmax_scale,
    )
    return check, sl.scope
