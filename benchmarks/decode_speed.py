#!/usr/bin/env python3
"""Decode speed: one new query token per sequence against a bf16 KV cache, flashcute against SDPA's
flash and cuDNN backends and a device-to-device copy, in one process (issue #12's measurement).

    python3 benchmarks/decode_speed.py [--batches 1,16,64] [--seqlens 4096,16384,65536,131072]
                                       [--heads 32:8,8:8] [--headdim 128] [--max-gb 40]

For each point, q is (batch, 1, nheads, headdim) and the cache k, v (batch, seqlen_k, nheads_k,
headdim), contiguous; flashcute runs ``flash_attn_func(q, k, v)`` (the kvcache entry point of
issue #12 will take its place). The effective bandwidth is the bytes of K and V read, over the
CUDA-event median of 20 calls after 5 warm-ups. SDPA gets the same tensors transposed to
(batch, heads, seq, dim) and ``enable_gqa=True``; a backend that refuses a point shows "-". The
copy reference moves a 1 GiB buffer with ``Tensor.copy_``, counting the bytes read and written.
Each point's flashcute output is compared with SDPA flash's (max |diff|, printed) as a sanity
check; the numerical tests live in tests/python. An interim tool until ``python -m flashcute.bench``
has a decode mode.
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


def copy_tbps() -> float:
    n = 1 << 29  # 1 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e12


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--seqlens", default="4096,16384,65536,131072")
    parser.add_argument("--heads", default="32:8,8:8", help="nheads:nheads_k pairs")
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--max-gb", type=float, default=40.0, help="skip points whose KV cache is larger")
    args = parser.parse_args()
    d, dt = args.headdim, torch.bfloat16
    copy = copy_tbps()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, flashcute {flashcute.__version__}, bf16, "
          f"d {d}; device-to-device copy {copy:.2f} TB/s (read + written)")
    print("batch seqlen_k heads kv_MB | flashcute flash cudnn (TB/s of K+V) | fc/copy fc/best-sdpa | maxdiff")
    for heads in args.heads.split(","):
        h, hk = (int(x) for x in heads.split(":"))
        for b in (int(x) for x in args.batches.split(",")):
            for s in (int(x) for x in args.seqlens.split(",")):
                kv_bytes = 2 * b * s * hk * d * 2
                if kv_bytes > args.max_gb * 1e9:
                    continue
                q = torch.randn(b, 1, h, d, device="cuda", dtype=dt)
                k = torch.randn(b, s, hk, d, device="cuda", dtype=dt)
                v = torch.randn(b, s, hk, d, device="cuda", dtype=dt)
                tbps, outs = {}, {}
                outs["flashcute"] = flashcute.flash_attn_func(q, k, v)
                tbps["flashcute"] = kv_bytes / (time_ms(lambda: flashcute.flash_attn_func(q, k, v)) * 1e-3) / 1e12
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(backend):
                            def run():
                                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=h != hk)
                            outs[name] = run().transpose(1, 2)
                            tbps[name] = kv_bytes / (time_ms(run) * 1e-3) / 1e12
                    except RuntimeError:
                        tbps[name] = None
                best = max((x for n, x in tbps.items() if n != "flashcute" and x), default=None)
                diff = (outs["flashcute"].float() - outs["flash"].float()).abs().max().item() if "flash" in outs else float("nan")
                cells = " ".join(f"{tbps[n]:.2f}" if tbps.get(n) else "-" for n in ("flashcute", "flash", "cudnn"))
                ratio = f"{tbps['flashcute'] / best:.2f}" if best else "-"
                print(f"{b} {s} {h}:{hk} {kv_bytes / 1e6:.0f} | {cells} | {tbps['flashcute'] / copy:.2f} {ratio} | {diff:.1e}",
                      flush=True)
                q = k = v = qt = kt = vt = outs = None  # free this point's cache before the next one
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
