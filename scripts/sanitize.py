#!/usr/bin/env python3
"""A small set of flashcute forward calls for NVIDIA compute-sanitizer (docs/sanitizer.md).

    for t in memcheck racecheck synccheck initcheck; do
      compute-sanitizer --tool $t --error-exitcode 1 python3 scripts/sanitize.py --backward --kvcache --varlen
    done

The cases cover the edges a kernel gets wrong: ragged seqlens (17, 113, 257: partial first and
last tiles), seqlen_q > seqlen_k with causal (query rows that see no key), several key blocks with
a ragged tail, GQA 4:1 and MQA, a sliding window, softcap, head dims that pad up to a kernel head
dim (72 -> 96), every kernel head dim, a strided packed-qkv view and a caller-provided `out`, each
in bf16 and fp16. Sizes are tiny so that racecheck finishes in seconds. --kvcache adds
flash_attn_with_kvcache calls: paged caches with shuffled pages and an append, split-KV (automatic
and forced), a contiguous MQA cache, out-of-range page numbers and cache lengths, and prefill calls
of 64 queries and more (the sm90 kernels on compute capability 9.0). --varlen adds
flash_attn_varlen_func calls, forward and backward on each path (empty, one-row and
ragged sequences, GQA, masks), and garbage cu_seqlens: out of range, and descending.

The only GPU kernels this process launches are flashcute's: inputs are made on the CPU and copied
in, and the checks run on the CPU after one synchronisation at the end. So every sanitizer report
is about flashcute. PYTORCH_NO_CUDA_MEMORY_CACHING=1 (set here unless already set) gives every
tensor its own cudaMalloc, so memcheck sees an access past a tensor's end instead of it landing in
the caching allocator's slack.

Each output and its logsumexp are checked with flashcute.testing, the project's one reference and
rule (FlashAttention's: error <= 2 x naive low-precision error + a tiny slack; no NaN; lse -inf
exactly on the rows that see no key). A case whose dtype or head dim is not compiled into this
build is skipped.
Exit code 0 when every case that ran passed, 1 otherwise (and 1 without a GPU).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")  # before torch is imported
# One CPU thread for the CPU-side checks: under memcheck, with the varlen backward cases, torch's
# OpenMP pool ended the process at exit with std::terminate after every case had passed (H100,
# 2026-11-27; clean with one thread).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import flashcute  # noqa: E402
import torch  # noqa: E402
from flashcute.bench.impls import env_var  # noqa: E402
from flashcute.testing import check_attention, check_gradients  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    packed_qkv: bool = False  # q, k, v are strided views of one (b, s, 3, h, d) tensor
    out_arg: bool = False  # pass a preallocated `out`
    sm90_tiles: str = ""  # FLASHCUTE_SM90_TILES for this call ("long": d 64's 192 x 128 tiles)

    def describe(self) -> str:
        mask = "causal" if self.causal else "full"
        if self.window != (-1, -1):
            mask += f" window{self.window}"
        if self.softcap:
            mask += f" softcap {self.softcap:g}"
        return (
            f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.nheads}/{self.nheads_k} "
            f"d{self.headdim} {mask}" + (" packed-qkv" if self.packed_qkv else "") + (" out=" if self.out_arg else "")
            + (f" sm90-tiles={self.sm90_tiles}" if self.sm90_tiles else "")
        )


CASES: tuple[Case, ...] = (
    Case("ragged", 2, 17, 113, 4, 4, 64),
    Case("ragged-causal-sq>sk", 2, 113, 17, 4, 4, 64, causal=True),  # the first 96 rows see no key
    Case("causal-multiblock", 1, 257, 257, 2, 2, 128, causal=True),
    Case("gqa-4:1", 2, 113, 113, 8, 2, 128, causal=True),
    Case("mqa-hdim72", 2, 17, 113, 4, 1, 72),  # 72 runs on the 96 kernel with 24 columns predicated off
    Case("window", 1, 129, 300, 4, 4, 128, window=(32, 8)),
    Case("window-left-causal", 1, 300, 300, 2, 1, 64, causal=True, window=(48, -1)),
    Case("softcap", 1, 64, 128, 2, 2, 64, softcap=30.0),
    Case("hdim32", 1, 113, 113, 2, 2, 32, causal=True),
    Case("hdim192", 1, 113, 113, 2, 2, 192),
    Case("hdim256", 1, 113, 200, 2, 2, 256, causal=True),
    Case("hdim256-causal-sq>sk", 1, 300, 100, 2, 2, 256, causal=True),  # the first 200 rows see no key
    Case("packed-qkv-out", 2, 77, 77, 4, 4, 64, causal=True, packed_qkv=True, out_arg=True),
    # d 64's long-sequence sm90 tiles (three consumer warpgroups), forced on small calls.
    Case("long-tiles-ragged-causal", 2, 113, 300, 4, 2, 64, causal=True, sm90_tiles="long"),
    Case("long-tiles-multiblock", 1, 400, 700, 4, 4, 64, sm90_tiles="long"),
    # A causal call of 16 query tiles per head and 136 units (more than the 132 SMs): a rotated
    # round of pairs, then the tail dealt tile by tile (sm90/scheduler.hpp).
    Case("causal-rounds-tail", 1, 2048, 2048, 17, 17, 64, causal=True),
    # 288 (key block, KV head, batch) tiles, more than twice the SMs: d 128's persistent backward
    # takes several a CTA (sm90/kernel_bwd.hpp).
    Case("bwd-persistent-tiles", 12, 64, 300, 8, 8, 128, causal=True),
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DEVICE = "cuda"


def make_inputs(case: Case, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v on the GPU, generated on the CPU so that no GPU kernel runs for them."""
    gen = torch.Generator().manual_seed(seed)
    if case.packed_qkv:
        assert case.seqlen_q == case.seqlen_k and case.nheads == case.nheads_k
        qkv = torch.randn(case.batch, case.seqlen_q, 3, case.nheads, case.headdim, generator=gen).to(dtype).to(DEVICE)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q = torch.randn(case.batch, case.seqlen_q, case.nheads, case.headdim, generator=gen)
    k = torch.randn(case.batch, case.seqlen_k, case.nheads_k, case.headdim, generator=gen)
    v = torch.randn(case.batch, case.seqlen_k, case.nheads_k, case.headdim, generator=gen)
    return tuple(x.to(dtype).to(DEVICE) for x in (q, k, v))


def launch(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One flashcute call (asynchronous); returns (out, lse)."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if case.out_arg else None
    with env_var("FLASHCUTE_SM90_TILES", case.sm90_tiles or None):
        result = flashcute.flash_attn_func(
            q,
            k,
            v,
            softmax_scale=case.headdim**-0.5,
            causal=case.causal,
            window_size=case.window,
            softcap=case.softcap,
            return_lse=True,
            out=out,
        )
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"flash_attn_func(return_lse=True) returned {type(result).__name__}, expected (out, lse)")
    if out is not None and result[0].data_ptr() != out.data_ptr():
        raise ValueError("flash_attn_func(out=...) did not write into the given tensor")
    return result



def check(
    case: Case, dtype: torch.dtype, inputs: tuple[torch.Tensor, ...], out: torch.Tensor, lse: torch.Tensor
) -> tuple[bool, str]:
    """Compares one case's output and logsumexp (copied to the CPU) with the reference."""
    q, k, v = (x.cpu() for x in inputs)
    if tuple(out.shape) != tuple(q.shape) or out.dtype != dtype:
        return False, f"out is {tuple(out.shape)} {out.dtype}, expected {tuple(q.shape)} {dtype}"
    result = check_attention(out.cpu(), q, k, v, lse=lse.cpu(), softmax_scale=case.headdim**-0.5, causal=case.causal,
                             window_size=case.window, softcap=case.softcap)
    return result.ok, result.summary()


def check_backward(case: Case, inputs: tuple[torch.Tensor, ...], out: torch.Tensor,
                   lse: torch.Tensor) -> tuple[bool, str]:
    """flash_attn_bwd of one case into NaN-poisoned outputs, checked on the CPU: on the sm80
    backward (FLASHCUTE_BACKWARD_PATH=sm80), and on the sm90 one where it takes the case, with
    and without deterministic."""
    q, k, v = inputs
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(q.dtype).to(DEVICE)
    opts = dict(softmax_scale=case.headdim**-0.5, causal=case.causal, window_size=case.window, softcap=case.softcap)
    notes = []
    # sm90 twice: its dQ adds in arrival order, then in turn (deterministic: spin-waits across CTAs).
    for path, deterministic in (("sm80", False), ("sm90", False), ("sm90", True)):
        grads = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
        with env_var("FLASHCUTE_FORWARD_PATH", path), env_var("FLASHCUTE_BACKWARD_PATH", path):
            flashcute.flash_attn_bwd(dout, q, k, v, out, lse, deterministic=deterministic, dq=grads[0],
                                     dk=grads[1], dv=grads[2], **opts)
        ran = flashcute.last_backward_path()
        if ran != path:  # the sm90 backward does not take this case
            continue
        torch.cuda.synchronize()
        result = check_gradients(tuple(g.cpu() for g in grads), dout.cpu(), *(x.cpu() for x in inputs), **opts)
        name = ran + (" deterministic" if deterministic else "")
        if not result.ok:
            return False, f"{name} backward: {result.message}"
        notes.append(f"{name} grads {result.summary()}")
    return True, "; ".join(notes)


@dataclass(frozen=True)
class KvCase:
    """A flash_attn_with_kvcache call: b sequences, sq new queries (and as many appended keys when
    append), a cache of `capacity` keys a sequence, paged when page > 0."""

    name: str
    batch: int
    seqlen_q: int
    nheads: int
    nheads_k: int
    headdim: int
    capacity: int
    page: int = 0
    append: bool = True
    causal: bool = False
    num_splits: int = 0
    garbage: bool = False  # out-of-range pages and cache lengths: the sanitizer's verdict, and NaN where it belongs

    def describe(self) -> str:
        return (f"b{self.batch} sq{self.seqlen_q} h{self.nheads}/{self.nheads_k} d{self.headdim} cap{self.capacity} "
                + (f"page{self.page}" if self.page else "contiguous") + (" append" if self.append else "")
                + (" causal" if self.causal else "") + f" splits={self.num_splits}")


KV_CASES: tuple[KvCase, ...] = (
    KvCase("kv-paged16-append", 2, 1, 8, 2, 128, 160, page=16),
    KvCase("kv-paged64-multi-causal", 2, 4, 4, 4, 64, 256, page=64, causal=True, num_splits=3),
    KvCase("kv-contig-mqa", 3, 1, 4, 1, 128, 300, append=False),
    KvCase("kv-paged32-garbage", 2, 1, 4, 2, 64, 128, page=32, garbage=True),
    # Blocks past the first two: the main loop's loads, through the page slots (one split).
    KvCase("kv-paged16-long", 2, 1, 8, 2, 64, 1024, page=16, num_splits=1),
    KvCase("kv-paged32-garbage-long", 2, 1, 4, 2, 128, 1024, page=32, garbage=True, num_splits=1),
    # 64 queries and more: the sm90 kernels on an H100 / H200 (boxes, mended blocks, whole blocks).
    KvCase("kv-prefill-paged16", 2, 80, 4, 2, 128, 320, page=16, causal=True),
    KvCase("kv-prefill-contig", 2, 64, 4, 1, 64, 200),
    KvCase("kv-prefill-paged128", 2, 96, 4, 2, 128, 512, page=128, append=False),
    KvCase("kv-prefill-garbage", 2, 64, 4, 2, 64, 128, page=64, append=False, garbage=True),
)


def run_kvcache(case: KvCase, dtype: torch.dtype, seed: int) -> tuple[bool, str]:
    """One KV-cache call (inputs made on the CPU), checked per sequence on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    b, d, hk = case.batch, case.headdim, case.nheads_k
    if case.page:
        per_seq = case.capacity // case.page
        num_pages = b * per_seq + 2
        table = torch.randperm(num_pages, generator=gen)[: b * per_seq].view(b, per_seq).to(torch.int32)
        shape = (num_pages, case.page, hk, d)
    else:
        table, shape = None, (b, case.capacity, hk, d)
    kc, vc = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(b, case.seqlen_q, case.nheads, d, generator=gen).to(dtype)
    new = case.seqlen_q if case.append else 0
    kn, vn = (torch.randn(b, new, hk, d, generator=gen).to(dtype) for _ in range(2)) if new else (None, None)
    lens = [int(x) for x in torch.randint(0, case.capacity - new + 1, (b,), generator=gen)]
    if case.garbage:
        table[0, 0], table[-1, -1], table[-1, 0] = -3, 1 << 30, -3  # sequence 1: its first and last pages
        lens = [-7, 1 << 30][:b]
    dev = [None if x is None else x.to(DEVICE) for x in (q, kc, vc, kn, vn, table)]
    seqlens = torch.tensor(lens, dtype=torch.int32).to(DEVICE)
    out, lse = flashcute.flash_attn_with_kvcache(dev[0], dev[1], dev[2], dev[3], dev[4], cache_seqlens=seqlens,
                                                 block_table=dev[5], causal=case.causal, num_splits=case.num_splits,
                                                 return_lse=True)
    torch.cuda.synchronize()
    if case.garbage:  # sequence 0 has no keys (out 0); sequence 1 sees them all, its first and last pages out of range
        ok = bool((out[0] == 0).all()) and bool(torch.isnan(out[1]).all()) and bool(torch.isnan(lse[1]).all())
        return ok, "ran with out-of-range pages and lengths; NaN exactly where a row sees a bad page"
    kc2, vc2 = dev[1].cpu(), dev[2].cpu()
    if case.page:  # each sequence's keys in order, through its pages
        logical = (kc2[table.long()].reshape(b, -1, hk, d), vc2[table.long()].reshape(b, -1, hk, d))
    else:
        logical = (kc2, vc2)
    notes = []
    for i in range(b):
        keys = lens[i] + new
        if new and not (torch.equal(logical[0][i, lens[i]:keys], kn[i]) and torch.equal(logical[1][i, lens[i]:keys], vn[i])):
            return False, f"sequence {i}: the appended rows differ from k, v"
        r = check_attention(out[i:i + 1].cpu(), q[i:i + 1], logical[0][i:i + 1, :keys], logical[1][i:i + 1, :keys],
                            lse=lse[i:i + 1].cpu(), causal=case.causal)
        if not r.ok:
            return False, f"sequence {i}: {r.message}"
        notes.append(r.summary())
    return True, "; ".join(notes[:1])


@dataclass(frozen=True)
class VarlenCase:
    """A flash_attn_varlen_func call and its backward (autograd). `cu` set: these cu_seqlens_q and
    cu_seqlens_k instead of the lengths' (garbage: only the sanitizer's verdict and finite
    results count)."""

    name: str
    lens_q: tuple[int, ...]
    lens_k: tuple[int, ...]
    nheads: int
    nheads_k: int
    headdim: int
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    cu: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def describe(self) -> str:
        return (f"q{self.lens_q} k{self.lens_k} h{self.nheads}/{self.nheads_k} d{self.headdim}"
                + (" causal" if self.causal else "") + (f" window{self.window}" if self.window != (-1, -1) else "")
                + (f" cu_seqlens {self.cu}" if self.cu else ""))


VARLEN_CASES: tuple[VarlenCase, ...] = (
    VarlenCase("varlen-ragged-causal", (17, 1, 0, 300), (17, 40, 5, 300), 4, 2, 64, causal=True),
    VarlenCase("varlen-gqa-window", (200, 129, 77), (150, 129, 300), 8, 2, 128, window=(40, 7)),
    VarlenCase("varlen-equal-causal", (192, 192, 192), (100, 192, 250), 4, 2, 128, causal=True),  # sm90: the longest's walk
    # 300 tiles, most past their sequence's keys: d 128's persistent backward skips those.
    VarlenCase("varlen-many-tiles", (100,) + (3, 0, 40) * 8, (300,) + (7, 20, 0) * 8, 8, 4, 128, causal=True),
    VarlenCase("varlen-out-of-range", (64, 64, 64), (48, 48, 48), 2, 2, 64, causal=True,
               cu=((0, 1 << 30, -5, 192), (-100, 10, 9, 1 << 20))),
    # Sequences 0 and 2 both take rows [0, 300) (1 is empty): their sm90 workspace blocks overlap.
    VarlenCase("varlen-descending", (300, 0), (200, 0), 2, 2, 64, cu=((0, 300, 0, 300), (0, 200, 0, 200))),
    # One cu_seqlens array for queries and keys (self-attention): at d <= 64 the sm90 backward's
    # lean preprocess with the per-entry exact-D kernel; a trailing exact run, then garbage.
    VarlenCase("varlen-self-window", (1, 113, 300, 64), (1, 113, 300, 64), 4, 2, 64, window=(10, 60)),
    VarlenCase("varlen-self-garbage", (64, 64, 64), (64, 64, 64), 2, 2, 64, causal=True,
               cu=((0, 1 << 30, -5, 192), (0, 1 << 30, -5, 192))),
)


def run_varlen(case: VarlenCase, dtype: torch.dtype, seed: int) -> tuple[bool, str]:
    """The forward and its backward on the sm80 paths, then on the sm90 ones (the backward with
    and without deterministic) where they take the call, each sequence checked on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(case.lens_q), sum(case.lens_k)
    q = torch.randn(tq, case.nheads, case.headdim, generator=gen).to(dtype)
    k, v = (torch.randn(tk, case.nheads_k, case.headdim, generator=gen).to(dtype) for _ in range(2))
    dout = torch.randn(q.shape, generator=gen).to(dtype)
    spans = []
    for lens in (case.lens_q, case.lens_k):
        ends = [0]
        for n in lens:
            ends.append(ends[-1] + n)
        spans.append(ends)
    cu_q, cu_k = case.cu if case.cu else spans
    dev_cu = [torch.tensor(c, dtype=torch.int32).to(DEVICE) for c in (cu_q, cu_k)]
    if tuple(cu_q) == tuple(cu_k):
        dev_cu[1] = dev_cu[0]  # one array, as self-attention passes it
    opts = dict(softmax_scale=case.headdim**-0.5, causal=case.causal, window_size=case.window)
    notes = []
    for path, deterministic in (("sm80", False), ("sm90", False), ("sm90", True)):
        leaves = [x.to(DEVICE).requires_grad_() for x in (q, k, v)]
        with env_var("FLASHCUTE_FORWARD_PATH", path), env_var("FLASHCUTE_BACKWARD_PATH", path):
            # Garbage cu_seqlens may make a sequence as long as the arrays: maxima that cover it.
            maxima = (tq, tk) if case.cu else (max(case.lens_q), max(case.lens_k))
            out, lse = flashcute.flash_attn_varlen_func(*leaves, *dev_cu, *maxima,
                                                        deterministic=deterministic, return_lse=True, **opts)
            grads = torch.autograd.grad(out, leaves, dout.to(DEVICE))
            fwd_ran = flashcute.last_forward_path()
        ran = flashcute.last_backward_path()
        if ran != path:  # the sm90 backward does not take this case
            continue
        torch.cuda.synchronize()
        name = (ran if fwd_ran == ran else f"{fwd_ran} forward, {ran}") + (" deterministic" if deterministic else "")
        out, lse, grads = out.detach().cpu(), lse.cpu(), [g.cpu() for g in grads]
        if case.cu:
            if not all(bool(torch.isfinite(x).all()) for x in (out, *grads)):
                return False, f"{name}: a non-finite output or gradient"
            notes.append(f"{name}: ran, finite")
            continue
        for i in range(len(case.lens_q)):
            (q0, q1), (k0, k1) = spans[0][i:i + 2], spans[1][i:i + 2]
            if q1 == q0 or k1 == k0:
                continue
            args = (q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
            r = check_attention(out[None, q0:q1], *args, lse=lse[None, :, q0:q1], **opts)
            if not r.ok:
                return False, f"{name}, sequence {i}: forward: {r.message}"
            g = (grads[0][None, q0:q1], grads[1][None, k0:k1], grads[2][None, k0:k1])
            r = check_gradients(g, dout[None, q0:q1], *args, **opts)
            if not r.ok:
                return False, f"{name}, sequence {i}: backward: {r.message}"
        notes.append(f"{name} ok")
    return True, "; ".join(notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bf16,fp16", help="comma-separated: bf16, fp16 (default both)")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--sync-each", action="store_true", help="synchronise after every call (to attribute a fault)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--backward", action="store_true",
                        help="also run flash_attn_bwd on every case and check dq, dk, dv")
    parser.add_argument("--kvcache", action="store_true",
                        help="also run flash_attn_with_kvcache cases (paged, append, split-KV, garbage indices)")
    parser.add_argument("--varlen", action="store_true",
                        help="also run flash_attn_varlen_func cases, forward and backward (garbage cu_seqlens too)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.only in c.name]
    if args.list:
        for c in cases:
            print(f"{c.name:22s} {c.describe()}")
        return 0
    if not torch.cuda.is_available():
        print("sanitize.py: torch sees no CUDA GPU: this script needs an sm80+ NVIDIA GPU", file=sys.stderr)
        return 1
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]

    # Launch everything, then synchronise once: the sanitizer reports per kernel launch anyway.
    launched: list[tuple[Case, str, torch.dtype, tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]] = []
    skipped: list[tuple[Case, str, str]] = []
    failed: list[tuple[Case, str, str]] = []
    for ci, case in enumerate(cases):
        for dname in dtypes:
            dtype = DTYPES[dname]
            inputs = make_inputs(case, dtype, seed=ci)
            try:
                out, lse = launch(case, *inputs)
            except Exception as exc:  # noqa: BLE001 - report and go on with the other cases
                (skipped if isinstance(exc, NotImplementedError) else failed).append(
                    (case, dname, f"{type(exc).__name__}: {exc}")
                )
                continue
            if args.sync_each:
                torch.cuda.synchronize()
            # Which forward kernels ran it: sm90 (wgmma + TMA) on an H100/H200 with them built.
            bm, bn = flashcute.last_forward_tile()
            launched.append((case, dname, dtype, inputs, out, lse, f"{flashcute.last_forward_path()} {bm}x{bn}"))
    torch.cuda.synchronize()

    passed = 0
    paths: dict[str, int] = {}
    for case, dname, dtype, inputs, out, lse, path in launched:
        paths[path] = paths.get(path, 0) + 1
        ok, note = check(case, dtype, inputs, out, lse)
        if ok and args.backward:
            ok, bwd_note = check_backward(case, inputs, out, lse)
            note += "; " + bwd_note
        passed += ok
        if not ok:
            failed.append((case, dname, note))
        else:
            print(f"PASS {dname} {case.name:22s} [{path}] {case.describe()}: {note}", flush=True)
    # The KV-cache and varlen cases: each runs and checks itself (run_kvcache, run_varlen).
    extra = [(KV_CASES, run_kvcache, 100, False)] if args.kvcache else []
    extra += [(VARLEN_CASES, run_varlen, 200, True)] if args.varlen else []
    for extra_cases, run, seed, describe in extra:
        for ci, x_case in enumerate(c for c in extra_cases if args.only in c.name):
            for dname in dtypes:
                try:
                    ok, note = run(x_case, DTYPES[dname], seed=seed + ci)
                except NotImplementedError as exc:
                    skipped.append((x_case, dname, f"NotImplementedError: {exc}"))
                    continue
                passed += ok
                if ok:
                    what = f" {x_case.describe()}:" if describe else ""
                    print(f"PASS {dname} {x_case.name:22s}{what} {note}", flush=True)
                else:
                    failed.append((x_case, dname, note))
    for case, dname, note in skipped:
        print(f"SKIP {dname} {case.name:22s} {case.describe()}: {note}", flush=True)
    for case, dname, note in failed:
        print(f"FAIL {dname} {case.name:22s} {case.describe()}: {note}", flush=True)
    print(
        f"sanitize.py: {passed} cases passed, {len(failed)} failed, {len(skipped)} skipped (not compiled); "
        f"forward kernels: " + ", ".join(f"{n} on {p}" for p, n in sorted(paths.items())),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
