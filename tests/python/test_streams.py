"""Stream semantics (GPU): flash_attn_func runs on the caller's current stream (or `stream=`),
orders itself after pending work there, and never synchronises the device or blocks the host.

The hazard detector: q is produced on a side stream behind ~100 ms of queued matmuls, into a
block that the caching allocator previously filled with NaN. A kernel on any other stream (or
one that is not ordered after the producer) reads NaN or stale data and the comparison fails.
"""

from __future__ import annotations

import pytest

import flashcute
from flashcute.testing import check_attention

pytestmark = pytest.mark.gpu

# Stream semantics do not depend on the shape: a head dim and dtype this build has kernels for.
B, S, H = 2, 1024, 8
D = 128 if flashcute.kernel_head_dim(128) else max(flashcute.compiled_head_dims())
DTYPE = "bfloat16" if "bfloat16" in flashcute.compiled_dtypes() else "float16"


def _busy(torch, ms_target: float = 100.0):
    """Queues roughly ms_target ms of fp32 matmuls on the current stream; returns the tensors."""
    x = torch.randn(4096, 4096, device="cuda")
    y = x
    for _ in range(max(1, int(ms_target / 2))):  # ~2-3 ms per 4096^3 fp32 matmul on an H100
        y = y @ x
        y = y / y.abs().amax().clamp_min(1.0)  # keep it finite
    return y


def _sources(torch, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda: torch.randn(B, S, H, D, device="cuda", generator=g, dtype=getattr(torch, DTYPE))  # noqa: E731
    q_src, k, v = mk(), mk(), mk()
    torch.cuda.synchronize()
    return q_src, k, v


def _produce_behind_pending_work(torch, q_src):
    """On the current stream: poison the next block of q's size with NaN, queue ~100 ms of
    work, then q = q_src * 1 (so q is only valid once that work is done)."""
    torch.full((q_src.numel(),), float("nan"), dtype=q_src.dtype, device="cuda")  # freed at once
    busy = _busy(torch)
    q = q_src * 1
    return q, busy


def _warm_up(torch, q_src, k, v):
    """One call up front, so that the caching allocator already holds an output block (a fresh
    cudaMalloc may synchronise on its own) and the kernel is loaded. Two outputs alive at once
    leave two blocks of q's size cached: one for q, one for the output of the call under test."""
    outs = [flashcute.flash_attn_func(q_src, k, v, causal=True) for _ in range(2)]
    torch.cuda.synchronize()
    del outs


def _check(torch, out, q_src, k, v, causal=True, lse=None):
    check = check_attention(out, q_src, k, v, lse=lse, causal=causal)
    assert check.ok, check.message


def test_current_stream_without_sync(torch):
    q_src, k, v = _sources(torch)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _warm_up(torch, q_src, k, v)
        q, busy = _produce_behind_pending_work(torch, q_src)
        torch.cuda.set_sync_debug_mode("error")  # any synchronising torch call inside raises
        try:
            out = flashcute.flash_attn_func(q, k, v, causal=True)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert not s.query(), "flash_attn_func waited for the stream (the host blocked)"
    torch.cuda.synchronize()
    _check(torch, out, q_src, k, v)
    del busy


def test_no_device_synchronisation(torch):
    """Work pending on another stream is still pending after the call."""
    q_src, k, v = _sources(torch, 1)
    _warm_up(torch, q_src, k, v)
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        busy = _busy(torch, 200.0)
    out = flashcute.flash_attn_func(q_src, k, v, causal=True)
    assert not other.query(), "flash_attn_func synchronised the device"
    torch.cuda.synchronize()
    _check(torch, out, q_src, k, v)
    del busy


def _stream_arg_cases(torch, s):
    class Protocol:  # the CUDA stream protocol (cuda.core)
        def __init__(self, stream):
            self.stream = stream

        def __cuda_stream__(self):
            return (0, self.stream.cuda_stream)

    return {"int": s.cuda_stream, "cuda_stream_protocol": Protocol(s), "torch_stream": s}


@pytest.mark.parametrize("kind", ["int", "cuda_stream_protocol", "torch_stream"])
def test_stream_argument(torch, kind):
    """stream= names a side stream on which q is produced behind pending work; the call is made
    from the default stream and must run on (and be ordered in) the named stream."""
    q_src, k, v = _sources(torch, 2)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _warm_up(torch, q_src, k, v)
        q, busy = _produce_behind_pending_work(torch, q_src)
    out = flashcute.flash_attn_func(q, k, v, causal=True, stream=_stream_arg_cases(torch, s)[kind])
    assert not s.query(), "flash_attn_func waited for the stream"
    # The result is ready in s's order: read it there.
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    _check(torch, out, q_src, k, v)
    del busy


def test_stream_argument_waits_for_current_stream(torch):
    """Inputs produced on the current stream (the framework's convention) are ready for a
    kernel launched on another stream via stream=."""
    q_src, k, v = _sources(torch, 3)
    q, busy = _produce_behind_pending_work(torch, q_src)  # on the default stream
    s = torch.cuda.Stream()
    out = flashcute.flash_attn_func(q, k, v, causal=True, stream=s)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    _check(torch, out, q_src, k, v)
    del busy


def test_stream_argument_with_lse(torch):
    """stream= with return_lse: both outputs are produced on that stream (read them there)."""
    q_src, k, v = _sources(torch, 4)
    s = torch.cuda.Stream()
    out, lse = flashcute.flash_attn_func(q_src, k, v, causal=True, stream=s, return_lse=True)
    with torch.cuda.stream(s):
        out2 = out.clone()
        lse2 = lse.clone()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    _check(torch, out2, q_src, k, v, lse=lse2)


def test_cupy_current_stream(cupy, torch, require_kernel):
    """CuPy: q produced on a non-default CuPy stream behind pending work; call inside it."""
    import numpy as np

    require_kernel("float16", 64)

    rng = np.random.default_rng(5)
    host = [rng.standard_normal((1, 512, 4, 64)).astype(np.float16) for _ in range(3)]
    q_src, k, v = (cupy.asarray(a) for a in host)
    cupy.cuda.Device().synchronize()
    s = cupy.cuda.Stream(non_blocking=True)

    def pending_work(x, rounds):
        y = x
        for _ in range(rounds):
            y = y @ x
            y = y / cupy.maximum(cupy.abs(y).max(), 1.0)
        return y

    with s:
        x = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)
        pending_work(x, 1)  # CuPy compiles its kernels on first use, on the host: not in the timed region
        q_src * 1
    s.synchronize()
    with s:
        pending_work(x, 30)
        q = q_src * 1
        out = flashcute.flash_attn_func(q, k, v, causal=True)
        assert not s.done, "flash_attn_func waited for the stream"
    s.synchronize()
    tq, tk, tv = (torch.as_tensor(a, device="cuda") for a in host)
    _check(torch, torch.as_tensor(cupy.asnumpy(out), device="cuda"), tq, tk, tv)


def test_stream_argument_of_the_other_entry_points(torch):
    """stream= on flash_attn_bwd, flash_attn_varlen_func and merge_attn_states: each waits for the
    current stream, where its inputs are produced behind pending work, and runs on the named one;
    the results equal those of plain calls."""
    q_src, k, v = _sources(torch, 5)
    dout = torch.randn_like(q_src)
    out, lse = flashcute.flash_attn_func(q_src, k, v, causal=True, return_lse=True)
    # deterministic=True: the default backward adds dQ in arrival order, not the same bits every run.
    ref_grads = flashcute.flash_attn_bwd(dout, q_src, k, v, out, lse, causal=True, deterministic=True)
    cu = torch.arange(0, B * S + 1, S, dtype=torch.int32, device="cuda")
    flat = [x.reshape(B * S, H, D) for x in (q_src, k, v)]
    ref_varlen = flashcute.flash_attn_varlen_func(*flat, cu, cu, S, S, causal=True)
    ref_merge = flashcute.merge_attn_states(out, lse, out, lse)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()

    q, busy = _produce_behind_pending_work(torch, q_src)
    grads = flashcute.flash_attn_bwd(dout, q, k, v, out, lse, causal=True, deterministic=True, stream=s)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))

    q, busy = _produce_behind_pending_work(torch, q_src)
    res = flashcute.flash_attn_varlen_func(q.reshape(B * S, H, D), *flat[1:], cu, cu, S, S, causal=True, stream=s)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(res, ref_varlen)

    o2, busy = _produce_behind_pending_work(torch, out)
    res = flashcute.merge_attn_states(o2, lse, out, lse, stream=s)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(res[0], ref_merge[0]) and torch.equal(res[1], ref_merge[1])
    del busy
