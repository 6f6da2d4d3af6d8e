"""flashcute's PyTorch binding: the custom ops ``flashcute::fwd`` and ``flashcute::fwd_lse``, and
the eager fast path.

The ops are defined from Python with ``torch.library.Library``; flashcute links no part of PyTorch.
``fwd`` returns the output, ``fwd_lse`` the output and the lse, so a call that does not ask for the
lse allocates none. Both have fake implementations (shapes, dtypes and strides, no data), so
``torch.compile`` (``fullgraph=True``, ``dynamic=True``, ``mode="reduce-overhead"``),
``torch.export`` and CUDA-graph capture all see one opaque op. The CUDA kernels allocate the
outputs with torch on the current stream and launch there, through ``flashcute._C.fwd`` with
descriptors (data pointer, shape, strides, dtype) of the tensors.

``flash_attn_func`` on torch tensors goes through the ops whenever something may be tracing it:
under ``torch.compile``/``torch.export``, with a dispatch mode active (FakeTensorMode, FlopCounter,
...) and for tensor subclasses. Plain eager calls take a fast path to the same ``_C.fwd`` that
skips the op dispatcher; the kernel, the validation and the stream are the same either way.
Every op is registered by one helper, ``_op`` (schema, CUDA kernel, fake, autograd).

Gradients: when q, k or v requires grad, ``flash_attn_func`` calls ``fwd_lse``, whose autograd
formula (``register_autograd``) runs a third op, ``flashcute::bwd`` (dq, dk, dv), so training works
eagerly and under ``torch.compile``. ``flash_attn_bwd`` on torch tensors calls ``flashcute::bwd``
under tracing and launches directly otherwise.

This module is torch's binding in flashcute's framework registry (flashcute._args): flash_attn,
flash_attn_varlen, flash_attn_bwd, flash_attn_kvcache and merge_attn_states, the same functions as
the other frameworks'. Imported by flashcute only when a torch tensor is passed (or torch is
imported already), so ``import flashcute`` never imports torch.
"""

from contextlib import nullcontext as _nullcontext
from typing import Any, Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from . import _C, _args

_args._tracing = torch.compiler.is_compiling  # see _args._check_scalars_first

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def _dtype_name(t: Tensor) -> str:
    return _DTYPE_NAMES.get(t.dtype) or str(t.dtype).replace("torch.", "")


def _desc(t: Tensor) -> Tuple[int, Any, Tuple[int, ...], str]:
    """(data_ptr, shape, strides, dtype name): what _C's entries need of a tensor."""
    return (t.data_ptr(), t.shape, t.stride(), _dtype_name(t))


def _lse_shape(q: Tensor) -> Tuple[Any, Any, Any]:
    b, sq, h, _ = q.shape
    return (b, h, sq)


def _launch(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor], options: tuple, index: int,
            stream: int, check_stream_device: bool) -> None:
    _C.fwd(_desc(q), _desc(k), _desc(v), _desc(out), None if lse is None else _desc(lse), options, stream, index,
           check_stream_device)


def _device_index(*named: Tuple[str, Optional[Tensor]]) -> int:
    """The index of the one CUDA device all the named tensors are on (None entries are skipped);
    raises naming the first that is not, against the first tensor."""
    ref_name, ref = named[0]
    index = ref.get_device()
    for name, t in named:
        if t is None:
            continue
        if not t.is_cuda:
            raise TypeError(f"{name}: expected a CUDA array, got a {t.device.type.upper()} torch.Tensor")
        if t.get_device() != index:
            raise ValueError(f"{name}: on {t.device} but {ref_name} is on {ref.device}")
    return index


def _cuda_index(q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor] = None, *more: Tuple[str, Tensor]) -> int:
    """_device_index of q, k, v, out and more (name, tensor) pairs."""
    return _device_index(("q", q), ("k", k), ("v", v), ("out", out), *more)


def _current_stream(index: int) -> int:
    # The raw handle, without making a torch.cuda.Stream object (a few microseconds a call).
    return torch._C._cuda_getCurrentRawStream(index)


def _launch_context(device: torch.device, stream: Optional[int], current: int) -> Tuple[int, Any, bool]:
    """Where an eager launch runs: (stream handle, context to allocate the outputs in,
    check_stream_device). The current stream, or `stream`, which first waits for the current one
    (an event: the host does not block) and under which the outputs are allocated, so that the
    caching allocator keeps them in its order."""
    if stream is None or stream == current:
        return current, _nullcontext(), False
    default = torch.cuda.default_stream(device)
    launch = default if stream == default.cuda_stream else torch.cuda.ExternalStream(stream, device=device)
    launch.wait_stream(torch.cuda.current_stream(device))
    return stream, torch.cuda.stream(launch), True


# ---------------------------------------------------------------------------------------- the ops

# The ops are defined with the low-level torch.library.Library and a CUDA kernel, not with
# torch.library.custom_op: custom_op wraps every call in Python autograd and device dispatch
# layers, which cost 30 us a call under torch.compile on an H100 (docs/perf-notes.md, host
# overhead). The fake implementations make them traceable.
_lib = torch.library.Library("flashcute", "DEF")

# The attention options, as every op takes them (flashcute._args._parse_options' tuple); a
# softmax_scale of None is 1 / sqrt(headdim), set by the validation.
_OPTIONS = "float? softmax_scale, bool causal, SymInt window_left, SymInt window_right, float softcap"


def _op(schema: str, cuda: Callable, fake: Callable, backward: Optional[Callable] = None,
        setup_context: Optional[Callable] = None) -> Any:
    """Defines the op flashcute::<name> of `schema`: its CUDA kernel, its fake implementation (shapes,
    dtypes and strides, for tracing) and, when given, its autograd formula. Returns the op's
    overload, resolved once (torch.ops attribute lookups cost per call)."""
    name = schema[:schema.index("(")]
    _lib.define(schema)
    _lib.impl(name, cuda, "CUDA")
    torch.library.register_fake(f"flashcute::{name}", fake, lib=_lib)
    if backward is not None:
        torch.library.register_autograd(f"flashcute::{name}", backward, setup_context=setup_context, lib=_lib)
    return getattr(torch.ops.flashcute, name).default


def _check_traced(q: Tensor, k: Tensor, v: Tensor, options: tuple) -> None:
    # The validation at trace time, where the shapes are known (under dynamic shapes the launch
    # validates them): the arrays as contiguous stand-ins (data pointer 256, strides None).
    shapes = [tuple(t.shape) for t in (q, k, v)]
    if all(isinstance(d, int) for s in shapes for d in s):
        _C.check_fwd(*((256, s, None, _dtype_name(t)) for s, t in zip(shapes, (q, k, v))), options)


def _grad_ready(t: Tensor) -> Tensor:
    # Autograd may hand an expanded (stride 0) or otherwise strided gradient; the kernels want
    # the last dim contiguous and 16-byte rows.
    return t if t.is_contiguous() else t.contiguous()


# fwd returns out and fwd_lse (out, lse), so that a call that does not ask for the lse allocates
# none. fwd_lse is differentiable: its autograd formula runs bwd.


def _fwd_cuda(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float], causal: bool, window_left: int,
              window_right: int, softcap: float) -> Tensor:
    """flashcute::fwd: out = attention(q, k, v), on the current stream of q's device. q (batch,
    seqlen_q, nheads, headdim); k, v (batch, seqlen_k, nheads_k, headdim); window bounds -1 for
    unbounded."""
    index = _cuda_index(q, k, v)
    out = q.new_empty(q.shape)
    _launch(q, k, v, out, None, (softmax_scale, causal, window_left, window_right, softcap), index,
            _current_stream(index), False)
    return out


def _fwd_lse_cuda(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float], causal: bool, window_left: int,
                  window_right: int, softcap: float, deterministic: bool = False) -> Tuple[Tensor, Tensor]:
    """flashcute::fwd_lse: (out, lse), lse the logsumexp of each row, (batch, nheads, seqlen_q) float32.
    deterministic is for its backward (flash_attn_func's argument), which autograd runs with it."""
    index = _cuda_index(q, k, v)
    out = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    _launch(q, k, v, out, lse, (softmax_scale, causal, window_left, window_right, softcap), index,
            _current_stream(index), False)
    return out, lse


def _fwd_fake(q: Tensor, k: Tensor, v: Tensor, *options: Any) -> Tensor:
    _check_traced(q, k, v, options)
    return q.new_empty(q.shape)


def _fwd_lse_fake(q: Tensor, k: Tensor, v: Tensor, *options: Any) -> Tuple[Tensor, Tensor]:
    _check_traced(q, k, v, options[:5])  # without deterministic
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


def _fwd_lse_setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options, ctx.deterministic = tuple(options[:5]), bool(options[5]) if len(options) > 5 else False
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # else autograd zero-fills an lse gradient (a kernel) every backward


def _fwd_lse_backward(ctx: Any, grad_out: Optional[Tensor], grad_lse: Optional[Tensor]) -> tuple:
    # The lse is not differentiable (as in FlashAttention-2): its gradient, if any, is ignored.
    if grad_out is None:  # no gradient reached out (grads are not materialized)
        return (None,) * len(ctx.needs_input_grad)
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _bwd_op(_grad_ready(grad_out), q, k, v, out, lse, *ctx.options, ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None, None


_fwd_op = _op(f"fwd(Tensor q, Tensor k, Tensor v, {_OPTIONS}) -> Tensor", _fwd_cuda, _fwd_fake)
_fwd_lse_op = _op(f"fwd_lse(Tensor q, Tensor k, Tensor v, {_OPTIONS}, bool deterministic=False) -> (Tensor, Tensor)",
                  _fwd_lse_cuda,
                  _fwd_lse_fake, _fwd_lse_backward, _fwd_lse_setup_context)


# ---------------------------------------------------------------------------------------- backward


def _bwd_launch(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dq: Tensor, dk: Tensor,
                dv: Tensor, options: tuple, deterministic: bool, index: int, stream: int,
                check_stream_device: bool, varlen: tuple = (), partial_keys: bool = False) -> None:
    """varlen: () or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k); partial_keys: as
    flash_attn_bwd's."""
    if varlen:
        floats = _C.bwd_varlen_workspace_floats(varlen[0].shape[0] - 1, q.shape[1], q.shape[0], q.shape[2],
                                                str(q.dtype).removeprefix("torch."), index)
        varlen = (_desc(varlen[0]), _desc(varlen[1]), varlen[2], varlen[3])
    else:
        b, sq, h, d = q.shape
        floats = _C.bwd_workspace_floats(b, h, sq, d, str(q.dtype).removeprefix("torch."), index)
    workspace = q.new_empty((floats,), dtype=torch.float32)  # D = rowsum(dout * out) (+ sm90's dQ accumulator)
    _C.bwd(_desc(dout), _desc(q), _desc(k), _desc(v), _desc(out), _desc(lse), _desc(dq), _desc(dk), _desc(dv),
           _desc(workspace), options, deterministic, stream, index, check_stream_device, *varlen,
           partial_keys=partial_keys)


def _bwd_cuda(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int, softcap: float,
              deterministic: bool, partial_keys: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """flashcute::bwd: (dq, dk, dv) from dout and the forward's q, k, v, out and lse."""
    index = _cuda_index(q, k, v, out, ("dout", dout), ("lse", lse))
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    _bwd_launch(dout, q, k, v, out, lse, dq, dk, dv, (softmax_scale, causal, window_left, window_right, softcap),
                deterministic, index, _current_stream(index), False, partial_keys=partial_keys)
    return dq, dk, dv


def _grads_fake(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, *rest: Any) -> Tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_bwd_op = _op(f"bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_OPTIONS}, "
              "bool deterministic, bool partial_keys=False) -> (Tensor, Tensor, Tensor)", _bwd_cuda, _grads_fake)


# ---------------------------------------------------------------------------------------- varlen

# A variable-length batch (flash_attn_varlen_func): q, out (total_q, nheads, headdim), k, v
# (total_k, nheads_k, headdim), cu_seqlens_* int32 (batch + 1,) on the device, never read on the
# host. One op returns (out, lse), lse (nheads, total_q): its autograd formula needs the lse, and
# it costs 4 bytes a query row and head.
_VARLEN = f"Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, {_OPTIONS}"


def _varlen_lse_shape(q: Tensor) -> Tuple[Any, Any]:
    return (q.shape[1], q.shape[0])


def _varlen_launch(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor], cu_q: Tensor, cu_k: Tensor,
                   max_q: int, max_k: int, options: tuple, index: int, stream: int, check_stream_device: bool) -> None:
    _C.fwd(_desc(q), _desc(k), _desc(v), _desc(out), None if lse is None else _desc(lse), options, stream, index,
           check_stream_device, _desc(cu_q), _desc(cu_k), max_q, max_k)


def _varlen_fwd_cuda(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, *options: Any) -> Tuple[Tensor, Tensor]:
    """flashcute::varlen_fwd: (out, lse) of a variable-length batch, on the current stream. The
    last option, deterministic, is for its backward."""
    options = options[:5]
    index = _cuda_index(q, k, v, None, ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k))
    out = q.new_empty(q.shape)
    lse = q.new_empty(_varlen_lse_shape(q), dtype=torch.float32)
    _varlen_launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options, index,
                   _current_stream(index), False)
    return out, lse


def _varlen_bwd_cuda(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, *rest: Any) -> Tuple[Tensor, Tensor, Tensor]:
    """flashcute::varlen_bwd: (dq, dk, dv) of a variable-length batch."""
    *options, deterministic = rest
    index = _cuda_index(q, k, v, out, ("dout", dout), ("lse", lse), ("cu_seqlens_q", cu_seqlens_q),
                        ("cu_seqlens_k", cu_seqlens_k))
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    _bwd_launch(dout, q, k, v, out, lse, dq, dk, dv, tuple(options), deterministic, index, _current_stream(index), False,
                (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))
    return dq, dk, dv


def _varlen_fwd_fake(q: Tensor, k: Tensor, v: Tensor, *rest: Any) -> Tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(_varlen_lse_shape(q), dtype=torch.float32)


def _varlen_fwd_setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.sizes = (max_q, max_k)
    ctx.options, ctx.deterministic = tuple(options[:5]), bool(options[5]) if len(options) > 5 else False
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # as fwd_lse's: no zero-filled lse gradient


def _varlen_fwd_backward(ctx: Any, grad_out: Optional[Tensor], grad_lse: Optional[Tensor]) -> tuple:
    if grad_out is None:
        return (None,) * len(ctx.needs_input_grad)
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = _varlen_bwd_op(_grad_ready(grad_out), q, k, v, out, lse, cu_q, cu_k, *ctx.sizes, *ctx.options,
                                 ctx.deterministic)
    return (dq, dk, dv) + (None,) * 10


_varlen_fwd_op = _op(f"varlen_fwd(Tensor q, Tensor k, Tensor v, {_VARLEN}, bool deterministic=False) -> (Tensor, Tensor)",
                     _varlen_fwd_cuda,
                     _varlen_fwd_fake, _varlen_fwd_backward, _varlen_fwd_setup_context)
_varlen_bwd_op = _op(f"varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_VARLEN}, "
                     "bool deterministic) -> (Tensor, Tensor, Tensor)", _varlen_bwd_cuda, _grads_fake)


# ---------------------------------------------------------------------------------------- merge


def _merge_launch(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, out: Tensor, lse: Tensor, index: int,
                  stream: int, check_stream_device: bool) -> None:
    _C.merge(_desc(out_a), _desc(lse_a), _desc(out_b), _desc(lse_b), _desc(out), _desc(lse), stream, index,
             check_stream_device)


def _merge_index(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, out: Optional[Tensor] = None) -> int:
    return _device_index(("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b), ("out", out))


def _merge_cuda(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """flashcute::merge_attn_states: (out, lse) over the union of two disjoint key sets."""
    index = _merge_index(out_a, lse_a, out_b, lse_b)
    out, lse = out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape)
    _merge_launch(out_a, lse_a, out_b, lse_b, out, lse, index, _current_stream(index), False)
    return out, lse


def _merge_fake(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape)


_merge_op = _op("merge_attn_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b) -> (Tensor, Tensor)",
                _merge_cuda, _merge_fake)


# ---------------------------------------------------------------------------------------- KV cache

# flash_attn_with_kvcache: attention over a KV cache, contiguous or paged, after writing the new
# keys and values (k, v) into it in place, so the caches are mutated arguments. cache_seqlens and
# block_table stay on the device (a decode step can be captured in a CUDA graph). The split-KV
# workspace is allocated inside the op, with torch, on the launch stream.


def _kvcache_launch(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                    cache_seqlens: Optional[Tensor], block_table: Optional[Tensor], out: Tensor, lse: Optional[Tensor],
                    options: tuple, num_splits: int, index: int, stream: int, check_stream_device: bool) -> int:
    keep = []  # the workspace lives until the launch is made; the allocator orders its reuse after it

    def alloc(n: int) -> tuple:
        keep.append(q.new_empty((n,), dtype=torch.float32))
        return _desc(keep[-1])

    # The descriptors spelled out: this runs on every eager decode step (docs/perf-notes.md, host overhead).
    return _C.fwd_kvcache(_desc(q), _desc(k_cache), _desc(v_cache), _desc(out), None if lse is None else _desc(lse),
                          None if k is None else _desc(k), None if v is None else _desc(v),
                          None if cache_seqlens is None else _desc(cache_seqlens),
                          None if block_table is None else _desc(block_table), alloc, options, num_splits, stream,
                          index, check_stream_device)


def _kvcache_index(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                   cache_seqlens: Optional[Tensor], block_table: Optional[Tensor], out: Optional[Tensor]) -> int:
    # One pass without names first (a decode step's eight arrays); the named check where it fails.
    # is_cuda too: get_device() gives other device types' indices as well.
    index = q.get_device() if q.is_cuda else -1
    if index >= 0:
        for t in (k_cache, v_cache, k, v, cache_seqlens, block_table, out):
            if t is not None and (not t.is_cuda or t.get_device() != index):
                break
        else:
            return index
    return _device_index(("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
                         ("cache_seqlens", cache_seqlens), ("block_table", block_table), ("out", out))


def _fwd_kvcache_cuda(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                      cache_seqlens: Optional[Tensor], block_table: Optional[Tensor], *rest: Any) -> Tuple[Tensor, Tensor]:
    """flashcute::fwd_kvcache: (out, lse) over the cache, after appending k, v; current stream."""
    *options, num_splits = rest
    index = _kvcache_index(q, k_cache, v_cache, k, v, cache_seqlens, block_table, None)
    out = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    _kvcache_launch(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, tuple(options), num_splits, index,
                    _current_stream(index), False)
    return out, lse


def _fwd_kvcache_fake(q: Tensor, *rest: Any) -> Tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


_fwd_kvcache_op = _op(
    "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? cache_seqlens, "
    f"Tensor? block_table, {_OPTIONS}, int num_splits) -> (Tensor, Tensor)", _fwd_kvcache_cuda, _fwd_kvcache_fake)


# ---------------------------------------------------------------------------------------- the binding


def _may_be_traced(*tensors: Optional[Tensor]) -> bool:
    """Whether anything but a plain eager call could be happening: then the op is the way in."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return True
    for t in tensors:  # a loop, not any(): a generator costs more than the check on a decode step
        if t is not None and type(t) is not Tensor:
            return True
    return False


def _refuse_out_stream(what: str) -> None:
    raise TypeError(f"{what}: not supported when q, k or v requires grad, or under torch.compile, torch.export or "
                    "other tracing (the op allocates its output and runs on the current stream); call without them")


def flash_attn(q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor], return_lse: bool, stream: Optional[int],
               options: tuple, deterministic: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """flash_attn_func's torch path. options: (softmax_scale or None, causal, window_left,
    window_right, softcap); deterministic: for the backward autograd runs."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # Differentiable: flashcute::fwd_lse, whose autograd formula runs flashcute::bwd.
        if out is not None or stream is not None:
            raise TypeError(
                "out=, stream=: not supported when q, k or v requires grad (the differentiable op allocates "
                "its output and runs on the current stream); call without them, or under torch.no_grad()"
            )
        o, lse = _fwd_lse_op(q, k, v, *options, deterministic)
        return o, (lse if return_lse else None)
    if _may_be_traced(q, k, v, out):
        if out is not None or stream is not None:
            raise TypeError(
                "out=, stream=: not supported under torch.compile, torch.export or other tracing (the traced "
                "op allocates its output and runs on the current stream); call without them there"
            )
        if return_lse:
            return _fwd_lse_op(q, k, v, *options)
        return _fwd_op(q, k, v, *options), None

    # Eager: the same launch as the op's, without the dispatcher.
    index = _cuda_index(q, k, v, out)
    current = _current_stream(index)
    if stream is None or stream == current:  # the common case, without the context manager
        if out is None:
            out = q.new_empty(q.shape)
        lse = q.new_empty(_lse_shape(q), dtype=torch.float32) if return_lse else None
        _launch(q, k, v, out, lse, options, index, current, False)
        return out, lse
    handle, ctx, check = _launch_context(q.device, stream, current)
    with ctx:
        if out is None:
            out = q.new_empty(q.shape)
        lse = q.new_empty(_lse_shape(q), dtype=torch.float32) if return_lse else None
    _launch(q, k, v, out, lse, options, index, handle, check)
    return out, lse


def flash_attn_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor], stream: Optional[int],
                   options: tuple, deterministic: bool, partial_keys: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """flash_attn_bwd's torch path: the op under tracing, a direct launch eagerly."""
    if _may_be_traced(dout, q, k, v, out, lse, dq, dk, dv):
        if dq is not None or dk is not None or dv is not None or stream is not None:
            raise TypeError(
                "dq=, dk=, dv=, stream=: not supported under torch.compile, torch.export or other tracing (the "
                "traced op allocates its outputs and runs on the current stream); call without them there"
            )
        return _bwd_op(dout, q, k, v, out, lse, *options, deterministic, partial_keys)
    index = _cuda_index(q, k, v, out, ("dout", dout), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv))
    handle, ctx, check = _launch_context(q.device, stream, _current_stream(index))
    with ctx:
        dq = q.new_empty(q.shape) if dq is None else dq
        dk = k.new_empty(k.shape) if dk is None else dk
        dv = v.new_empty(v.shape) if dv is None else dv
        _bwd_launch(dout, q, k, v, out, lse, dq, dk, dv, options, deterministic, index, handle, check,
                    partial_keys=partial_keys)
    return dq, dk, dv


def flash_attn_varlen(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
                      out: Optional[Tensor], return_lse: bool, stream: Optional[int],
                      options: tuple, deterministic: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """flash_attn_varlen_func's torch path: the op when differentiable or traced, else a direct launch."""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if grad or _may_be_traced(q, k, v, out, cu_q, cu_k):
        if out is not None or stream is not None:
            _refuse_out_stream("out=, stream=")
        o, lse = _varlen_fwd_op(q, k, v, cu_q, cu_k, max_q, max_k, *options, deterministic)
        return o, (lse if return_lse else None)
    index = _cuda_index(q, k, v, out, ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k))
    handle, ctx, check = _launch_context(q.device, stream, _current_stream(index))
    with ctx:
        out = q.new_empty(q.shape) if out is None else out
        lse = q.new_empty(_varlen_lse_shape(q), dtype=torch.float32) if return_lse else None
        _varlen_launch(q, k, v, out, lse, cu_q, cu_k, max_q, max_k, options, index, handle, check)
    return out, lse


def merge_attn_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, out: Optional[Tensor],
                      stream: Optional[int]) -> Tuple[Tensor, Tensor]:
    """merge_attn_states' torch path: the op, or a direct launch for out= / stream= (eager only)."""
    if out is None and stream is None:
        return _merge_op(out_a, lse_a, out_b, lse_b)
    if _may_be_traced(out_a, lse_a, out_b, lse_b, out):
        raise TypeError("out=, stream=: not supported under torch.compile, torch.export or other tracing; call "
                        "without them there")
    index = _merge_index(out_a, lse_a, out_b, lse_b, out)
    handle, ctx, check = _launch_context(out_a.device, stream, _current_stream(index))
    with ctx:
        out = out_a.new_empty(out_a.shape) if out is None else out
        lse = lse_a.new_empty(lse_a.shape)
        _merge_launch(out_a, lse_a, out_b, lse_b, out, lse, index, handle, check)
    return out, lse


def flash_attn_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                       cache_seqlens: Union[None, int, Tensor], block_table: Optional[Tensor], out: Optional[Tensor],
                       return_lse: bool, stream: Optional[int], options: tuple,
                       num_splits: int) -> Tuple[Tensor, Optional[Tensor]]:
    """flash_attn_with_kvcache's torch path: the op under tracing, a direct launch eagerly. An int
    cache_seqlens is the same length for every batch entry."""
    if cache_seqlens is not None and not isinstance(cache_seqlens, Tensor):
        cache_seqlens = torch.full((q.shape[0],), int(cache_seqlens), dtype=torch.int32, device=q.device)
    if _may_be_traced(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out):
        if out is not None or stream is not None:
            raise TypeError(
                "out=, stream=: not supported under torch.compile, torch.export or other tracing (the traced op "
                "allocates its output and runs on the current stream); call without them there"
            )
        o, lse = _fwd_kvcache_op(q, k_cache, v_cache, k, v, cache_seqlens, block_table, *options, num_splits)
        return o, (lse if return_lse else None)
    index = _kvcache_index(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out)
    current = _current_stream(index)
    if stream is None or stream == current:  # the common case, without the context manager
        if out is None:
            out = q.new_empty(q.shape)
        lse = q.new_empty(_lse_shape(q), dtype=torch.float32) if return_lse else None
        _kvcache_launch(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, options, num_splits, index,
                        current, False)
        return out, lse
    handle, ctx, check = _launch_context(q.device, stream, current)
    with ctx:
        out = q.new_empty(q.shape) if out is None else out
        lse = q.new_empty(_lse_shape(q), dtype=torch.float32) if return_lse else None
        _kvcache_launch(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, options, num_splits, index,
                        handle, check)
    return out, lse
