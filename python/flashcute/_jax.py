"""flashcute's JAX binding: the forward as an XLA FFI custom call.

The handler (src/xla_ffi.cpp, compiled into flashcute._C) is registered with XLA as
``flashcute_fwd`` for the CUDA platform and called with ``jax.ffi.ffi_call``, so it runs on the
stream XLA gives it, inside ``jax.jit``, ``lax.scan`` and command buffers, with no host
synchronisation. XLA allocates the outputs.

- **Trace-time errors.** Before the call is staged out, ``flashcute._C.check_fwd`` runs the library's
  one validation on the shapes and dtypes, so bad input raises the same TypeError / ValueError
  naming the argument as the other frameworks, at trace time.
- **vmap.** A vmapped leading axis is folded into the batch (``jax.custom_batching.custom_vmap``):
  one launch over ``vmap_size * batch``, not a loop. Unbatched operands are broadcast first.
- **grad.** The call is a ``jax.custom_vjp``: the forward keeps q, k, v, out and lse, and the
  backward is a second FFI handler (``flashcute_bwd``), folded over vmapped axes like the forward.
  The lse is not differentiable (its cotangent is ignored), as in FlashAttention-2.
- **varlen.** ``flash_attn_varlen_func`` uses the handlers ``flashcute_varlen_fwd`` / ``_bwd``, with
  cu_seqlens as int32 operands (device buffers, never read on the host) and the max seqlens as
  static attributes. Under vmap each vmapped element is its own launch (``lax.map``): folding
  ragged batches into one would need their lengths on the host.

JAX's binding in flashcute's framework registry (flashcute._args), with the same functions as the
other frameworks' (flash_attn_bwd and flash_attn_kvcache refuse JAX arrays, saying why). Imported by
flashcute only when a jax.Array is passed, so ``import flashcute`` never imports JAX.
"""

import functools
import math
from typing import Any, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _C

_TARGET = "flashcute_fwd"
_BWD_TARGET = "flashcute_bwd"
_VARLEN_TARGETS = ("flashcute_varlen_fwd", "flashcute_varlen_bwd")
_MERGE_TARGET = "flashcute_merge"
_registered = False


class Options(NamedTuple):
    """The static (non-array) arguments of a call, hashable for jax's caches."""

    softmax_scale: float
    causal: bool
    window_left: int
    window_right: int
    softcap: float
    deterministic: bool = False  # for the backward (jax.grad)
    partial_keys: bool = False  # the backward's k, v are part of the keys out and lse cover (ring attention)


def _register() -> None:
    global _registered
    if _registered:
        return
    targets = _C.xla_ffi_targets()
    if _TARGET not in targets:
        raise NotImplementedError(
            "flashcute was built without its JAX binding: no XLA FFI headers were found at build time "
            "(build option FLASHCUTE_XLA_FFI; install jax before building flashcute, or set it to ON)"
        )
    jax.ffi.register_ffi_target(_TARGET, targets[_TARGET], platform="CUDA")
    for name in (_BWD_TARGET, *_VARLEN_TARGETS, _MERGE_TARGET):
        if name in targets:
            jax.ffi.register_ffi_target(name, targets[name], platform="CUDA")
    _registered = True


def _dtype_name(x: Any) -> str:
    return str(jnp.dtype(x.dtype))


def _desc(x: Any) -> tuple:
    """x as flashcute._C.check_fwd takes a tracer: a contiguous stand-in of its shape and dtype."""
    return (256, tuple(x.shape), None, _dtype_name(x))


def _validated(q: Any, k: Any, v: Any, options: tuple, varlen: tuple = ()) -> Options:
    """The library's validation on what a tracer knows (shapes and dtypes; varlen: cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k), then the options as the handlers' attributes take
    them: the scale set (1 / sqrt(headdim) by default)."""
    extra = (_desc(varlen[0]), _desc(varlen[1]), *varlen[2:]) if varlen else ()
    _C.check_fwd(_desc(q), _desc(k), _desc(v), options, *extra)
    scale = options[0]
    return Options(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale, *options[1:])


def _ffi_fwd(q: Any, k: Any, v: Any, opts: Options) -> Tuple[Any, Any]:
    b, sq, h, _ = q.shape
    call = jax.ffi.ffi_call(
        _TARGET,
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
    )
    return call(q, k, v, softmax_scale=np.float32(opts.softmax_scale), causal=bool(opts.causal),
                window_left=np.int64(opts.window_left), window_right=np.int64(opts.window_right),
                softcap=np.float32(opts.softcap))


# vmap: fold the vmapped axis into the batch. custom_vmap hands the rule each batched operand with
# its vmapped axis first.
def _folded(opts: Options):
    @jax.custom_batching.custom_vmap
    def f(q, k, v):
        return _ffi_fwd(q, k, v, opts)

    @f.def_vmap
    def rule(axis_size, in_batched, q, k, v):
        q, k, v = (x if batched else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, batched in zip((q, k, v), in_batched))
        fold = lambda x: x.reshape(axis_size * x.shape[1], *x.shape[2:])  # noqa: E731
        out, lse = f(fold(q), fold(k), fold(v))  # f again: a nested vmap folds once more
        b = q.shape[1]
        return (out.reshape(axis_size, b, *out.shape[1:]), lse.reshape(axis_size, b, *lse.shape[1:])), (True, True)

    return f


def _ffi_bwd(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, opts: Options) -> Tuple[Any, Any, Any]:
    b, sq, h, d = q.shape
    # The workspace is sized for the current device (XLA runs the call where it was traced for).
    floats = _C.bwd_workspace_floats(b, h, sq, d, str(jnp.dtype(q.dtype)))
    call = jax.ffi.ffi_call(
        _BWD_TARGET,
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
         jax.ShapeDtypeStruct(v.shape, v.dtype),
         jax.ShapeDtypeStruct((floats,), jnp.float32)),
    )
    dq, dk, dv, _ = call(dout, q, k, v, out, lse, softmax_scale=np.float32(opts.softmax_scale),
                         causal=bool(opts.causal), window_left=np.int64(opts.window_left),
                         window_right=np.int64(opts.window_right), softcap=np.float32(opts.softcap),
                         deterministic=bool(opts.deterministic), partial_keys=bool(opts.partial_keys))
    return dq, dk, dv


def _folded_bwd(opts: Options):
    @jax.custom_batching.custom_vmap
    def f(dout, q, k, v, out, lse):
        return _ffi_bwd(dout, q, k, v, out, lse, opts)

    @f.def_vmap
    def rule(axis_size, in_batched, *args):
        args = [x if batched else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, batched in zip(args, in_batched)]
        fold = lambda x: x.reshape(axis_size * x.shape[1], *x.shape[2:])  # noqa: E731
        grads = f(*(fold(x) for x in args))
        b = args[1].shape[1]
        return tuple(g.reshape(axis_size, b, *g.shape[1:]) for g in grads), (True, True, True)

    return f


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q: Any, k: Any, v: Any, opts: Options) -> Tuple[Any, Any]:
    return _folded(opts)(q, k, v)


def _attention_fwd(q, k, v, opts):
    out, lse = _attention(q, k, v, opts)
    return (out, lse), (q, k, v, out, lse)


def _attention_bwd(opts, residuals, cotangents):
    # The lse is not differentiable (as in FlashAttention-2): its cotangent is ignored.
    q, k, v, out, lse = residuals
    dout, _ = cotangents
    return _folded_bwd(opts)(dout.astype(q.dtype), q, k, v, out, lse)


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attn(q: Any, k: Any, v: Any, out: Any, return_lse: bool, stream: Any, options: tuple,
               deterministic: bool = False) -> Tuple[Any, Any]:
    """flash_attn_func's JAX path. options: (softmax_scale or None, causal, window_left, window_right,
    softcap); deterministic: for the backward jax.grad runs."""
    if out is not None:
        raise TypeError(
            "out: JAX arrays are immutable, so out= is not supported with JAX inputs; flash_attn_func returns a "
            "new array"
        )
    if stream is not None:
        raise TypeError("stream: not supported with JAX inputs: flashcute runs on the stream XLA gives it")
    opts = _validated(q, k, v, options)._replace(deterministic=bool(deterministic))
    _register()
    o, lse = _attention(q, k, v, opts)
    return o, (lse if return_lse else None)


# ---------------------------------------------------------------------------------------- varlen


class VarlenSizes(NamedTuple):
    max_seqlen_q: int
    max_seqlen_k: int


def _attrs(opts: Options, sizes: VarlenSizes) -> dict:
    return dict(softmax_scale=np.float32(opts.softmax_scale), causal=bool(opts.causal),
                window_left=np.int64(opts.window_left), window_right=np.int64(opts.window_right),
                softcap=np.float32(opts.softcap), max_seqlen_q=np.int64(sizes.max_seqlen_q),
                max_seqlen_k=np.int64(sizes.max_seqlen_k))


def _sequential_vmap(f, n_out: int):
    """custom_vmap that runs f once per vmapped element (lax.map), for calls that cannot be folded."""
    g = jax.custom_batching.custom_vmap(f)

    @g.def_vmap
    def rule(axis_size, in_batched, *args):
        args = [x if batched else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, batched in zip(args, in_batched)]
        return jax.lax.map(lambda xs: g(*xs), tuple(args)), (True,) * n_out

    return g


def _varlen_fwd_call(opts: Options, sizes: VarlenSizes):
    def f(q, k, v, cu_q, cu_k):
        call = jax.ffi.ffi_call(
            _VARLEN_TARGETS[0],
            (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((q.shape[1], q.shape[0]), jnp.float32)),
        )
        return call(q, k, v, cu_q, cu_k, **_attrs(opts, sizes))

    return _sequential_vmap(f, 2)


def _varlen_bwd_call(opts: Options, sizes: VarlenSizes):
    def f(dout, q, k, v, out, lse, cu_q, cu_k):
        call = jax.ffi.ffi_call(
            _VARLEN_TARGETS[1],
            (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
             jax.ShapeDtypeStruct(v.shape, v.dtype),
             jax.ShapeDtypeStruct((_C.bwd_varlen_workspace_floats(cu_q.shape[0] - 1, q.shape[1], q.shape[0], q.shape[2],
                                                                  str(jnp.dtype(q.dtype))),), jnp.float32)),
        )
        dq, dk, dv, _ = call(dout, q, k, v, out, lse, cu_q, cu_k, **_attrs(opts, sizes),
                             deterministic=bool(opts.deterministic))
        return dq, dk, dv

    return _sequential_vmap(f, 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _varlen_attention(q, k, v, cu_q, cu_k, sizes: VarlenSizes, opts: Options):
    return _varlen_fwd_call(opts, sizes)(q, k, v, cu_q, cu_k)


def _varlen_attention_fwd(q, k, v, cu_q, cu_k, sizes, opts):
    out, lse = _varlen_attention(q, k, v, cu_q, cu_k, sizes, opts)
    return (out, lse), (q, k, v, out, lse, cu_q, cu_k)


def _varlen_attention_bwd(sizes, opts, residuals, cotangents):
    q, k, v, out, lse, cu_q, cu_k = residuals
    dout, _ = cotangents  # the lse is not differentiable
    dq, dk, dv = _varlen_bwd_call(opts, sizes)(dout.astype(q.dtype), q, k, v, out, lse, cu_q, cu_k)
    return dq, dk, dv, None, None  # cu_seqlens: integer, no cotangent


_varlen_attention.defvjp(_varlen_attention_fwd, _varlen_attention_bwd)


def flash_attn_varlen(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: int, max_k: int, out: Any,
                      return_lse: bool, stream: Any, options: tuple, deterministic: bool = False) -> Tuple[Any, Any]:
    """flash_attn_varlen_func's JAX path."""
    if out is not None:
        raise TypeError("out: JAX arrays are immutable, so out= is not supported with JAX inputs")
    if stream is not None:
        raise TypeError("stream: not supported with JAX inputs: flashcute runs on the stream XLA gives it")
    sizes = VarlenSizes(max_q, max_k)
    opts = _validated(q, k, v, options, (cu_q, cu_k, max_q, max_k))._replace(deterministic=bool(deterministic))
    _register()
    if _VARLEN_TARGETS[0] not in _C.xla_ffi_targets():
        raise NotImplementedError("flashcute's JAX binding has no varlen handler in this build")
    o, lse = _varlen_attention(q, k, v, cu_q, cu_k, sizes, opts)
    return o, (lse if return_lse else None)


# ---------------------------------------------------------------------------------------- merge


def _merge_call(out_a, lse_a, out_b, lse_b):
    call = jax.ffi.ffi_call(_MERGE_TARGET, (jax.ShapeDtypeStruct(out_a.shape, out_a.dtype),
                                           jax.ShapeDtypeStruct(lse_a.shape, jnp.float32)))
    return call(out_a, lse_a, out_b, lse_b)


_merge = _sequential_vmap(_merge_call, 2)


def merge_attn_states(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any, out: Any, stream: Any) -> Tuple[Any, Any]:
    """merge_attn_states' JAX path (not differentiable). Shapes and dtypes are checked at trace time."""
    if out is not None or stream is not None:
        raise TypeError("out=, stream=: not supported with JAX inputs (immutable arrays; XLA's stream)")
    for name, x, ref, ref_name in (("out_b", out_b, out_a, "out_a"), ("lse_b", lse_b, lse_a, "lse_a")):
        if tuple(x.shape) != tuple(ref.shape):
            raise ValueError(f"{name}: expected shape {tuple(ref.shape)} like {ref_name}, got {tuple(x.shape)}")
        if x.dtype != ref.dtype:
            raise TypeError(f"{name}: expected {_dtype_name(ref)} like {ref_name}, got {_dtype_name(x)}")
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b)):
        if _dtype_name(x) != "float32":
            raise TypeError(f"{name}: expected float32, got {_dtype_name(x)}")
    _register()
    return _merge(out_a, lse_a, out_b, lse_b)


# ---------------------------------------------------------------------------------------- refused


def flash_attn_bwd(dout: Any, q: Any, *args: Any) -> Any:
    raise TypeError("q: flash_attn_bwd takes torch or CuPy arrays; JAX users differentiate flash_attn_func "
                    "with jax.grad")


def flash_attn_kvcache(q: Any, *args: Any) -> Any:
    raise TypeError("q: flash_attn_with_kvcache updates the cache in place, which needs torch or CuPy arrays, "
                    "and q is a jax.Array")
