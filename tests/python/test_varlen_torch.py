"""flash_attn_varlen_func on the GPU: packed batches of sequences of different lengths (0 and 1
included), forward and backward, each sequence checked against the float32 reference with
FlashAttention's rule (flashcute.testing), and bit for bit against a fixed-length call of that
sequence alone; outputs poisoned with NaN, guards around them; cu_seqlens never read on the host
(CUDA-graph replay with new lengths) and never able to move a kernel outside its arrays.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Tuple

import pytest

import flashcute
from flashcute.testing import check_attention, check_gradients

pytestmark = pytest.mark.gpu


@dataclass(frozen=True)
class Case:
    lens_q: Tuple[int, ...]
    lens_k: Tuple[int, ...]
    h: int = 4
    hk: int = 2
    d: int = 64
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0

    @property
    def id(self) -> str:
        s = f"q{'_'.join(map(str, self.lens_q))}-k{'_'.join(map(str, self.lens_k))}-h{self.h}:{self.hk}-d{self.d}"
        if self.causal:
            s += "-causal"
        if self.window != (-1, -1):
            s += f"-win{self.window[0]}_{self.window[1]}"
        if self.softcap:
            s += f"-cap{self.softcap:g}"
        return s

    def options(self) -> dict:
        return dict(causal=self.causal, window_size=self.window, softcap=self.softcap)


CASES = [
    Case((17, 1, 0, 113), (17, 40, 5, 113)),                     # an empty and a one-row sequence
    Case((128, 300, 1), (300, 128, 1), causal=True),               # Sq != Sk both ways, bottom-right per sequence
    Case((1000, 17), (1030, 0), h=8, hk=1, causal=True),           # MQA, a sequence without keys
    Case((0, 200, 77), (50, 200, 77), h=16, hk=2, d=128, window=(40, 7)),  # GQA 8:1
    Case((250, 64), (250, 64), d=256, softcap=20.0),
    Case((300, 33, 65), (310, 1, 64), h=4, hk=4, d=96, causal=True, window=(-1, 16)),
    Case((70, 130), (130, 70), d=40),                              # padded to kernel head dim 64
    # Equal query lengths: on sm90 the walk over the longest sequence's tiles (the others take the
    # walk over the sequences' units).
    Case((256, 256, 256), (256, 256, 256), h=4, hk=2, d=128, causal=True),
    Case((200, 200), (150, 260), d=64),
    # Equal query and key lengths, passed as one cu_seqlens array (self-attention): at d <= 64 the
    # sm90 backward's lean preprocess, with a leading or a trailing exact-D run per sequence; a
    # narrow window keeps every block on the full preprocess.
    Case((1, 113, 1000, 64, 65), (1, 113, 1000, 64, 65), h=4, hk=2, d=64, causal=True),
    Case((200, 17, 129), (200, 17, 129), d=64, window=(10, 60)),
    Case((300, 50), (300, 50), d=64, window=(16, 20)),
]


def _cu(torch, lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


def _inputs(torch, c: Case, dtype: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    tq, tk = sum(c.lens_q), sum(c.lens_k)
    q = torch.randn(tq, c.h, c.d, device="cuda", generator=g).to(dt)
    k = torch.randn(tk, c.hk, c.d, device="cuda", generator=g).to(dt)
    v = torch.randn(tk, c.hk, c.d, device="cuda", generator=g).to(dt)
    dout = torch.randn(tq, c.h, c.d, device="cuda", generator=g).to(dt)
    return q, k, v, dout


def _spans(lens) -> List[Tuple[int, int]]:
    out, s = [], 0
    for n in lens:
        out.append((s, s + n))
        s += n
    return out


@pytest.fixture
def same_kernels_as_varlen(monkeypatch):
    """A test that compares a varlen call bit for bit with fixed-length calls runs both on the
    same kernels: here the sm80 ones, forward and backward (on an H100/H200 the forward would
    otherwise take the sm90 kernels, whose results differ from the sm80 ones in the last bits)."""
    monkeypatch.setenv("FLASHCUTE_FORWARD_PATH", "sm80")
    monkeypatch.setenv("FLASHCUTE_BACKWARD_PATH", "sm80")


@pytest.mark.parametrize("fwd_path", ["sm80", "sm90"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_forward_per_sequence(torch, require_kernel, sm90_fwd_why_not, monkeypatch, case, dtype, fwd_path):
    """Each sequence by the rule, and bit for bit the sequence alone through flash_attn_func on
    the same forward path (sm90: the first tile table, which the varlen kernel uses): the rows a
    sequence's last tiles read past its end, the next sequence's, must change nothing."""
    require_kernel(dtype, case.d)
    if fwd_path == "sm90" and (why := sm90_fwd_why_not(case.d, dtype)):
        pytest.skip(why)
    monkeypatch.setenv("FLASHCUTE_FORWARD_PATH", fwd_path)
    monkeypatch.setenv("FLASHCUTE_SM90_TILES", "base")
    q, k, v, _ = _inputs(torch, case, dtype, seed=hash(case.id) % 1000)
    cu_q, cu_k = _cu(torch, case.lens_q), _cu(torch, case.lens_k)
    # out is a view into a NaN-poisoned buffer with guard rows on both sides.
    guard = 5
    buf = torch.full((q.shape[0] + 2 * guard, case.h, case.d), float("nan"), dtype=q.dtype, device="cuda")
    out = buf[guard:guard + q.shape[0]]
    res, lse = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(case.lens_q), max(case.lens_k),
                                                return_lse=True, out=out, **case.options())
    assert res is out and lse.shape == (case.h, q.shape[0]) and lse.dtype == torch.float32
    assert flashcute.last_forward_path() == fwd_path
    assert torch.isnan(buf[:guard]).all() and torch.isnan(buf[guard + q.shape[0]:]).all(), "a guard row was written"
    for (q0, q1), (k0, k1) in zip(_spans(case.lens_q), _spans(case.lens_k)):
        if q1 == q0:
            continue
        if k1 == k0:  # no key: out = 0 and lse = -inf (the reference takes no empty key set)
            assert not out[q0:q1].any() and bool((lse[:, q0:q1] == float("-inf")).all())
            continue
        qs, ks, vs = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        check = check_attention(out[None, q0:q1], qs, ks, vs, lse=lse[None, :, q0:q1], **case.options())
        assert check.ok, (q0, q1, k0, k1, check.message)
        # The same bits as the sequence alone through flash_attn_func.
        alone, alone_lse = flashcute.flash_attn_func(qs, ks, vs, return_lse=True, **case.options())
        assert torch.equal(out[None, q0:q1], alone)
        assert torch.equal(lse[None, :, q0:q1], alone_lse)


@pytest.mark.parametrize("bwd_path", ["sm80", "sm90"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_backward_per_sequence(torch, sm90_bwd_why_not, require_kernel, monkeypatch, case, dtype, bwd_path,
                               same_kernels_as_varlen):
    """Each sequence's gradients by the rule, and bit for bit those of the sequence alone through
    flash_attn_func on the same backward path. On the sm90 path both calls are deterministic (its
    dQ adds otherwise land in any order): a sequence's padding rows, which the sm90 kernels read
    from the next sequence, must add exact zeros."""
    require_kernel(dtype, case.d)
    if bwd_path == "sm90" and (why := sm90_bwd_why_not(case.d, dtype)):
        pytest.skip(why)
    monkeypatch.setenv("FLASHCUTE_BACKWARD_PATH", bwd_path)
    det = dict(deterministic=bwd_path == "sm90")
    q, k, v, dout = _inputs(torch, case, dtype, seed=hash(case.id) % 1000 + 1)
    cu_q = _cu(torch, case.lens_q)
    cu_k = cu_q if case.lens_k == case.lens_q else _cu(torch, case.lens_k)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = flashcute.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(case.lens_q), max(case.lens_k), **det,
                                           **case.options())
    out.backward(dout)
    assert flashcute.last_backward_path() == bwd_path
    dq, dk, dv = (x.grad for x in leaves)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    for (q0, q1), (k0, k1) in zip(_spans(case.lens_q), _spans(case.lens_k)):
        grads = (dq[None, q0:q1], dk[None, k0:k1], dv[None, k0:k1])
        if q1 == q0:  # no query: the keys get zero gradients
            assert not grads[1].any() and not grads[2].any()
            continue
        if k1 == k0:
            assert not grads[0].any()
            continue
        args = (dout[None, q0:q1], q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
        check = check_gradients(grads, *args, **case.options())
        assert check.ok, (q0, q1, k0, k1, check.message)
        alone = [x.detach().requires_grad_() for x in args[1:]]
        flashcute.flash_attn_func(*alone, **det, **case.options()).backward(args[0])
        for a, b in zip(grads, alone):
            assert torch.equal(a, b.grad)


def test_random_batches(torch, require_kernel):
    """Random lengths (0 and 1 likely), head ratios and options, forward and backward by the rule."""
    rng = random.Random(4321)
    dims = [d for d in (32, 64, 96, 128, 192, 256) if flashcute.kernel_head_dim(d) == d]
    if not dims:
        pytest.skip("no head dim compiled")
    require_kernel("bfloat16", dims[0])
    for i in range(8):
        b = rng.randint(1, 6)
        lens_q = tuple(rng.choice([0, 1, rng.randint(1, 400)]) for _ in range(b))
        lens_k = tuple(rng.choice([0, 1, rng.randint(1, 400)]) for _ in range(b))
        hk = rng.choice([1, 2, 4])
        c = Case(lens_q, lens_k, h=hk * rng.choice([1, 2, 4]), hk=hk, d=rng.choice(dims), causal=rng.random() < 0.5,
                 window=rng.choice([(-1, -1), (rng.randint(0, 64), rng.randint(0, 64))]))
        if max(lens_q) == 0:
            continue
        q, k, v, dout = _inputs(torch, c, "bfloat16", seed=500 + i)
        cu_q, cu_k = _cu(torch, lens_q), _cu(torch, lens_k)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out, lse = flashcute.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True,
                                                    **c.options())
        out.backward(dout)
        for (q0, q1), (k0, k1) in zip(_spans(lens_q), _spans(lens_k)):
            if q1 == q0 or k1 == k0:
                continue
            args = (q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
            check = check_attention(out.detach()[None, q0:q1], *args, lse=lse[None, :, q0:q1], **c.options())
            assert check.ok, (c.id, check.message)
            grads = (leaves[0].grad[None, q0:q1], leaves[1].grad[None, k0:k1], leaves[2].grad[None, k0:k1])
            check = check_gradients(grads, dout[None, q0:q1], *args, **c.options())
            assert check.ok, (c.id, check.message)


def test_fa2_return_conventions(torch, require_kernel):
    require_kernel("bfloat16", 64)
    c = Case((10, 20), (10, 20))
    q, k, v, _ = _inputs(torch, c, "bfloat16", seed=1)
    cu = _cu(torch, c.lens_q)
    out = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, 20, 20)
    out2, lse, none = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, 20, 20, 0.0, None, False, (-1, -1), 0.0,
                                                       None, False, True)
    out3, lse3 = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, 20, 20, return_softmax_lse=True)
    assert none is None and torch.equal(out, out2) and torch.equal(out, out3) and torch.equal(lse, lse3)
    assert lse.shape == (4, 30)


def test_cuda_graph_replays_with_new_lengths(torch, require_kernel):
    """cu_seqlens live on the device: a captured call replayed with new lengths matches eager."""
    require_kernel("bfloat16", 64)
    c = Case((100, 50, 7), (80, 120, 7), causal=True)
    q, k, v, _ = _inputs(torch, c, "bfloat16", seed=2)
    cu_q, cu_k = _cu(torch, c.lens_q), _cu(torch, c.lens_k)
    out = torch.empty_like(q)
    flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 157, 207, causal=True, out=out)  # warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 157, 207, causal=True, out=out)
    for lens_q, lens_k in (((100, 50, 7), (80, 120, 7)), ((1, 156, 0), (200, 7, 0)), ((157, 0, 0), (0, 207, 0))):
        cu_q.copy_(_cu(torch, lens_q))
        cu_k.copy_(_cu(torch, lens_k))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 157, 207, causal=True)
        assert torch.equal(out, eager), (lens_q, lens_k)


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_backward_more_tiles_than_sms(torch, sm90_bwd_why_not, require_kernel, deterministic):
    """d 128's persistent sm90 backward over a batch of one long sequence and many short ones (and
    empty ones): more tiles than twice the SMs, most of them past their sequence's keys (skipped).
    Each sequence's gradients by the rule; a sequence without queries gets zero dk and dv."""
    require_kernel("bfloat16", 128)
    if why := sm90_bwd_why_not(128, "bfloat16"):
        pytest.skip(why)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hk = 4
    short = (2 * sms) // (3 * hk) + 1  # 3 key blocks (the long sequence's) per sequence and KV head
    lens_q = (300,) + tuple((0, 1, 70, 129)[i % 4] for i in range(short))
    lens_k = (330,) + tuple((5, 64, 130, 0)[i % 4] for i in range(short))
    case = Case(lens_q, lens_k, h=2 * hk, hk=hk, d=128, causal=True)
    q, k, v, dout = _inputs(torch, case, "bfloat16", seed=23)
    cu_q, cu_k = _cu(torch, lens_q), _cu(torch, lens_k)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = flashcute.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                           deterministic=deterministic)
    out.backward(dout)
    assert flashcute.last_backward_path() == "sm90"
    dq, dk, dv = (x.grad for x in leaves)
    for (q0, q1), (k0, k1) in zip(_spans(lens_q), _spans(lens_k)):
        if q1 == q0:
            assert not dk[k0:k1].any() and not dv[k0:k1].any()
            continue
        if k1 == k0:
            assert not dq[q0:q1].any()
            continue
        grads = (dq[None, q0:q1], dk[None, k0:k1], dv[None, k0:k1])
        check = check_gradients(grads, dout[None, q0:q1], q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                                causal=True)
        assert check.ok, (q0, q1, k0, k1, check.message)


def test_garbage_cu_seqlens_stay_inside_the_arrays(torch, require_kernel):
    """Out-of-range, negative and decreasing entries are clamped on the device: no fault, and no
    write outside out (guards) or into other memory (compute-sanitizer checks the reads)."""
    require_kernel("bfloat16", 64)
    tq, tk, h, d = 64, 48, 2, 64
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(tq, h, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(tk, h, d, device="cuda", generator=g).bfloat16()
    v = torch.randn(tk, h, d, device="cuda", generator=g).bfloat16()
    guard = 8
    buf = torch.full((tq + 2 * guard, h, d), 7.0, dtype=torch.bfloat16, device="cuda")
    out = buf[guard:guard + tq]
    for cu_q, cu_k in (([0, 1 << 30, -5, 64], [-100, 10, 9, 1 << 20]), ([64, 0, 64, 0], [48, 48, 0, 12])):
        cq = torch.tensor(cu_q, dtype=torch.int32, device="cuda")
        ck = torch.tensor(cu_k, dtype=torch.int32, device="cuda")
        flashcute.flash_attn_varlen_func(q, k, v, cq, ck, 200, 200, out=out, causal=True)
        torch.cuda.synchronize()
        assert (buf[:guard] == 7).all() and (buf[guard + tq:] == 7).all()
        assert not torch.isnan(out).any()
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        flashcute.flash_attn_varlen_func(*leaves, cq, ck, 200, 200, causal=True).sum().backward()
        torch.cuda.synchronize()
        assert all(torch.isfinite(x.grad).all() for x in leaves)


def test_descending_cu_seqlens_end_deterministic_backward(torch, require_kernel):
    """cu_seqlens that descend give sequences whose rows overlap (here sequences 0 and 2 both
    take rows [0, 1000)). The sm90 backward's deterministic dQ turns, counted per block of the
    workspace, then meet another sequence's counts there: the call must still end (wait_turn
    waits for count >= turn), with finite gradients."""
    require_kernel("bfloat16", 64)
    tq, tk, h, d = 1000, 600, 2, 64
    g = torch.Generator(device="cuda").manual_seed(5)
    leaves = [torch.randn(n, h, d, device="cuda", generator=g).bfloat16().requires_grad_() for n in (tq, tk, tk)]
    cq = torch.tensor([0, tq, 0, tq], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, tk, 0, tk], dtype=torch.int32, device="cuda")
    flashcute.flash_attn_varlen_func(*leaves, cq, ck, tq, tk, deterministic=True).sum().backward()
    torch.cuda.synchronize()
    assert all(torch.isfinite(x.grad).all() for x in leaves)


def test_torch_compile_forward_and_backward(torch, require_kernel):
    require_kernel("bfloat16", 64)
    torch._dynamo.reset()
    c = Case((100, 30, 1), (90, 60, 5), causal=True)
    q, k, v, dout = _inputs(torch, c, "bfloat16", seed=4)
    cu_q, cu_k = _cu(torch, c.lens_q), _cu(torch, c.lens_k)

    def loss(q, k, v):
        return (flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 100, 90, causal=True) * dout).sum()

    explained = torch._dynamo.explain(loss)(*(x.detach().requires_grad_() for x in (q, k, v)))
    assert explained.graph_break_count == 0, explained.break_reasons
    eager = [x.detach().requires_grad_() for x in (q, k, v)]
    loss(*eager).backward()
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    torch.compile(loss, fullgraph=True)(*leaves).backward()
    for a, b in zip(leaves, eager):
        assert torch.equal(a.grad, b.grad)


def test_opcheck(torch, require_kernel):
    require_kernel("bfloat16", 64)
    c = Case((20, 9), (15, 30), causal=True)
    q, k, v, dout = _inputs(torch, c, "bfloat16", seed=5)
    cu_q, cu_k = _cu(torch, c.lens_q), _cu(torch, c.lens_k)
    args = (q, k, v, cu_q, cu_k, 20, 30, 0.125, True, -1, -1, 0.0)
    torch.library.opcheck(torch.ops.flashcute.varlen_fwd.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_cupy(torch, cupy, require_kernel):
    require_kernel("float16", 64)
    c = Case((33, 0, 70), (40, 9, 70), causal=True)
    q, k, v, _ = _inputs(torch, c, "float16", seed=6)
    cu_q, cu_k = _cu(torch, c.lens_q), _cu(torch, c.lens_k)
    ref, ref_lse = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 70, causal=True, return_lse=True)
    torch.cuda.synchronize()
    arrays = [cupy.from_dlpack(x) for x in (q, k, v, cu_q, cu_k)]
    out, lse = flashcute.flash_attn_varlen_func(*arrays, 70, 70, causal=True, return_lse=True)
    cupy.cuda.get_current_stream().synchronize()
    assert isinstance(out, cupy.ndarray)
    assert torch.equal(torch.from_dlpack(out), ref) and torch.equal(torch.from_dlpack(lse), ref_lse)


def test_device_errors(torch, require_kernel):
    require_kernel("bfloat16", 64)
    c = Case((10, 20), (10, 20))
    q, k, v, _ = _inputs(torch, c, "bfloat16", seed=7)
    cu = _cu(torch, c.lens_q)
    with pytest.raises(TypeError, match="cu_seqlens_k: expected a CUDA array"):
        flashcute.flash_attn_varlen_func(q, k, v, cu, cu.cpu(), 20, 20)
    with pytest.raises(TypeError, match="cu_seqlens_q: expected int32"):
        flashcute.flash_attn_varlen_func(q, k, v, cu.long(), cu, 20, 20)
    with pytest.raises(ValueError, match="q: expected 3 dims"):
        flashcute.flash_attn_varlen_func(q[None], k, v, cu, cu, 20, 20)
