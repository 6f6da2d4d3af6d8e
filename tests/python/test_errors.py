"""Every argument check of flashcute._C.fwd and flashcute.flash_attn_func, with NumPy arrays.

These run without a GPU (CI): _C.fwd checks the device last, so each structural problem is
reported before "not a CUDA array". Each test checks the exception type and that the message
names the argument. Python-level checks run before any array check.
"""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import flashcute
from flashcute import _C

F16 = np.float16
OPTIONS = (0.125, False, -1, -1, 0.0)  # softmax_scale, causal, window_left, window_right, softcap


def arr(shape, dtype=F16):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def qkv(b=2, sq=128, sk=100, h=8, hk=4, d=64, dtype=F16):
    q = arr((b, sq, h, d), dtype)
    k = arr((b, sk, hk, d), dtype)
    v = arr((b, sk, hk, d), dtype)
    return q, k, v


def fwd(q, k, v, out=None, lse=None, *, softmax_scale=0.125, causal=False, window_left=-1, window_right=-1,
        softcap=0.0, stream=0):
    if out is None:
        out = np.empty_like(q)
    return _C.fwd(q, k, v, out, lse, (softmax_scale, causal, window_left, window_right, softcap), stream)


def aligned_like(shape, dtype=F16, offset_bytes=0, strides=None):
    """An array of `shape` whose data pointer is `offset_bytes` past a 64-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    n = int(np.prod(shape)) if strides is None else 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    buf = np.zeros(n * itemsize + 256, dtype=np.uint8)
    start = (-buf.ctypes.data) % 64 + offset_bytes
    flat = buf[start:start + n * itemsize].view(dtype)
    if strides is None:
        return flat.reshape(shape)
    return as_strided(flat, shape=shape, strides=tuple(s * itemsize for s in strides))


def raises(exc, *fragments):
    """pytest.raises whose message must contain every fragment (literally)."""
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


def needs_fp16_kernels(*head_dims):
    """Valid float16 NumPy arrays reach the device check only if this build has their kernels
    (the build-configuration check comes just before it)."""
    if "float16" not in _C.compiled_dtypes():
        pytest.skip("float16 is not compiled into this build")
    for d in head_dims:
        if _C.kernel_head_dim(d) == 0:
            pytest.skip(f"head dim {d} is not compiled into this build")


# ------------------------------------------------------------------------------------ baseline


def test_valid_cpu_arrays_fail_only_on_device():
    needs_fp16_kernels(64)
    q, k, v = qkv()
    with raises(TypeError, "q: expected a CUDA array, got a CPU array (device type 1)"):
        fwd(q, k, v)
    # The same with lse and GQA 2:1 and a packed, strided layout: still only the device check.
    packed = arr((2, 128, 3, 8, 64))
    q, k, v = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
    with raises(TypeError, "q: expected a CUDA array"):
        fwd(q, k, v, lse=np.empty((2, 8, 128), np.float32))


def test_flash_attn_func_rejects_numpy():
    q, k, v = qkv()
    with raises(TypeError, "q: expected a CUDA array, got a CPU numpy.ndarray"):
        flashcute.flash_attn_func(q, k, v)


def test_not_an_array():
    q, k, v = qkv()
    with raises(TypeError, "k: expected an array", "got list"):
        fwd(q, [[1.0]], v)
    with raises(TypeError, "out: expected an array", "NoneType"):
        _C.fwd(q, k, v, None, None, OPTIONS, 0)
    with raises(TypeError, "q: expected a CUDA array", "got str"):
        flashcute.flash_attn_func("q", k, v)


# ------------------------------------------------------------------------------------ dtypes


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float64, np.uint16])
def test_q_dtype(dtype):
    q, k, v = qkv()
    with raises(TypeError, "q: expected a float16 or bfloat16 array, got " + np.dtype(dtype).name):
        fwd(q.astype(dtype), k.astype(dtype), v.astype(dtype))


@pytest.mark.parametrize("name", ["k", "v", "out"])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_mixed_dtypes(name, dtype):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, out=np.zeros_like(q))
    args[name] = args[name].astype(dtype)
    with raises(TypeError, f"{name}: expected float16 like q, got {np.dtype(dtype).name}"):
        fwd(**args)


# ------------------------------------------------------------------------------------ ranks and shapes


@pytest.mark.parametrize(
    "name, dims",
    [("q", "(batch, seqlen_q, nheads, headdim)"), ("k", "(batch, seqlen_k, nheads_k, headdim)"),
     ("v", "(batch, seqlen_k, nheads_k, headdim)"), ("out", "(batch, seqlen_q, nheads, headdim)")],
)
@pytest.mark.parametrize("rank", [3, 5])
def test_rank(name, dims, rank):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, out=np.empty_like(q))
    a = args[name]
    args[name] = a[0] if rank == 3 else a[None]
    with raises(ValueError, f"{name}: expected 4 dims {dims}", f"got {rank}"):
        fwd(**args)


def test_flash_attn_func_rank_of_q_is_checked_by_the_validation():
    # A fake CUDA producer gets past the CPU check; the rank is then the compiled validation's to
    # check (plan_fwd), before the device its export says it is on.
    class FakeCuda:
        def __init__(self):
            self.array = np.zeros((2, 128, 64), F16)

        def __dlpack__(self, **kw):
            return self.array.__dlpack__()

        def __dlpack_device__(self):
            return (2, 0)

    with raises(ValueError, "q: expected 4 dims (batch, seqlen_q, nheads, headdim), got 3"):
        flashcute.flash_attn_func(FakeCuda(), FakeCuda(), FakeCuda(), out=FakeCuda())


def test_k_batch_mismatch():
    q, k, v = qkv(b=2)
    _, k3, v3 = qkv(b=3)
    with raises(ValueError, "k: batch 3 does not match q's batch 2"):
        fwd(q, k3, v3)


def test_k_headdim_mismatch():
    q, _, _ = qkv(d=64)
    _, k, v = qkv(d=128)
    with raises(ValueError, "k: headdim 128 does not match q's headdim 64"):
        fwd(q, k, v)


@pytest.mark.parametrize(
    "which, shape",
    [("batch", (3, 100, 4, 64)), ("seqlen_k", (2, 99, 4, 64)), ("nheads_k", (2, 100, 2, 64)),
     ("headdim", (2, 100, 4, 128))],
)
def test_v_shape_mismatch(which, shape):
    q, k, _ = qkv()
    with raises(ValueError, "v: expected shape (2, 100, 4, 64) like k", f"got {shape}", f"{which} differs"):
        fwd(q, k, arr(shape))


def test_nheads_multiple_of_nheads_k():
    q, k, v = qkv(h=12, hk=5)
    with raises(ValueError, "nheads (12) must be a multiple of nheads_k (5)"):
        fwd(q, k, v)


def test_zero_heads():
    q, k, v = qkv(h=0, hk=4)
    with raises(ValueError, "q: nheads must be >= 1, got 0"):
        fwd(q, k, v)
    q, k, v = qkv(h=4, hk=0)
    with raises(ValueError, "k: nheads_k must be >= 1, got 0"):
        fwd(q, k, v)


@pytest.mark.parametrize("d", [260, 12, 0, 4, 264])
def test_headdim(d):
    q, k, v = qkv(d=d, sq=4, sk=4)
    with raises(ValueError, f"headdim must be a multiple of 8 and <= 256, got {d}"):
        fwd(q, k, v)


@pytest.mark.parametrize("shape", [(2, 128, 8, 32), (2, 127, 8, 64), (1, 128, 8, 64), (2, 128, 4, 64)])
def test_out_shape(shape):
    q, k, v = qkv()
    with raises(ValueError, "out: expected shape (2, 128, 8, 64) like q", f"got {shape}"):
        fwd(q, k, v, out=arr(shape))


def test_out_dtype():
    q, k, v = qkv()
    with raises(TypeError, "out: expected float16 like q, got float32"):
        fwd(q, k, v, out=np.empty(q.shape, np.float32))


def test_lse():
    q, k, v = qkv()
    with raises(TypeError, "lse: expected float32 (batch, nheads, seqlen_q) = (2, 8, 128)", "float16"):
        fwd(q, k, v, lse=np.empty((2, 8, 128), F16))
    for shape in [(2, 128, 8), (2, 8, 127), (2, 8), (2, 8, 128, 1)]:
        with raises(ValueError, "lse: expected float32 (batch, nheads, seqlen_q) = (2, 8, 128)", f"got shape {shape}"):
            fwd(q, k, v, lse=np.empty(shape, np.float32))
    strided = np.empty((2, 8, 256), np.float32)[:, :, ::2]
    with raises(ValueError, "lse: expected float32 (batch, nheads, seqlen_q) contiguous in seqlen_q (stride 1)"):
        fwd(q, k, v, lse=strided)
    overlapping = as_strided(np.empty(128, np.float32), shape=(2, 8, 128), strides=(0, 0, 4))
    with raises(ValueError, "lse:", "overlap"):
        fwd(q, k, v, lse=overlapping)
    misaligned = np.empty(2 * 8 * 128 * 4 + 4, np.uint8)
    start = (-misaligned.ctypes.data) % 16 + 2
    with raises(ValueError, "lse: the data pointer must be 4-byte aligned"):
        fwd(q, k, v, lse=misaligned[start:start + 2 * 8 * 128 * 4].view(np.float32).reshape(2, 8, 128))


# ------------------------------------------------------------------------------------ strides and alignment


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
def test_last_dim_must_be_contiguous(name):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, out=np.empty_like(q))
    a = args[name]
    args[name] = np.empty(a.shape[:3] + (2 * a.shape[3],), F16)[..., ::2]
    with raises(ValueError, f"{name}: the last dim must be contiguous (stride 1), got stride 2"):
        fwd(**args)


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
@pytest.mark.parametrize("which, axis", [("batch", 0), ("row (seqlen)", 1), ("head", 2)])
def test_strides_multiple_of_8(name, which, axis):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, out=np.empty_like(q))
    b, s, h, d = args[name].shape
    head = d + 8
    row = h * head + 8
    strides = [s * row + 8, row, head, 1]  # padded, all multiples of 8
    strides[axis] += 4  # break one of them
    args[name] = aligned_like((b, s, h, d), strides=strides)
    with raises(ValueError, f"{name}: the {which} stride must be a multiple of 8 elements (16 bytes)",
                f"got {strides[axis]}"):
        fwd(**args)


def test_size_one_dims_ignore_strides():
    # A stride that only multiplies index 0 is never used: batch 1, seqlen 1, one head.
    needs_fp16_kernels(64)
    q = aligned_like((1, 1, 1, 64), strides=(3, 5, 7, 1))
    k = aligned_like((1, 1, 1, 64), strides=(3, 5, 7, 1))
    with raises(TypeError, "q: expected a CUDA array"):
        fwd(q, k, k.copy(), out=aligned_like((1, 1, 1, 64), strides=(13, 11, 9, 1)))


def test_negative_strides():
    q, k, v = qkv()
    with raises(ValueError, "k: negative strides are not supported"):
        fwd(q, k[:, ::-1], v)


def test_out_must_not_overlap_itself():
    q, k, v = qkv()
    out = as_strided(np.empty(2 * 128 * 64, F16), shape=q.shape, strides=(128 * 64 * 2, 64 * 2, 0, 2))
    with raises(ValueError, "out:", "overlap"):
        fwd(q, k, v, out=out)


@pytest.mark.parametrize("name", ["q", "k", "v", "out"])
@pytest.mark.parametrize("offset", [2, 8])
def test_alignment(name, offset):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, out=np.empty_like(q))
    args[name] = aligned_like(args[name].shape, offset_bytes=offset)
    with raises(ValueError, f"{name}: the data pointer must be 16-byte aligned"):
        fwd(**args)


# ------------------------------------------------------------------------------------ scalars (_C)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), 1e300, 1e-60])
def test_softmax_scale(scale):
    q, k, v = qkv()
    with raises(ValueError, "softmax_scale must be a finite number > 0"):
        fwd(q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("cap", [-1.0, float("nan"), float("inf")])
def test_softcap(cap):
    q, k, v = qkv()
    with raises(ValueError, "softcap must be a finite number >= 0"):
        fwd(q, k, v, softcap=cap)


@pytest.mark.parametrize("name", ["window_left", "window_right"])
def test_window(name):
    q, k, v = qkv()
    with raises(ValueError, f"{name} must be >= -1 (-1: unbounded), got -2"):
        fwd(q, k, v, **{name: -2})


def test_stream_handle():
    q, k, v = qkv()
    with raises(ValueError, "stream: expected a CUDA stream handle >= 0, got -1"):
        fwd(q, k, v, stream=-1)


# ------------------------------------------------------------------------------------ flash_attn_func arguments


@pytest.mark.parametrize("window", [(1,), (1, 2, 3), "ab", 5, None, (1.5, 0), (True, 0), ("1", 2)])
def test_window_size_type(window):
    q, k, v = qkv()
    with raises(TypeError, "window_size"):
        flashcute.flash_attn_func(q, k, v, window_size=window)


@pytest.mark.parametrize("window", [(-2, 0), (0, -5)])
def test_window_size_value(window):
    q, k, v = qkv()
    side, got = ("left", -2) if window[0] == -2 else ("right", -5)
    with raises(ValueError, f"window_{side} must be >= -1 (-1: unbounded), got {got}"):
        flashcute.flash_attn_func(q, k, v, window_size=window)


def test_window_size_accepts_lists_and_numpy_ints():
    q, k, v = qkv()
    for window in ([3, 0], (np.int64(3), np.int32(-1))):
        with raises(TypeError, "q: expected a CUDA array"):  # got past the window check
            flashcute.flash_attn_func(q, k, v, window_size=window)


@pytest.mark.parametrize("cap, exc", [(-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                                      ("30", TypeError), (None, TypeError), (True, TypeError)])
def test_softcap_python(cap, exc):
    q, k, v = qkv()
    with raises(exc, "softcap"):
        flashcute.flash_attn_func(q, k, v, softcap=cap)


@pytest.mark.parametrize("scale, exc", [(0.0, ValueError), (-0.5, ValueError), (float("nan"), ValueError),
                                        (float("inf"), ValueError), ("0.1", TypeError)])
def test_softmax_scale_python(scale, exc):
    q, k, v = qkv()
    with raises(exc, "softmax_scale"):
        flashcute.flash_attn_func(q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("name", ["causal", "return_lse", "deterministic", "return_attn_probs"])
def test_bool_args(name):
    q, k, v = qkv()
    with raises(TypeError, f"{name}: expected a bool"):
        flashcute.flash_attn_func(q, k, v, **{name: "yes"})
    with raises(TypeError, "q: expected a CUDA array"):  # a real bool is accepted
        flashcute.flash_attn_func(q, k, v, **{name: True})


@pytest.mark.parametrize("name", ["deterministic", "partial_keys"])
def test_bwd_bool_args(name):
    q, k, v = qkv()
    with raises(TypeError, f"{name}: expected a bool"):
        flashcute.flash_attn_bwd(q, q, k, v, q, q, **{name: "yes"})


@pytest.mark.parametrize("stream", ["abc", 1.5, object(), True, b"\x00"])
def test_stream_type(stream):
    q, k, v = qkv()
    with raises(TypeError, "stream:"):
        flashcute.flash_attn_func(q, k, v, stream=stream)


def test_stream_values():
    q, k, v = qkv()
    with raises(ValueError, "stream: expected a handle >= 0, got -3"):
        flashcute.flash_attn_func(q, k, v, stream=-3)

    class BadProtocol:
        def __cuda_stream__(self):
            return 7

    with raises(TypeError, "stream: __cuda_stream__ must return (version, handle)"):
        flashcute.flash_attn_func(q, k, v, stream=BadProtocol())

    class Protocol:
        def __cuda_stream__(self):
            return (0, 1234)

    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 1234

    for s in (Protocol(), TorchLike(), CupyLike(), 0, np.int64(5)):
        with raises(TypeError, "q: expected a CUDA array"):  # accepted: got to the array checks
            flashcute.flash_attn_func(q, k, v, stream=s)


def test_flash_attention_2_positional_order():
    # FlashAttention-2's order: q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
    # alibi_slopes, deterministic, return_attn_probs. Each positional lands where FA2 puts it.
    q, k, v = qkv()
    with raises(NotImplementedError, "dropout_p: flashcute has no dropout yet", "got 0.125"):
        flashcute.flash_attn_func(q, k, v, 0.125)
    with raises(TypeError, "q: expected a CUDA array"):  # all valid: got to the array checks
        flashcute.flash_attn_func(q, k, v, 0.0, 0.125, True, (8, 0), 30.0, None, True, False)
    with raises(ValueError, "softmax_scale must be a finite number > 0"):
        flashcute.flash_attn_func(q, k, v, 0.0, -1.0)
    with raises(TypeError, "causal: expected a bool"):
        flashcute.flash_attn_func(q, k, v, 0.0, None, "yes")
    with raises(NotImplementedError, "alibi_slopes"):
        flashcute.flash_attn_func(q, k, v, 0.0, None, False, (-1, -1), 0.0, np.ones(8, np.float32))
    with pytest.raises(TypeError):  # return_lse, out and stream are keyword-only
        flashcute.flash_attn_func(q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False, False, True)


@pytest.mark.parametrize("p, exc, fragment", [(-0.1, ValueError, "dropout_p: expected a probability in [0, 1)"),
                                              (1.0, ValueError, "dropout_p: expected a probability in [0, 1)"),
                                              (float("nan"), ValueError, "dropout_p"),
                                              ("0.1", TypeError, "dropout_p: expected a float"),
                                              (0.5, NotImplementedError, "dropout_p must be 0.0")])
def test_dropout_p(p, exc, fragment):
    q, k, v = qkv()
    with raises(exc, fragment):
        flashcute.flash_attn_func(q, k, v, dropout_p=p)


def test_errors_carry_their_structure():
    # The compiled validation's Status, as attributes of the exception.
    q, k, v = qkv()
    with pytest.raises(TypeError) as info:
        fwd(q, k.astype(np.float32), v)
    assert (info.value.arg, info.value.expected, info.value.got) == ("k", "float16 like q", "float32")
    _, k3, v3 = qkv(b=3)
    with pytest.raises(ValueError) as info:
        fwd(q, k3, v3)
    assert info.value.arg == "k" and info.value.expected == "batch 2 like q" and info.value.got == "3"
    with pytest.raises(ValueError) as info:
        fwd(q, k, v, softcap=-1.0)
    assert info.value.arg == "softcap" and "-1" in info.value.got


def test_outputs_must_be_writable():
    q, k, v = qkv()
    out = np.empty_like(q)
    out.flags.writeable = False
    with raises(TypeError, "out: expected a writable array, got a read-only numpy.ndarray"):
        fwd(q, k, v, out=out)
    lse = np.empty((2, 8, 128), np.float32)
    lse.flags.writeable = False
    with raises(TypeError, "lse: expected a writable array"):
        fwd(q, k, v, lse=lse)
    # Read-only inputs are fine: only the device check is left.
    needs_fp16_kernels(64)
    for a in (q, k, v):
        a.flags.writeable = False
    with raises(TypeError, "q: expected a CUDA array"):
        fwd(q, k, v)


# ------------------------------------------------------------------------------------ frameworks (faked)


class FakeCudaArray:
    """Claims to be a CUDA DLPack producer; never exported in these tests."""

    def __init__(self, shape=(2, 128, 8, 64)):
        self.shape = shape

    def __dlpack__(self, **kwargs):
        raise BufferError("fake")

    def __dlpack_device__(self):
        return (2, 0)


def test_unknown_dlpack_producer_needs_out():
    q = FakeCudaArray()
    with raises(TypeError, "q: flashcute allocates outputs through torch, CuPy or JAX", "out="):
        flashcute.flash_attn_func(q, FakeCudaArray(), FakeCudaArray())
    with raises(TypeError, "return_lse=False"):
        flashcute.flash_attn_func(q, FakeCudaArray(), FakeCudaArray(), out=FakeCudaArray(), return_lse=True)


def test_cpu_array_after_cuda_q():
    q = FakeCudaArray()
    with raises(TypeError, "k: expected a CUDA array, got a CPU numpy.ndarray"):
        flashcute.flash_attn_func(q, arr((2, 128, 8, 64)), FakeCudaArray())


def test_mixed_frameworks(monkeypatch):
    # A stand-in "cupy" module (CI has no CuPy): detection goes by isinstance on sys.modules.
    fake_cupy = types.ModuleType("cupy")

    class ndarray(FakeCudaArray):
        pass

    fake_cupy.ndarray = ndarray
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    with raises(TypeError, "k: is a cupy.ndarray but q is a", "same framework"):
        flashcute.flash_attn_func(FakeCudaArray(), ndarray(), FakeCudaArray())
    with raises(TypeError, "out: is a", "but q is a cupy.ndarray"):
        flashcute.flash_attn_func(ndarray(), ndarray(), ndarray(), out=FakeCudaArray())


def test_dlpack_non_cuda_device():
    class RocmArray(FakeCudaArray):
        def __dlpack_device__(self):
            return (10, 0)

    with raises(TypeError, "q: expected a CUDA array, got a ROCm"):
        flashcute.flash_attn_func(RocmArray(), RocmArray(), RocmArray())


def test_argument_checks_precede_array_checks():
    # Bad plain arguments are reported even with arrays that would fail too.
    with raises(ValueError, "softcap"):
        flashcute.flash_attn_func(None, None, None, softcap=-1.0)
    with raises(TypeError, "stream:"):
        flashcute.flash_attn_func(None, None, None, stream="default")


# ------------------------------------------------------------------------------------ build configuration


def test_not_compiled_head_dim():
    dims = _C.compiled_head_dims()
    missing = [d for d in range(8, 257, 8) if _C.kernel_head_dim(d) == 0]
    if not missing:
        pytest.skip(f"every head dim has a kernel in this build ({dims})")
    d = missing[0]
    q, k, v = qkv(d=d, sq=4, sk=4)
    if "float16" not in _C.compiled_dtypes():
        pytest.skip("float16 is not compiled: NumPy cannot make bfloat16 arrays")
    with raises(NotImplementedError, f"head dim {d}", "FLASHCUTE_HEAD_DIMS"):
        fwd(q, k, v)


def test_not_compiled_float16():
    if "float16" in _C.compiled_dtypes():
        pytest.skip("float16 is compiled in this build")
    q, k, v = qkv()
    with raises(NotImplementedError, "float16", "FLASHCUTE_DTYPES"):
        fwd(q, k, v)


# ------------------------------------------------------------------------------------ descriptors / check_fwd


def _desc(shape, dtype="float16", ptr=0x10000, strides=None):
    if strides is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.insert(0, acc)
            acc *= s
    return (ptr, tuple(shape), tuple(strides), dtype)


def fwd_raw(q, k, v, out=None, lse=None, **kw):
    args = dict(softmax_scale=0.125, causal=False, window_left=-1, window_right=-1, softcap=0.0)
    args.update(kw)
    return _C.fwd(q, k, v, out if out is not None else q, lse, tuple(args.values()), 0, 0, False)


def test_fwd_raw_validates_before_any_cuda_call():
    # The torch binding's entry: the same validation as fwd, from (ptr, shape, strides, dtype).
    q, kv = _desc((2, 128, 8, 64)), _desc((3, 100, 4, 64), ptr=0x20000)
    with raises(ValueError, "k: batch 3 does not match q's batch 2"):
        fwd_raw(q, kv, kv)
    kv = _desc((2, 100, 4, 64), "bfloat16", ptr=0x20000)
    with raises(TypeError, "k: expected float16 like q, got bfloat16"):
        fwd_raw(q, kv, kv)
    kv = _desc((2, 100, 4, 64), ptr=0x20008)
    with raises(ValueError, "k: the data pointer must be 16-byte aligned"):
        fwd_raw(q, kv, kv)
    with raises(TypeError, "q: expected a (data_ptr, shape, strides, dtype) descriptor"):
        fwd_raw((0x10000, (2, 128, 8, 64)), kv, kv)
    with raises(ValueError, "softcap must be a finite number >= 0"):
        fwd_raw(q, _desc((2, 100, 4, 64), ptr=0x20000), _desc((2, 100, 4, 64), ptr=0x20000), softcap=-1.0)


def test_bwd_raw_names_each_new_argument():
    # The backward's entry (flash_attn_bwd's torch path): plan_bwd checks the forward's arrays by the
    # forward's rules, then each new one by name, before any CUDA call.
    if "float16" not in _C.compiled_dtypes() or _C.kernel_head_dim(64) != 64:
        pytest.skip("needs this build's float16 head-dim-64 kernels (the forward's arrays are checked first)")
    b, s, h, hk, d = 2, 128, 8, 4, 64
    good = dict(
        dout=_desc((b, s, h, d), ptr=0x60000), q=_desc((b, s, h, d)), k=_desc((b, 100, hk, d), ptr=0x20000),
        v=_desc((b, 100, hk, d), ptr=0x30000), out=_desc((b, s, h, d), ptr=0x40000),
        lse=_desc((b, h, s), "float32", ptr=0x50000), dq=_desc((b, s, h, d), ptr=0x70000),
        dk=_desc((b, 100, hk, d), ptr=0x80000), dv=_desc((b, 100, hk, d), ptr=0x90000),
        workspace=_desc((_C.bwd_workspace_floats(b, h, s),), "float32", ptr=0xa0000),
    )

    def bwd_raw(**replace):
        arrays = {**good, **replace}
        return _C.bwd(*arrays.values(), OPTIONS, False, 0, 0, False)

    with raises(ValueError, "dout: expected shape (2, 128, 8, 64) like q, got (2, 128, 8, 32)"):
        bwd_raw(dout=_desc((b, s, h, 32), ptr=0x60000))
    with raises(TypeError, "dout: expected float16 like q, got bfloat16"):
        bwd_raw(dout=_desc((b, s, h, d), "bfloat16", ptr=0x60000))
    with raises(ValueError, "dout: the last dim must be contiguous"):
        bwd_raw(dout=_desc((b, s, h, d), ptr=0x60000, strides=(s * h * d * 2, h * d * 2, d * 2, 2)))
    with raises(TypeError, "lse: expected float32 (batch, nheads, seqlen_q)", "got dtype float16"):
        bwd_raw(lse=_desc((b, h, s), "float16", ptr=0x50000))
    with raises(ValueError, "lse: expected float32 (batch, nheads, seqlen_q)", "shape (2, 8, 127)"):
        bwd_raw(lse=_desc((b, h, s - 1), "float32", ptr=0x50000))
    with raises(ValueError, "dq: expected shape (2, 128, 8, 64) like q"):
        bwd_raw(dq=_desc((b, s, h - 1, d), ptr=0x70000))
    with raises(ValueError, "dk: expected shape (2, 100, 4, 64) like k"):
        bwd_raw(dk=_desc((b, 100, h, d), ptr=0x80000))
    with raises(TypeError, "dv: expected float16 like v, got float32"):
        bwd_raw(dv=_desc((b, 100, hk, d), "float32", ptr=0x90000))
    with raises(ValueError, "workspace: expected float32 with at least"):
        bwd_raw(workspace=_desc((7,), "float32", ptr=0xa0000))
    with raises(ValueError, "k: batch 3 does not match q's batch 2"):  # the forward's rules come first
        bwd_raw(k=_desc((3, 100, hk, d), ptr=0x20000), v=_desc((3, 100, hk, d), ptr=0x30000))


def test_check_fwd_is_the_same_validation():
    shapes = ((2, 128, 8, 64), (2, 100, 3, 64), (2, 100, 3, 64))
    with raises(ValueError, "nheads (8) must be a multiple of nheads_k (3)"):
        _C.check_fwd(*((256, s, None, "float16") for s in shapes), OPTIONS)
    with raises(ValueError, "window_left must be >= -1"):
        _C.check_fwd(*[(256, (1, 4, 2, 64), None, "float16")] * 3, (0.125, False, -5, -1, 0.0))


# ------------------------------------------------------------------------------------ varlen


def varlen_fwd(q, k, v, cu_q, cu_k, max_q=64, max_k=64, out=None, lse=None, **kw):
    if out is None:
        out = np.empty_like(q)
    return _C.fwd(q, k, v, out, lse, OPTIONS, 0, -1, True, cu_q, cu_k, max_q, max_k, **kw)


def varlen_arrays(total_q=100, total_k=90, h=8, hk=4, d=64, batch=3):
    q, k, v = arr((total_q, h, d)), arr((total_k, hk, d)), arr((total_k, hk, d))
    cu_q = np.array([0, 40, 60, total_q][: batch + 1], np.int32)
    cu_k = np.array([0, 30, 60, total_k][: batch + 1], np.int32)
    return q, k, v, cu_q, cu_k


def test_varlen_valid_cpu_arrays_fail_only_on_device():
    needs_fp16_kernels(64)
    q, k, v, cu_q, cu_k = varlen_arrays()
    with raises(TypeError, "q: expected a CUDA array"):
        varlen_fwd(q, k, v, cu_q, cu_k, lse=np.empty((8, 100), np.float32))


def test_varlen_cu_seqlens_checks():
    q, k, v, cu_q, cu_k = varlen_arrays()
    with raises(TypeError, "cu_seqlens_q: expected int32 (batch + 1,) contiguous, got int64"):
        varlen_fwd(q, k, v, cu_q.astype(np.int64), cu_k)
    with raises(TypeError, "cu_seqlens_k: expected int32", "got float32"):
        varlen_fwd(q, k, v, cu_q, cu_k.astype(np.float32))
    with raises(ValueError, "cu_seqlens_q: expected int32 (batch + 1,)", "shape (2, 2)"):
        varlen_fwd(q, k, v, cu_q[:4].reshape(2, 2), cu_k)
    with raises(ValueError, "cu_seqlens_q: expected int32 (batch + 1,)", "shape (0,)"):
        varlen_fwd(q, k, v, cu_q[:0], cu_k[:0])
    with raises(ValueError, "cu_seqlens_k: shape (3,) does not match cu_seqlens_q's (4,)"):
        varlen_fwd(q, k, v, cu_q, cu_k[:3])
    with raises(ValueError, "cu_seqlens_q: expected int32 (batch + 1,) contiguous", "strides (2,)"):
        varlen_fwd(q, k, v, np.zeros(8, np.int32)[::2], cu_k)
    with raises(ValueError, "cu_seqlens_k: a variable-length call takes both cu_seqlens_q and cu_seqlens_k"):
        _C.fwd(q, k, v, np.empty_like(q), None, OPTIONS, 0, cu_seqlens_q=cu_q, max_seqlen_q=64, max_seqlen_k=64)
    with raises(ValueError, "max_seqlen_k must be >= 0"):
        varlen_fwd(q, k, v, cu_q, cu_k, max_k=-1)


def test_varlen_array_shapes():
    q, k, v, cu_q, cu_k = varlen_arrays()
    with raises(ValueError, "q: expected 3 dims (total_q, nheads, headdim), got 4"):
        varlen_fwd(q[None], k, v, cu_q, cu_k)
    with raises(ValueError, "k: expected 3 dims (total_k, nheads_k, headdim)"):
        varlen_fwd(q, k[None], v, cu_q, cu_k)
    with raises(ValueError, "k: headdim 32 does not match q's headdim 64"):
        varlen_fwd(q, arr((90, 4, 32)), arr((90, 4, 32)), cu_q, cu_k)
    with raises(ValueError, "v: expected shape (90, 4, 64) like k, got (91, 4, 64)"):
        varlen_fwd(q, k, arr((91, 4, 64)), cu_q, cu_k)
    with raises(ValueError, "out: expected shape (100, 8, 64) like q"):
        varlen_fwd(q, k, v, cu_q, cu_k, out=np.empty((99, 8, 64), F16))
    with raises(ValueError, "lse: expected float32 (nheads, total_q) = (8, 100)", "shape (1, 8, 100)"):
        varlen_fwd(q, k, v, cu_q, cu_k, lse=np.empty((1, 8, 100), np.float32))
    with raises(ValueError, "nheads (8) must be a multiple of nheads_k (3)"):
        varlen_fwd(q, arr((90, 3, 64)), arr((90, 3, 64)), cu_q, cu_k)
    with raises(TypeError, "v: expected float16 like q"):
        varlen_fwd(q, k, arr((90, 4, 64), np.float32), cu_q, cu_k)


def test_varlen_python_keywords():
    q, k, v, cu_q, cu_k = varlen_arrays()
    with raises(NotImplementedError, "dropout_p"):
        flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 64, 0.1)
    with raises(NotImplementedError, "alibi_slopes"):
        flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 64, alibi_slopes=np.ones(8, np.float32))
    with raises(NotImplementedError, "block_table"):
        flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 64, block_table=np.zeros((3, 4), np.int32))
    with raises(TypeError, "max_seqlen_q: expected an int, got float"):
        flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64.0, 64)
    with raises(ValueError, "max_seqlen_k must be >= 0 and <= 2147483647, got -2"):
        flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, -2)
    with raises(TypeError, "q: expected a CUDA array, got a CPU numpy.ndarray"):
        flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 64)


def test_varlen_bwd_raw_names_each_argument():
    if "float16" not in _C.compiled_dtypes() or _C.kernel_head_dim(64) != 64:
        pytest.skip("needs this build's float16 head-dim-64 kernels (the forward's arrays are checked first)")
    tq, tk, h, hk, d = 100, 90, 8, 4, 64
    good = dict(
        dout=_desc((tq, h, d), ptr=0x60000), q=_desc((tq, h, d)), k=_desc((tk, hk, d), ptr=0x20000),
        v=_desc((tk, hk, d), ptr=0x30000), out=_desc((tq, h, d), ptr=0x40000),
        lse=_desc((h, tq), "float32", ptr=0x50000), dq=_desc((tq, h, d), ptr=0x70000),
        dk=_desc((tk, hk, d), ptr=0x80000), dv=_desc((tk, hk, d), ptr=0x90000),
        workspace=_desc((_C.bwd_workspace_floats(1, h, tq),), "float32", ptr=0xa0000),
    )
    cu = dict(cu_seqlens_q=_desc((4,), "int32", ptr=0xb0000), cu_seqlens_k=_desc((4,), "int32", ptr=0xc0000),
              max_seqlen_q=64, max_seqlen_k=64)

    def bwd_raw(**replace):
        arrays = {**good, **{k: v for k, v in replace.items() if k in good}}
        extra = {**cu, **{k: v for k, v in replace.items() if k in cu}}
        return _C.bwd(*arrays.values(), OPTIONS, False, 0, 0, False, **extra)

    with raises(ValueError, "dout: expected 3 dims (total_q, nheads, headdim) like q, got 4"):
        bwd_raw(dout=_desc((1, tq, h, d), ptr=0x60000))
    with raises(ValueError, "dk: expected shape (90, 4, 64) like k, got (90, 8, 64)"):
        bwd_raw(dk=_desc((tk, h, d), ptr=0x80000))
    with raises(ValueError, "workspace: expected float32 with at least 800 elements"):
        bwd_raw(workspace=_desc((799,), "float32", ptr=0xa0000))
    with raises(ValueError, "lse: expected float32 (nheads, total_q) = (8, 100)"):
        bwd_raw(lse=_desc((1, h, tq), "float32", ptr=0x50000))
    with raises(TypeError, "cu_seqlens_q: expected int32 (batch + 1,) contiguous, got int64"):
        bwd_raw(cu_seqlens_q=_desc((4,), "int64", ptr=0xb0000))


# ------------------------------------------------------------------------------------ merge


def test_merge_checks_each_argument():
    oa, ob = arr((2, 8, 4, 64)), arr((2, 8, 4, 64))
    la, lb = arr((2, 4, 8), np.float32), arr((2, 4, 8), np.float32)

    def merge(out_a=oa, lse_a=la, out_b=ob, lse_b=lb, out=None, lse=None):
        out = np.empty_like(out_a) if out is None else out
        lse = np.empty((2, 4, 8), np.float32) if lse is None else lse
        return _C.merge(out_a, lse_a, out_b, lse_b, out, lse, 0)

    with raises(TypeError, "out_a: expected a CUDA array"):  # valid: only the device check fails
        merge()
    with raises(TypeError, "out_a: expected a CUDA array"):  # varlen shapes and float32 partials
        _C.merge(arr((30, 4, 64), np.float32), arr((4, 30), np.float32), arr((30, 4, 64), np.float32),
                 arr((4, 30), np.float32), np.empty((30, 4, 64), np.float32), np.empty((4, 30), np.float32), 0)
    with raises(ValueError, "out_a: expected 4 dims (batch, seqlen, nheads, headdim) or 3"):
        merge(out_a=arr((8, 64)))
    with raises(TypeError, "out_a: expected a float16, bfloat16 or float32 array, got int32"):
        merge(out_a=oa.astype(np.int32))
    with raises(ValueError, "out_b: expected shape (2, 8, 4, 64) like out_a, got (2, 8, 4, 32)"):
        merge(out_b=arr((2, 8, 4, 32)))
    with raises(TypeError, "out_b: expected float16 like out_a, got float32"):
        merge(out_b=ob.astype(np.float32))
    with raises(ValueError, "out: expected shape (2, 8, 4, 64) like out_a"):
        merge(out=np.empty((2, 8, 4, 63), F16))
    with raises(ValueError, "lse_a: expected float32 (batch, nheads, seqlen) = (2, 4, 8), got shape (2, 8, 4)"):
        merge(lse_a=arr((2, 8, 4), np.float32))
    with raises(TypeError, "lse_b: expected float32 (batch, nheads, seqlen)", "dtype float16"):
        merge(lse_b=lb.astype(F16))
    with raises(ValueError, "lse: expected float32 (batch, nheads, seqlen)"):
        merge(lse=np.empty((2, 4, 9), np.float32))
    with raises(ValueError, "out_a: expected the last dim contiguous"):
        merge(out_a=np.asfortranarray(oa))
    with raises(TypeError, "out_a: expected a CUDA array, got a CPU numpy.ndarray"):
        flashcute.merge_attn_states(oa, la, ob, lb)


# ------------------------------------------------------------------------------------ the registry


def test_every_binding_has_the_same_functions():
    # flash_attn_interface dispatches through the registry only: each framework's binding module
    # answers every call, running it or refusing it by name.
    from flashcute import _args

    names = ("flash_attn", "flash_attn_varlen", "flash_attn_bwd", "flash_attn_kvcache", "merge_attn_states")
    for fw in (*_args._FRAMEWORKS, _args._DLPACK):
        if fw.name in ("torch", "jax"):
            pytest.importorskip(fw.name)
        binding = fw.load()
        assert binding.__name__ == "flashcute._" + ("dlpack" if fw.name in ("numpy", "dlpack") else fw.name)
        for name in names:
            assert callable(getattr(binding, name, None)), (fw.name, name)


def test_registry_recognises_arrays_by_type():
    from flashcute import _args

    class DlpackOnly:
        def __dlpack__(self, **kw):
            raise AssertionError("not exported to be recognised")

        def __dlpack_device__(self):
            return (2, 0)

    assert _args._framework(np.zeros(3)).name == "numpy"
    assert _args._framework(DlpackOnly()) is _args._DLPACK
    assert type(DlpackOnly()) in _args._BY_TYPE  # the next call is one dict lookup
    for not_an_array in ([1.0], "q", None, 3):
        assert _args._framework(not_an_array) is None
    with pytest.raises(TypeError, match="q: flash_attn_bwd allocates through torch or CuPy"):
        flashcute.flash_attn_bwd(*[DlpackOnly()] * 6)
    with pytest.raises(TypeError, match="out_a: merge_attn_states allocates through torch, CuPy or JAX"):
        flashcute.merge_attn_states(*[DlpackOnly()] * 4)


def test_options_tuple_is_read_strictly():
    # The compiled entry points take the options as one tuple, as flashcute._args makes it.
    q, k, v = qkv()
    out = np.empty_like(q)
    with raises(TypeError, "options: expected a tuple (softmax_scale or None, causal"):
        _C.fwd(q, k, v, out, None, [0.125, False, -1, -1, 0.0], 0)
    with raises(TypeError, "causal: expected a bool, got int"):
        _C.fwd(q, k, v, out, None, (0.125, 1, -1, -1, 0.0), 0)
    with pytest.raises(TypeError):
        _C.fwd(q, k, v, out, None, ("0.125", False, -1, -1, 0.0), 0)
    _C.check_options((None, True, 3, 0, 30.0), 128, 0, 2**31 - 1)  # valid: no error
    with raises(ValueError, "num_splits: expected 0 (automatic) to 128, got -1"):
        _C.check_options((None, False, -1, -1, 0.0), -1)


@pytest.mark.parametrize("fn, args, name, layout", [
    ("flash_attn_qkvpacked_func", lambda p: (p,), "qkv", "(batch_size, seqlen, 3, nheads, headdim)"),
    ("flash_attn_kvpacked_func", lambda p: (arr((2, 16, 8, 64)), p), "kv", "(batch_size, seqlen_k, 2, nheads_k, headdim)"),
    ("flash_attn_varlen_qkvpacked_func", lambda p: (p, np.zeros(3, np.int32), 16), "qkv", "(total, 3, nheads, headdim)"),
    ("flash_attn_varlen_kvpacked_func", lambda p: (arr((32, 8, 64)), p, np.zeros(3, np.int32), np.zeros(3, np.int32), 16, 16),
     "kv", "(total_k, 2, nheads_k, headdim)"),
])
def test_packed_forms_check_the_packed_array(fn, args, name, layout):
    """FlashAttention-2's packed forms: the packed array's shape first, then that it is a CUDA array,
    each error naming it; plain arguments before either."""
    f = getattr(flashcute, fn)
    parts = 3 if name == "qkv" else 2
    good = [2, 16, parts, 8, 64] if "batch_size" in layout else [32, parts, 8, 64]
    wrong_parts = list(good)
    wrong_parts[len(good) - 3] = 5 - parts  # 2 for qkv, 3 for kv
    for shape in (good[1:], wrong_parts, good + [1]):
        with raises(ValueError, f"{name}: expected a {layout} array, got shape {tuple(shape)}"):
            f(*args(arr(tuple(shape))))
    with raises(TypeError, f"{name}: expected a CUDA array, got a CPU numpy.ndarray"):
        f(*args(arr(tuple(good))))
    with raises(TypeError, f"{name}: expected a CUDA array"):
        f(*args([[1.0]]))
    with raises(NotImplementedError, "dropout_p: flashcute has no dropout yet"):
        f(*args(arr((1,))), dropout_p=0.1)
    with raises(TypeError, "window_size: expected a tuple (left, right)"):
        f(*args(arr((1,))), window_size=(1, 2, 3))
