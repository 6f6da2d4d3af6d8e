"""The torch custom op flashcute::fwd without a GPU: registration, the fake implementation, and
tracing with torch.compile / torch.export on meta tensors (CI runs these with a CPU torch).

Meta tensors carry shapes, dtypes and strides but no data, and run an op's fake implementation,
so everything a tracer sees can be checked here; tests/python/test_torch_compile.py runs the
same on the GPU and compares values.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import _torch  # noqa: E402,F401  (registers the op)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


# The dtype the traced calls use: one this build compiled (FLASHCUTE_DTYPES may leave either out).
DTYPE = torch.float16 if "float16" in flashcute.compiled_dtypes() else torch.bfloat16


def meta(*shape, dtype=DTYPE):
    return torch.empty(shape, dtype=dtype, device="meta")


def attn(q, k, v, **kw):
    return flashcute.flash_attn_func(q, k, v, **kw)


ARGS = ("(Tensor q, Tensor k, Tensor v, float? softmax_scale, bool causal, SymInt window_left, "
        "SymInt window_right, float softcap)")


def test_ops_are_registered_with_their_schemas():
    assert str(torch.ops.flashcute.fwd.default._schema) == f"flashcute::fwd{ARGS} -> Tensor"
    # fwd_lse's deterministic is its backward's (flash_attn_func's argument, kept for autograd).
    lse_args = ARGS[:-1] + ", bool deterministic=False)"
    assert str(torch.ops.flashcute.fwd_lse.default._schema) == f"flashcute::fwd_lse{lse_args} -> (Tensor, Tensor)"


def test_fake_implementations():
    q, k = meta(2, 128, 8, 64), meta(2, 100, 4, 64)
    out = torch.ops.flashcute.fwd(q, k, k, 0.125, True, -1, -1, 0.0)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    out, lse = torch.ops.flashcute.fwd_lse(q, k, k, 0.125, True, -1, -1, 0.0)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (2, 8, 128) and lse.is_contiguous()


def test_traced_call_without_lse_uses_the_op_without_lse():
    q, k = meta(2, 128, 8, 64), meta(2, 100, 4, 64)
    for return_lse, op in ((False, "flashcute.fwd.default"), (True, "flashcute.fwd_lse.default")):
        explained = torch._dynamo.explain(lambda q, k, v: attn(q, k, v, return_lse=return_lse))(q, k, k)
        code = explained.graphs[0].code
        assert op in code and code.count("flashcute.") == 1, code


def test_fake_implementation_validates():
    with pytest.raises(ValueError, match="k: batch 3 does not match q's batch 2"):
        torch.ops.flashcute.fwd(meta(2, 128, 8, 64), meta(3, 100, 4, 64), meta(3, 100, 4, 64), 0.125, False, -1, -1,
                                0.0)
    with pytest.raises(TypeError, match=f"v: expected {str(DTYPE).split('.')[-1]} like q, got float32"):
        torch.ops.flashcute.fwd_lse(meta(2, 128, 8, 64), meta(2, 100, 4, 64),
                                    meta(2, 100, 4, 64, dtype=torch.float32), 0.125, False, -1, -1, 0.0)


def test_compile_fullgraph_has_no_graph_break():
    q, k = meta(2, 128, 8, 64), meta(2, 100, 4, 64)
    explained = torch._dynamo.explain(lambda q, k, v: attn(q, k, v, causal=True, return_lse=True))(q, k, k)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert "flashcute.fwd_lse" in explained.graphs[0].code
    out, lse = torch.compile(lambda q, k, v: attn(q, k, v, causal=True, return_lse=True), fullgraph=True,
                             backend="eager")(q, k, k)
    assert out.shape == q.shape and lse.shape == (2, 8, 128)


def test_compile_dynamic_shapes():
    f = torch.compile(lambda q, k, v: attn(q, k, v, window_size=(16, 0)), fullgraph=True, dynamic=True,
                      backend="aot_eager")
    for b, sq, sk in [(1, 64, 64), (3, 200, 17), (2, 17, 1000)]:
        out = f(meta(b, sq, 8, 64), meta(b, sk, 2, 64), meta(b, sk, 2, 64))
        assert out.shape == (b, sq, 8, 64)


def test_trace_time_errors_name_the_argument():
    # The fake implementation raises the validation's ValueError; Dynamo may report it inside its
    # own exception type, with the message.
    f = torch.compile(lambda q, k, v: attn(q, k, v), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"nheads \(8\) must be a multiple of nheads_k \(3\)"):
        f(meta(2, 128, 8, 64), meta(2, 100, 3, 64), meta(2, 100, 3, 64))
    with pytest.raises(Exception, match=r"headdim must be a multiple of 8 and <= 256, got 60"):
        f(meta(2, 128, 8, 60), meta(2, 100, 8, 60), meta(2, 100, 8, 60))


@pytest.mark.parametrize("kw", [{"out": "like q"}, {"stream": 0}])
def test_eager_only_keywords_refused_under_compile(kw):
    q = meta(1, 16, 2, 64)
    kwargs = {name: (torch.empty_like(q) if value == "like q" else value) for name, value in kw.items()}
    with pytest.raises(Exception, match="not supported under torch.compile"):
        torch.compile(lambda q: attn(q, q, q, **kwargs), fullgraph=True, backend="eager")(q)


def test_gradients_flow_through_the_bwd_op():
    # On meta tensors the fake implementations give the shapes: flash_attn_func with inputs that
    # require grad is flashcute::fwd_lse, and its autograd formula calls flashcute::bwd.
    q, k, v = (meta(*s).requires_grad_() for s in ((2, 16, 4, 64), (2, 24, 2, 64), (2, 24, 2, 64)))
    out = attn(q, k, v, causal=True)
    out.backward(torch.empty_like(out))
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


class _Ops(TorchDispatchMode):
    """Names the ops that run while it is active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _backward_ops(out):
    with _Ops() as ops:
        out.backward(torch.empty_like(out))
    return ops.names


def test_backward_fills_no_lse_gradient():
    # The lse output is not differentiable. With gradient materialisation on, autograd would
    # zero-fill a gradient for it before every backward: a fill kernel a call on the GPU.
    q, k, v = (meta(*s).requires_grad_() for s in ((2, 16, 4, 64), (2, 24, 2, 64), (2, 24, 2, 64)))
    names = _backward_ops(attn(q, k, v, causal=True))
    assert "flashcute.bwd.default" in names and not any("zeros" in n or "fill" in n for n in names), names
    q, k = meta(40, 4, 64).requires_grad_(), meta(50, 2, 64).requires_grad_()
    cu_q = torch.tensor([0, 10, 40], dtype=torch.int32, device="meta")
    cu_k = torch.tensor([0, 20, 50], dtype=torch.int32, device="meta")
    names = _backward_ops(flashcute.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 30, 30, causal=True))
    assert "flashcute.varlen_bwd.default" in names and not any("zeros" in n or "fill" in n for n in names), names


def test_compiled_forward_and_backward_trace_one_op_each():
    q, k, v = (meta(*s).requires_grad_() for s in ((2, 16, 4, 64), (2, 24, 2, 64), (2, 24, 2, 64)))
    explained = torch._dynamo.explain(lambda q, k, v: attn(q, k, v, causal=True).sum())(q, k, v)
    assert explained.graph_break_count == 0 and "flashcute.fwd_lse" in explained.graphs[0].code
    f = torch.compile(lambda q, k, v: attn(q, k, v, causal=True), fullgraph=True, backend="aot_eager")
    out = f(q, k, v)
    out.backward(torch.empty_like(out))
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_out_and_stream_are_refused_with_grad():
    q = meta(1, 16, 2, 64).requires_grad_()
    with pytest.raises(TypeError, match="not supported when q, k or v requires grad"):
        attn(q, q.detach(), q.detach(), out=torch.empty_like(q.detach()))


def test_export():
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return flashcute.flash_attn_func(q, k, v, causal=True)

    q, k = meta(2, 128, 8, 64), meta(2, 100, 4, 64)
    program = torch.export.export(M(), (q, k, k))
    assert "torch.ops.flashcute.fwd.default" in program.graph_module.code
    assert program.module()(q, k, k).shape == q.shape


def test_eager_meta_tensors_are_not_cuda():
    # Outside a tracer, a plain eager call on meta tensors is an ordinary non-CUDA tensor.
    with pytest.raises(TypeError, match="q: expected a CUDA array, got a META torch.Tensor"):
        attn(meta(1, 16, 2, 64), meta(1, 16, 2, 64), meta(1, 16, 2, 64))


def test_flash_attn_bwd_refuses_cpu_tensors():
    q = torch.randn(1, 16, 2, 64, dtype=torch.float16)
    lse = torch.zeros(1, 2, 16)
    with pytest.raises(TypeError, match="q: expected a CUDA array, got a CPU torch.Tensor"):
        flashcute.flash_attn_bwd(q, q, q, q, q, lse)


def test_first_call_under_compile_imports_the_binding():
    # flashcute imported before torch: the torch binding is imported by the first torch call, which
    # here is traced by torch.compile (fullgraph: the import must not break the graph).
    import subprocess
    import sys

    code = ("import flashcute, torch\n"
            "q = torch.empty(2, 128, 8, 64, dtype=torch.bfloat16, device='meta')\n"
            "f = torch.compile(lambda q: flashcute.flash_attn_func(q, q, q, causal=True), fullgraph=True, "
            "backend='eager')\n"
            "assert f(q).shape == q.shape\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
