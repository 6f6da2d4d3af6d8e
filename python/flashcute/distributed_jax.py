"""flashcute.distributed_jax: context parallelism in JAX, ring attention over a mesh axis.

The same schedule as :mod:`flashcute.distributed` (docs/context-parallel.md), written for
``jax.shard_map``: call :func:`ring_flash_attn` inside a shard_map whose mesh axis `axis_name`
splits the sequence dim. K/V blocks travel the ring by ``lax.ppermute``, the partial results merge
by their logsumexp, and ``jax.grad`` runs the ring backward (a ``jax.custom_vjp``: the blocks travel
again with float32 dK/dV accumulators that end at their owner). Which case a step computes depends
on the rank (``lax.axis_index``), so the causal steps are a ``lax.cond`` between the two shapes.

Layout: :func:`zigzag_indices` gives the permutation of the sequence that puts rank r's zigzag
chunks (r and 2W - 1 - r) in place r of an even split, so ``x[:, idx]`` sharded over the mesh is
the causal layout (and ``inverse`` undoes it); without a mask the plain split is the layout.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

import numpy as np

__all__ = ["ring_flash_attn", "zigzag_indices"]


def zigzag_indices(seqlen: int, world_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """(idx, inverse): x[:, idx] is the zigzag layout of a sequence of `seqlen` tokens over
    `world_size` ranks (an even split of it gives rank r its chunks r and 2W - 1 - r), and
    y[:, inverse] puts such a layout back in sequence order."""
    if world_size < 1 or seqlen % (2 * world_size):
        raise ValueError(f"seqlen: expected a multiple of 2 * world_size = {2 * world_size}, got {seqlen}")
    c = seqlen // (2 * world_size)
    chunks = np.arange(seqlen).reshape(2 * world_size, c)
    idx = np.concatenate([np.concatenate([chunks[r], chunks[2 * world_size - 1 - r]]) for r in range(world_size)])
    return idx, np.argsort(idx)


class _FlashKernels:
    """flashcute's forward (out, lse) and backward FFI calls (flashcute._jax)."""

    def fwd(self, q, k, v, causal, scale, softcap):
        from . import _jax

        opts = _jax._validated(q, k, v, (scale, causal, -1, -1, softcap))
        _jax._register()
        return _jax._folded(opts)(q, k, v)

    def bwd(self, dout, q, k, v, out, lse, causal, scale, softcap, deterministic, partial_keys=True):
        from . import _jax

        opts = _jax._validated(q, k, v, (scale, causal, -1, -1, softcap))
        _jax._register()
        opts = opts._replace(deterministic=deterministic, partial_keys=partial_keys)
        return _jax._folded_bwd(opts)(dout, q, k, v, out, lse)


def _merge(out, lse, o, lse_o):
    import jax.numpy as jnp

    new = jnp.logaddexp(lse, lse_o)
    safe = jnp.where(jnp.isinf(new), 0.0, new)  # rows with no key yet: weights 0
    wa = jnp.exp(lse - safe).transpose(0, 2, 1)[..., None]
    wb = jnp.exp(lse_o - safe).transpose(0, 2, 1)[..., None]
    return out * wa + o.astype(jnp.float32) * wb, new


def _varying_axes(x) -> frozenset:
    import jax

    t = jax.typeof(x)
    mat = getattr(t, "mat", None)  # the manual axis type (JAX 0.10 on); older JAX: .vma
    return frozenset(mat.varying if mat is not None else getattr(t, "vma", ()))


def _vary_like(x, ref):
    """x typed as varying over every mesh axis ref varies over. shard_map (check_vma) types the
    results of an FFI call as invariant; a custom_vjp's cotangents must match its inputs' types."""
    from jax import lax

    missing = tuple(sorted(_varying_axes(ref) - _varying_axes(x)))
    if not missing:
        return x
    return lax.pcast(x, missing, to="varying") if hasattr(lax, "pcast") else lax.pvary(x, missing)


def _ring(axis_name: str, world: int):
    from jax import lax

    perm = [(i, (i + 1) % world) for i in range(world)]
    return lax.axis_index(axis_name), (lambda x: lax.ppermute(x, axis_name, perm))


def _fwd(kern, axis_name, world, q, k, v, causal, scale, softcap):
    import jax.numpy as jnp
    from jax import lax

    r, send = _ring(axis_name, world)
    b, s, h, _ = q.shape
    c = s // 2
    out = jnp.zeros(q.shape, jnp.float32)
    lse = jnp.full((b, h, s), -jnp.inf, jnp.float32)
    k_cur, v_cur = k, v
    for step in range(world):
        if not causal or step == 0:
            o, l = kern.fwd(q, k_cur, v_cur, causal and step == 0, scale, softcap)
            out, lse = _merge(out, lse, o, l)
        else:
            j = (r - step) % world

            def earlier(kc, vc):  # all queries against j's first chunk
                o, l = kern.fwd(q, kc[:, :c], vc[:, :c], False, scale, softcap)
                return o.astype(jnp.float32), l

            def later(kc, vc):  # the second chunk's queries against both of j's chunks
                o, l = kern.fwd(q[:, c:], kc, vc, False, scale, softcap)
                pad_o = jnp.zeros((b, c, *q.shape[2:]), jnp.float32)
                pad_l = jnp.full((b, h, c), -jnp.inf, jnp.float32)
                return jnp.concatenate([pad_o, o.astype(jnp.float32)], 1), jnp.concatenate([pad_l, l], -1)

            out, lse = _merge(out, lse, *lax.cond(j < r, earlier, later, k_cur, v_cur))
        if step + 1 < world:
            k_cur, v_cur = send(k_cur), send(v_cur)
    return out.astype(q.dtype), lse


def _bwd(kern, axis_name, world, dout, q, k, v, out, lse, causal, scale, softcap, deterministic):
    import jax.numpy as jnp
    from jax import lax

    r, send = _ring(axis_name, world)
    c = q.shape[1] // 2
    f32 = jnp.float32
    dq = jnp.zeros(q.shape, f32)
    k_cur, v_cur = k, v
    dkv = None
    for step in range(world):
        if not causal or step == 0:
            def own(partial):
                return lambda: kern.bwd(dout, q, k_cur, v_cur, out, lse, causal and step == 0, scale, softcap,
                                        deterministic, partial_keys=partial)

            if causal and step == 0 and world > 1 and c > 64:  # as flashcute.distributed._partial_keys
                g = lax.cond(r == 0, own(False), own(True))
            else:
                g = own(world > 1)()
            g = tuple(x.astype(f32) for x in g)
        else:
            j = (r - step) % world

            def earlier(kc, vc):
                gq, gk, gv = kern.bwd(dout, q, kc[:, :c], vc[:, :c], out, lse, False, scale, softcap, deterministic,
                                      partial_keys=True)
                zeros = jnp.zeros((gk.shape[0], c, *gk.shape[2:]), f32)
                return (gq.astype(f32), jnp.concatenate([gk.astype(f32), zeros], 1),
                        jnp.concatenate([gv.astype(f32), zeros], 1))

            def later(kc, vc):
                gq, gk, gv = kern.bwd(dout[:, c:], q[:, c:], kc, vc, out[:, c:], lse[..., c:], False, scale, softcap,
                                      deterministic, partial_keys=True)
                zeros = jnp.zeros((gq.shape[0], c, *gq.shape[2:]), f32)
                return jnp.concatenate([zeros, gq.astype(f32)], 1), gk.astype(f32), gv.astype(f32)

            g = lax.cond(j < r, earlier, later, k_cur, v_cur)
        dq = dq + g[0]
        dk_b, dv_b = g[1], g[2]
        if dkv is not None:  # this block's accumulators, from the rank that held it last step
            dk_b, dv_b = dk_b + dkv[0], dv_b + dkv[1]
        dkv = (send(dk_b), send(dv_b)) if world > 1 else (dk_b, dv_b)  # the last send reaches the owner
        if step + 1 < world:
            k_cur, v_cur = send(k_cur), send(v_cur)
    return dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype)


@functools.lru_cache(maxsize=None)
def _op(kern, axis_name: str, world: int, causal: bool, scale: float, softcap: float, deterministic: bool):
    import jax

    @jax.custom_vjp
    def f(q, k, v):
        out, lse = _fwd(kern, axis_name, world, q, k, v, causal, scale, softcap)
        return _vary_like(out, q), _vary_like(lse, q)

    def f_fwd(q, k, v):
        out, lse = f(q, k, v)
        return (out, lse), (q, k, v, out, lse)

    def f_bwd(res, cot):  # the lse is not differentiable (its cotangent is ignored), as in flash_attn_func
        q, k, v, out, lse = res
        grads = _bwd(kern, axis_name, world, cot[0].astype(q.dtype), q, k, v, out, lse, causal, scale, softcap,
                     deterministic)
        return tuple(_vary_like(g, x) for g, x in zip(grads, (q, k, v)))

    f.defvjp(f_fwd, f_bwd)
    return f


_FLASH = _FlashKernels()


def ring_flash_attn(q: Any, k: Any, v: Any, axis_name: str, world_size: int, softmax_scale: Optional[float] = None,
                    causal: bool = False, softcap: float = 0.0, deterministic: bool = False,
                    return_lse: bool = False, _kernels: Optional[Any] = None):
    """Ring attention, inside ``jax.shard_map`` over mesh axis `axis_name` (of `world_size` devices)
    splitting the sequence dim: q, k, v are this device's shards (batch, seqlen / W, heads,
    headdim), in the zigzag layout when causal (:func:`zigzag_indices`). Returns this shard's
    out (and its float32 lse (batch, nheads, seqlen / W)); differentiable by jax.grad."""
    if causal and q.shape[1] % 2:
        raise ValueError(f"q: a causal shard holds two zigzag chunks, so its length must be even, got {q.shape[1]}")
    if q.shape[1] != k.shape[1] or k.shape != v.shape:
        raise ValueError(f"k, v: expected shards of q's sequence length and alike, got q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    scale = float(softmax_scale) if softmax_scale is not None else q.shape[-1] ** -0.5
    kern = _kernels if _kernels is not None else _FLASH
    out, lse = _op(kern, axis_name, int(world_size), bool(causal), scale, float(softcap), bool(deterministic))(q, k, v)
    return (out, lse) if return_lse else out
