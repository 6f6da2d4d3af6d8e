"""flashcute's CuPy path: the arrays go through DLPack (``flashcute._C``'s ``fwd``, ``bwd`` and
``merge``) and the outputs are allocated with CuPy.

nanobind, given a plain object, calls x.__dlpack__() (with max_version, or nothing) but never
passes a stream, which CuPy reads as "the consumer uses the legacy default stream" and answers
with a cross-stream dependency nobody asked for. flashcute therefore exports CuPy arrays itself
with stream=-1 (the protocol's "no synchronisation, the consumer orders the work") and hands
nanobind the capsules. The work is then ordered explicitly: the kernel runs on CuPy's current
stream, in whose order the inputs are ready by CuPy's own convention; when `stream=` names a
different stream, that stream first waits (an event, no host block) for the current one.
CuPy's binding in flashcute's framework registry (flashcute._args), with the same functions as
the other frameworks'. Imported on the first CuPy call only.
"""

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


def _run_fwd(q: Any, k: Any, v: Any, out: Any, lse_shape: Optional[Tuple[int, ...]], stream: Optional[int],
             options: tuple, varlen: tuple = ()) -> Tuple[Any, Any]:
    """The forward: out (allocated like q unless given) and, when lse_shape is given, the lse.
    varlen: () or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(q.device.id):
        handle, alloc_ctx = launch_context(q.device.id, stream)
        with alloc_ctx:
            out = cupy.empty(q.shape, dtype=q.dtype) if out is None else out
            lse = cupy.empty(lse_shape, dtype=cupy.float32) if lse_shape is not None else None
    extra = (-1, True, _export(varlen[0]), _export(varlen[1]), *varlen[2:]) if varlen else ()
    _C.fwd(_export(q), _export(k), _export(v), _export(out), _export(lse), options, handle, *extra)
    return out, lse


def flash_attn(q: Any, k: Any, v: Any, out: Any, return_lse: bool, stream: Optional[int],
               options: tuple, deterministic: bool = False) -> Tuple[Any, Any]:
    """flash_attn_func's CuPy path (deterministic: for a backward; CuPy has no autograd)."""
    # Of another rank, q is refused by the validation, which needs no lse to say so.
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if return_lse and q.ndim == 4 else None
    return _run_fwd(q, k, v, out, lse_shape, stream, options)


def flash_attn_varlen(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: int, max_k: int, out: Any,
                      return_lse: bool, stream: Optional[int], options: tuple,
                      deterministic: bool = False) -> Tuple[Any, Any]:
    """flash_attn_varlen_func's CuPy path (eager, forward only)."""
    lse_shape = (q.shape[1], q.shape[0]) if return_lse and q.ndim == 3 else None
    return _run_fwd(q, k, v, out, lse_shape, stream, options, (cu_q, cu_k, max_q, max_k))


def flash_attn_bwd(dout, q, k, v, out, lse, dq, dk, dv, stream, options, deterministic, partial_keys=False):
    """flash_attn_bwd's CuPy path: dq, dk, dv (allocated like q, k, v unless given)."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(q.device.id):
        handle, alloc_ctx = launch_context(q.device.id, stream)
        with alloc_ctx:
            dq = cupy.empty(q.shape, dtype=q.dtype) if dq is None else dq
            dk = cupy.empty(k.shape, dtype=k.dtype) if dk is None else dk
            dv = cupy.empty(v.shape, dtype=v.dtype) if dv is None else dv
            b, sq, h, d = q.shape
            floats = _C.bwd_workspace_floats(b, h, sq, d, str(q.dtype), q.device.id)
            workspace = cupy.empty((floats,), dtype=cupy.float32)
    _C.bwd(*(_export(a) for a in (dout, q, k, v, out, lse, dq, dk, dv, workspace)), options, deterministic, handle,
           partial_keys=partial_keys)
    return dq, dk, dv


def merge_attn_states(out_a, lse_a, out_b, lse_b, out, stream):
    """merge_attn_states' CuPy path: (out, lse), out allocated like out_a unless given."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(out_a.device.id):
        handle, alloc_ctx = launch_context(out_a.device.id, stream)
        with alloc_ctx:
            out = cupy.empty(out_a.shape, dtype=out_a.dtype) if out is None else out
            lse = cupy.empty(lse_a.shape, dtype=cupy.float32)
    _C.merge(*(_export(a) for a in (out_a, lse_a, out_b, lse_b, out, lse)), handle)
    return out, lse


def flash_attn_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, want_lse, stream, options,
                       num_splits):
    """flash_attn_with_kvcache's CuPy path: (out, lse or None), out allocated like q unless given; the
    split-KV workspace from CuPy's pool, under the launch stream. An int cache_seqlens is the same
    length for every batch entry."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(q.device.id):
        if cache_seqlens is not None and not isinstance(cache_seqlens, cupy.ndarray):
            cache_seqlens = cupy.full((q.shape[0],), int(cache_seqlens), dtype=cupy.int32)
        handle, alloc_ctx = launch_context(q.device.id, stream)
        with alloc_ctx:
            out = cupy.empty(q.shape, dtype=q.dtype) if out is None else out
            b, sq, h, _ = q.shape
            lse = cupy.empty((b, h, sq), dtype=cupy.float32) if want_lse else None

            def alloc(n):
                return _export(cupy.empty((n,), dtype=cupy.float32))  # the capsule keeps the array alive

            _C.fwd_kvcache(*(_export(a) for a in (q, k_cache, v_cache, out, lse, k, v, cache_seqlens, block_table)),
                           alloc, options, num_splits, handle)
    return out, lse
