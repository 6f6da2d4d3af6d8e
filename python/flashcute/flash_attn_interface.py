"""flashcute's Python API: :func:`flash_attn_func` over torch, CuPy, JAX and any DLPack CUDA array.

The heavy lifting (validation of shapes, strides, dtypes, devices and values, and the launch) is
in the compiled module :mod:`flashcute._C`. The Python side adds what is framework specific:
recognising torch / CuPy / JAX arrays without importing a framework the caller did not use, picking
the stream, and allocating the outputs through the caller's framework (so caching allocators and
stream order hold). torch goes through the custom ops ``flashcute::fwd``/``fwd_lse``
(:mod:`flashcute._torch`), JAX through an XLA FFI custom call (:mod:`flashcute._jax`), CuPy and
other DLPack producers through DLPack.
"""

import numbers
from typing import Any, Optional, Tuple, Union

from ._args import (_as_bool, _as_int, _check_cuda_array, _check_fa2_only, _check_scalars_first, _one_framework,
                    _parse_options, _parse_stream)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_bwd",
           "merge_attn_states", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"]

# Each call checks its plain arguments (flashcute._args), finds the framework of its arrays in the
# registry (flashcute._args._framework), and hands the call to that framework's binding, which has
# the same functions for every framework: flashcute._torch (the custom ops, and an eager fast path
# that passes data pointers, shapes and strides, no DLPack), flashcute._jax (XLA FFI custom calls),
# flashcute._cupy (DLPack, ordered on CuPy's stream), flashcute._dlpack (other DLPack producers).


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    out: Any = None,
    stream: Union[None, int, Any] = None,
) -> Union[Any, Tuple[Any, Any], Tuple[Any, Any, None]]:
    """FlashAttention forward pass: ``softmax(q @ k^T * softmax_scale) @ v``.

    Supports multi-query and grouped-query attention (MQA/GQA) by passing in k, v with fewer heads
    than q. The number of heads in q must be divisible by the number of heads in k, v: if q has 6
    heads and k, v have 2, heads 0, 1, 2 of q attend to head 0 of k, v, and heads 3, 4, 5 of q to
    head 1.

    If causal=True, the causal mask is aligned to the bottom right corner of the attention matrix.
    For example, if seqlen_q = 2 and seqlen_k = 5, the causal mask (1 = keep, 0 = masked out) is::

        1 1 1 1 0
        1 1 1 1 1

    If seqlen_q = 5 and seqlen_k = 2, the causal mask is::

        0 0
        0 0
        0 0
        1 0
        1 1

    If a row of the mask is all zero, the output of that row is 0 (and its lse is -inf).

    If window_size != (-1, -1), implements sliding window local attention: query at position i
    only attends to keys between ``[i + seqlen_k - seqlen_q - window_size[0],
    i + seqlen_k - seqlen_q + window_size[1]]`` inclusive; -1 leaves that side unbounded.

    The positional order and the keywords are FlashAttention-2's, so code written for
    ``flash_attn.flash_attn_func`` runs by changing the import; ``return_lse``, ``out`` and
    ``stream`` are flashcute's own and keyword-only.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim)
        k: (batch_size, seqlen_k, nheads_k, headdim)
        v: (batch_size, seqlen_k, nheads_k, headdim)
            CUDA arrays of one framework (torch.Tensor, cupy.ndarray, jax.Array, or any DLPack
            producer together with ``out=``), float16 or bfloat16 (the same for all), on one device.
            headdim is a multiple of 8, at most 256. The last dim must be contiguous; the other
            strides are free (e.g. q, k, v may be slices of one packed (b, s, 3, h, d) tensor) as
            long as they are multiples of 8 elements and the data is 16-byte aligned.
        dropout_p: float. Dropout probability. flashcute has no dropout yet: only 0.0 is accepted
            (NotImplementedError otherwise). FlashAttention-2 callers pass 0.0 at inference.
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply a causal attention mask (e.g., for auto-regressive modeling).
        window_size: (left, right). If not (-1, -1), implements sliding window local attention.
        softcap: float. Anything > 0 activates softcapping: scores = softcap * tanh(scores / softcap).
        alibi_slopes: not supported yet: only None is accepted (NotImplementedError otherwise).
        deterministic: bool. Whether the backward (autograd, jax.grad) gives the same bits on
            every run. The forward always does, and so does the sm80 backward (every gradient
            element is written by one thread block). The Hopper backward adds each block's dQ
            in arrival order unless this is set; then in a fixed order, a little slower.
        return_attn_probs: bool. As in FlashAttention-2, return ``(out, softmax_lse, None)``: the
            logsumexp, and None where FlashAttention-2 returns the dropout mask (it has one only
            with dropout_p > 0, which flashcute does not support).
        return_lse: bool. Return ``(out, lse)``.
        out: optional preallocated output like q (same shape and dtype; may be a strided view,
            with the same stride rules as q). Eager only: not under torch.compile, torch.export or
            other tracing (TypeError there), and not for JAX, whose arrays are immutable.
        stream: where to run. None (default): the framework's current stream, i.e.
            ``torch.cuda.current_stream(q.device)`` or ``cupy.cuda.get_current_stream()``. Or an int
            cudaStream_t handle, or an object with ``__cuda_stream__`` (the CUDA stream protocol),
            ``.cuda_stream`` (torch) or ``.ptr`` (CuPy). Eager only, as ``out``; not for JAX, where
            the kernel runs on the stream XLA gives it.

    Stream semantics: the inputs are taken to be ready in the order of the framework's current
    stream (the framework's own rule). When ``stream`` is another stream, it first waits for the
    current one (an event: the host does not block) and the outputs are allocated on it, so the
    framework's caching allocator keeps them in its order; reading the result on another stream is
    the caller's to order, as for any work on a side stream. flashcute never synchronises the
    device, and for torch and CuPy never blocks the host.

    torch: the call is the custom op ``torch.ops.flashcute.fwd`` (``fwd_lse`` with the lse), so it
    works under ``torch.compile`` (also ``fullgraph=True``, ``dynamic=True``,
    ``mode="reduce-overhead"``), ``torch.export`` and CUDA-graph capture; plain eager calls skip the
    op dispatcher for speed and run the same kernel on the same stream.

    JAX: the call is an XLA FFI custom call, so it works eagerly (without blocking the host) and
    under ``jax.jit``, ``lax.scan`` and ``jax.vmap`` (a vmapped axis is folded into the batch);
    ``jax.grad`` runs flashcute's backward through a second FFI call. Bad input raises the same
    errors at trace time.

    Gradients: the output is differentiable with respect to q, k and v (torch autograd, also under
    ``torch.compile``; ``jax.grad``); the lse is not. With inputs that require grad, ``out`` and
    ``stream`` are refused (TypeError). ``flash_attn_bwd`` runs the same backward directly.

    Return:
        out: (batch_size, seqlen_q, nheads, headdim), like q, in q's framework.
        lse [if return_lse or return_attn_probs]: (batch_size, nheads, seqlen_q), float32. The
            natural-log logsumexp of each row of the scaled (and softcapped, masked) scores.
            A row that sees no key (possible with causal and seqlen_q > seqlen_k, or a window)
            has lse = -inf and out = 0. FlashAttention-2 gives +inf there; -inf is the logsumexp
            of an empty set, so that such a row weighs nothing when partial results are merged by
            their lse (exp(lse - m) = 0), where +inf would take over the merge.

    A zero batch size or seqlen_q returns an empty output without launching anything.

    Raises:
        TypeError: an argument of the wrong type or dtype, a CPU array, or mixed frameworks.
        ValueError: a bad shape, stride, alignment or value, or arrays on different devices.
        NotImplementedError: the dtype or head dim was left out of this build
            (build options FLASHCUTE_DTYPES / FLASHCUTE_HEAD_DIMS), or a feature flashcute does
            not have yet (dropout_p > 0, alibi_slopes).
        RuntimeError: a CUDA error.

    The errors that come from the compiled validation carry its structure: ``exc.arg`` (the
    argument), ``exc.expected`` and ``exc.got``.
    """
    # Plain arguments first, so that their messages do not depend on the arrays.
    _check_fa2_only(dropout_p, alibi_slopes)
    deterministic = _as_bool("deterministic", deterministic)  # for the backward
    return_attn_probs = _as_bool("return_attn_probs", return_attn_probs)
    options = _parse_options(softmax_scale, causal, window_size, softcap)
    return_lse = _as_bool("return_lse", return_lse)
    stream = _parse_stream(stream)

    # Arrays: CUDA arrays of one framework.
    try:
        fw = _one_framework(("q", q), ("k", k), ("v", v), ("out", out), optional=("out",))
        out, lse = fw.binding.flash_attn(q, k, v, out, return_lse or return_attn_probs, stream, options,
                                         deterministic)
    except (TypeError, ValueError):
        _check_scalars_first(options)
        raise
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_lse else out


def flash_attn_bwd(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    *,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    stream: Union[None, int, Any] = None,
    partial_keys: bool = False,
) -> Tuple[Any, Any, Any]:
    """FlashAttention backward pass: the gradients of ``out = flash_attn_func(q, k, v, ...)``.

    For callers that run the backward themselves (CuPy, or any framework's own autograd); torch
    and JAX users get the same kernels through ``flash_attn_func``'s gradient.

    Arguments:
        dout: (batch_size, seqlen_q, nheads, headdim), the gradient of the loss with respect to out.
        q, k, v: the forward's inputs; out: its output; lse: its ``return_lse=True`` lse,
            float32 (batch_size, nheads, seqlen_q).
        softmax_scale, causal, window_size, softcap: exactly the forward's.
        deterministic: the same bits on every run. The sm80 backward always is (no atomics: every
            gradient element is written by one thread block); the Hopper backward then adds each
            block's dQ in a fixed order, a little slower.
        dq, dk, dv: optional preallocated outputs, like q, k and v (eager only).
        stream: as for ``flash_attn_func``.
        partial_keys: k and v are part of the keys that out and lse were computed over, as in ring
            attention, where each block's backward takes the merged out and lse
            (:mod:`flashcute.distributed`). dq, dk and dv are then this block's share of the
            gradients. (Without it, rows that see at most 64 keys recompute the softmax backward's
            row constant from k and v, which is exact only when they are all the keys.)

    Return:
        (dq, dk, dv): like q, k and v. With MQA/GQA, dk and dv are summed over each group of query
        heads. Rows of q that see no key get dq = 0; keys no query sees get dk = dv = 0.

    Memory: a float32 workspace besides the outputs, from the framework's allocator: batch_size *
    nheads * seqlen_q elements on the mma.sync backward, about (headdim + 2) times that on the
    Hopper one (its fp32 dQ accumulator). Raises the same errors as ``flash_attn_func``, naming
    the argument.
    """
    options = _parse_options(softmax_scale, causal, window_size, softcap)
    deterministic = _as_bool("deterministic", deterministic)
    partial_keys = _as_bool("partial_keys", partial_keys)
    stream = _parse_stream(stream)

    try:
        fw = _one_framework(("q", q), ("dout", dout), ("k", k), ("v", v), ("out", out), ("lse", lse), ("dq", dq),
                            ("dk", dk), ("dv", dv), optional=("dq", "dk", "dv"))
        return fw.binding.flash_attn_bwd(dout, q, k, v, out, lse, dq, dk, dv, stream, options, deterministic,
                                         partial_keys)
    except (TypeError, ValueError):
        _check_scalars_first(options)
        raise


# ---------------------------------------------------------------------------
# Variable-length batches
# ---------------------------------------------------------------------------


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Any = None,
    *,
    return_lse: bool = False,
    return_softmax_lse: bool = False,
    out: Any = None,
    stream: Union[None, int, Any] = None,
) -> Union[Any, Tuple[Any, Any], Tuple[Any, Any, None]]:
    """FlashAttention forward pass over a batch of sequences of different lengths, packed without
    padding (FlashAttention-2's ``flash_attn_varlen_func``, in its positional order).

    Sequence ``b`` has the query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and the key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of k and v; every option of :func:`flash_attn_func`
    applies to each sequence on its own (causal and windows aligned to each sequence's bottom-right
    corner, softcap, GQA). A sequence may be empty (length 0).

    Arguments:
        q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim). CUDA arrays, float16 or
            bfloat16, with the stride rules of :func:`flash_attn_func`.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) CUDA arrays on q's device, non-decreasing,
            starting at 0 (FlashAttention-2's). They are never read on the host, so a call can be
            captured in a CUDA graph; the kernels clamp their entries into [0, total], so no value
            in them makes a kernel read or write outside q, k, v, out or lse. Self-attention may
            pass one array as both (with equal totals and maxima), which lets the Hopper backward
            at head dim <= 64 skip work it cannot otherwise rule out on the host.
        max_seqlen_q, max_seqlen_k: ints, at least the longest sequence's query and key counts, as
            in FlashAttention-2: they size the launch, and rows past them are not computed.
        dropout_p, alibi_slopes: only 0.0 and None (NotImplementedError otherwise).
        softmax_scale, causal, window_size, softcap, deterministic: as in :func:`flash_attn_func`.
        return_attn_probs: FlashAttention-2's: return ``(out, softmax_lse, None)``.
        block_table: a paged KV cache for varlen is not built yet: only None (NotImplementedError).
        return_lse, return_softmax_lse: return ``(out, lse)``.
        out: optional preallocated output like q (eager only). stream: as in :func:`flash_attn_func`.

    torch: the call is the custom op ``torch.ops.flashcute.varlen_fwd``, differentiable (its
    backward is ``flashcute::varlen_bwd``, on the kernels of :func:`flash_attn_bwd`) and traceable
    by ``torch.compile``. CuPy: eager, forward only. JAX: an XLA FFI call, differentiable with
    ``jax.grad`` and usable under ``jax.jit``; under ``jax.vmap`` each vmapped element is its own
    launch. Rows outside every sequence (when ``cu_seqlens_q[-1] < total_q``, or
    ``cu_seqlens_k[-1] < total_k``) are not written, in out or in the gradients, as in
    FlashAttention-2.

    Return:
        out: (total_q, nheads, headdim), like q.
        lse [if return_lse, return_softmax_lse or return_attn_probs]: float32 (nheads, total_q), as in
            FlashAttention-2; -inf for rows that see no key.
    """
    _check_fa2_only(dropout_p, alibi_slopes)
    if block_table is not None:
        raise NotImplementedError("block_table: a paged KV cache is not supported by flash_attn_varlen_func yet; "
                                  "pass None")
    deterministic = _as_bool("deterministic", deterministic)
    return_attn_probs = _as_bool("return_attn_probs", return_attn_probs)
    want_lse = _as_bool("return_lse", return_lse) | _as_bool("return_softmax_lse", return_softmax_lse)
    max_seqlen_q = _as_int("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _as_int("max_seqlen_k", max_seqlen_k)
    options = _parse_options(softmax_scale, causal, window_size, softcap)
    stream = _parse_stream(stream)

    want_lse = want_lse or return_attn_probs
    try:
        fw = _one_framework(("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                            ("cu_seqlens_k", cu_seqlens_k), ("out", out), optional=("out",))
        out, lse = fw.binding.flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out,
                                                want_lse, stream, options, deterministic)
    except (TypeError, ValueError):
        _check_scalars_first(options, 0, max_seqlen_q, max_seqlen_k)
        raise
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if want_lse else out


# ---------------------------------------------------------------------------
# FlashAttention-2's packed forms
# ---------------------------------------------------------------------------


def _unpack(name: str, packed: Any, layout: Tuple[str, ...]) -> Tuple[Any, ...]:
    """The parts of a packed array (FlashAttention-2's qkv or kv) along its "3" or "2" axis, as
    views where the framework has them: torch's unbind (one stack in autograd's backward), else
    indexing (JAX slices, CuPy views). The shape is checked before the device, as _C checks a
    structure before the device."""
    axis = layout.index("3") if "3" in layout else layout.index("2")
    shape = getattr(packed, "shape", None)
    if shape is None:
        _check_cuda_array(name, packed)  # not an array at all: the usual TypeError
        raise TypeError(f"{name}: expected an array with a shape (torch.Tensor, cupy.ndarray, jax.Array), "
                        f"got {type(packed).__qualname__}")
    shape = tuple(shape)
    if len(shape) != len(layout) or shape[axis] != int(layout[axis]):
        raise ValueError(f"{name}: expected a ({', '.join(layout)}) array, got shape {shape}")
    _check_cuda_array(name, packed)
    if hasattr(packed, "unbind"):
        return tuple(packed.unbind(axis))
    index = (slice(None),) * axis
    return tuple(packed[index + (i,)] for i in range(int(layout[axis])))


def flash_attn_qkvpacked_func(
    qkv: Any,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    stream: Union[None, int, Any] = None,
) -> Union[Any, Tuple[Any, Any], Tuple[Any, Any, None]]:
    """FlashAttention-2's ``flash_attn_qkvpacked_func``: :func:`flash_attn_func` on q, k and v
    packed in one array.

    Arguments:
        qkv: (batch_size, seqlen, 3, nheads, headdim): q, k and v are its views ``qkv[:, :, i]``
            (no copy; torch autograd returns the gradient as one (b, s, 3, h, d) tensor).
        The other arguments and the return value are :func:`flash_attn_func`'s.
    """
    _check_fa2_only(dropout_p, alibi_slopes)
    _parse_options(softmax_scale, causal, window_size, softcap)  # plain arguments first, as flash_attn_func
    q, k, v = _unpack("qkv", qkv, ("batch_size", "seqlen", "3", "nheads", "headdim"))
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, stream=stream)


def flash_attn_kvpacked_func(
    q: Any,
    kv: Any,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    stream: Union[None, int, Any] = None,
) -> Union[Any, Tuple[Any, Any], Tuple[Any, Any, None]]:
    """FlashAttention-2's ``flash_attn_kvpacked_func``: :func:`flash_attn_func` with k and v
    packed in one array.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim).
        kv: (batch_size, seqlen_k, 2, nheads_k, headdim): k and v are its views ``kv[:, :, i]``.
        The other arguments and the return value are :func:`flash_attn_func`'s.
    """
    _check_fa2_only(dropout_p, alibi_slopes)
    _parse_options(softmax_scale, causal, window_size, softcap)
    k, v = _unpack("kv", kv, ("batch_size", "seqlen_k", "2", "nheads_k", "headdim"))
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, stream=stream)


def flash_attn_varlen_qkvpacked_func(
    qkv: Any,
    cu_seqlens: Any,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    stream: Union[None, int, Any] = None,
) -> Union[Any, Tuple[Any, Any], Tuple[Any, Any, None]]:
    """FlashAttention-2's ``flash_attn_varlen_qkvpacked_func``: :func:`flash_attn_varlen_func`
    on q, k and v packed in one array, with one cu_seqlens and max_seqlen for queries and keys.

    Arguments:
        qkv: (total, 3, nheads, headdim): q, k and v are its views ``qkv[:, i]``.
        cu_seqlens: int32 (batch + 1,), as cu_seqlens_q and cu_seqlens_k of
            :func:`flash_attn_varlen_func`. max_seqlen: the longest sequence.
        The other arguments and the return value are :func:`flash_attn_varlen_func`'s.
    """
    _check_fa2_only(dropout_p, alibi_slopes)
    _parse_options(softmax_scale, causal, window_size, softcap)
    q, k, v = _unpack("qkv", qkv, ("total", "3", "nheads", "headdim"))
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                                  return_lse=return_lse, stream=stream)


def flash_attn_varlen_kvpacked_func(
    q: Any,
    kv: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    stream: Union[None, int, Any] = None,
) -> Union[Any, Tuple[Any, Any], Tuple[Any, Any, None]]:
    """FlashAttention-2's ``flash_attn_varlen_kvpacked_func``: :func:`flash_attn_varlen_func`
    with k and v packed in one array.

    Arguments:
        q: (total_q, nheads, headdim).
        kv: (total_k, 2, nheads_k, headdim): k and v are its views ``kv[:, i]``.
        The other arguments and the return value are :func:`flash_attn_varlen_func`'s.
    """
    _check_fa2_only(dropout_p, alibi_slopes)
    _parse_options(softmax_scale, causal, window_size, softcap)
    k, v = _unpack("kv", kv, ("total_k", "2", "nheads_k", "headdim"))
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_lse=return_lse, stream=stream)


# ---------------------------------------------------------------------------
# flash_attn_with_kvcache
# ---------------------------------------------------------------------------


def flash_attn_with_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k: Any = None,
    v: Any = None,
    rotary_cos: Any = None,
    rotary_sin: Any = None,
    cache_seqlens: Union[None, int, Any] = None,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Any = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    return_lse: bool = False,
    out: Any = None,
    stream: Union[None, int, Any] = None,
) -> Union[Any, Tuple[Any, Any]]:
    """Attention over a KV cache, for incremental decoding (FlashAttention-2's
    ``flash_attn_with_kvcache``, in its positional order).

    If k and v are given, they are first written into k_cache and v_cache **in place**, at the
    positions given by cache_seqlens; then q attends to the first ``cache_seqlens[b] + seqlen_new``
    keys of each batch entry ``b``. With ``causal=True`` the mask is aligned to the bottom-right
    corner (the last query sees every key), as in :func:`flash_attn_func`; the other options too.

    The query heads of one KV head are processed together when seqlen_q is 1 and there is no
    window, so each cached byte is read once per KV head. ``num_splits=0`` splits the keys of each
    (batch entry, KV head) over several CTAs when the batch and the heads alone would leave SMs
    idle, and merges the parts by their logsumexp. On a compute capability 9.0 GPU (H100, H200),
    calls of 64 query rows or more (chunked prefill, prefix caching) run on the Hopper kernels in
    one pass instead: ``num_splits`` is not used there (``FLASHCUTE_FORWARD_PATH=sm80`` keeps them
    on the split-KV kernels).

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), float16 or bfloat16.
        k_cache, v_cache: (batch, seqlen_cache, nheads_k, headdim), or, with block_table, a paged
            cache (num_blocks, page_size, nheads_k, headdim); page_size a power of two >= 16
            (16, 32, 64, 128, 256, ...). Like q in dtype; the last dim contiguous.
        k, v: optional new keys and values (batch, seqlen_new, nheads_k, headdim), appended at
            ``cache_seqlens[b]``; they need cache_seqlens. New rows that would land past the cache's
            capacity are dropped (the host cannot see cache_seqlens to refuse them).
        cache_seqlens: int32 (batch,) array on q's device, or an int for every entry: the keys
            already in each entry's cache. Never read on the host (CUDA-graph capturable). None:
            the whole cache. Values are clamped into [0, capacity].
        block_table: int32 (batch, max_num_blocks_per_seq) on q's device: page ``j`` of entry ``b`` is
            ``k_cache[block_table[b, j]]``. Entries are not checked on the host (that would need a
            host read). A key on a page outside [0, num_blocks) is never read or written (the
            append drops it): the query rows that see it get NaN in out and lse, the others are
            unaffected. Entries past a sequence's keys are never read, so they may hold anything
            (-1 padding, say).
        softmax_scale, causal, window_size, softcap: as in :func:`flash_attn_func`.
        num_splits: 0 chooses; 1 never splits; n > 1 splits the keys n ways (at most 128); the
            split-KV kernels' setting (see above).
        rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, alibi_slopes: FlashAttention-2
            features not built yet: only None (NotImplementedError otherwise). rotary_interleaved
            is then ignored.
        return_softmax_lse, return_lse: also return the lse (batch, nheads, seqlen_q), float32.
        out: optional preallocated output like q (eager only). stream: as in :func:`flash_attn_func`.

    torch: the call is the custom op ``torch.ops.flashcute.fwd_kvcache`` (k_cache and v_cache
    are its mutated arguments), traceable by ``torch.compile`` and capturable in a CUDA graph.
    CuPy: eager. JAX arrays are immutable, and an in-place cache update has no JAX spelling here:
    TypeError. Not differentiable.

    Return:
        out: (batch, seqlen_q, nheads, headdim), like q.
        lse [if return_softmax_lse or return_lse]: float32 (batch, nheads, seqlen_q).
    """
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad)):
        if value is not None:
            raise NotImplementedError(f"{name}: not supported by flashcute's flash_attn_with_kvcache yet; pass None")
    _check_fa2_only(0.0, alibi_slopes)
    _as_bool("rotary_interleaved", rotary_interleaved)
    want_lse = _as_bool("return_softmax_lse", return_softmax_lse) | _as_bool("return_lse", return_lse)
    num_splits = _as_int("num_splits", num_splits)
    options = _parse_options(softmax_scale, causal, window_size, softcap)
    stream = _parse_stream(stream)
    if isinstance(cache_seqlens, bool):
        raise TypeError("cache_seqlens: expected an int32 array or an int, got bool")
    seqlens_int = isinstance(cache_seqlens, numbers.Integral)  # made into an array below, in q's framework
    try:
        fw = _one_framework(("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
                            ("block_table", block_table), ("out", out),
                            ("cache_seqlens", None if seqlens_int else cache_seqlens),
                            optional=("k", "v", "block_table", "out", "cache_seqlens"))
        out, lse = fw.binding.flash_attn_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, want_lse,
                                                 stream, options, num_splits)
    except (TypeError, ValueError):
        _check_scalars_first(options, num_splits)
        raise
    return (out, lse) if want_lse else out


# ---------------------------------------------------------------------------
# merge_attn_states
# ---------------------------------------------------------------------------


def merge_attn_states(
    out_a: Any,
    lse_a: Any,
    out_b: Any,
    lse_b: Any,
    *,
    out: Any = None,
    stream: Union[None, int, Any] = None,
) -> Tuple[Any, Any]:
    """Merges two partial attentions of the same queries over disjoint key sets into the attention
    over their union, exactly, by their logsumexp (cascade / prefix-shared attention, split-KV,
    context parallelism)::

        lse = log(exp(lse_a) + exp(lse_b))
        out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

    computed around max(lse_a, lse_b) in float32. A row with lse -inf on one side (it saw no key
    there, as flashcute's own lse says) takes the other side; -inf on both gives out = 0 and
    lse = -inf; NaN stays NaN.

    Arguments:
        out_a, out_b: (batch, seqlen, nheads, headdim) as from :func:`flash_attn_func`, or
            (total, nheads, headdim) as from :func:`flash_attn_varlen_func`; float16, bfloat16 or
            float32, both the same; the last dim contiguous.
        lse_a, lse_b: their float32 lse, (batch, nheads, seqlen) or (nheads, total).
        out: optional preallocated output like out_a, which may be out_a itself (in place); eager
            only. stream: as in :func:`flash_attn_func`.

    Return:
        (out, lse): like out_a and lse_a, in their framework (torch: the op
        ``torch.ops.flashcute.merge_attn_states``, traceable; CuPy; JAX: an XLA FFI call).
    """
    stream = _parse_stream(stream)
    fw = _one_framework(("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b), ("out", out),
                        optional=("out",))
    return fw.binding.merge_attn_states(out_a, lse_a, out_b, lse_b, out, stream)
