"""flashcute.testing, the one reference and tolerance rule, on the CPU (NumPy): CI runs these.

The reference must compute attention as documented (the mask, GQA, softcap, empty rows), its
naive low-precision variant must round as the dtype does, and the rule must fail what it should:
NaN (an unwritten output), a wrong value, wrong lse rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashcute import testing as ft


def direct_attention(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0):
    """A slow, obviously correct float64 attention: one query row at a time."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = np.zeros((b, sq, h, d))
    lse = np.full((b, h, sq), -np.inf)
    left, right = window
    if causal:
        right = 0
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hk)
            for i in range(sq):
                keys = [j for j in range(sk)
                        if (left < 0 or j >= i + sk - sq - left) and (right < 0 or j <= i + sk - sq + right)]
                if not keys:
                    continue
                s = np.array([q[bi, i, hi].astype(np.float64) @ k[bi, j, kh].astype(np.float64) * scale for j in keys])
                if softcap > 0:
                    s = softcap * np.tanh(s / softcap)
                m = s.max()
                p = np.exp(s - m)
                out[bi, i, hi] = (p / p.sum()) @ v[bi, keys, kh].astype(np.float64)
                lse[bi, hi, i] = m + math.log(p.sum())
    return out, lse


@pytest.mark.parametrize("causal, window, softcap, sq, sk, h, hk", [
    (False, (-1, -1), 0.0, 17, 17, 2, 2),
    (True, (-1, -1), 0.0, 23, 9, 4, 2),     # sq > sk: the first 14 rows see no key
    (False, (3, 2), 0.0, 13, 29, 4, 1),     # window, MQA
    (True, (5, -1), 5.0, 31, 31, 2, 1),     # causal + left window + softcap
])
def test_reference_matches_direct_attention(causal, window, softcap, sq, sk, h, hk):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, sq, h, 16)).astype(np.float32)
    k = rng.standard_normal((2, sk, hk, 16)).astype(np.float32)
    v = rng.standard_normal((2, sk, hk, 16)).astype(np.float32)
    out, lse = ft.attention_ref(q, k, v, softmax_scale=0.3, causal=causal, window_size=window, softcap=softcap)
    want_out, want_lse = direct_attention(q, k, v, 0.3, causal, window, softcap)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    assert (np.isneginf(lse) == np.isneginf(want_lse)).all()
    seen = ~np.isneginf(want_lse)
    np.testing.assert_allclose(lse[seen], want_lse[seen], atol=2e-5)
    mask = ft.visible_mask(sq, sk, causal, window)
    assert (out[:, ~mask.any(axis=-1)] == 0).all()


def test_chunking_does_not_change_the_result(monkeypatch):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 40, 2, 8)).astype(np.float32) for _ in range(3))
    whole, whole_lse = ft.attention_ref(q, k, v, causal=True)
    monkeypatch.setattr(ft, "CHUNK_SCORES", 2 * 40 * 3)  # 3 rows at a time
    chunked, chunked_lse = ft.attention_ref(q, k, v, causal=True)
    np.testing.assert_array_equal(whole, chunked)
    np.testing.assert_array_equal(whole_lse, chunked_lse)


def test_bf16_rounding_is_round_to_nearest_even():
    ops = ft._ArrayOps(np)
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7, 1 + 2**-9, -2.5, 3.0e38, np.inf, -np.inf], np.float32)
    want = np.array([1.0, 1.0, 1 + 4 * 2**-8, 1 + 2**-7, 1.0, -2.5, 2.9980e38, np.inf, -np.inf], np.float32)
    got = ops.round_bf16(x)
    np.testing.assert_array_equal(got[:6], want[:6])      # ties go to even, others to nearest
    assert abs(got[6] / 3.0e38 - 1) < 2**-8                # 8 mantissa bits left
    assert got[7] == np.inf and got[8] == -np.inf
    assert np.isnan(ops.round_bf16(np.array([np.nan], np.float32)))[0]
    # Everything it returns is a bfloat16 value: the low 16 bits are zero.
    r = ops.round_bf16(np.random.default_rng(2).standard_normal(1000).astype(np.float32))
    assert (r.view(np.uint32) & 0xFFFF == 0).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_naive_low_precision_is_less_accurate(dtype):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 64, 2, 32)).astype(np.float32) for _ in range(3))
    ref, _ = ft.attention_ref(q, k, v)
    naive, _ = ft.attention_ref(q, k, v, lowp=dtype)
    err = np.abs(naive - ref).max()
    eps = {"float16": 2**-11, "bfloat16": 2**-8}[dtype]
    assert 0 < err < 16 * eps  # it rounds, and only by a few ulps


def _fp16_inputs(seed=4, sq=50, sk=70):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, sq, 4, 32)).astype(np.float16),
            rng.standard_normal((2, sk, 2, 32)).astype(np.float16),
            rng.standard_normal((2, sk, 2, 32)).astype(np.float16))


def test_check_passes_a_correct_output():
    q, k, v = _fp16_inputs()
    ref, lse = ft.attention_ref(q, k, v, causal=True)
    check = ft.check_attention(ref.astype(np.float16), q, k, v, lse=lse, causal=True)
    assert check.ok, check.message
    assert check.out_err <= check.out_bound and "out err" in check.summary()


def test_check_fails_nan_wrong_values_and_wrong_lse():
    q, k, v = _fp16_inputs(sq=90, sk=70)  # causal, sq > sk: 20 rows see no key
    ref, lse = ft.attention_ref(q, k, v, causal=True)
    out = ref.astype(np.float16)

    unwritten = out.copy()
    unwritten[1, 33, 2, 5] = np.nan
    check = ft.check_attention(unwritten, q, k, v, causal=True)
    assert not check.ok and "non-finite" in check.message

    wrong = out.copy()
    wrong[0, 60, 1, :] += np.float16(0.05)
    check = ft.check_attention(wrong, q, k, v, causal=True)
    assert not check.ok and "max error" in check.message

    lse_bad = lse.copy()
    lse_bad[0, 0, 0] = 0.0  # a row that sees no key must be -inf
    check = ft.check_attention(out, q, k, v, lse=lse_bad, causal=True)
    assert not check.ok and "-inf" in check.message

    lse_off = lse.copy()
    lse_off[1, 3, 80] += 0.1
    check = ft.check_attention(out, q, k, v, lse=lse_off, causal=True)
    assert not check.ok and "lse: max error" in check.message

    with pytest.raises(AssertionError, match="non-finite"):
        ft.assert_attention_close(unwritten, q, k, v, causal=True)


def test_tolerance_is_twice_naive_plus_atol():
    assert ft.tolerance(1e-3) == 2e-3 + ft.OUT_ATOL
    assert ft.tolerance(0.0, ft.LSE_ATOL) == ft.LSE_ATOL


def test_check_refuses_non_half_inputs():
    q = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        ft.check_attention(q, q, q, q)
