"""FlashAttention-2's packed forms (flash_attn_qkvpacked_func, flash_attn_kvpacked_func and their
varlen twins) on the GPU: the same bits as flash_attn_func / flash_attn_varlen_func on the views
of the packed array, the gradient of the packed array as one tensor, and the call traced by
torch.compile and jax.jit. Their argument checks run without a GPU (test_errors.py)."""

from __future__ import annotations

import pytest

import flashcute
from flashcute.testing import check_attention


def _randn(torch, shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, device="cuda", generator=g, dtype=torch.bfloat16)


def _cu(torch, lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


def test_qkvpacked_is_flash_attn_func_on_its_views(torch, require_kernel):
    """qkv (b, s, 3, h, d): the output and lse of flash_attn_func on qkv[:, :, i] bit for bit, and
    qkv.grad the three leaves' gradients stacked (deterministic, so bits compare)."""
    require_kernel("bfloat16", 128)
    qkv = _randn(torch, (2, 300, 3, 8, 128), 1)
    dout = _randn(torch, (2, 300, 8, 128), 2)
    packed = qkv.clone().requires_grad_()
    out, lse, none = flashcute.flash_attn_qkvpacked_func(packed, 0.0, None, True, (-1, -1), 0.0, None, True, True)
    assert none is None
    leaves = [x.clone().requires_grad_() for x in qkv.unbind(2)]
    ref, ref_lse = flashcute.flash_attn_func(*leaves, causal=True, deterministic=True, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    check = check_attention(out, *qkv.unbind(2), lse=lse, causal=True)
    assert check.ok, check.message
    out.backward(dout)
    ref.backward(dout)
    assert packed.grad.shape == qkv.shape
    assert torch.equal(packed.grad, torch.stack([x.grad for x in leaves], dim=2))


def test_kvpacked_gqa_window_softcap(torch, require_kernel):
    """kv (b, s_k, 2, h_k, d) with GQA 4:1, a window and softcap: flash_attn_func's bits."""
    require_kernel("bfloat16", 64)
    q = _randn(torch, (2, 200, 8, 64), 3)
    kv = _randn(torch, (2, 150, 2, 2, 64), 4)
    opts = dict(window_size=(40, 8), softcap=20.0)
    out, lse = flashcute.flash_attn_kvpacked_func(q, kv, return_lse=True, **opts)
    ref, ref_lse = flashcute.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], return_lse=True, **opts)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    check = check_attention(out, q, kv[:, :, 0], kv[:, :, 1], lse=lse, **opts)
    assert check.ok, check.message


def test_varlen_packed_forms(torch, require_kernel):
    """The varlen twins: qkv (total, 3, h, d) with one cu_seqlens, and q with kv (total_k, 2, h_k, d)
    and separate ones; flash_attn_varlen_func's bits, and the packed gradient."""
    require_kernel("bfloat16", 64)
    lens = [100, 1, 257]
    cu = _cu(torch, lens)
    qkv = _randn(torch, (sum(lens), 3, 4, 64), 5)
    packed = qkv.clone().requires_grad_()
    out = flashcute.flash_attn_varlen_qkvpacked_func(packed, cu, max(lens), causal=True, deterministic=True)
    leaves = [x.clone().requires_grad_() for x in qkv.unbind(1)]
    ref = flashcute.flash_attn_varlen_func(*leaves, cu, cu, max(lens), max(lens), causal=True, deterministic=True)
    assert torch.equal(out, ref)
    dout = _randn(torch, out.shape, 6)
    out.backward(dout)
    ref.backward(dout)
    assert torch.equal(packed.grad, torch.stack([x.grad for x in leaves], dim=1))

    lens_k = [80, 33, 300]
    cu_k = _cu(torch, lens_k)
    q = _randn(torch, (sum(lens), 8, 64), 7)
    kv = _randn(torch, (sum(lens_k), 2, 2, 64), 8)
    out, lse = flashcute.flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, max(lens), max(lens_k), causal=True,
                                                         return_lse=True)
    ref, ref_lse = flashcute.flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu, cu_k, max(lens), max(lens_k),
                                                    causal=True, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_qkvpacked_under_torch_compile(torch, require_kernel):
    """fullgraph torch.compile of forward and backward through the packed form: eager's bits."""
    require_kernel("bfloat16", 64)
    torch._dynamo.reset()
    qkv = _randn(torch, (2, 130, 3, 4, 64), 9)
    dout = _randn(torch, (2, 130, 4, 64), 10)

    def loss(x):
        return (flashcute.flash_attn_qkvpacked_func(x, causal=True, deterministic=True) * dout).sum()

    eager = qkv.clone().requires_grad_()
    loss(eager).backward()
    compiled = qkv.clone().requires_grad_()
    torch.compile(loss, fullgraph=True)(compiled).backward()
    assert torch.equal(compiled.grad, eager.grad)


def test_qkvpacked_jax_grad(jax, require_kernel):
    """JAX: jax.jit of jax.grad through the packed form equals the grads of flash_attn_func on the
    slices, stacked."""
    require_kernel("bfloat16", 64)
    jnp = jax.numpy
    qkv = jax.random.normal(jax.random.key(0), (2, 96, 3, 4, 64), jnp.bfloat16)
    dout = jax.random.normal(jax.random.key(1), (2, 96, 4, 64), jnp.float32)

    def packed_loss(x):
        out = flashcute.flash_attn_qkvpacked_func(x, causal=True, deterministic=True)
        return (out.astype(jnp.float32) * dout).sum()

    def loss(q, k, v):
        out = flashcute.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return (out.astype(jnp.float32) * dout).sum()

    g = jax.jit(jax.grad(packed_loss))(qkv)
    parts = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    assert g.shape == qkv.shape
    assert bool(jnp.array_equal(g, jnp.stack(parts, axis=2)))
