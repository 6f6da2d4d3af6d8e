"""One decode step per (impl, shape) inside an NVTX range "prof", for Nsight Compute.

Each call runs once untimed first, so ncu sees the steady-state kernels (for flashcute: the
split-KV kernel or its decode twin, and the combine where the call splits):

    ncu --clock-control none --set full --nvtx --nvtx-include "prof/" -o decode -f \\
        python3 scripts/ncu_decode.py --impls flashcute,paged,cudnn --shapes 1:4096,16:16384

Shapes are BATCH:SEQLEN_K: one query token a sequence, a full cache of SEQLEN_K keys, bf16,
--heads query:KV heads (default 32:8) and --headdim (default 128); `paged` is flashcute on the
same keys in pages of --page tokens (default 64), placed in a random order.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcute
from ncu_fwd import profile_once  # scripts/, the running script's folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default="flashcute,paged,cudnn", help="flashcute, paged, cudnn, flash (SDPA backends)")
    parser.add_argument("--shapes", default="1:4096,16:16384", help="BATCH:SEQLEN_K, comma-separated")
    parser.add_argument("--heads", default="32:8", help="query:KV heads")
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--page", type=int, default=64, help="page size of the paged cache")
    args = parser.parse_args()
    h, hk = map(int, args.heads.split(":"))
    d = args.headdim
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for spec in args.shapes.split(","):
        b, sk = map(int, spec.split(":"))
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        per_seq = -(-sk // args.page)
        table = torch.randperm(b * per_seq, device="cuda").to(torch.int32).view(b, per_seq)
        pages = [torch.zeros(b * per_seq, args.page, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        for cache, src in zip(pages, (k, v)):
            padded = torch.zeros(b, per_seq * args.page, hk, d, device="cuda", dtype=torch.bfloat16)
            padded[:, :sk] = src
            cache[table.flatten().long()] = padded.view(b * per_seq, args.page, hk, d)
        for impl in args.impls.split(","):
            if impl == "flashcute":
                def call():
                    return flashcute.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
            elif impl == "paged":
                def call():
                    return flashcute.flash_attn_with_kvcache(q, pages[0], pages[1], cache_seqlens=seqlens,
                                                             block_table=table)
            else:
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def call(backend=backends[impl]):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=h != hk)
            profile_once(call, f"{impl} batch={b} seqlen_k={sk} heads={h}:{hk} d={d}")


if __name__ == "__main__":
    main()
