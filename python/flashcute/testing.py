"""The reference attention and the one tolerance rule, for flashcute's tests, its benchmark, its
sanitizer script, and anyone checking their own build.

>>> import torch, flashcute, flashcute.testing as ft
>>> q, k, v = (torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
>>> out, lse = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True)
>>> ft.assert_attention_close(out, q, k, v, lse=lse, causal=True)

**The rule** is FlashAttention's: against a float32 reference, flashcute's error must be at most
twice the error of the same attention computed naively in the input precision, plus a tiny
absolute slack::

    max |out - ref_fp32| <= 2 * max |naive_lowprec - ref_fp32| + OUT_ATOL
    max |lse - lse_fp32| <= 2 * max |lse_naive - lse_fp32| + LSE_ATOL   (rows that see a key)

and nothing may be NaN or infinite, except lse, which is -inf exactly on the rows that see no key
(their output is 0). A poisoned (NaN-filled) output that the kernel failed to write therefore
fails the check.

**The naive low-precision attention** is FlashAttention's ``attention_ref(upcast=False)``: it
rounds to the input dtype what attention computed in that dtype (GEMMs with float32 accumulation,
softmax in float32) would round: q * softmax_scale, the scores, the softcapped scores, the
probabilities and the output. The rounding is emulated in float32 (bfloat16 by bit arithmetic), so the
reference is the same computation in torch, CuPy and NumPy, and needs no bfloat16 support from the
array library.

**The mask** is FlashAttention-2's, aligned to the bottom-right corner: query i sees key j iff
``i + sk - sq - left <= j <= i + sk - sq + right``, a negative bound being unbounded and causal
meaning ``right = 0``. GQA maps query head h to KV head ``h // (nheads // nheads_k)``.

Arrays may be torch tensors (any device), CuPy arrays, NumPy arrays or JAX arrays (copied to the
host); results come back as float32 arrays of the same library (NumPy for JAX). Work is done in
chunks of query rows, so the reference of a long sequence needs memory in proportion to
``CHUNK_SCORES``, not to seqlen_q * seqlen_k.
"""

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

__all__ = [
    "OUT_ATOL",
    "LSE_ATOL",
    "attention_ref",
    "visible_mask",
    "tolerance",
    "Check",
    "check_attention",
    "assert_attention_close",
    "GRAD_ATOL",
    "attention_grads_ref",
    "check_gradients",
]

OUT_ATOL = 1e-5
GRAD_ATOL = 1e-4
LSE_ATOL = 1e-3
# Scores held at once by the reference (64 MiB of float32); rows are processed in chunks of this.
CHUNK_SCORES = 1 << 24

_DTYPE_NAMES = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def tolerance(naive_err: float, atol: float = OUT_ATOL) -> float:
    """The rule: the error allowed for an output whose naive low-precision error is naive_err."""
    return 2.0 * naive_err + atol


# ------------------------------------------------------------------------------ array libraries


class _Ops:
    """What the reference needs of an array library; the names torch, NumPy and CuPy share."""

    def __init__(self, module: Any) -> None:
        self.m = module

    def einsum(self, spec: str, a: Any, b: Any) -> Any:
        return self.m.einsum(spec, a, b)

    def exp(self, x: Any) -> Any:
        return self.m.exp(x)

    def tanh(self, x: Any) -> Any:
        return self.m.tanh(x)

    def isfinite(self, x: Any) -> Any:
        return self.m.isfinite(x)

    def isneginf(self, x: Any) -> Any:
        return self.m.isneginf(x)


class _TorchOps(_Ops):
    def f32(self, x: Any) -> Any:
        return x.float()

    def zeros(self, shape: Tuple[int, ...], like: Any) -> Any:
        return self.m.zeros(shape, dtype=self.m.float32, device=like.device)

    def arange(self, n: int, like: Any) -> Any:
        return self.m.arange(n, device=like.device)

    def repeat_heads(self, x: Any, g: int) -> Any:
        return x.repeat_interleave(g, dim=2)

    def rowmax(self, x: Any) -> Any:
        return x.amax(dim=-1, keepdim=True)

    def rowsum(self, x: Any) -> Any:
        return x.sum(dim=-1, keepdim=True)

    def where(self, c: Any, a: Any, b: Any) -> Any:
        as_tensor = lambda x: x if self.m.is_tensor(x) else self.m.tensor(x, dtype=self.m.float32, device=c.device)  # noqa: E731
        return self.m.where(c, as_tensor(a), as_tensor(b))

    def log(self, x: Any) -> Any:
        return self.m.log(x)

    def round_fp16(self, x: Any) -> Any:
        return x.half().float()

    def round_bf16(self, x: Any) -> Any:
        return x.bfloat16().float()

    def max_abs(self, x: Any) -> float:
        return float(x.abs().max().item()) if x.numel() else 0.0

    def all(self, x: Any) -> bool:
        return bool(x.all().item())

    def count(self, x: Any) -> int:
        return int(x.sum().item())

    def exact_fp32(self) -> Any:
        """TF32 off for the reference's matmuls, restored afterwards."""
        return _Tf32Off(self.m)


class _Tf32Off:
    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def __enter__(self) -> None:
        self.saved = self.torch.backends.cuda.matmul.allow_tf32
        self.torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc: Any) -> None:
        self.torch.backends.cuda.matmul.allow_tf32 = self.saved


class _ArrayOps(_Ops):
    """NumPy and CuPy (the same API)."""

    def f32(self, x: Any) -> Any:
        return self.m.asarray(x, dtype=self.m.float32)

    def zeros(self, shape: Tuple[int, ...], like: Any) -> Any:
        return self.m.zeros(shape, dtype=self.m.float32)

    def arange(self, n: int, like: Any) -> Any:
        return self.m.arange(n)

    def repeat_heads(self, x: Any, g: int) -> Any:
        return self.m.repeat(x, g, axis=2)

    def rowmax(self, x: Any) -> Any:
        return x.max(axis=-1, keepdims=True)

    def rowsum(self, x: Any) -> Any:
        return x.sum(axis=-1, keepdims=True)

    def where(self, c: Any, a: Any, b: Any) -> Any:
        return self.m.where(c, a, b).astype(self.m.float32)

    def log(self, x: Any) -> Any:
        with _np_errstate(self.m):
            return self.m.log(x)

    def round_fp16(self, x: Any) -> Any:
        return x.astype(self.m.float16).astype(self.m.float32)

    def round_bf16(self, x: Any) -> Any:
        # Round to nearest even on the top 16 bits of the float32 (NaN and inf stay what they are).
        u = self.m.ascontiguousarray(x, dtype=self.m.float32).view(self.m.uint32)
        rounded = (u + self.m.uint32(0x7FFF) + ((u >> self.m.uint32(16)) & self.m.uint32(1))) & self.m.uint32(0xFFFF0000)
        special = (u & self.m.uint32(0x7F800000)) == self.m.uint32(0x7F800000)
        return self.m.where(special, u, rounded).astype(self.m.uint32).view(self.m.float32)

    def max_abs(self, x: Any) -> float:
        return float(abs(x).max()) if x.size else 0.0

    def all(self, x: Any) -> bool:
        return bool(x.all())

    def count(self, x: Any) -> int:
        return int(x.sum())

    def exact_fp32(self) -> Any:
        return _np_errstate(self.m)


def _np_errstate(xp: Any) -> Any:
    import contextlib

    errstate = getattr(xp, "errstate", None)
    return errstate(divide="ignore", invalid="ignore") if errstate is not None else contextlib.nullcontext()


def _ops_for(x: Any) -> Tuple[Any, Any]:
    """(ops, array converter) for x's library. JAX arrays are copied to NumPy."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _TorchOps(torch), lambda a: a
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return _ArrayOps(cupy), lambda a: a
    import numpy as np

    if isinstance(x, np.ndarray):
        return _ArrayOps(np), lambda a: a
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, getattr(jax, "Array", ())):
        return _ArrayOps(np), lambda a: np.asarray(a.astype("float32"))
    return _ArrayOps(np), np.asarray


def _dtype_name(x: Any) -> str:
    name = str(getattr(x, "dtype", "")).replace("torch.", "")
    return _DTYPE_NAMES.get(name, name)


# ------------------------------------------------------------------------------ the reference


def visible_mask(seqlen_q: int, seqlen_k: int, causal: bool = False, window_size: Tuple[int, int] = (-1, -1)) -> Any:
    """(seqlen_q, seqlen_k) NumPy bool array: True where query i sees key j."""
    import numpy as np

    left, right = window_size
    if causal:
        right = 0
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    shift = i + seqlen_k - seqlen_q
    m = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        m &= j >= shift - left
    if right >= 0:
        m &= j <= shift + right
    return m


def attention_ref(
    q: Any,
    k: Any,
    v: Any,
    *,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    lowp: Optional[str] = None,
) -> Tuple[Any, Any]:
    """Attention in float32: returns (out (b, sq, h, d), lse (b, h, sq)), both float32.

    q (b, sq, h, d), k and v (b, sk, hk, d), in any float dtype (upcast here). ``lowp``:
    None for the float32 reference, or "float16" / "bfloat16" for the naive low-precision
    attention of the module docstring. A row that sees no key gets out = 0 and lse = -inf.
    """
    ops, conv = _ops_for(q)
    q, k, v = conv(q), conv(k), conv(v)
    if lowp is not None:
        lowp = _DTYPE_NAMES.get(str(lowp).replace("torch.", ""), str(lowp))
        if lowp not in ("float16", "bfloat16"):
            raise ValueError(f"lowp: expected None, 'float16' or 'bfloat16', got {lowp!r}")
    rnd = {None: lambda x: x, "float16": ops.round_fp16, "bfloat16": ops.round_bf16}[lowp]
    b, sq, h, d = (int(s) for s in q.shape)
    sk, hk = int(k.shape[1]), int(k.shape[2])
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    left, right = window_size
    if causal:
        right = 0
    q, k, v = ops.f32(q), ops.f32(k), ops.f32(v)
    if h != hk:
        k, v = ops.repeat_heads(k, h // hk), ops.repeat_heads(v, h // hk)
    out = ops.zeros((b, sq, h, d), like=q)
    lse = ops.zeros((b, h, sq), like=q)
    if b * h * sq == 0:
        return out, lse
    chunk = max(1, min(sq, CHUNK_SCORES // max(1, b * h * sk)))
    cols = ops.arange(sk, like=q)[None, :]
    with ops.exact_fp32():
        for r0 in range(0, sq, chunk):
            r1 = min(sq, r0 + chunk)
            scores = rnd(ops.einsum("bthd,bshd->bhts", rnd(q[:, r0:r1] * scale), k))  # (b, h, rows, sk)
            if softcap > 0:
                scores = rnd(ops.tanh(scores / softcap) * softcap)
            diag = ops.arange(r1 - r0, like=q)[:, None] + (r0 + sk - sq)  # (rows, 1)
            visible = cols >= 0
            if right >= 0:
                visible = visible & (cols <= diag + right)
            if left >= 0:
                visible = visible & (cols >= diag - left)
            scores = ops.where(visible, scores, -math.inf)
            row_max = ops.rowmax(scores)
            row_max = ops.where(ops.isfinite(row_max), row_max, 0.0)
            p = ops.exp(scores - row_max)
            row_sum = ops.rowsum(p)
            seen = row_sum > 0
            safe_sum = ops.where(seen, row_sum, 1.0)
            p = rnd(p / safe_sum)
            out[:, r0:r1] = rnd(ops.einsum("bhts,bshd->bthd", p, v))
            lse[:, :, r0:r1] = ops.where(seen, ops.log(safe_sum) + row_max, -math.inf)[..., 0]
    return out, lse


# ------------------------------------------------------------------------------ the check


@dataclass
class Check:
    """The outcome of check_attention(). ``ok`` is the verdict; ``message`` says why it failed."""

    ok: bool
    out_err: float
    out_bound: float
    out_naive_err: float
    lse_err: Optional[float] = None
    lse_bound: Optional[float] = None
    message: str = ""

    def __bool__(self) -> bool:
        return self.ok

    def summary(self) -> str:
        s = f"out err {self.out_err:.2e} <= {self.out_bound:.2e}" if self.ok else self.message
        if self.ok and self.lse_err is not None:
            s += f", lse err {self.lse_err:.2e} <= {self.lse_bound:.2e}"
        return s


def check_attention(
    out: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    lse: Any = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    what: str = "out",
) -> Check:
    """Checks an attention output (and its lse, if given) against the rule of the module docstring.

    ``out`` is (b, sq, h, d) like q, in q's dtype; ``lse`` float32 (b, h, sq). The low precision of
    the naive attention is q's dtype.
    """
    kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap)
    dtype = _dtype_name(q)
    if dtype not in ("float16", "bfloat16"):
        raise TypeError(f"q: expected float16 or bfloat16 inputs to compare against, got {dtype}")
    ref, lse_ref = attention_ref(q, k, v, **kw)
    naive, lse_naive = attention_ref(q, k, v, lowp=dtype, **kw)
    ops, conv = _ops_for(q)
    out = ops.f32(conv(out))
    problems = []
    if tuple(out.shape) != tuple(ref.shape):
        return Check(False, math.inf, 0.0, 0.0, message=f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    bad = ops.count(~ops.isfinite(out))
    out_err = ops.max_abs(out - ref)
    naive_err = ops.max_abs(naive - ref)
    bound = tolerance(naive_err, OUT_ATOL)
    if bad:
        problems.append(f"{what}: {bad} non-finite values (NaN: unwritten or invalid)")
    if not out_err <= bound:  # NaN compares False
        problems.append(f"{what}: max error {out_err:.3e} > bound {bound:.3e} (naive low-precision error {naive_err:.3e})")
    result = Check(not problems, out_err, bound, naive_err)
    if lse is not None:
        lse = ops.f32(conv(lse))
        name = "lse" if what == "out" else f"{what} lse"
        if tuple(lse.shape) != tuple(lse_ref.shape):
            problems.append(f"{name}: shape {tuple(lse.shape)}, expected {tuple(lse_ref.shape)}")
        else:
            empty = ops.isneginf(lse_ref)
            if not ops.all(ops.isneginf(lse) == empty):
                problems.append(
                    f"{name}: -inf at {ops.count(ops.isneginf(lse))} rows, expected exactly at the "
                    f"{ops.count(empty)} rows that see no key"
                )
            seen = ~empty
            if ops.count(seen):
                got = lse[seen]
                if not ops.all(ops.isfinite(got)):
                    problems.append(f"{name}: NaN or inf in rows that see keys")
                result.lse_err = ops.max_abs(got - lse_ref[seen])
                result.lse_bound = tolerance(ops.max_abs(lse_naive[seen] - lse_ref[seen]), LSE_ATOL)
                if not result.lse_err <= result.lse_bound:
                    problems.append(f"{name}: max error {result.lse_err:.3e} > bound {result.lse_bound:.3e}")
            else:
                result.lse_err, result.lse_bound = 0.0, LSE_ATOL
    result.ok = not problems
    result.message = "; ".join(problems)
    return result


def assert_attention_close(out: Any, q: Any, k: Any, v: Any, **kwargs: Any) -> Check:
    """check_attention(), raising AssertionError with its message when the output fails."""
    result = check_attention(out, q, k, v, **kwargs)
    if not result.ok:
        raise AssertionError(result.message)
    return result


# ------------------------------------------------------------------------------ gradients (torch)


def attention_grads_ref(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    lowp: bool = False,
) -> Tuple[Any, Any, Any]:
    """(dq, dk, dv) of attention by torch autograd, torch tensors only: in float32 (the reference),
    or with ``lowp=True`` in the inputs' dtype (the naive attention of the rule, as FlashAttention's
    ``attention_ref(upcast=False)``: q * scale, the scores, the probabilities and the output rounded
    to that dtype). Rows that see no key have zero gradients. Memory: the whole score matrix."""
    import torch

    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    dt = q.dtype if lowp else torch.float32
    with _Tf32Off(torch), torch.enable_grad():
        qr, kr, vr = (x.detach().to(dt).requires_grad_() for x in (q, k, v))
        kk = kr.repeat_interleave(h // hk, dim=2)
        vv = vr.repeat_interleave(h // hk, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", qr * scale, kk)
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        seen = torch.from_numpy(visible_mask(sq, sk, causal, window_size)).to(q.device)
        empty = ~seen.any(dim=-1, keepdim=True)  # rows that see no key
        scores = scores.masked_fill(~seen | empty, float("-inf")).masked_fill(empty, 0.0)
        probs = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0).to(dt)
        out = torch.einsum("bhqk,bkhd->bqhd", probs, vv)
        dq, dk, dv = torch.autograd.grad(out, (qr, kr, vr), dout.to(dt))
    return dq.float(), dk.float(), dv.float()


def check_gradients(grads: Tuple[Any, Any, Any], dout: Any, q: Any, k: Any, v: Any,
                    parts: Tuple[str, ...] = ("dq", "dk", "dv"), **kwargs: Any) -> Check:
    """Checks (dq, dk, dv) against the rule: each gradient's max error against the float32
    reference at most twice the naive low-precision attention's, plus GRAD_ATOL; no NaN or inf.
    torch tensors only. parts: which of them to check. kwargs: softmax_scale, causal, window_size,
    softcap."""
    import torch

    ref = attention_grads_ref(dout, q, k, v, **kwargs)
    naive = attention_grads_ref(dout, q, k, v, lowp=True, **kwargs)
    problems, worst, worst_bound, worst_naive = [], 0.0, 0.0, 0.0
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        if name not in parts:
            continue
        if tuple(g.shape) != tuple(r.shape):
            problems.append(f"{name}: shape {tuple(g.shape)}, expected {tuple(r.shape)}")
            continue
        g = g.float()
        bad = int((~torch.isfinite(g)).sum())
        err = float((g - r).abs().max()) if g.numel() else 0.0
        naive_err = float((n - r).abs().max()) if g.numel() else 0.0
        bound = tolerance(naive_err, GRAD_ATOL)
        if bad:
            problems.append(f"{name}: {bad} non-finite values (NaN: unwritten or invalid)")
        if not err <= bound:
            problems.append(f"{name}: max error {err:.3e} > bound {bound:.3e} (naive low-precision error {naive_err:.3e})")
        if err / max(bound, 1e-30) >= worst / max(worst_bound, 1e-30):
            worst, worst_bound, worst_naive = err, bound, naive_err
    return Check(not problems, worst, worst_bound, worst_naive, message="; ".join(problems))
