"""Numerical tests of flash_attn_func on torch tensors (GPU), against an fp32 reference.

Rule: flashcute.testing's (FlashAttention's): max |out - ref_fp32| <= 2 * max |naive_lowprec -
ref_fp32| + 1e-5, with fresh torch.randn inputs, the output poisoned with NaN before the call, and
every element checked finite (so an unwritten element fails). lse is checked against the fp32
logsumexp by the same rule, and must be -inf exactly on the rows that see no key.

The grid samples the combinations (head dims incl. padded ones, dtypes, seqlens with Sq != Sk both
ways, causal, windows, softcap, GQA/MQA, packed qkv views, strided out=) instead of taking their
product; it takes a minute or two on an H100.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import pytest

import flashcute
from flashcute.testing import check_attention, visible_mask

pytestmark = pytest.mark.gpu

HEAD_DIMS = [32, 64, 96, 128, 192, 256]
PADDED_HEAD_DIMS = [8, 40, 72, 136, 200]
SEQLENS = [(1, 1), (17, 17), (113, 113), (128, 128), (1000, 1000), (2049, 2049), (1, 1000), (1000, 1), (17, 128),
           (128, 17), (113, 2049), (2049, 113), (1000, 2049), (2049, 1000)]
WINDOWS = [(64, 0), (32, 17), (-1, 8), (8, -1), (0, 0), (5, 3), (256, 256)]
HEADS = [(4, 4), (16, 2), (8, 1), (6, 3)]  # MHA, GQA 8:1, MQA, GQA 2:1
OUT_MODES = ["alloc", "poisoned", "view"]


@dataclass(frozen=True)
class Case:
    dtype: str = "bfloat16"
    d: int = 64
    sq: int = 128
    sk: int = 128
    h: int = 4
    hk: int = 4
    b: int = 2
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    layout: str = "separate"  # or "packed": q, k, v = qkv.unbind(2)
    out_mode: str = "poisoned"
    return_lse: bool = True
    softmax_scale: Optional[float] = None

    @property
    def id(self) -> str:
        parts = [
            {"float16": "fp16", "bfloat16": "bf16"}[self.dtype], f"d{self.d}", f"sq{self.sq}", f"sk{self.sk}",
            f"b{self.b}", f"h{self.h}" + (f"k{self.hk}" if self.hk != self.h else ""),
        ]
        if self.causal:
            parts.append("causal")
        if self.window != (-1, -1):
            parts.append(f"win{self.window[0]}_{self.window[1]}")
        if self.softcap:
            parts.append(f"cap{self.softcap:g}")
        if self.layout != "separate":
            parts.append(self.layout)
        parts.append(self.out_mode)
        if not self.return_lse:
            parts.append("nolse")
        if self.softmax_scale is not None:
            parts.append(f"scale{self.softmax_scale:g}")
        return "-".join(parts)

    def valid(self) -> bool:
        if self.h % self.hk:
            return False
        if self.layout == "packed" and (self.sq != self.sk or self.h != self.hk):
            return False
        # Keep the fp32 reference (b * h * sq * sk scores) small enough for a quick test.
        return self.b * self.h * self.sq * self.sk <= 48 * 2**20


def _fit(c: Case) -> Case:
    """Shrinks batch/heads until the case is cheap enough."""
    while not c.valid() and c.b > 1:
        c = replace(c, b=1)
    while not c.valid() and c.h > c.hk and c.h // 2 % c.hk == 0 and c.h // 2 >= c.hk:
        c = replace(c, h=c.h // 2)
    return c


def _grid():
    cases = []
    dtypes = ["float16", "bfloat16"]
    # Every head dim (kernel and padded) with both dtypes.
    for i, d in enumerate(HEAD_DIMS + PADDED_HEAD_DIMS):
        for j, dtype in enumerate(dtypes):
            sq, sk = SEQLENS[(2 * i + j) % len(SEQLENS)]
            cases.append(Case(dtype=dtype, d=d, sq=sq, sk=sk, causal=bool((i + j) % 2),
                              out_mode=OUT_MODES[(i + j) % 3]))
    # Every seqlen pair, causal and not.
    for i, (sq, sk) in enumerate(SEQLENS):
        for causal in (False, True):
            cases.append(Case(dtype=dtypes[i % 2], d=[64, 128, 96][i % 3], sq=sq, sk=sk, causal=causal,
                              out_mode=OUT_MODES[i % 3], return_lse=bool(i % 4)))
    # Sliding windows on square and rectangular problems.
    for i, window in enumerate(WINDOWS):
        for j, (sq, sk) in enumerate([(128, 128), (113, 2049), (2049, 113), (1000, 1000)]):
            cases.append(Case(dtype=dtypes[(i + j) % 2], d=[64, 128, 40, 256][j], sq=sq, sk=sk, window=window,
                              causal=(i == 1 and j == 3), out_mode=OUT_MODES[(i + j) % 3]))
    # Softcap.
    for i, (sq, sk) in enumerate([(128, 128), (1000, 1000), (113, 2049), (2049, 113)]):
        for causal in (False, True):
            cases.append(Case(dtype=dtypes[i % 2], d=[64, 128, 256, 72][i], sq=sq, sk=sk, causal=causal,
                              softcap=30.0 if i < 3 else 5.0))
    # GQA / MQA.
    for i, (h, hk) in enumerate(HEADS[1:]):
        for j, (sq, sk) in enumerate([(128, 128), (1000, 2049), (2049, 1000)]):
            cases.append(Case(dtype=dtypes[(i + j) % 2], d=[64, 128, 96][j], sq=sq, sk=sk, h=h, hk=hk,
                              causal=bool(j % 2), out_mode=OUT_MODES[(i + j) % 3]))
    # Packed qkv views and strided out=.
    for i, (d, s) in enumerate([(64, 128), (128, 1000), (256, 113), (40, 2049), (136, 17)]):
        cases.append(Case(dtype=dtypes[i % 2], d=d, sq=s, sk=s, layout="packed", causal=bool(i % 2),
                          out_mode=["view", "poisoned"][i % 2]))
    # Explicit softmax_scale.
    cases.append(Case(softmax_scale=0.3, d=128, sq=257, sk=511, causal=True))
    # A random sample of the full product, seeded so the ids are stable.
    rng = random.Random(1234)
    for _ in range(48):
        sq, sk = rng.choice(SEQLENS)
        h, hk = rng.choice(HEADS)
        window = rng.choice(WINDOWS + [(-1, -1)] * 3)
        cases.append(Case(
            dtype=rng.choice(dtypes), d=rng.choice(HEAD_DIMS + PADDED_HEAD_DIMS), sq=sq, sk=sk, h=h, hk=hk,
            b=rng.choice([1, 2, 3]), causal=rng.random() < 0.4, window=window,
            softcap=rng.choice([0.0, 0.0, 0.0, 30.0]), out_mode=rng.choice(OUT_MODES),
            layout="packed" if (sq == sk and h == hk and rng.random() < 0.3) else "separate",
            return_lse=rng.random() < 0.8,
        ))
    cases = [_fit(c) for c in cases]
    assert all(c.valid() for c in cases)
    unique = {c.id: c for c in cases}  # drop accidental duplicates
    return list(unique.values())


GRID = _grid()


def _make_inputs(torch, c: Case, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, c.dtype)
    if c.layout == "packed":
        qkv = torch.randn(c.b, c.sq, 3, c.h, c.d, device="cuda", generator=g).to(dtype)
        q, k, v = qkv.unbind(2)
    else:
        q = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=g).to(dtype)
        k = torch.randn(c.b, c.sk, c.hk, c.d, device="cuda", generator=g).to(dtype)
        v = torch.randn(c.b, c.sk, c.hk, c.d, device="cuda", generator=g).to(dtype)
    return q, k, v


def _nan_bits(torch, dtype):
    return torch.full((1,), float("nan"), dtype=dtype, device="cuda").view(torch.int16)[0].item()


def run_case(torch, c: Case, seed: int = 0):
    q, k, v = _make_inputs(torch, c, seed)
    kwargs = dict(causal=c.causal, window_size=c.window, softcap=c.softcap, return_lse=c.return_lse,
                  softmax_scale=c.softmax_scale)
    buf = view_mask = None
    if c.out_mode == "alloc":
        # Leave NaN in the caching allocator's block of this size, so that an unwritten
        # element of the freshly allocated output most likely reads as NaN.
        torch.full((q.numel(),), float("nan"), dtype=q.dtype, device="cuda")
        res = flashcute.flash_attn_func(q, k, v, **kwargs)
        out = res[0] if c.return_lse else res
    else:
        if c.out_mode == "poisoned":
            out_arg = torch.full((c.b, c.sq, c.h, c.d), float("nan"), dtype=q.dtype, device="cuda")
        else:  # a strided view inside a larger NaN buffer, with guard bytes around it
            buf = torch.full((c.b, c.sq + 2, c.h, c.d + 16), float("nan"), dtype=q.dtype, device="cuda")
            out_arg = buf[:, 1:c.sq + 1, :, 8:8 + c.d]
            view_mask = torch.zeros(buf.shape, dtype=torch.bool, device="cuda")
            view_mask[:, 1:c.sq + 1, :, 8:8 + c.d] = True
        res = flashcute.flash_attn_func(q, k, v, out=out_arg, **kwargs)
        out = res[0] if c.return_lse else res
        assert out is out_arg, "out= must be returned as is"
    torch.cuda.synchronize()

    assert isinstance(out, torch.Tensor)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    lse = None
    if c.return_lse:
        lse = res[1]
        assert isinstance(lse, torch.Tensor) and lse.is_cuda
        assert tuple(lse.shape) == (c.b, c.h, c.sq) and lse.dtype == torch.float32
    check = check_attention(out, q, k, v, lse=lse, softmax_scale=c.softmax_scale, causal=c.causal,
                            window_size=c.window, softcap=c.softcap)
    assert check.ok, check.message

    # Rows that see no key: exactly 0.
    empty_rows = torch.as_tensor(~visible_mask(c.sq, c.sk, c.causal, c.window).any(axis=-1), device=q.device)
    if bool(empty_rows.any()):
        assert bool((out[:, empty_rows] == 0).all()), "rows that see no key must be 0"

    if buf is not None:
        bits = buf.view(torch.int16)
        nan_bits = _nan_bits(torch, q.dtype)
        assert bool((bits[~view_mask] == nan_bits).all()), "out= view: bytes outside the view were written"


@pytest.mark.parametrize("case", GRID, ids=[c.id for c in GRID])
def test_grid(torch, require_kernel, case):
    require_kernel(case.dtype, case.d)
    run_case(torch, case, seed=zlib.crc32(case.id.encode()))


def test_grid_covers_the_spec():
    ids = [c.id for c in GRID]
    for d in HEAD_DIMS + PADDED_HEAD_DIMS:
        for dt in ("fp16", "bf16"):
            assert any(i.startswith(f"{dt}-d{d}-") for i in ids), (dt, d)
    for sq, sk in SEQLENS:
        assert any(f"-sq{sq}-sk{sk}-" in i for i in ids), (sq, sk)
    for key in ["causal", "win64_0", "win32_17", "win-1_8", "cap30", "h16k2", "h8k1", "packed", "view", "alloc"]:
        assert any(key in i for i in ids), key
    assert 100 <= len(GRID) <= 250, len(GRID)


# ------------------------------------------------------------------------------------ targeted cases


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "sq, sk, causal, window",
    [(300, 100, True, (-1, -1)), (300, 100, False, (0, 0)), (128, 128, False, (0, 0)), (64, 200, False, (-1, 0)),
     (1000, 17, True, (3, -1))],
    ids=["causal_sq>sk", "window00_sq>sk", "window00_square", "right0_sq<sk", "causal_left3"],
)
def test_rows_without_keys(torch, require_kernel, dtype, sq, sk, causal, window):
    """Rows that see no key: out exactly 0, lse -inf, no NaN anywhere."""
    require_kernel(dtype, 64)
    c = Case(dtype=dtype, d=64, sq=sq, sk=sk, causal=causal, window=window, out_mode="poisoned")
    mask = torch.as_tensor(visible_mask(sq, sk, causal, window), device="cuda")
    run_case(torch, c, seed=7)
    q, k, v = _make_inputs(torch, c, 8)
    out, lse = flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    torch.cuda.synchronize()
    empty = ~mask.any(dim=-1)
    assert not bool(torch.isnan(out).any()) and not bool(torch.isnan(lse).any())
    assert bool((out[:, empty] == 0).all())
    assert bool(torch.isneginf(lse[:, :, empty]).all())
    assert bool(torch.isfinite(lse[:, :, ~empty]).all())
    if causal and sq > sk:
        assert int(empty.sum()) == sq - sk


def test_window_right_beyond_seqlen_k_follows_the_documented_mask(torch, require_kernel):
    """docs/design.md: query i sees key j iff j <= i + sk - sq + right. With sq = 300, sk = 100 and
    right = 150, rows 0..49 see no key. (FlashAttention-2 treats right >= sk as unbounded, which is
    the documented mask only when right >= sq - 1: plan_fwd normalises by that bound instead.)"""
    require_kernel("bfloat16", 64)
    c = Case(dtype="bfloat16", d=64, sq=300, sk=100, window=(-1, 150), out_mode="poisoned")
    run_case(torch, c, seed=11)


def test_seqlen_k_zero(torch, require_kernel):
    """No keys at all: out = 0 and lse = -inf everywhere (a non-empty output)."""
    require_kernel("float16", 64)
    q = torch.randn(2, 33, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 0, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 0, 2, 64, device="cuda", dtype=torch.float16)
    out_arg = torch.full_like(q, float("nan"))
    out, lse = flashcute.flash_attn_func(q, k, v, out=out_arg, return_lse=True)
    torch.cuda.synchronize()
    assert out is out_arg
    assert bool((out == 0).all())
    assert lse.shape == (2, 4, 33) and bool(torch.isneginf(lse).all())


@pytest.mark.parametrize("shape", [(0, 128, 4, 64), (2, 0, 4, 64)], ids=["batch0", "seqlen_q0"])
@pytest.mark.parametrize("return_lse", [False, True])
def test_zero_size(torch, require_kernel, shape, return_lse):
    require_kernel("bfloat16", shape[3])
    b, sq, h, d = shape
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 64, h, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, 64, h, d, device="cuda", dtype=torch.bfloat16)
    res = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=return_lse)
    out = res[0] if return_lse else res
    assert isinstance(out, torch.Tensor) and out.shape == shape and out.dtype == q.dtype and out.is_cuda
    if return_lse:
        assert res[1].shape == (b, h, sq) and res[1].dtype == torch.float32 and res[1].is_cuda


def test_default_softmax_scale_is_rsqrt_headdim(torch, require_kernel):
    require_kernel("float16", 72)
    q, k, v = (torch.randn(1, 64, 2, 72, device="cuda", dtype=torch.float16) for _ in range(3))
    a = flashcute.flash_attn_func(q, k, v)
    b = flashcute.flash_attn_func(q, k, v, softmax_scale=1 / math.sqrt(72))
    c = flashcute.flash_attn_func(q, k, v, softmax_scale=2 / math.sqrt(72))
    torch.cuda.synchronize()
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_flash_attention_2_call(torch, require_kernel):
    """The call as FlashAttention-2 users write it: positional options, return_attn_probs."""
    require_kernel("bfloat16", 128)
    c = Case(dtype="bfloat16", d=128, sq=300, sk=200, h=8, hk=2)
    q, k, v = _make_inputs(torch, c, 12)
    out, lse, s_dmask = flashcute.flash_attn_func(q, k, v, 0.0, None, True, (-1, -1), 0.0, None, False, True)
    out2, lse2 = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    assert s_dmask is None
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    check = check_attention(out, q, k, v, lse=lse, causal=True)
    assert check.ok, check.message


@pytest.mark.parametrize("d", [32, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("rate", [1.0, 5.0, 12.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_row_maxima_that_grow_across_key_blocks(torch, require_kernel, d, rate, causal):
    """Scores that rise by `rate` (natural-log units) every 128 keys: toward the first key in head 0,
    toward the last in head 1, so that a row's running maximum grows block after block in whichever
    order a kernel walks them: by 1.4, 7.2 or 17 in log2 units a block, below and above the 2^8
    that the sm90 kernel lets the probabilities reach before it moves the maximum and rescales O
    (the lazy rescale). Random inputs never get there: their row maxima settle in the first block."""
    dtype = "bfloat16" if rate != 5.0 else "float16"
    require_kernel(dtype, d)
    sq, sk, h = 1000, 1000, 2
    g = torch.Generator(device="cuda").manual_seed(int(rate * 10) + d + causal)
    e = torch.full((d,), d ** -0.5, device="cuda")  # a unit vector
    # q_i = sqrt(d) e + noise, k_j = c_j e + noise: q_i . k_j / sqrt(d) = c_j + O(1).
    q = d ** 0.5 * e + 0.5 * torch.randn(1, sq, h, d, device="cuda", generator=g)
    ramp = torch.arange(sk, device="cuda", dtype=torch.float32) * (rate / 128)
    c = torch.stack([ramp.flip(0), ramp], dim=-1)  # (sk, h)
    k = c[None, :, :, None] * e + 0.5 * torch.randn(1, sk, h, d, device="cuda", generator=g)
    v = torch.randn(1, sk, h, d, device="cuda", generator=g)
    q, k, v = (t.to(getattr(torch, dtype)) for t in (q, k, v))
    out = torch.full_like(q, float("nan"))
    _, lse = flashcute.flash_attn_func(q, k, v, causal=causal, out=out, return_lse=True)
    torch.cuda.synchronize()
    check = check_attention(out, q, k, v, lse=lse, causal=causal)
    assert check.ok, check.message


def test_results_are_deterministic(torch, require_kernel):
    require_kernel("bfloat16", 128)
    c = Case(dtype="bfloat16", d=128, sq=1000, sk=1000, causal=True)
    q, k, v = _make_inputs(torch, c, 3)
    a = flashcute.flash_attn_func(q, k, v, causal=True)
    b = flashcute.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(a, b)


def test_inputs_are_not_modified(torch, require_kernel):
    require_kernel("float16", 64)
    c = Case(dtype="float16", d=64, sq=128, sk=256, h=8, hk=2)
    q, k, v = _make_inputs(torch, c, 5)
    copies = [t.clone() for t in (q, k, v)]
    flashcute.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    for t, t0 in zip((q, k, v), copies):
        assert torch.equal(t, t0)


# ------------------------------------------------------------------------------------ errors on the GPU


def test_gpu_errors(torch):
    q = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(TypeError, match="k: expected float16 like q, got bfloat16"):
        flashcute.flash_attn_func(q, q.bfloat16(), q)
    with pytest.raises(TypeError, match="q: expected a CUDA array, got a CPU torch.Tensor"):
        flashcute.flash_attn_func(q.cpu(), q, q)
    with pytest.raises(TypeError, match="v: expected a CUDA array, got a CPU torch.Tensor"):
        flashcute.flash_attn_func(q, q, q.cpu())
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 64, 4, 64\) like q"):
        flashcute.flash_attn_func(q, q, q, out=torch.empty(2, 64, 4, 32, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match=r"v: the last dim must be contiguous \(stride 1\), got stride 2"):
        flashcute.flash_attn_func(q, q, torch.randn(2, 64, 4, 128, device="cuda", dtype=torch.float16)[..., ::2])
    with pytest.raises(ValueError, match="q: the data pointer must be 16-byte aligned"):
        flat = torch.randn(2 * 64 * 4 * 64 + 1, device="cuda", dtype=torch.float16)
        flashcute.flash_attn_func(flat[1:].view(2, 64, 4, 64), q, q)


def test_requires_grad_gives_a_differentiable_output(torch, require_kernel):
    # The gradients themselves: tests/python/test_bwd_torch.py.
    require_kernel("float16", 64)
    q = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
    assert flashcute.flash_attn_func(q, k, k).requires_grad
    with torch.no_grad():
        out = flashcute.flash_attn_func(q, k, k)
    torch.cuda.synchronize()
    assert not out.requires_grad and bool(torch.isfinite(out).all())


def test_other_device(torch, require_kernel):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    require_kernel("float16", 64)
    c = Case(dtype="float16", d=64, sq=200, sk=300)
    with torch.cuda.device(1):
        q, k, v = _make_inputs(torch, c, 9)
    # The current device is 0; the tensors live on 1.
    out = flashcute.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize(1)
    assert out.device == q.device
    check = check_attention(out, q, k, v, causal=True)
    assert check.ok, check.message
    with pytest.raises(ValueError, match="k: on cuda:0 but q is on cuda:1"):
        flashcute.flash_attn_func(q, k.to("cuda:0"), v)
