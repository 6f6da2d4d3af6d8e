"""flash_attn_func from CuPy and JAX (GPU): results come back in the caller's framework and match
the fp32 reference (flashcute.testing); JAX under jit, lax.scan and vmap gives the eager results;
mixed frameworks and JAX-specific misuse are refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import pytest

import flashcute
from flashcute.testing import check_attention

pytestmark = pytest.mark.gpu


@dataclass(frozen=True)
class Case:
    id: str
    b: int
    sq: int
    sk: int
    h: int
    hk: int
    d: int
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0

    @property
    def options(self) -> dict:
        return dict(causal=self.causal, window_size=self.window, softcap=self.softcap)


CASES = [
    Case("mha", 2, 128, 128, 4, 4, 64),
    Case("gqa_causal", 1, 113, 300, 8, 2, 128, causal=True),
    Case("mqa_causal_sq>sk", 2, 300, 113, 4, 1, 40, causal=True),  # the first 187 rows see no key
    Case("window_softcap", 1, 257, 257, 2, 2, 96, window=(32, 17), softcap=30.0),
]


def _inputs(c: Case, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((c.b, c.sq, c.h, c.d), dtype=np.float32),
            rng.standard_normal((c.b, c.sk, c.hk, c.d), dtype=np.float32),
            rng.standard_normal((c.b, c.sk, c.hk, c.d), dtype=np.float32))


# ------------------------------------------------------------------------------------ CuPy


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cupy(cupy, require_kernel, case):
    require_kernel("float16", case.d)
    q, k, v = (cupy.asarray(a.astype(np.float16)) for a in _inputs(case))
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, **case.options)
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    assert out.shape == q.shape and out.dtype == cupy.float16
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == cupy.float32
    check = check_attention(out, q, k, v, lse=lse, **case.options)  # computed with CuPy
    assert check.ok, check.message


def test_cupy_out_view_and_packed(cupy, require_kernel):
    b, s, h, d = 2, 200, 4, 64
    require_kernel("float16", d)
    rng = np.random.default_rng(1)
    qkv = cupy.asarray(rng.standard_normal((b, s, 3, h, d), dtype=np.float32).astype(np.float16))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    buf = cupy.full((b, s, h, d + 16), cupy.nan, dtype=cupy.float16)
    out_arg = buf[..., 8:8 + d]
    out = flashcute.flash_attn_func(q, k, v, causal=True, out=out_arg)
    assert out is out_arg
    host = cupy.asnumpy(buf)
    assert np.isnan(host[..., :8]).all() and np.isnan(host[..., 8 + d:]).all()
    check = check_attention(out, q, k, v, causal=True)
    assert check.ok, check.message


def test_cupy_zero_size(cupy, require_kernel):
    require_kernel("float16", 64)
    q = cupy.zeros((0, 16, 2, 64), dtype=cupy.float16)
    out, lse = flashcute.flash_attn_func(q, q, q, return_lse=True)
    assert isinstance(out, cupy.ndarray) and out.shape == (0, 16, 2, 64) and lse.shape == (0, 2, 16)


# ------------------------------------------------------------------------------------ JAX


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_jax(jax, require_kernel, case, dtype):
    require_kernel(dtype, case.d)
    jnp = jax.numpy
    q, k, v = (jnp.asarray(a, dtype=getattr(jnp, dtype)) for a in _inputs(case, seed=2))
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, **case.options)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == jnp.float32
    assert out.devices() == q.devices()
    check = check_attention(out, q, k, v, lse=lse, **case.options)  # computed with NumPy
    assert check.ok, check.message


def test_jax_result_is_complete_when_returned(jax, require_kernel):
    """The output must be complete when JAX first reads it: consume it immediately, many times,
    with a kernel big enough that a missing synchronisation would show (zeros instead of data)."""
    jnp = jax.numpy
    b, s, h, d = 1, 2048, 16, 128
    require_kernel("bfloat16", d)
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, d), dtype=np.float32), dtype=jnp.bfloat16) for _ in range(3))
    first = flashcute.flash_attn_func(q, k, v)
    # Read right away, against the reference on a few heads (and the last one).
    for heads in (slice(0, 2), slice(h - 1, h)):
        sub = (slice(None), slice(None), heads)
        check = check_attention(first[sub], q[sub], k[sub], v[sub])
        assert check.ok, check.message
    for _ in range(10):
        out = flashcute.flash_attn_func(q, k, v)
        assert bool(jnp.array_equal(out, first))  # JAX reads out right away


def _jax_inputs(jax, shape_q, shape_kv, seed, dtype="bfloat16"):
    jnp = jax.numpy
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal(shape_q, dtype=np.float32), dtype=dtype),
            jnp.asarray(rng.standard_normal(shape_kv, dtype=np.float32), dtype=dtype),
            jnp.asarray(rng.standard_normal(shape_kv, dtype=np.float32), dtype=dtype))


def test_jax_jit_matches_eager(jax, require_kernel):
    require_kernel("bfloat16", 128)
    jnp = jax.numpy
    q, k, v = _jax_inputs(jax, (2, 300, 8, 128), (2, 200, 2, 128), 5)
    eager, eager_lse = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True)
    f = jax.jit(lambda q, k, v: flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True))
    out, lse = f(q, k, v)
    assert bool(jnp.array_equal(out, eager)) and bool(jnp.array_equal(lse, eager_lse))
    check = check_attention(out, q, k, v, lse=lse, causal=True)
    assert check.ok, check.message


@pytest.mark.parametrize("window, softcap", [((-1, -1), 0.0), ((50, 10), 20.0)], ids=["causal", "window-softcap"])
def test_jax_jit_grad(jax, torch, require_kernel, window, softcap):
    """jax.jit(jax.grad(...)) through the bwd FFI handler: checked by the rule, and the same bits as
    torch autograd on the same inputs (one kernel); vmap of the grad folds into the batch."""
    require_kernel("bfloat16", 128)
    from flashcute.testing import check_gradients

    jnp = jax.numpy
    q, k, v = _jax_inputs(jax, (2, 300, 8, 128), (2, 200, 2, 128), 8)
    dout = _jax_inputs(jax, (2, 300, 8, 128), (1,), 9)[0]
    opts = dict(causal=True, window_size=window, softcap=softcap)

    def loss(q, k, v):  # deterministic: the two frameworks' grads are compared bit for bit
        out = flashcute.flash_attn_func(q, k, v, deterministic=True, **opts)
        return (out.astype(jnp.float32) * dout.astype(jnp.float32)).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    t = [torch.from_dlpack(x) for x in (q, k, v, dout)]
    leaves = [x.clone().requires_grad_() for x in t[:3]]
    flashcute.flash_attn_func(*leaves, deterministic=True, **opts).backward(t[3])
    for g, leaf in zip(grads, leaves):
        assert torch.equal(torch.from_dlpack(g), leaf.grad)
    check = check_gradients(tuple(torch.from_dlpack(g) for g in grads), *t[3:], *t[:3], **opts)
    assert check.ok, check.message
    # vmap over a leading axis of 2 of the same problem: each slice gets the same gradients.
    stacked = [jnp.stack([x, x]) for x in (q, k, v)]
    vgrads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(*stacked)
    for vg, g in zip(vgrads, grads):
        assert bool(jnp.array_equal(vg[0], g)) and bool(jnp.array_equal(vg[1], g))


def test_jax_scan(jax, require_kernel):
    """Inside lax.scan under jit: each step is the same as the call on its own."""
    require_kernel("bfloat16", 64)
    jnp = jax.numpy
    qs, k, v = _jax_inputs(jax, (4, 1, 128, 4, 64), (1, 128, 4, 64), 6)

    @jax.jit
    def run(qs, k, v):
        def step(carry, q):
            out = flashcute.flash_attn_func(q, k, v, causal=True)
            return carry + out.astype(jnp.float32).sum(), out
        return jax.lax.scan(step, jnp.float32(0), qs)

    total, outs = run(qs, k, v)
    for i in range(4):
        assert bool(jnp.array_equal(outs[i], flashcute.flash_attn_func(qs[i], k, v, causal=True)))
    assert bool(jnp.isfinite(total))


def test_jax_vmap_matches_slices(jax, require_kernel):
    require_kernel("bfloat16", 64)
    jnp = jax.numpy
    qs, ks, vs = _jax_inputs(jax, (3, 2, 100, 4, 64), (3, 2, 77, 2, 64), 7)
    outs = jax.jit(jax.vmap(lambda q, k, v: flashcute.flash_attn_func(q, k, v, window_size=(16, 4))))(qs, ks, vs)
    for i in range(3):
        assert bool(jnp.array_equal(outs[i], flashcute.flash_attn_func(qs[i], ks[i], vs[i], window_size=(16, 4))))
    # k and v shared by every vmapped q (broadcast, then folded).
    outs = jax.vmap(lambda q: flashcute.flash_attn_func(q, ks[0], vs[0]))(qs)
    for i in range(3):
        assert bool(jnp.array_equal(outs[i], flashcute.flash_attn_func(qs[i], ks[0], vs[0])))


def test_jax_eager_call_does_not_block(jax, require_kernel):
    """An eager call returns before its kernel finishes: XLA runs it on its stream, asynchronously."""
    import time

    require_kernel("bfloat16", 128)
    q, k, v = _jax_inputs(jax, (1, 16384, 16, 128), (1, 16384, 16, 128), 8)
    flashcute.flash_attn_func(q, k, v).block_until_ready()  # compile and load once
    # A blocking call fails every attempt; an asynchronous one fails only when the host stalls
    # (one run in six did, for 9 ms), so three attempts.
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = flashcute.flash_attn_func(q, k, v)
        t1 = time.perf_counter()
        out.block_until_ready()
        t2 = time.perf_counter()
        took.append((t1 - t0, t2 - t0))
        if t1 - t0 < 0.5 * (t2 - t0):
            return
    raise AssertionError(f"the call took most of the time until ready (call, ready) in s: {took}")


def test_jax_refusals(jax):
    jnp = jax.numpy
    q = jnp.zeros((1, 16, 2, 64), dtype=jnp.float16)
    with pytest.raises(TypeError, match="out: JAX arrays are immutable"):
        flashcute.flash_attn_func(q, q, q, out=jnp.zeros_like(q))
    with pytest.raises(TypeError, match="stream: not supported with JAX inputs"):
        flashcute.flash_attn_func(q, q, q, stream=0)
    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError:
        cpu = None
    if cpu is not None:
        qc = jax.device_put(q, cpu)
        with pytest.raises(TypeError, match="q: expected a CUDA array, got a CPU jax.Array"):
            flashcute.flash_attn_func(qc, qc, qc)


def test_jax_zero_size(jax):
    jnp = jax.numpy
    q = jnp.zeros((2, 0, 2, 64), dtype=jnp.bfloat16)
    k = jnp.zeros((2, 5, 2, 64), dtype=jnp.bfloat16)
    out, lse = flashcute.flash_attn_func(q, k, k, return_lse=True)
    assert isinstance(out, jax.Array) and out.shape == (2, 0, 2, 64) and lse.shape == (2, 2, 0)


# ------------------------------------------------------------------------------------ mixing


def test_mixed_frameworks(torch, cupy):
    tq = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
    cq = cupy.asarray(np.zeros((1, 16, 2, 64), dtype=np.float16))
    with pytest.raises(TypeError, match="k: is a cupy.ndarray but q is a torch.Tensor"):
        flashcute.flash_attn_func(tq, cq, tq)
    with pytest.raises(TypeError, match="out: is a torch.Tensor but q is a cupy.ndarray"):
        flashcute.flash_attn_func(cq, cq, cq, out=torch.empty_like(tq))


def test_mixed_torch_jax(torch, jax):
    tq = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
    jq = jax.numpy.zeros((1, 16, 2, 64), dtype=jax.numpy.float16)
    with pytest.raises(TypeError, match="v: is a jax.Array but q is a torch.Tensor"):
        flashcute.flash_attn_func(tq, tq, jq)


def test_jax_varlen_jit_grad_vmap(jax, torch, require_kernel):
    """flash_attn_varlen_func on JAX arrays: jit, grad and vmap give the same bits as torch's op."""
    require_kernel("bfloat16", 64)
    jnp = jax.numpy
    lens_q, lens_k = (100, 0, 1, 57), (80, 9, 30, 57)
    cu_q = jnp.asarray(np.cumsum([0, *lens_q]), dtype=jnp.int32)
    cu_k = jnp.asarray(np.cumsum([0, *lens_k]), dtype=jnp.int32)
    q, k, v = _jax_inputs(jax, (sum(lens_q), 8, 64), (sum(lens_k), 2, 64), 10)
    dout = _jax_inputs(jax, (sum(lens_q), 8, 64), (1,), 11)[0]
    opts = dict(causal=True, window_size=(40, -1))

    def loss(q, k, v):
        out = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 80, **opts)
        return (out.astype(jnp.float32) * dout.astype(jnp.float32)).sum()

    out, lse = jax.jit(lambda q, k, v: flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 80, return_lse=True,
                                                                         **opts))(q, k, v)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    t = [torch.from_dlpack(x) for x in (q, k, v, dout, cu_q, cu_k)]
    leaves = [x.clone().requires_grad_() for x in t[:3]]
    t_out, t_lse = flashcute.flash_attn_varlen_func(*leaves, t[4], t[5], 100, 80, return_lse=True, **opts)
    t_out.backward(t[3])
    assert torch.equal(torch.from_dlpack(out), t_out) and torch.equal(torch.from_dlpack(lse), t_lse)
    for g, leaf in zip(grads, leaves):
        assert torch.equal(torch.from_dlpack(g), leaf.grad)
    # vmap over two copies: a launch each (lax.map), the same bits.
    stacked = [jnp.stack([x, x]) for x in (q, k, v)]
    vgrads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(*stacked)
    for vg, g in zip(vgrads, grads):
        assert bool(jnp.array_equal(vg[0], g)) and bool(jnp.array_equal(vg[1], g))
