"""flashcute's CuPy path: the arrays go through DLPack (``flashcute._C``'s ``fwd``, ``bwd`` and
``merge``) and the outputs are allocated with CuPy.

nanobind, given a plain object, calls x.__dlpack__() (with max_version, or nothing) but never
passes a stream, which CuPy reads as "the consumer uses the legacy default stream" and answers
with a cross-stream dependency nobody asked for. flashcute therefore exports CuPy arrays itself
with stream=-1 (the protocol's "no synchronisation, the consumer orders the work") and hands
nanobind the capsules. The work is then ordered explicitly: the kernel runs on CuPy's current
stream, in whose order the inputs are ready by CuPy's own convention; when `stream=` names a
different stream, that stream first waits (an event, no host block) for the current one.
Imported on the first CuPy call only.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Optional, Tuple

from . import _C


def _export(a: Any) -> Any:
    return None if a is None else a.__dlpack__(stream=-1)


def launch_context(device_id: int, stream: Optional[int]) -> Tuple[int, Any]:
    """(stream handle, allocation context) of a CuPy launch on the current device `device_id`: CuPy's
    current stream, or `stream`, which first waits for it (an event, no host block). CuPy's memory
    pool keeps per-stream free lists: allocating under the launch stream keeps the outputs ordered
    with it."""
    cupy = sys.modules["cupy"]
    current = cupy.cuda.get_current_stream()
    if stream is None or stream == current.ptr:
        return current.ptr, contextlib.nullcontext()
    launch = cupy.cuda.ExternalStream(stream, device_id=device_id)
    launch.wait_event(current.record())
    return stream, launch


def run_fwd(q: Any, k: Any, v: Any, out: Any, lse_shape: Optional[Tuple[int, ...]], stream: Optional[int], args: tuple,
            varlen: tuple = ()) -> Tuple[Any, Any]:
    """The forward: out (allocated like q unless given) and, when lse_shape is given, the lse.
    varlen: () or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(q.device.id):
        handle, alloc_ctx = launch_context(q.device.id, stream)
        with alloc_ctx:
            out = cupy.empty(q.shape, dtype=q.dtype) if out is None else out
            lse = cupy.empty(lse_shape, dtype=cupy.float32) if lse_shape is not None else None
    extra = (_export(varlen[0]), _export(varlen[1]), *varlen[2:]) if varlen else ()
    _C.fwd(_export(q), _export(k), _export(v), _export(out), _export(lse), *args, handle, *extra)
    return out, lse


def run_bwd(dout, q, k, v, out, lse, dq, dk, dv, stream, args, deterministic):
    """The backward: dq, dk, dv (allocated like q, k, v unless given)."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(q.device.id):
        handle, alloc_ctx = launch_context(q.device.id, stream)
        with alloc_ctx:
            dq = cupy.empty(q.shape, dtype=q.dtype) if dq is None else dq
            dk = cupy.empty(k.shape, dtype=k.dtype) if dk is None else dk
            dv = cupy.empty(v.shape, dtype=v.dtype) if dv is None else dv
            b, sq, h, _ = q.shape
            workspace = cupy.empty((_C.bwd_workspace_floats(b, h, sq),), dtype=cupy.float32)
    _C.bwd(*(_export(a) for a in (dout, q, k, v, out, lse, dq, dk, dv, workspace)), *args, deterministic, handle)
    return dq, dk, dv


def run_merge(out_a, lse_a, out_b, lse_b, out, stream):
    """merge_attn_states: (out, lse), out allocated like out_a unless given."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(out_a.device.id):
        handle, alloc_ctx = launch_context(out_a.device.id, stream)
        with alloc_ctx:
            out = cupy.empty(out_a.shape, dtype=out_a.dtype) if out is None else out
            lse = cupy.empty(lse_a.shape, dtype=cupy.float32)
    _C.merge(*(_export(a) for a in (out_a, lse_a, out_b, lse_b, out, lse)), handle)
    return out, lse


def run_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, want_lse, stream, args, num_splits):
    """flash_attn_with_kvcache: (out, lse or None), out allocated like q unless given; the split-KV
    workspace from CuPy's pool, under the launch stream."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(q.device.id):
        handle, alloc_ctx = launch_context(q.device.id, stream)
        with alloc_ctx:
            out = cupy.empty(q.shape, dtype=q.dtype) if out is None else out
            b, sq, h, _ = q.shape
            lse = cupy.empty((b, h, sq), dtype=cupy.float32) if want_lse else None

            def alloc(n):
                return _export(cupy.empty((n,), dtype=cupy.float32))  # the capsule keeps the array alive

            _C.fwd_kvcache(*(_export(a) for a in (q, k_cache, v_cache, out, lse, k, v, cache_seqlens, block_table)),
                           alloc, *args, num_splits, handle)
    return out, lse
