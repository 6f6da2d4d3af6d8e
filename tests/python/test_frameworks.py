"""flash_attn_func from CuPy and JAX (GPU): results come back in the caller's framework and match
a NumPy fp32 reference; mixed frameworks and JAX-specific misuse are refused."""

from __future__ import annotations

import numpy as np
import pytest

import flashcute
from fc_reference import assert_close_np, assert_lse_close_np, attention_ref_np, require_kernel

pytestmark = pytest.mark.gpu

CASES = [
    # (b, sq, sk, h, hk, d, causal, window, softcap)
    (2, 128, 128, 4, 4, 64, False, (-1, -1), 0.0),
    (1, 113, 300, 8, 2, 128, True, (-1, -1), 0.0),
    (2, 300, 113, 4, 1, 40, True, (-1, -1), 0.0),  # the first 187 rows see no key
    (1, 257, 257, 2, 2, 96, False, (32, 17), 30.0),
]
CASE_IDS = ["mha", "gqa_causal", "mqa_causal_sq>sk", "window_softcap"]


def _inputs(case, seed=0):
    b, sq, sk, h, hk, d = case[:6]
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, sq, h, d), dtype=np.float32),
            rng.standard_normal((b, sk, hk, d), dtype=np.float32),
            rng.standard_normal((b, sk, hk, d), dtype=np.float32))


def _check(out, lse, q32, k32, v32, case, lowp):
    causal, window, softcap = case[6:]
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    out_ref, lse_ref = attention_ref_np(q32, k32, v32, **kw)
    out_naive, lse_naive = attention_ref_np(q32, k32, v32, lowp=lowp, **kw)
    assert_close_np(out, out_ref, out_naive)
    assert_lse_close_np(lse, lse_ref, lse_naive)


# ------------------------------------------------------------------------------------ CuPy


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_cupy(cupy, case):
    require_kernel("float16", case[5])
    q32, k32, v32 = _inputs(case)
    # Round to fp16 on the host so that the reference sees exactly the kernel's inputs.
    q32, k32, v32 = (a.astype(np.float16).astype(np.float32) for a in (q32, k32, v32))
    q, k, v = (cupy.asarray(a.astype(np.float16)) for a in (q32, k32, v32))
    causal, window, softcap = case[6:]
    out, lse = flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                         return_lse=True)
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    assert out.shape == q.shape and out.dtype == cupy.float16
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == cupy.float32
    _check(cupy.asnumpy(out), cupy.asnumpy(lse), q32, k32, v32, case, np.float16)


def test_cupy_out_view_and_packed(cupy):
    b, s, h, d = 2, 200, 4, 64
    require_kernel("float16", d)
    rng = np.random.default_rng(1)
    qkv32 = rng.standard_normal((b, s, 3, h, d), dtype=np.float32).astype(np.float16).astype(np.float32)
    qkv = cupy.asarray(qkv32.astype(np.float16))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    buf = cupy.full((b, s, h, d + 16), cupy.nan, dtype=cupy.float16)
    out_arg = buf[..., 8:8 + d]
    out = flashcute.flash_attn_func(q, k, v, causal=True, out=out_arg)
    assert out is out_arg
    host = cupy.asnumpy(buf)
    assert np.isnan(host[..., :8]).all() and np.isnan(host[..., 8 + d:]).all()
    out_ref, _ = attention_ref_np(qkv32[:, :, 0], qkv32[:, :, 1], qkv32[:, :, 2], causal=True)
    out_naive, _ = attention_ref_np(qkv32[:, :, 0], qkv32[:, :, 1], qkv32[:, :, 2], causal=True, lowp=np.float16)
    assert_close_np(cupy.asnumpy(out), out_ref, out_naive)


def test_cupy_zero_size(cupy):
    q = cupy.zeros((0, 16, 2, 64), dtype=cupy.float16)
    out, lse = flashcute.flash_attn_func(q, q, q, return_lse=True)
    assert isinstance(out, cupy.ndarray) and out.shape == (0, 16, 2, 64) and lse.shape == (0, 2, 16)


# ------------------------------------------------------------------------------------ JAX


def _jax_dtype(jax, name):
    return getattr(jax.numpy, name)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_jax(jax, case, dtype):
    require_kernel(dtype, case[5])
    jnp = jax.numpy
    q32, k32, v32 = _inputs(case, seed=2)
    q, k, v = (jnp.asarray(a, dtype=_jax_dtype(jax, dtype)) for a in (q32, k32, v32))
    q32, k32, v32 = (np.asarray(a.astype(jnp.float32)) for a in (q, k, v))  # exactly the kernel's inputs
    causal, window, softcap = case[6:]
    out, lse = flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                         return_lse=True)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == jnp.float32
    assert out.devices() == q.devices()
    lowp = np.float16 if dtype == "float16" else jnp.bfloat16  # jnp.bfloat16 is ml_dtypes' numpy dtype
    _check(np.asarray(out.astype(jnp.float32)), np.asarray(lse), q32, k32, v32, case, lowp)


def test_jax_result_is_complete_when_returned(jax):
    """The output must be complete when JAX first reads it: consume it immediately, many times,
    with a kernel big enough that a missing synchronisation would show (zeros instead of data)."""
    jnp = jax.numpy
    b, s, h, d = 1, 2048, 16, 128
    require_kernel("bfloat16", d)
    rng = np.random.default_rng(3)
    q32 = rng.standard_normal((b, s, h, d), dtype=np.float32)
    q = jnp.asarray(q32, dtype=jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((b, s, h, d), dtype=np.float32), dtype=jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((b, s, h, d), dtype=np.float32), dtype=jnp.bfloat16)
    first = flashcute.flash_attn_func(q, k, v)
    # Read right away, against the reference on a few heads (and the last one).
    for heads in (slice(0, 2), slice(h - 1, h)):
        sub = (slice(None), slice(None), heads)
        q32, k32, v32 = (np.asarray(a[sub].astype(jnp.float32)) for a in (q, k, v))
        out_ref, _ = attention_ref_np(q32, k32, v32)
        out_naive, _ = attention_ref_np(q32, k32, v32, lowp=jnp.bfloat16)
        assert_close_np(np.asarray(first[sub].astype(jnp.float32)), out_ref, out_naive)
    for _ in range(10):
        out = flashcute.flash_attn_func(q, k, v)
        assert bool(jnp.array_equal(out, first))  # JAX reads out right away


def test_jax_explicit_stream(jax, torch):
    """stream= with JAX: the kernel runs there and that stream is synchronised."""
    require_kernel("float16", 64)
    jnp = jax.numpy
    q = jnp.asarray(np.random.default_rng(4).standard_normal((1, 256, 2, 64)), dtype=jnp.float16)
    s = torch.cuda.Stream()
    out = flashcute.flash_attn_func(q, q, q, causal=True, stream=s.cuda_stream)
    assert s.query()  # synchronised before returning
    ref = flashcute.flash_attn_func(q, q, q, causal=True)
    assert bool(jnp.array_equal(out, ref))


def test_jax_refusals(jax):
    jnp = jax.numpy
    q = jnp.zeros((1, 16, 2, 64), dtype=jnp.float16)
    with pytest.raises(TypeError, match="out: JAX arrays are immutable"):
        flashcute.flash_attn_func(q, q, q, out=jnp.zeros_like(q))
    with pytest.raises(TypeError, match="q: got a traced JAX value"):
        jax.jit(lambda a: flashcute.flash_attn_func(a, a, a))(q)
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
