"""Past 2^31 elements (GPU, large): 64-bit addressing everywhere.

batch 1, seqlen 16384, 1024 heads, headdim 128, bfloat16: q, k and v are slices of one packed
(1, 16384, 3, 1024, 128) tensor (12 GiB, element offsets up to 6.4e9), out is 2^31 elements
(4 GiB, byte offsets past 2^32) and starts as NaN. Every element of out must be written and
finite; the first, middle and last heads are compared with an fp32 reference computed for those
heads only. Needs ~22 GiB of free GPU memory; skipped below 24 GiB.
"""

from __future__ import annotations

import pytest

import flashcute
from flashcute.testing import check_attention

pytestmark = [pytest.mark.gpu, pytest.mark.large]

GiB = 1 << 30
B, S, H, D = 1, 16384, 1024, 128
CHECK_HEADS = [0, 1, 511, 1022, 1023]


@pytest.mark.parametrize(
    "causal, window",
    [(False, (1000, 1000)), (True, (-1, -1))],
    ids=["window1000", "causal"],
)
def test_past_2_31_elements(torch, require_kernel, causal, window):
    require_kernel("bfloat16", D)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if free < 24 * GiB:
        pytest.skip(f"needs 24 GiB of free GPU memory, {free / GiB:.1f} GiB free")

    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.empty(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16)
    for i in range(3):  # fill in 4 GiB pieces to keep the fp32 temporary of randn small
        for h0 in range(0, H, 128):
            qkv[:, :, i, h0:h0 + 128] = torch.randn(B, S, 128, D, device="cuda", generator=g)
    q, k, v = qkv.unbind(2)
    assert q.numel() == 2**31 and qkv.numel() > 6 * 10**9
    out_arg = torch.full((B, S, H, D), float("nan"), device="cuda", dtype=torch.bfloat16)

    out, lse = flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window, out=out_arg, return_lse=True)
    torch.cuda.synchronize()
    assert out is out_arg and lse.shape == (B, H, S)

    # Every element written and finite, checked in slices to keep temporaries small.
    for h0 in range(0, H, 64):
        assert bool(torch.isfinite(out[:, :, h0:h0 + 64]).all()), f"non-finite output in heads {h0}..{h0 + 63}"
    assert bool(torch.isfinite(lse).all())

    for h in CHECK_HEADS:
        sl = slice(h, h + 1)
        qh, kh, vh = q[:, :, sl], k[:, :, sl], v[:, :, sl]
        check = check_attention(out[:, :, sl], qh, kh, vh, lse=lse[:, sl], causal=causal, window_size=window,
                                what=f"out head {h}")
        assert check.ok, check.message
        torch.cuda.empty_cache()


def test_backward_past_2_31_elements(torch, require_kernel):
    """The backward at the same size (window 1000): dq, dk, dv (2^31 elements each) start as NaN;
    every element must be written and finite, and heads 0 and 1023 match the rule."""
    from flashcute.testing import check_gradients

    require_kernel("bfloat16", D)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if free < 44 * GiB:
        pytest.skip(f"needs 44 GiB of free GPU memory, {free / GiB:.1f} GiB free")
    window = (1000, 1000)
    g = torch.Generator(device="cuda").manual_seed(1)
    qkv = torch.empty(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16)
    dout = torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    for t in [qkv[:, :, i] for i in range(3)] + [dout]:
        for h0 in range(0, H, 128):
            t[:, :, h0:h0 + 128] = torch.randn(B, S, 128, D, device="cuda", generator=g)
    q, k, v = qkv.unbind(2)
    out, lse = flashcute.flash_attn_func(q, k, v, window_size=window, return_lse=True)
    dq, dk, dv = (torch.full((B, S, H, D), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flashcute.flash_attn_bwd(dout, q, k, v, out, lse, window_size=window, dq=dq, dk=dk, dv=dv)
    torch.cuda.synchronize()
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        for h0 in range(0, H, 64):
            assert bool(torch.isfinite(t[:, :, h0:h0 + 64]).all()), f"{name}: non-finite in heads {h0}..{h0 + 63}"
    for h in (0, H - 1):
        sl = slice(h, h + 1)
        check = check_gradients((dq[:, :, sl], dk[:, :, sl], dv[:, :, sl]), dout[:, :, sl], q[:, :, sl], k[:, :, sl],
                                v[:, :, sl], window_size=window)
        assert check.ok, f"head {h}: {check.message}"
        torch.cuda.empty_cache()
