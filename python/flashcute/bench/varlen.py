"""``python -m flashcute.bench varlen``: prefill of a batch of sequences of mixed lengths, packed
(:func:`flashcute.flash_attn_varlen_func`) against the same batch padded to its longest sequence
(:func:`flashcute.flash_attn_func`, the way without varlen).

The lengths are drawn log-uniformly from ``--min-len`` to ``--max-len`` (seeded) until
``--tokens`` tokens, or all ``--equal`` long (then the padded call is the plain fixed-length call
on the same work); bf16, causal unless ``--no-causal``. The varlen call is timed on each forward
path of ``--paths`` (``FLASHCUTE_FORWARD_PATH``: sm90, the Hopper kernels where the GPU has them,
and sm80); the padded call and ``fixed``, a fixed-length call of the batch's mean length over the
same number of tokens, on the default path. ``--pass bwd`` times the backward instead
(``torch.autograd.grad`` of the output, the forward run once). Useful TFLOP/s counts only the real
tokens, FlashAttention's way: 4 * H * D * L^2 (/ 2 causal) a sequence of length L, times 2.5 for
the backward. The padded call computes the padding too (its rows are masked in nothing but cost
the same), which is what packing saves. ``--modes eager`` (the default) times plain calls, ``--modes
graph`` CUDA-graph replays of each (the forward only), ``--modes eager,graph`` both, a row each.
Writes ``varlen-<date>.csv`` to ``--out-dir``. Timed by
flashcute.bench's standard timing (:mod:`flashcute.bench.timing`: a warm-up, every timed call after
an L2 flush, the two calls in order and then in reverse, the median of ``--iters``). torch only.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import math
import os
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import flashcute

from . import timing
from .arrays import TorchLib
from .decode import _list, check_choices, graph_replay
from .timing import Subject, Timing, time_subjects

PROG = "flashcute.bench varlen"
MODES = ("eager", "graph")


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
    p.add_argument("--paths", default="sm90,sm80", help="forward paths to time the varlen call on (default sm90,sm80)")
    p.add_argument("--modes", default="eager",
                   help="eager and/or graph, comma-separated: plain calls, CUDA-graph replays (default eager)")
    p.add_argument("--out-dir", type=Path, default=Path("bench-results"), help="where varlen-<date>.csv goes")
    a = p.parse_args(argv)
    paths, modes = _list(a.paths), _list(a.modes)
    check_choices(p, "--paths", paths, ("sm90", "sm80"))
    check_choices(p, "--modes", modes, MODES)
    if "graph" in modes and a.pass_ == "bwd":
        p.error("--modes graph times the forward only (the backward's autograd call is not captured); "
                "use --modes eager with --pass bwd")
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
    mean = round(total / len(lens))
    fixed_batch = max(1, round(total / mean))
    print(f"# {PROG}: {how.method(flush_nbytes)}; fixed: {fixed_batch} x {mean} tokens")
    print("mode  headdim | " + " | ".join(f"varlen {x} ms  TFLOP/s" for x in paths) +
          " | padded ms  TFLOP/s | fixed ms  TFLOP/s | " + " | ".join(f"{x}/padded {x}/fixed" for x in paths))
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    default_path = os.environ.get("FLASHCUTE_FORWARD_PATH")

    def on_path(path, f):
        """f with FLASHCUTE_FORWARD_PATH set to path (None: as the environment had it)."""
        def call():
            if path is None:
                os.environ.pop("FLASHCUTE_FORWARD_PATH", None)
            else:
                os.environ["FLASHCUTE_FORWARD_PATH"] = path
            return f()
        return call

    rows: list[dict] = []
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

        qf = torch.randn(fixed_batch, mean, h, d, device="cuda", dtype=torch.bfloat16)
        kf = torch.randn(fixed_batch, mean, hk, d, device="cuda", dtype=torch.bfloat16)
        vf = torch.randn_like(kf)
        fixed_flops = fixed_batch * 4 * h * d * mean * mean / (2 if a.causal else 1) * (2.5 if a.pass_ == "bwd" else 1)

        calls = {}
        for path in paths:
            calls[f"varlen {path}"] = (on_path(path, lambda: flashcute.flash_attn_varlen_func(
                q, k, v, cu, cu, longest, longest, causal=a.causal)), (q, k, v))
        calls["padded"] = (on_path(default_path, lambda: flashcute.flash_attn_func(qp, kp, vp, causal=a.causal)),
                           (qp, kp, vp))
        calls["fixed"] = (on_path(default_path, lambda: flashcute.flash_attn_func(qf, kf, vf, causal=a.causal)),
                          (qf, kf, vf))
        for mode in modes:
            subjects = []
            for name, (f, inputs) in calls.items():
                # A graph captures the path each call takes (FLASHCUTE_FORWARD_PATH is read when it is called).
                call = _backward(torch, f, inputs) if a.pass_ == "bwd" else f
                subjects.append(Subject(name, [graph_replay(torch, call) if mode == "graph" else call]))
            timed = time_subjects(lib, subjects, how, flush)
            on_path(default_path, lambda: None)()
            if timed.errors:
                raise next(iter(timed.errors.values()))
            t = {name: statistics.median(timed.times_ms[name]) for name in calls}
            speed = {name: (fixed_flops if name == "fixed" else flops) / t[name] / 1e9 for name in calls}
            cols = [f"{t[f'varlen {x}']:9.3f} {speed[f'varlen {x}']:8.1f}" for x in paths]
            cols += [f"{t['padded']:9.3f} {speed['padded']:8.1f}", f"{t['fixed']:9.3f} {speed['fixed']:8.1f}"]
            cols += [f"{t['padded'] / t[f'varlen {x}']:.2f}x {speed[f'varlen {x}'] / speed['fixed']:.2f}x" for x in paths]
            print(f"{mode:5s} {d:7d} | " + " | ".join(cols), flush=True)
            rows += [{"mode": mode, "headdim": d, "subject": name, "ms": t[name], "tflops": speed[name]} for name in calls]
    a.out_dir.mkdir(parents=True, exist_ok=True)
    path = a.out_dir / f"varlen-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%SZ}.csv"
    write_csv(path, rows, pass_=a.pass_, causal=a.causal, heads=(h, hk), lens=lens, timing_kind=how.kind)
    print(f"# {PROG}: wrote {path}")
    return 0


def write_csv(path: Path, rows: Sequence[dict], *, pass_: str, causal: bool, heads: tuple[int, int],
              lens: Sequence[int], timing_kind: str) -> None:
    """One line per (head dim, subject): the run's shape, the median ms and the useful TFLOP/s."""
    with open(path, "w") as f:
        f.write("mode,pass,causal,nheads,nheads_k,sequences,tokens,longest,headdim,subject,timing,ms,tflops\n")
        for r in rows:
            f.write(f"{r['mode']},{pass_},{int(causal)},{heads[0]},{heads[1]},{len(lens)},{sum(lens)},{max(lens)},"
                    f"{r['headdim']},{r['subject']},{timing_kind},{r['ms']:.5f},{r['tflops']:.2f}\n")


def _backward(torch, forward, inputs):
    """A call that runs the backward of forward() (run once here) for a fresh random dout."""
    leaves = [x.requires_grad_() for x in inputs]
    out = forward()
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)
