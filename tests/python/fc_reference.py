"""Reference attention for the GPU tests (torch and NumPy), and the comparison rule.

The rule is FlashAttention's: the kernel's error against an fp32 reference must be at most
twice the error of the same math done naively in the input precision, plus a small epsilon:

    max |out - ref_fp32| <= 2 * max |naive_lowprec - ref_fp32| + 1e-5

Masking follows docs/design.md literally (no normalisation of large windows): query i sees
key j iff  i + sk - sq - left <= j <= i + sk - sq + right, a negative bound being unbounded,
causal meaning right = 0. A row that sees no key has out = 0 and lse = -inf.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np
import pytest

OUT_EPS = 1e-5
LSE_EPS = 1e-3


def require_kernel(dtype: str, head_dim: int) -> None:
    """Skips the calling test, with the reason, when this build has no kernel for dtype
    ("float16" / "bfloat16") at head_dim (build options FLASHCUTE_DTYPES / FLASHCUTE_HEAD_DIMS)."""
    import flashcute

    if dtype not in flashcute.compiled_dtypes() or flashcute.kernel_head_dim(head_dim) == 0:
        pytest.skip(f"{dtype} / head dim {head_dim} is not compiled into this build")


def mask_bounds(causal: bool, window_size: Tuple[int, int]) -> Tuple[int, int]:
    left, right = window_size
    if causal:
        right = 0
    return left, right


# ---------------------------------------------------------------------------------------- torch


def visible_mask_torch(torch, sq: int, sk: int, causal: bool, window_size, device) -> Any:
    """(sq, sk) bool: True where query i sees key j."""
    left, right = mask_bounds(causal, window_size)
    i = torch.arange(sq, device=device, dtype=torch.int64)[:, None]
    j = torch.arange(sk, device=device, dtype=torch.int64)[None, :]
    shift = i + sk - sq
    m = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        m &= j >= shift - left
    if right >= 0:
        m &= j <= shift + right
    return m


def attention_ref(
    torch,
    q,
    k,
    v,
    *,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size=(-1, -1),
    softcap: float = 0.0,
    upcast: bool = True,
):
    """Returns (out, lse). upcast=True: everything in fp32 (out fp32). upcast=False: the naive
    low-precision version (matmuls and softmax in q's dtype; lse from the low-precision scores)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    g = h // hk
    if g > 1:  # q head i uses k/v head i // g
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    mask = visible_mask_torch(torch, sq, sk, causal, window_size, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1)  # (b, h, sq); -inf for rows that see nothing
    attn = torch.softmax(scores, dim=-1)
    attn = attn.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # 0, not NaN, for empty rows
    out = torch.einsum("bhts,bshd->bthd", attn.to(v.dtype), v)
    return out, lse


def assert_out_close(torch, out, out_ref, out_naive, what: str = "out") -> None:
    out = out.float()
    assert bool(torch.isfinite(out).all()), f"{what}: {int((~torch.isfinite(out)).sum())} non-finite values"
    assert bool(torch.isfinite(out_ref).all()) and bool(torch.isfinite(out_naive.float()).all())
    err = (out - out_ref).abs().max().item() if out.numel() else 0.0
    naive_err = (out_naive.float() - out_ref).abs().max().item() if out.numel() else 0.0
    bound = 2 * naive_err + OUT_EPS
    assert err <= bound, f"{what}: max error {err:.3e} > bound {bound:.3e} (naive low-precision error {naive_err:.3e})"


def assert_lse_close(torch, lse, lse_ref, lse_naive, what: str = "lse") -> None:
    assert lse.dtype == torch.float32, f"{what}: dtype {lse.dtype}"
    assert tuple(lse.shape) == tuple(lse_ref.shape), f"{what}: shape {tuple(lse.shape)} vs {tuple(lse_ref.shape)}"
    assert not bool(torch.isnan(lse).any()), f"{what}: NaN"
    empty = torch.isneginf(lse_ref)
    assert bool(torch.equal(torch.isneginf(lse), empty)), (
        f"{what}: -inf at {int(torch.isneginf(lse).sum())} rows, expected at {int(empty.sum())} (rows that see no key)"
    )
    assert bool(torch.isfinite(lse[~empty]).all()), f"{what}: non-finite values in rows that see keys"
    if bool((~empty).any()):
        err = (lse[~empty] - lse_ref[~empty]).abs().max().item()
        naive_err = (lse_naive[~empty] - lse_ref[~empty]).abs().max().item()
        bound = 2 * naive_err + LSE_EPS
        assert err <= bound, f"{what}: max error {err:.3e} > bound {bound:.3e} (naive error {naive_err:.3e})"


# ---------------------------------------------------------------------------------------- NumPy


def round_to(x: np.ndarray, dtype: Any) -> np.ndarray:
    """Rounds float32 x to `dtype` (np.float16 or ml_dtypes.bfloat16) and back to float32."""
    return np.asarray(x, dtype=np.float32).astype(dtype).astype(np.float32)


def attention_ref_np(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, lowp=None):
    """NumPy reference on float32 arrays. lowp=None: fp32 throughout. lowp=<dtype>: the naive
    low-precision version, rounding scores, probabilities and output to that dtype."""
    q, k, v = (np.asarray(a, dtype=np.float32) for a in (q, k, v))
    rnd = (lambda x: round_to(x, lowp)) if lowp is not None else (lambda x: x)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    g = h // hk
    k = np.repeat(k, g, axis=2)
    v = np.repeat(v, g, axis=2)
    scores = rnd(rnd(np.einsum("bthd,bshd->bhts", q, k)) * scale)
    if softcap > 0:
        scores = rnd(np.tanh(scores / softcap) * softcap)
    left, right = mask_bounds(causal, window_size)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    mask = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        mask &= j >= i + sk - sq - left
    if right >= 0:
        mask &= j <= i + sk - sq + right
    scores = np.where(mask, scores, -np.inf)
    row_has = mask.any(axis=-1)
    m = np.where(row_has[:, None], scores.max(axis=-1, keepdims=True), 0.0)
    with np.errstate(divide="ignore"):
        e = np.exp(scores - m)
        s = e.sum(axis=-1, keepdims=True)
        lse = np.where(row_has, (np.log(s) + m)[..., 0], -np.inf)
        p = rnd(np.where(row_has[:, None], e / np.where(s == 0, 1, s), 0.0))
    out = rnd(np.einsum("bhts,bshd->bthd", p, v))
    return out.astype(np.float32), lse.astype(np.float32)


def assert_close_np(out, out_ref, out_naive, what="out", eps=OUT_EPS):
    out = np.asarray(out, dtype=np.float32)
    assert np.isfinite(out).all(), f"{what}: {int((~np.isfinite(out)).sum())} non-finite values"
    err = float(np.abs(out - out_ref).max()) if out.size else 0.0
    naive_err = float(np.abs(out_naive - out_ref).max()) if out.size else 0.0
    bound = 2 * naive_err + eps
    assert err <= bound, f"{what}: max error {err:.3e} > bound {bound:.3e} (naive error {naive_err:.3e})"


def assert_lse_close_np(lse, lse_ref, lse_naive, what="lse"):
    lse = np.asarray(lse, dtype=np.float32)
    assert lse.shape == lse_ref.shape, f"{what}: shape {lse.shape} vs {lse_ref.shape}"
    assert not np.isnan(lse).any(), f"{what}: NaN"
    empty = np.isneginf(lse_ref)
    assert (np.isneginf(lse) == empty).all(), f"{what}: -inf rows differ from the rows that see no key"
    if (~empty).any():
        err = float(np.abs(lse[~empty] - lse_ref[~empty]).max())
        naive_err = float(np.abs(lse_naive[~empty] - lse_ref[~empty]).max())
        bound = 2 * naive_err + LSE_EPS
        assert err <= bound, f"{what}: max error {err:.3e} > bound {bound:.3e} (naive error {naive_err:.3e})"
