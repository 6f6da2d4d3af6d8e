"""The JAX binding without a GPU: the XLA FFI handler is compiled in and registers, and what a
tracer sees (trace-time errors, the staged custom call, vmap folding, the grad error) is right.
CI runs these with a CPU jax; tests/python/test_frameworks.py runs the calls on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import flashcute  # noqa: E402
from flashcute import _C  # noqa: E402


def spec(*shape, dtype=jnp.float16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.fixture
def fp16_d64(require_kernel):
    """Valid calls get past the validation only if this build has their kernel."""
    require_kernel("float16", 64)


def jaxpr(f, *args):
    return str(jax.make_jaxpr(f)(*args))


def test_ffi_handler_is_built_in():
    targets = _C.xla_ffi_targets()
    if not targets:
        pytest.fail("flashcute._C was built without the XLA FFI handler; CI builds with FLASHCUTE_XLA_FFI=ON")
    assert set(targets) == {"flashcute_fwd", "flashcute_bwd", "flashcute_varlen_fwd", "flashcute_varlen_bwd",
                            "flashcute_merge"}
    assert all(type(t).__name__ == "PyCapsule" for t in targets.values())


def test_traced_call_is_one_custom_call(fp16_d64):
    from flashcute import _jax

    _jax._register()
    text = jaxpr(lambda q, k, v: flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True),
                 spec(2, 128, 8, 64), spec(2, 100, 4, 64), spec(2, 100, 4, 64))
    assert text.count("ffi_call") == 1 or text.count("flashcute_fwd") >= 1, text
    assert "f16[2,128,8,64]" in text and "f32[2,8,128]" in text


def test_traced_packed_form_slices_then_one_custom_call(fp16_d64):
    """flash_attn_qkvpacked_func under a tracer: the three slices of qkv, one forward custom call;
    a wrong packed shape fails at trace time naming qkv."""
    from flashcute import _jax

    _jax._register()
    text = jaxpr(lambda qkv: flashcute.flash_attn_qkvpacked_func(qkv, causal=True), spec(2, 128, 3, 8, 64))
    assert text.count("flashcute_fwd") == 1, text
    assert "f16[2,128,3,8,64]" in text and "f16[2,128,8,64]" in text
    with pytest.raises(ValueError, match=r"qkv: expected a \(batch_size, seqlen, 3, nheads, headdim\) array"):
        jax.make_jaxpr(flashcute.flash_attn_qkvpacked_func)(spec(2, 128, 2, 8, 64))


@pytest.mark.parametrize("shapes, exc, message", [
    (((2, 128, 8, 64), (3, 100, 4, 64), (3, 100, 4, 64)), ValueError, "k: batch 3 does not match q's batch 2"),
    (((2, 128, 8, 64), (2, 100, 3, 64), (2, 100, 3, 64)), ValueError, "nheads (8) must be a multiple of nheads_k (3)"),
    (((2, 128, 8, 60), (2, 100, 8, 60), (2, 100, 8, 60)), ValueError, "headdim must be a multiple of 8 and <= 256"),
    (((2, 128, 8), (2, 100, 8, 64), (2, 100, 8, 64)), ValueError, "q: expected 4 dims"),
])
def test_trace_time_errors_name_the_argument(shapes, exc, message):
    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)")):
        jax.make_jaxpr(flashcute.flash_attn_func)(*(spec(*s) for s in shapes))


def test_trace_time_dtype_errors():
    with pytest.raises(TypeError, match="k: expected float16 like q, got float32"):
        jax.make_jaxpr(flashcute.flash_attn_func)(spec(1, 16, 2, 64), spec(1, 16, 2, 64, dtype=jnp.float32),
                                                 spec(1, 16, 2, 64))
    with pytest.raises(TypeError, match="q: expected a float16 or bfloat16 array, got float32"):
        jax.make_jaxpr(flashcute.flash_attn_func)(*(spec(1, 16, 2, 64, dtype=jnp.float32) for _ in range(3)))


def test_vmap_folds_into_the_batch(fp16_d64):
    # vmap over a leading axis of 5: one custom call over batch 5 * 2, not five.
    f = jax.vmap(lambda q, k, v: flashcute.flash_attn_func(q, k, v))
    text = jaxpr(f, spec(5, 2, 32, 4, 64), spec(5, 2, 48, 4, 64), spec(5, 2, 48, 4, 64))
    assert "f16[10,32,4,64]" in text, text
    out = jax.eval_shape(f, spec(5, 2, 32, 4, 64), spec(5, 2, 48, 4, 64), spec(5, 2, 48, 4, 64))
    assert out.shape == (5, 2, 32, 4, 64)
    # An unbatched k/v is broadcast; nested vmaps fold twice.
    g = jax.vmap(jax.vmap(lambda q, k, v: flashcute.flash_attn_func(q, k, v), in_axes=(0, None, None)),
                 in_axes=(0, None, None))
    text = jaxpr(g, spec(3, 5, 2, 32, 4, 64), spec(2, 48, 4, 64), spec(2, 48, 4, 64))
    assert "f16[30,32,4,64]" in text, text


def test_grad_is_the_bwd_custom_call(fp16_d64):
    from flashcute import _jax

    _jax._register()

    def loss(q, k, v):
        return flashcute.flash_attn_func(q, k, v, causal=True).astype(jnp.float32).sum()

    text = jaxpr(jax.grad(loss, argnums=(0, 1, 2)), spec(2, 16, 4, 64), spec(2, 24, 2, 64), spec(2, 24, 2, 64))
    assert "flashcute_bwd" in text, text
    grads = jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2)), spec(2, 16, 4, 64), spec(2, 24, 2, 64),
                           spec(2, 24, 2, 64))
    assert [g.shape for g in grads] == [(2, 16, 4, 64), (2, 24, 2, 64), (2, 24, 2, 64)]
    # flash_attn_func's deterministic reaches the backward call (the sm90 backward is not).
    text = jaxpr(jax.grad(lambda q, k, v: flashcute.flash_attn_func(q, k, v, deterministic=True).astype(
        jnp.float32).sum()), spec(2, 16, 4, 64), spec(2, 24, 2, 64), spec(2, 24, 2, 64))
    assert "('deterministic', True)" in text, text
    assert "('deterministic', False)" in jaxpr(jax.grad(loss), spec(2, 16, 4, 64), spec(2, 24, 2, 64), spec(2, 24, 2, 64))
    # vmap of grad folds the vmapped axis into the batch of the backward call too.
    text = jaxpr(jax.vmap(jax.grad(loss)), spec(3, 2, 16, 4, 64), spec(3, 2, 24, 2, 64), spec(3, 2, 24, 2, 64))
    assert "f16[6,16,4,64]" in text and text.count("flashcute_bwd") >= 1, text


def test_keywords_jax_cannot_take():
    q = spec(1, 16, 2, 64)
    with pytest.raises(TypeError, match="out: JAX arrays are immutable"):
        jax.make_jaxpr(lambda q: flashcute.flash_attn_func(q, q, q, out=q))(q)
    with pytest.raises(TypeError, match="stream: not supported with JAX inputs"):
        jax.make_jaxpr(lambda q: flashcute.flash_attn_func(q, q, q, stream=0))(q)


def test_cpu_arrays_are_refused():
    q = jax.device_put(np.zeros((1, 16, 2, 64), np.float16), jax.devices("cpu")[0])
    with pytest.raises(TypeError, match="q: expected a CUDA array, got a CPU jax.Array"):
        flashcute.flash_attn_func(q, q, q)


def test_varlen_traces_to_its_custom_calls(fp16_d64):
    from flashcute import _jax

    _jax._register()
    cu = spec(4, dtype=jnp.int32)

    def loss(q, k, v, cu_q, cu_k):
        return flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 50, causal=True).astype(jnp.float32).sum()

    args = (spec(100, 4, 64), spec(120, 2, 64), spec(120, 2, 64), cu, cu)
    text = jaxpr(loss, *args)
    assert "flashcute_varlen_fwd" in text, text
    text = jaxpr(jax.grad(loss, argnums=(0, 1, 2)), *args)
    assert "flashcute_varlen_bwd" in text, text
    out, lse = jax.eval_shape(lambda *a: flashcute.flash_attn_varlen_func(*a, 40, 50, return_lse=True), *args)
    assert out.shape == (100, 4, 64) and lse.shape == (4, 100)


def test_varlen_trace_time_errors():
    q, kv = spec(100, 4, 64), spec(120, 2, 64)
    with pytest.raises(TypeError, match="cu_seqlens_q: expected int32"):
        jax.make_jaxpr(lambda q, k, v, c: flashcute.flash_attn_varlen_func(q, k, v, c, c, 8, 8))(
            q, kv, kv, spec(4, dtype=jnp.float32))
    with pytest.raises(ValueError, match="cu_seqlens_k: shape"):
        jax.make_jaxpr(lambda q, k, v, a, b: flashcute.flash_attn_varlen_func(q, k, v, a, b, 8, 8))(
            q, kv, kv, spec(4, dtype=jnp.int32), spec(3, dtype=jnp.int32))
    with pytest.raises(ValueError, match="q: expected 3 dims"):
        jax.make_jaxpr(lambda q, k, v, c: flashcute.flash_attn_varlen_func(q, k, v, c, c, 8, 8))(
            spec(1, 100, 4, 64), kv, kv, spec(4, dtype=jnp.int32))
