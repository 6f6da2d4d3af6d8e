"""merge_attn_states on the GPU: two partial attentions over disjoint key sets merge into the
attention over all keys, checked against the float32 reference with FlashAttention's rule
(flashcute.testing); -inf rows, NaN, in-place, varlen shapes, float32 partials, torch.compile, CuPy
and JAX.
"""

from __future__ import annotations

import math

import pytest

import flashcute
from flashcute.testing import check_attention

pytestmark = pytest.mark.gpu


def _qkv(torch, b, sq, sk, h, hk, d, dtype="bfloat16", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    return (torch.randn(b, sq, h, d, device="cuda", generator=g).to(dt),
            torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dt),
            torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dt))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape, split, causal", [
    ((2, 113, 300, 4, 2, 64), 100, False),
    ((1, 1, 1000, 8, 1, 128), 999, False),
    ((2, 300, 300, 4, 4, 64), 150, True),  # causal: the first rows see no key of the second part
    ((1, 200, 100, 4, 4, 64), 30, True),   # sq > sk: the first rows see no key at all (both -inf)
], ids=["gqa", "decode-mqa", "causal-split", "causal-empty-rows"])
def test_two_halves_make_the_whole(torch, require_kernel, dtype, shape, split, causal):
    b, sq, sk, h, hk, d = shape
    require_kernel(dtype, d)
    q, k, v = _qkv(torch, *shape, dtype=dtype, seed=sk)
    # The two parts of the keys, each with the mask the whole would give it: causal and bottom-right
    # aligned on the whole, so the part [0, split) has window right = sk - split (seen from its own
    # bottom-right corner) and the part [split, sk) a left bound.
    if causal:
        a_opts = dict(window_size=(-1, sk - split))
        b_opts = dict(window_size=(-1, 0))
    else:
        a_opts = b_opts = {}
    out_a, lse_a = flashcute.flash_attn_func(q, k[:, :split], v[:, :split], return_lse=True, **a_opts)
    out_b, lse_b = flashcute.flash_attn_func(q, k[:, split:], v[:, split:], return_lse=True, **b_opts)
    out, lse = flashcute.merge_attn_states(out_a, lse_a, out_b, lse_b)
    check = check_attention(out, q, k, v, lse=lse, causal=causal)
    assert check.ok, check.message


def test_inf_nan_and_in_place(torch):
    h, d = 2, 40
    out_a = torch.randn(1, 4, h, d, device="cuda").bfloat16()
    out_b = torch.randn(1, 4, h, d, device="cuda").bfloat16()
    lse_a = torch.tensor([[[0.5, -math.inf, -math.inf, float("nan")]] * h], device="cuda")
    lse_b = torch.tensor([[[-math.inf, 2.0, -math.inf, 1.0]] * h], device="cuda")
    out, lse = flashcute.merge_attn_states(out_a, lse_a, out_b, lse_b)
    assert torch.equal(out[:, 0], out_a[:, 0]) and torch.equal(out[:, 1], out_b[:, 1])
    assert not out[:, 2].any() and bool((lse[..., 2] == -math.inf).all())
    assert bool(torch.isnan(out[:, 3]).all()) and bool(torch.isnan(lse[..., 3]).all())
    assert torch.equal(lse[..., 0], lse_a[..., 0]) and torch.equal(lse[..., 1], lse_b[..., 1])
    # In place into out_a, with a float32 pair checked against the formula.
    a32, b32 = out_a.float(), out_b.float()
    la, lb = torch.randn(1, h, 4, device="cuda"), torch.randn(1, h, 4, device="cuda")
    ref_lse = torch.logaddexp(la, lb)
    wa = torch.exp(la - ref_lse).transpose(1, 2)[..., None]
    wb = torch.exp(lb - ref_lse).transpose(1, 2)[..., None]
    ref = wa * a32 + wb * b32
    res, res_lse = flashcute.merge_attn_states(a32, la, b32, lb, out=a32)
    assert res is a32
    torch.testing.assert_close(res, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res_lse, ref_lse, rtol=1e-6, atol=1e-6)


def test_varlen_shapes_and_compile(torch, require_kernel):
    require_kernel("bfloat16", 64)
    cu = torch.tensor([0, 50, 50, 170], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(170, 4, 64, device="cuda", generator=g).bfloat16()
    k = torch.randn(170, 2, 64, device="cuda", generator=g).bfloat16()
    v = torch.randn(170, 2, 64, device="cuda", generator=g).bfloat16()
    k2 = torch.randn(170, 2, 64, device="cuda", generator=g).bfloat16()
    v2 = torch.randn(170, 2, 64, device="cuda", generator=g).bfloat16()
    out_a, lse_a = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, 120, 120, return_lse=True)
    out_b, lse_b = flashcute.flash_attn_varlen_func(q, k2, v2, cu, cu, 120, 120, return_lse=True)
    out, lse = flashcute.merge_attn_states(out_a, lse_a, out_b, lse_b)
    assert out.shape == (170, 4, 64) and lse.shape == (4, 170)
    for s0, s1 in ((0, 50), (50, 170)):
        kk = torch.cat([k[s0:s1], k2[s0:s1]])[None]
        vv = torch.cat([v[s0:s1], v2[s0:s1]])[None]
        check = check_attention(out[None, s0:s1], q[None, s0:s1], kk, vv, lse=lse[None, :, s0:s1])
        assert check.ok, check.message
    torch._dynamo.reset()
    compiled = torch.compile(flashcute.merge_attn_states, fullgraph=True)
    c_out, c_lse = compiled(out_a, lse_a, out_b, lse_b)
    assert torch.equal(c_out, out) and torch.equal(c_lse, lse)


def test_cupy_and_jax_match_torch(torch, cupy, jax):
    out_a = torch.randn(2, 33, 4, 64, device="cuda").half()
    out_b = torch.randn(2, 33, 4, 64, device="cuda").half()
    lse_a, lse_b = torch.randn(2, 4, 33, device="cuda"), torch.randn(2, 4, 33, device="cuda")
    ref, ref_lse = flashcute.merge_attn_states(out_a, lse_a, out_b, lse_b)
    torch.cuda.synchronize()
    c = flashcute.merge_attn_states(*(cupy.from_dlpack(x) for x in (out_a, lse_a, out_b, lse_b)))
    cupy.cuda.get_current_stream().synchronize()
    assert torch.equal(torch.from_dlpack(c[0]), ref) and torch.equal(torch.from_dlpack(c[1]), ref_lse)
    j_args = [jax.numpy.asarray(x.cpu().numpy()) for x in (out_a, lse_a, out_b, lse_b)]
    j = jax.jit(flashcute.merge_attn_states)(*j_args)
    assert torch.equal(torch.from_dlpack(j[0]), ref) and torch.equal(torch.from_dlpack(j[1]), ref_lse)


def test_errors(torch):
    out_a = torch.randn(1, 8, 2, 64, device="cuda").half()
    lse_a = torch.randn(1, 2, 8, device="cuda")
    with pytest.raises(ValueError, match=r"out_b: expected shape \(1, 8, 2, 64\) like out_a"):
        flashcute.merge_attn_states(out_a, lse_a, out_a[:, :4], lse_a)
    with pytest.raises(TypeError, match="out_b: expected float16 like out_a"):
        flashcute.merge_attn_states(out_a, lse_a, out_a.float(), lse_a)
    with pytest.raises(ValueError, match=r"lse_b: expected float32 \(batch, nheads, seqlen\) = \(1, 2, 8\)"):
        flashcute.merge_attn_states(out_a, lse_a, out_a, lse_a[..., :4])
    with pytest.raises(TypeError, match="lse_a: expected a CUDA array"):
        flashcute.merge_attn_states(out_a, lse_a.cpu(), out_a, lse_a)
