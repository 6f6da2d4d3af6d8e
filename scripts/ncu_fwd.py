"""One forward call per (impl, shape) inside an NVTX range "prof", for Nsight Compute.

Each call runs once untimed first (module load, cuDNN plan, autotuning), so ncu sees only the
steady-state kernel:

    ncu --clock-control none --set full --nvtx --nvtx-include "prof/" -o fwd -f \\
        python3 scripts/ncu_fwd.py --impls flashcute,cudnn --shapes 128:full:1024,256:causal:1024

Shapes are HEADDIM:{full,causal}:SEQLEN on FlashAttention's grid (batch = 16384 // seqlen,
heads = 2048 // headdim), bf16. The sm90 profiles in docs/perf-notes.md started from the default list.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcute

DEFAULT_SHAPES = "128:full:1024,128:causal:1024,256:full:4096,256:causal:1024,64:full:4096"


def profile_once(call, label: str) -> None:
    """Runs call once untimed, then once inside the NVTX range "prof" that ncu's --nvtx-include picks."""
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"profiled {label}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default="flashcute,cudnn", help="flashcute, cudnn, flash (SDPA backends)")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="HEADDIM:{full,causal}:SEQLEN, comma-separated")
    args = parser.parse_args()
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for spec in args.shapes.split(","):
        d, mask, s = spec.split(":")
        d, s, causal = int(d), int(s), mask == "causal"
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for impl in args.impls.split(","):
            if impl == "flashcute":
                def call():
                    return flashcute.flash_attn_func(q, k, v, causal=causal)
            else:
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def call(backend=backends[impl]):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            profile_once(call, f"{impl} d={d} {mask} s={s} b={b} h={h}")


if __name__ == "__main__":
    main()
