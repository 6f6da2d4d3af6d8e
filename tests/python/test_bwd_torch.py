"""The backward pass on the GPU: dq, dk, dv against a float32 reference with FlashAttention's rule
(flashcute.testing.check_gradients), through torch autograd on flash_attn_func and through
flash_attn_bwd; determinism; torch.compile of forward + backward; CuPy.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Tuple

import pytest

import flashcute
from flashcute.testing import check_gradients

pytestmark = pytest.mark.gpu


@dataclasses.dataclass(frozen=True)
class Case:
    b: int
    sq: int
    sk: int
    h: int
    hk: int
    d: int
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    scale: float = None  # type: ignore[assignment]
    packed: bool = False  # q, k, v sliced out of one (b, s, 3, h, d) tensor

    @property
    def id(self) -> str:
        s = f"b{self.b}-q{self.sq}-k{self.sk}-h{self.h}:{self.hk}-d{self.d}"
        if self.causal:
            s += "-causal"
        if self.window != (-1, -1):
            s += f"-win{self.window[0]}_{self.window[1]}"
        if self.softcap:
            s += f"-cap{self.softcap}"
        if self.scale is not None:
            s += f"-scale{self.scale}"
        if self.packed:
            s += "-packed"
        return s

    def options(self) -> dict:
        return dict(softmax_scale=self.scale, causal=self.causal, window_size=self.window, softcap=self.softcap)


# Every head dim, odd seqlens both ways, the masks, GQA 8:1, MQA, softcap, a custom scale, packed views.
CASES = [
    Case(2, 128, 128, 4, 4, 64),
    Case(1, 1, 1, 2, 2, 64),
    Case(2, 17, 113, 4, 2, 64, causal=True),
    Case(2, 113, 17, 4, 2, 64, causal=True),  # rows that see no key
    Case(1, 1000, 1030, 8, 1, 64, causal=True),  # MQA
    Case(1, 300, 300, 8, 1, 128, window=(40, 7)),
    Case(2, 257, 300, 16, 2, 128, softcap=30.0),  # GQA 8:1
    Case(1, 513, 513, 4, 4, 128, scale=0.3, causal=True),
    Case(2, 200, 200, 4, 4, 64, packed=True),
    Case(1, 333, 200, 4, 2, 32, window=(0, 0)),
    Case(1, 200, 333, 4, 2, 96, causal=True, softcap=5.0),
    Case(1, 130, 260, 4, 4, 192),
    Case(1, 260, 130, 4, 2, 256, causal=True),
    Case(1, 300, 300, 4, 4, 40, causal=True),  # padded to kernel head dim 64
    Case(1, 100, 170, 2, 2, 136, window=(50, 50)),  # padded to 192
    Case(1, 1100, 1100, 2, 1, 256, causal=True, window=(300, -1)),
    # Every row sees at most 64 keys (the exact D, common/dsum.hpp): a block's keys span two tiles.
    Case(2, 150, 140, 4, 2, 128, window=(20, 20), softcap=10.0),
    Case(1, 200, 200, 2, 2, 256, window=(10, 50)),
]


def _inputs(torch, c: Case, dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    if c.packed:
        assert c.sq == c.sk and c.h == c.hk
        qkv = torch.randn(c.b, c.sq, 3, c.h, c.d, device="cuda", generator=g).to(dt)
        q, k, v = qkv.unbind(2)
    else:
        q = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=g).to(dt)
        k = torch.randn(c.b, c.sk, c.hk, c.d, device="cuda", generator=g).to(dt)
        v = torch.randn(c.b, c.sk, c.hk, c.d, device="cuda", generator=g).to(dt)
    dout = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=g).to(dt)
    return q, k, v, dout


@pytest.mark.parametrize("bwd_path", ["sm80", "sm90"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_autograd_matches_reference(torch, sm90_bwd_why_not, require_kernel, monkeypatch, case, dtype, bwd_path):
    require_kernel(dtype, case.d)
    if bwd_path == "sm90" and (why := sm90_bwd_why_not(case.d, dtype)):
        pytest.skip(why)
    monkeypatch.setenv("FLASHCUTE_BACKWARD_PATH", bwd_path)
    q, k, v, dout = _inputs(torch, case, dtype, seed=hash(case.id) % 1000)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    if case.packed:  # gradients flow into the packed tensor through the strided views
        qkv = torch.stack([x.detach() for x in (q, k, v)], dim=2).requires_grad_()
        qv, kv, vv = qkv.unbind(2)
    else:
        qv, kv, vv = leaves
    out = flashcute.flash_attn_func(qv, kv, vv, **case.options())
    out.backward(dout)
    grads = qkv.grad.unbind(2) if case.packed else tuple(x.grad for x in leaves)
    assert flashcute.last_backward_path() == bwd_path
    check = check_gradients(grads, dout, q, k, v, **case.options())
    assert check.ok, check.message


@pytest.mark.parametrize("bwd_path", ["sm80", "sm90"])
def test_rows_that_see_few_keys(torch, sm90_bwd_why_not, require_kernel, monkeypatch, bwd_path):
    """Rows that see a few keys, where D = rowsum(dO * O) from the rounded O broke the rule (issue 30;
    common/dsum.hpp). First the issue's case: bf16, d 64, batch 2, 113 queries on 2 keys, one head,
    causal, window (16, 100), q/k/v strided views of one packed tensor, deterministic. Then random
    one- to eight-row problems on 1-80 keys; in a float32 simulation of the old D about one in ten
    of these broke the rule."""
    require_kernel("bfloat16", 64)
    monkeypatch.setenv("FLASHCUTE_BACKWARD_PATH", bwd_path)
    g = torch.Generator(device="cuda").manual_seed(30)
    if bwd_path == "sm80" or not sm90_bwd_why_not(64, "bfloat16"):
        packed = torch.randn(2, 113, 3, 1, 64, device="cuda", generator=g).to(torch.bfloat16)
        q, k, v = packed[:, :, 0], packed[:, :2, 1], packed[:, :2, 2]
        dout = torch.randn(2, 113, 1, 64, device="cuda", generator=g).to(torch.bfloat16)
        opts = dict(causal=True, window_size=(16, 100))
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        flashcute.flash_attn_func(*leaves, deterministic=True, **opts).backward(dout)
        assert flashcute.last_backward_path() == bwd_path
        check = check_gradients(tuple(x.grad for x in leaves), dout, q, k, v, **opts)
        assert check.ok, check.message
    rng = random.Random(30)
    ran = 0
    for i in range(40):
        d = rng.choice([64, 128])
        c = Case(rng.randint(1, 2), rng.randint(1, 8), rng.randint(1, 80), 2, rng.choice([1, 2]), d,
                 causal=rng.random() < 0.5,
                 window=rng.choice([(-1, -1), (rng.randint(0, 20), rng.randint(0, 100))]))
        dtype = rng.choice(["bfloat16", "float16"])
        if not flashcute.kernel_head_dim(d) or dtype not in flashcute.compiled_dtypes():
            continue
        if bwd_path == "sm90" and sm90_bwd_why_not(c.d, dtype):
            continue
        q, k, v, dout = _inputs(torch, c, dtype, seed=300 + i)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        flashcute.flash_attn_func(*leaves, **c.options()).backward(dout)
        assert flashcute.last_backward_path() == bwd_path
        check = check_gradients(tuple(x.grad for x in leaves), dout, q, k, v, **c.options())
        assert check.ok, (c.id, dtype, check.message)
        ran += 1
    if ran == 0:
        pytest.skip(f"no random case runs on the {bwd_path} backward with this build and GPU")


# Causal with 300 queries over 40 keys: the first 260 rows see no key, so at d 64 and 128 whole
# query blocks get no dQ add (the sm90 backward writes their zeros in the preprocess where the main
# kernel converts dQ itself).
_NO_KEY_BLOCKS = [Case(1, 300, 40, 4, 2, 128, causal=True), Case(2, 400, 30, 2, 1, 64, causal=True)]


@pytest.mark.parametrize("case", [CASES[2], CASES[6], CASES[12], *_NO_KEY_BLOCKS], ids=lambda c: c.id)
def test_flash_attn_bwd_writes_every_element(torch, require_kernel, case):
    """flash_attn_bwd into NaN-poisoned outputs: every element written, and the same bits as autograd
    (both deterministic: on the sm90 backward three or more dQ adds could land in either order)."""
    require_kernel("bfloat16", case.d)
    q, k, v, dout = _inputs(torch, case, "bfloat16", seed=7)
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, **case.options())
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    res = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, deterministic=True,
                                   **case.options())
    assert res[0] is dq and res[1] is dk and res[2] is dv
    check = check_gradients((dq, dk, dv), dout, q, k, v, **case.options())
    assert check.ok, check.message
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    flashcute.flash_attn_func(*leaves, deterministic=True, **case.options()).backward(dout)
    for a, b in zip((dq, dk, dv), leaves):
        assert torch.equal(a, b.grad)


def test_deterministic_reaches_the_backward(torch, sm90_bwd_why_not, require_kernel, monkeypatch):
    """flash_attn_func's deterministic is the one autograd's backward launch gets, and on a 9.0
    device with the sm90 backward that launch runs it either way (the default path)."""
    require_kernel("bfloat16", 64)
    monkeypatch.delenv("FLASHCUTE_BACKWARD_PATH", raising=False)
    from flashcute import _torch

    seen = []
    launch = _torch._C.bwd
    monkeypatch.setattr(_torch._C, "bwd", lambda *args, **kw: (seen.append(args[11]), launch(*args, **kw))[1])
    c = Case(1, 100, 100, 2, 2, 64, causal=True)
    q, k, v, dout = _inputs(torch, c, "bfloat16", seed=21)
    sm90 = not sm90_bwd_why_not(c.d, "bfloat16")
    for deterministic in (False, True):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        flashcute.flash_attn_func(*leaves, causal=True, deterministic=deterministic).backward(dout)
        assert seen[-1] is deterministic
        assert flashcute.last_backward_path() == ("sm90" if sm90 else "sm80")
        check = check_gradients(tuple(x.grad for x in leaves), dout, q, k, v, causal=True)
        assert check.ok, check.message


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "nomask"])
@pytest.mark.parametrize("d", [64, 128, 192, 256])
@pytest.mark.parametrize("bwd_path", ["sm80", "sm90"])
def test_deterministic_bits(torch, sm90_bwd_why_not, require_kernel, monkeypatch, bwd_path, d, causal):
    """Five runs, the same bits (a GQA case where the sm90 backward's dQ adds from 8-16 key blocks
    would land in any order without deterministic=True). d 192 and 256 run the split-D kernels,
    whose adds are counted by another warp than the one that makes them; without a mask the sm90
    key blocks walk their query blocks rotated (scheduler.hpp, BwdTile), 1000 queries against 1100
    keys so that they are not as many as the query blocks."""
    require_kernel("bfloat16", d)
    case = Case(2, 1000, 1000 if causal else 1100, 16, 2, d, causal=causal)
    if bwd_path == "sm90" and (why := sm90_bwd_why_not(case.d, "bfloat16")):
        pytest.skip(why)
    monkeypatch.setenv("FLASHCUTE_BACKWARD_PATH", bwd_path)
    q, k, v, dout = _inputs(torch, case, "bfloat16", seed=3)
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, causal=causal)
    first = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, causal=causal, deterministic=True)
    assert flashcute.last_backward_path() == bwd_path
    check = check_gradients(first, dout, q, k, v, causal=causal)
    assert check.ok, check.message
    for _ in range(4):
        again = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, causal=causal, deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@pytest.mark.parametrize("bwd_path", ["sm80", "sm90"])
def test_partial_keys_gives_each_blocks_share(torch, sm90_bwd_why_not, require_kernel, monkeypatch, bwd_path):
    """flash_attn_bwd over two blocks of the keys with the whole call's out and lse, as each step of
    ring attention does: with partial_keys=True the blocks' dq sum, and their dk and dv join, to the
    whole gradient by the rule. Without it, every row sees 60 keys of a block, few enough for the
    exact D over that block alone, and the sum fails: the check can fail."""
    require_kernel("bfloat16", 64)
    case = Case(2, 150, 120, 4, 2, 64)
    if bwd_path == "sm90" and (why := sm90_bwd_why_not(case.d, "bfloat16")):
        pytest.skip(why)
    monkeypatch.setenv("FLASHCUTE_BACKWARD_PATH", bwd_path)
    q, k, v, dout = _inputs(torch, case, "bfloat16", seed=11)
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True)
    blocks = (slice(0, 60), slice(60, 120))
    for partial in (True, False):
        parts = [flashcute.flash_attn_bwd(dout, q, k[:, b], v[:, b], out, lse, partial_keys=partial)
                 for b in blocks]
        assert flashcute.last_backward_path() == bwd_path
        grads = (parts[0][0].float() + parts[1][0].float(), torch.cat([parts[0][1], parts[1][1]], dim=1),
                 torch.cat([parts[0][2], parts[1][2]], dim=1))
        check = check_gradients(grads, dout, q, k, v)
        assert check.ok == partial, (partial, check.message or check.summary())


@pytest.mark.parametrize("window", [(-1, 0), (200, 0), (-1, -1)], ids=["causal", "window", "nomask"])
def test_deterministic_with_more_key_blocks_than_sms(torch, sm90_bwd_why_not, require_kernel, window):
    """Deterministic causal and windowed calls whose key blocks (128 keys each at d 128) outnumber
    the SMs: each block waits for the later ones' dQ adds, and while those were launched after it,
    every resident CTA could wait for one not yet running and the call hung (H100, d 192, 16k).
    Without a mask, the most key blocks that still walk rotated (half the SMs: launch_bwd.hpp),
    where a block also waits for blocks launched after it. Run in a child process with a timeout,
    so that a hang fails the test instead of the suite."""
    import os
    import subprocess
    import sys

    require_kernel("bfloat16", 128)
    if why := sm90_bwd_why_not(128, "bfloat16"):
        pytest.skip(why)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seqlen = 128 * (sms // 2 if window == (-1, -1) else sms + 8)
    code = f"""
import torch, flashcute
from flashcute.testing import check_gradients
g = torch.Generator(device="cuda").manual_seed(5)
q, k, v, dout = (torch.randn(1, {seqlen}, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
kw = dict(window_size={window})
out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, **kw)
first = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, deterministic=True, **kw)
assert flashcute.last_backward_path() == "sm90", flashcute.last_backward_path()
again = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, deterministic=True, **kw)
torch.cuda.synchronize()
assert all(torch.equal(a, b) for a, b in zip(first, again)), "deterministic=True gave different bits"
check = check_gradients(first, dout, q, k, v, **kw)
assert check.ok, check.message
print("ok")
"""
    try:
        env = {k: v for k, v in os.environ.items() if k != "FLASHCUTE_BACKWARD_PATH"}  # the default path
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the deterministic backward at seqlen {seqlen}, window {window} did not finish in 240 s")
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
def test_more_tiles_than_sms(torch, sm90_bwd_why_not, require_kernel, causal):
    """d 128's persistent main kernel (sm90/kernel_bwd.hpp) with more (key block, KV head, batch)
    tiles than twice the SMs, so that each CTA takes several in turn: a tile's K and V load while
    the one before stores its dK and dV, and its dQ adds follow the tile before's. GQA 4:1, 300 keys
    (a last key block of 44), by the rule; deterministic twice, the same bits."""
    require_kernel("bfloat16", 128)
    if why := sm90_bwd_why_not(128, "bfloat16"):
        pytest.skip(why)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hk, key_blocks = 8, 3
    b = (2 * sms + hk * key_blocks) // (hk * key_blocks)
    case = Case(b, 200, 300, 4 * hk, hk, 128, causal=causal)
    q, k, v, dout = _inputs(torch, case, "bfloat16", seed=17)
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, causal=causal)
    grads = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, causal=causal)
    assert flashcute.last_backward_path() == "sm90"
    check = check_gradients(grads, dout, q, k, v, causal=causal)
    assert check.ok, check.message
    first = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, causal=causal, deterministic=True)
    check = check_gradients(first, dout, q, k, v, causal=causal)
    assert check.ok, check.message
    again = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, causal=causal, deterministic=True)
    for x, y in zip(first, again):
        assert torch.equal(x, y)


def test_compile_forward_and_backward(torch, require_kernel):
    require_kernel("bfloat16", 64)
    torch._dynamo.reset()
    case = Case(2, 200, 150, 4, 2, 64, causal=True)
    q, k, v, dout = _inputs(torch, case, "bfloat16", seed=11)

    def loss(q, k, v):  # deterministic: compiled and eager grads compared bit for bit
        return (flashcute.flash_attn_func(q, k, v, causal=True, deterministic=True) * dout).sum()

    explained = torch._dynamo.explain(loss)(*(x.detach().requires_grad_() for x in (q, k, v)))
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(loss, fullgraph=True)
    eager_leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    loss(*eager_leaves).backward()
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    compiled(*leaves).backward()
    for a, b in zip(leaves, eager_leaves):
        assert torch.equal(a.grad, b.grad)


def test_lse_is_not_differentiable(torch, require_kernel):
    require_kernel("bfloat16", 64)
    q, k, v, dout = _inputs(torch, Case(1, 64, 64, 2, 2, 64), "bfloat16", seed=13)
    q.requires_grad_()
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


def test_cupy_flash_attn_bwd(torch, cupy, require_kernel):
    require_kernel("float16", 64)
    case = Case(1, 100, 120, 4, 2, 64, causal=True)
    q, k, v, dout = _inputs(torch, case, "float16", seed=17)
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    cq, ck, cv, cdo, co, clse = (cupy.from_dlpack(x) for x in (q, k, v, dout, out, lse))
    dq, dk, dv = flashcute.flash_attn_bwd(cdo, cq, ck, cv, co, clse, causal=True)
    cupy.cuda.get_current_stream().synchronize()
    assert all(isinstance(x, cupy.ndarray) for x in (dq, dk, dv))
    grads = tuple(torch.from_dlpack(x) for x in (dq, dk, dv))
    check = check_gradients(grads, dout, q, k, v, causal=True)
    assert check.ok, check.message


def test_random_cases(torch, require_kernel):
    """Random shapes and options, each checked by the rule."""
    rng = random.Random(1234)
    dims = [d for d in (32, 64, 96, 128, 192, 256) if flashcute.kernel_head_dim(d) == d]
    if not dims:
        pytest.skip("no head dim compiled")
    for i in range(12):
        d = rng.choice(dims) - rng.choice([0, 0, 8])
        hk = rng.choice([1, 2, 4])
        c = Case(rng.randint(1, 3), rng.randint(1, 700), rng.randint(1, 700), hk * rng.choice([1, 2, 4]), hk, d,
                 causal=rng.random() < 0.4, softcap=rng.choice([0.0, 0.0, 20.0]),
                 window=rng.choice([(-1, -1), (-1, -1), (rng.randint(0, 100), rng.randint(0, 100))]))
        dtype = rng.choice(["bfloat16", "float16"])
        if not flashcute.kernel_head_dim(d) or dtype not in flashcute.compiled_dtypes():
            continue
        q, k, v, dout = _inputs(torch, c, dtype, seed=100 + i)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        flashcute.flash_attn_func(*leaves, **c.options()).backward(dout)
        check = check_gradients(tuple(x.grad for x in leaves), dout, q, k, v, **c.options())
        assert check.ok, (c.id, dtype, check.message)
