"""``python -m flashcute.bench varlen``: prefill of a batch of sequences of mixed lengths, packed
(:func:`flashcute.flash_attn_varlen_func`) against the same batch padded to its longest sequence
(:func:`flashcute.flash_attn_func`, the way without varlen).

The lengths are drawn log-uniformly from ``--min-len`` to ``--max-len`` (seeded) until
``--tokens`` tokens, or all ``--equal`` long (then the padded call is the plain fixed-length call
on the same work); bf16, causal unless ``--no-causal``. ``--pass bwd`` times the backward instead
(``torch.autograd.grad`` of the output, the forward run once). Useful TFLOP/s counts only the real
tokens, FlashAttention's way: 4 * H * D * L^2 (/ 2 causal) a sequence of length L, times 2.5 for
the backward. The padded call computes the padding too (its rows are masked in nothing but cost
the same), which is what packing saves. Timed by
flashcute.bench's standard timing (:mod:`flashcute.bench.timing`: a warm-up, every timed call after
an L2 flush, the two calls in order and then in reverse, the median of ``--iters``). torch only.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
from collections.abc import Sequence

import flashcute

from . import timing
from .arrays import TorchLib
from .timing import Subject, Timing, time_subjects

PROG = "flashcute.bench varlen"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--min-len", type=int, default=128)
    p.add_argument("--max-len", type=int, default=8192)
    p.add_argument("--heads", default="32:8", help="nheads:nheads_k (default 32:8)")
    p.add_argument("--headdims", default="64,128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--equal", type=int, default=0, help="every sequence this long (instead of random lengths)")
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd")
    a = p.parse_args(argv)
    try:
        lib = TorchLib.load()
    except Exception as exc:
        print(f"{PROG}: needs torch with a CUDA device ({exc})", file=sys.stderr)
        return 1
    torch = lib.m
    how = Timing(timing.STANDARD, warmup=5, iters=a.iters)
    flush_nbytes = timing.flush_bytes(lib.device_info().l2_bytes)
    flush = lib.l2_flusher(flush_nbytes)
    rng = random.Random(a.seed)
    lens: list[int] = []
    while sum(lens) < a.tokens:
        lens.append(a.equal or int(math.exp(rng.uniform(math.log(a.min_len), math.log(a.max_len)))))
    h, hk = (int(x) for x in a.heads.split(":"))
    total, longest = sum(lens), max(lens)
    drawn = f"{a.equal} tokens each" if a.equal else f"{a.min_len}-{a.max_len} tokens (log-uniform, seed {a.seed})"
    print(f"# {PROG}: {torch.cuda.get_device_name()}, bf16, {'causal' if a.causal else 'no mask'}, {a.pass_}, "
          f"heads {h}:{hk}; {len(lens)} sequences of {drawn}: {total} tokens, padded to "
          f"{len(lens)} x {longest} = {len(lens) * longest}")
    print(f"# {PROG}: {how.method(flush_nbytes)}")
    print("headdim | varlen ms  TFLOP/s | padded ms  TFLOP/s | varlen/padded speed")
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    for d in (int(x) for x in a.headdims.split(",")):
        flops = sum(4 * h * d * n * n / (2 if a.causal else 1) for n in lens) * (2.5 if a.pass_ == "bwd" else 1)
        q = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(total, hk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        qp = torch.zeros(len(lens), longest, h, d, device="cuda", dtype=torch.bfloat16)
        kp = torch.zeros(len(lens), longest, hk, d, device="cuda", dtype=torch.bfloat16)
        vp = torch.zeros_like(kp)
        for i, n in enumerate(lens):  # right-aligned: the causal mask is bottom-right aligned
            s = int(cu[i])
            qp[i, longest - n:], kp[i, longest - n:], vp[i, longest - n:] = q[s:s + n], k[s:s + n], v[s:s + n]

        varlen = lambda: flashcute.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=a.causal)  # noqa: E731
        padded = lambda: flashcute.flash_attn_func(qp, kp, vp, causal=a.causal)  # noqa: E731
        if a.pass_ == "bwd":
            varlen, padded = (_backward(torch, f, x) for f, x in ((varlen, (q, k, v)), (padded, (qp, kp, vp))))
        timed = time_subjects(lib, [Subject("varlen", [varlen]), Subject("padded", [padded])], how, flush)
        if timed.errors:
            raise next(iter(timed.errors.values()))
        t_var, t_pad = (statistics.median(timed.times_ms[name]) for name in ("varlen", "padded"))
        print(f"{d:7d} | {t_var:9.3f} {flops / t_var / 1e9:8.1f} | {t_pad:9.3f} {flops / t_pad / 1e9:8.1f} | "
              f"{t_pad / t_var:.2f}x", flush=True)
    return 0


def _backward(torch, forward, inputs):
    """A call that runs the backward of forward() (run once here) for a fresh random dout."""
    leaves = [x.requires_grad_() for x in inputs]
    out = forward()
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)
