"""flashcute.distributed on the CPU: the zigzag layout's helpers, and the ring schedule (forward,
backward, merge by lse, the dK/dV accumulators' trip back to their owner) run by W processes over
torch.distributed's gloo backend with a float32 attention stand-in in place of the GPU kernels,
against autograd through whole-sequence attention. Bad calls raise on every rank; every run has a
deadline, so a hang fails instead of stalling the suite. The GPU runs (NCCL, the flashcute kernels)
are separate.
"""

from __future__ import annotations

import pytest
from ranks import spawn

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import flashcute.distributed as fcd  # noqa: E402


def _scores(q, k, scale, softcap):
    """(b, h, sq, sk) scores, K's heads repeated for GQA; and tanh's value where softcapped."""
    g = q.shape[2] // k.shape[2]
    kk = k.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk.float()) * scale
    if softcap > 0:
        t = torch.tanh(s / softcap)
        return softcap * t, t
    return s, None


def _mask(s, causal):
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(sk - sq + 1), float("-inf"))
    return s


class RefKernels:
    """The per-block forward (out, lse) and backward with the caller's (global) lse, in float32."""

    def fwd(self, q, k, v, causal, scale, softcap):
        s = _mask(_scores(q, k, scale, softcap)[0], causal)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[..., None])
        g = q.shape[2] // k.shape[2]
        out = torch.einsum("bhqk,bkhd->bqhd", p, v.float().repeat_interleave(g, dim=2))
        return out.to(q.dtype), lse

    def bwd(self, dout, q, k, v, out, lse, causal, scale, softcap, deterministic, partial_keys=True):
        s, t = _scores(q, k, scale, softcap)
        p = torch.exp(_mask(s, causal) - lse[..., None])
        b, sk, hk, d = k.shape
        g = q.shape[2] // hk
        vv = v.float().repeat_interleave(g, dim=2)
        dv = torch.einsum("bhqk,bqhd->bkhd", p, dout.float())
        dp = torch.einsum("bqhd,bkhd->bhqk", dout.float(), vv)
        dsum = (dout.float() * out.float()).sum(-1).transpose(1, 2)[..., None]  # (b, h, sq, 1)
        ds = p * (dp - dsum)
        if t is not None:
            ds = ds * (1 - t * t)
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, k.float().repeat_interleave(g, dim=2)) * scale
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.float()) * scale
        fold = (lambda x: x.view(b, sk, hk, g, d).sum(3))
        return dq.to(q.dtype), fold(dk).to(k.dtype), fold(dv).to(v.dtype)


def _whole(q, k, v, causal, scale, softcap):
    """out and lse of the whole sequence, through autograd-friendly ops."""
    s = _mask(_scores(q, k, scale, softcap)[0], causal)
    g = q.shape[2] // k.shape[2]
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v.repeat_interleave(g, dim=2))
    return out, torch.logsumexp(s, dim=-1)


def _init(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=60))


def _ring_worker(rank, world, init_file, causal, h, hk, softcap, split=False):
    _init(rank, world, init_file)
    if split:  # every shard long enough for the backward's calls over halves of the heads
        fcd._SPLIT_HEADS_FROM_TOKENS = 1
    try:
        gen = torch.Generator().manual_seed(7)
        b, s, d = 2, 12 * world, 16
        q = torch.randn(b, s, h, d, generator=gen, requires_grad=True)
        k = torch.randn(b, s, hk, d, generator=gen, requires_grad=True)
        v = torch.randn(b, s, hk, d, generator=gen, requires_grad=True)
        dout = torch.randn(b, s, h, d, generator=gen)
        scale = 0.3
        out_ref, lse_ref = _whole(q, k, v, causal, scale, softcap)
        dq_ref, dk_ref, dv_ref = torch.autograd.grad(out_ref, (q, k, v), dout)
        local = [fcd.shard(x.detach(), causal).requires_grad_() for x in (q, k, v)]
        out, lse = fcd.ring_flash_attn_func(*local, softmax_scale=scale, causal=causal, softcap=softcap,
                                            return_lse=True, _kernels=RefKernels())
        grads = torch.autograd.grad(out, local, fcd.shard(dout, causal))
        want = [out_ref, lse_ref.transpose(1, 2), dq_ref, dk_ref, dv_ref]
        got = [out, lse.transpose(1, 2), *grads]
        for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            w = fcd.shard(w.detach(), causal)
            assert torch.allclose(g, w, atol=2e-5, rtol=1e-4), (rank, name, (g - w).abs().max().item())
        # unshard gives the whole sequence back on every rank
        assert torch.allclose(fcd.unshard(out.detach(), causal), out_ref.detach(), atol=2e-5, rtol=1e-4)
        # check=False: no all-gather (a host synchronisation), the same result
        gather = dist.all_gather
        dist.all_gather = _refuse
        try:
            again = fcd.ring_flash_attn_func(*local, softmax_scale=scale, causal=causal, softcap=softcap, check=False,
                                             _kernels=RefKernels())
        finally:
            dist.all_gather = gather
        assert torch.equal(again, out)
    finally:
        dist.destroy_process_group()


def _refuse(*args, **kwargs):
    raise AssertionError("an all-gather with check=False")


def _mismatch_worker(rank, world, init_file):
    _init(rank, world, init_file)
    try:
        s = 8 if rank == 0 else 12  # rank 1 holds a longer shard
        q = torch.randn(1, s, 2, 16)
        with pytest.raises(ValueError, match="differ"):
            fcd.ring_flash_attn_func(q, q, q, causal=True, _kernels=RefKernels())
    finally:
        dist.destroy_process_group()


def _spawn(fn, world, args, tmp_path, deadline_s=120):
    spawn(fn, world, args, tmp_path, deadline_s)


def test_zigzag_shard_and_unshard_invert_each_other():
    x = torch.arange(2 * 3 * 24).view(2, 24, 3)
    for world in (1, 2, 3):
        shards = [fcd.zigzag_shard(x, world, r) for r in range(world)]
        assert torch.equal(fcd.zigzag_unshard(shards), x)
    # rank 0 of 2 holds chunks 0 and 3 of 4
    assert torch.equal(fcd.zigzag_shard(x, 2, 0), torch.cat([x[:, 0:6], x[:, 18:24]], dim=1))
    with pytest.raises(ValueError, match="not a multiple of 10"):
        fcd.zigzag_shard(x, 5, 0)
    with pytest.raises(ValueError, match="rank"):
        fcd.zigzag_shard(x, 2, 2)


def test_ring_needs_an_initialised_group_and_no_window():
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    q = torch.zeros(1, 4, 2, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        fcd.ring_flash_attn_func(q, q, q)
    with pytest.raises(NotImplementedError, match="window_size"):
        fcd.ring_flash_attn_func(q, q, q, window_size=(8, 0))
    with pytest.raises(TypeError, match="torch tensors"):
        fcd.ring_flash_attn_func(q.numpy(), q, q)
    with pytest.raises(TypeError, match="check: expected a bool"):
        fcd.ring_flash_attn_func(q, q, q, check="yes")


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_matches_the_whole_sequence(tmp_path, world, causal):
    _spawn(_ring_worker, world, (causal, 4, 2, 0.0), tmp_path)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ring_backward_over_halves_of_the_heads(tmp_path, world):
    _spawn(_ring_worker, world, (True, 6, 2, 0.0, True), tmp_path)


def test_head_groups():
    assert fcd._head_groups(1 << 20, 32, 8) == [(slice(0, 16), slice(0, 4)), (slice(16, 32), slice(4, 8))]
    assert fcd._head_groups(1 << 20, 5, 1) == [(slice(0, 5), slice(0, 1))]  # MQA: one call
    assert fcd._head_groups(1024, 32, 8) == [(slice(0, 32), slice(0, 8))]  # a short shard: one call


def test_ring_softcap_and_mqa(tmp_path):
    _spawn(_ring_worker, 2, (True, 4, 1, 5.0), tmp_path)


def test_mismatched_shards_raise_on_every_rank(tmp_path):
    _spawn(_mismatch_worker, 2, (), tmp_path)
