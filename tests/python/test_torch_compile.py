"""flash_attn_func inside the graphs torch users run (GPU): torch.compile (fullgraph, dynamic,
reduce-overhead), CUDA-graph capture, torch.export, sync-debug mode, and torch.library.opcheck.
The same kernel runs in every case, so every result must equal the eager one bit for bit.
"""

from __future__ import annotations

import pytest

import flashcute
from flashcute.testing import check_attention

pytestmark = pytest.mark.gpu


def _inputs(torch, b=2, sq=300, sk=200, h=8, hk=2, d=128, seed=0, dtype="bfloat16"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(b, sq, h, d, device="cuda", generator=g).to(dt)
    k = torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dt)
    v = torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dt)
    return q, k, v


def _attn(q, k, v):
    return flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True)


@pytest.fixture(autouse=True)
def _kernels(require_kernel, torch):
    require_kernel("bfloat16", 128)
    torch._dynamo.reset()


def test_compile_fullgraph_matches_eager(torch):
    q, k, v = _inputs(torch)
    eager_out, eager_lse = _attn(q, k, v)
    explained = torch._dynamo.explain(_attn)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    out, lse = torch.compile(_attn, fullgraph=True)(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    check = check_attention(out, q, k, v, lse=lse, causal=True)
    assert check.ok, check.message


def test_compile_dynamic_batch_and_seqlen(torch):
    f = torch.compile(_attn, fullgraph=True, dynamic=True)
    for i, (b, sq, sk) in enumerate([(1, 64, 64), (3, 257, 100), (2, 17, 1000), (4, 513, 513)]):
        q, k, v = _inputs(torch, b=b, sq=sq, sk=sk, seed=i)
        out, lse = f(q, k, v)
        eager_out, eager_lse = _attn(q, k, v)
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), (b, sq, sk)


def test_compile_reduce_overhead(torch):
    """mode="reduce-overhead" records the call into a CUDA graph and replays it."""
    f = torch.compile(lambda q, k, v: flashcute.flash_attn_func(q, k, v, causal=True), fullgraph=True,
                      mode="reduce-overhead")
    for seed in range(4):  # warm-up, record, replays with new inputs
        q, k, v = _inputs(torch, seed=seed)
        out = f(q, k, v).clone()
        torch.cuda.synchronize()
        assert torch.equal(out, flashcute.flash_attn_func(q, k, v, causal=True)), seed


def test_cuda_graph_capture_and_replay(torch):
    q, k, v = (t.clone() for t in _inputs(torch, seed=10))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graph wants
        for _ in range(2):
            _attn(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = _attn(q, k, v)
    for seed in (11, 12):
        nq, nk, nv = _inputs(torch, seed=seed)
        q.copy_(nq), k.copy_(nk), v.copy_(nv)
        graph.replay()
        eager_out, eager_lse = _attn(nq, nk, nv)
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager_out) and torch.equal(static_lse, eager_lse), seed


def test_no_synchronisation(torch):
    q, k, v = _inputs(torch, seed=20)
    compiled = torch.compile(_attn, fullgraph=True)
    compiled(q, k, v)  # compile outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising torch call raises
    try:
        eager = _attn(q, k, v)
        traced = compiled(q, k, v)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert torch.equal(eager[0], traced[0])


def test_export(torch):
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return flashcute.flash_attn_func(q, k, v, causal=True)

    q, k, v = _inputs(torch, seed=30)
    program = torch.export.export(Attention(), (q, k, v))
    assert "torch.ops.flashcute.fwd.default" in program.graph_module.code
    out = program.module()(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(out, flashcute.flash_attn_func(q, k, v, causal=True))


def test_opcheck(torch):
    """torch.library's own checks of the ops: schema, fake implementation against the real one,
    and that nothing mutates its inputs."""
    q, k, v = _inputs(torch, b=1, sq=65, sk=130, seed=40)
    for op in (torch.ops.flashcute.fwd.default, torch.ops.flashcute.fwd_lse.default):
        torch.library.opcheck(op, (q, k, v, 0.125, True, -1, -1, 0.0),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_eager_keywords_still_work(torch):
    q, k, v = _inputs(torch, seed=50)
    out_arg = torch.full_like(q, float("nan"))
    s = torch.cuda.Stream()
    out = flashcute.flash_attn_func(q, k, v, causal=True, out=out_arg, stream=s)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert out is out_arg and torch.equal(out, flashcute.flash_attn_func(q, k, v, causal=True))
