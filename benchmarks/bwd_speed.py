#!/usr/bin/env python3
"""Backward-pass speed: flashcute against SDPA's flash and cuDNN backends, in one process.

    python3 benchmarks/bwd_speed.py [--dtype bf16] [--seqlens 1024,4096,16384] [--dims 64,128,256]

For each point (batch * seqlen = 16k tokens, 2048 / headdim heads, as FlashAttention's benchmark),
the forward runs once with inputs that require grad; the timed call is the backward alone,
``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``: CUDA-event median of 20 calls
after 5 warm-ups. TFLOP/s count the backward as 2.5x the forward's 4 * b * h * s * s * d, halved
for causal (FlashAttention's convention). An interim tool until ``python -m flashcute.bench``
has a backward pass.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcute
from flashcute.bench.arrays import TorchLib
from flashcute.bench.timing import time_calls


def time_ms(fn, warmup: int = 5, iters: int = 20) -> float:
    """The median of `iters` CUDA-event-timed calls after `warmup` (flashcute.bench's timer)."""
    return statistics.median(time_calls(TorchLib.load(), [fn], warmup, iters))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--dims", default="64,128,256")
    args = parser.parse_args()
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, flashcute {flashcute.__version__}, {args.dtype}")
    print("headdim causal seqlen | flashcute flash cudnn (TFLOP/s) | fc/flash fc/cudnn")
    for d in (int(x) for x in args.dims.split(",")):
        for causal in (False, True):
            for s in (int(x) for x in args.seqlens.split(",")):
                b, h = max(1, 16384 // s), 2048 // d
                q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=dt) for _ in range(4))
                flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                res = {}
                leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                out = flashcute.flash_attn_func(*leaves, causal=causal)
                res["flashcute"] = time_ms(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
                for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    tl = [x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v)]
                    try:
                        with sdpa_kernel(backend):
                            o = F.scaled_dot_product_attention(*tl, is_causal=causal)
                            do = dout.transpose(1, 2)
                            res[name] = time_ms(lambda: torch.autograd.grad(o, tl, do, retain_graph=True))
                    except RuntimeError as e:
                        print(f"  {name} n/a: {str(e).splitlines()[0][:80]}")
                        res[name] = float("nan")
                tf = {k: flops / (ms * 1e-3) / 1e12 for k, ms in res.items()}
                print(f"{d:7d} {str(causal):6s} {s:6d} | {tf['flashcute']:7.1f} {tf['flash']:7.1f} {tf['cudnn']:7.1f} "
                      f"| {tf['flashcute'] / tf['flash']:.2f} {tf['flashcute'] / tf['cudnn']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
