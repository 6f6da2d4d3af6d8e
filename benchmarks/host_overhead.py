#!/usr/bin/env python3
"""Host time per call: flashcute against SDPA, eager and compiled, and under jax.jit.

    python3 benchmarks/host_overhead.py [--calls 2000] [--repeats 3] [--json FILE]

At a small shape (batch 1, seqlen 128, 8 heads, head dim 64, bf16) the GPU work is a few
microseconds, so a loop of calls with one synchronisation at its end measures what a call costs
the host: argument handling, allocation, validation, the launch. The decode rows time one step of
an eager generate loop the same way: one query token, 32 query heads on 8 KV heads, head dim 128,
a cache of 256 keys (flash_attn_with_kvcache with cache_seqlens, which may split the keys: the
workspace and the combine kernel are part of the step; SDPA with enable_gqa on the same keys). Each figure is the best of
--repeats loops of --calls calls (after a warm-up), in microseconds per call; the loops of all rows
of a framework run in rounds, one loop of each row per round, so that peers are measured alike. Rows whose library is
missing are skipped. docs/benchmarks.md ("Host overhead") records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Callable, Dict, List, Tuple

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

B, S, H, D = 1, 128, 8, 64


def per_call_us(call: Callable[[], Any], sync: Callable[[Any], None], calls: int) -> float:
    """One loop of `calls` calls and a synchronisation, in microseconds per call."""
    t0 = time.perf_counter()
    for _ in range(calls):
        last = call()
    sync(last)
    return (time.perf_counter() - t0) / calls * 1e6


def best_of_rounds(rows: List[Tuple[str, Callable[[], Any], Callable[[Any], None]]], calls: int,
                   repeats: int) -> Dict[str, float]:
    """Each row's best loop over `repeats` rounds; a round runs one loop of every row, so a drift of
    the machine's speed during the run touches every row alike."""
    for _, call, sync in rows:  # warm-up: compilation, caches, allocator
        per_call_us(call, sync, max(50, calls // 10))
    best = {name: float("inf") for name, _, _ in rows}
    for _ in range(repeats):
        for name, call, sync in rows:
            best[name] = min(best[name], per_call_us(call, sync, calls))
    return best


def torch_rows() -> List[Tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    import torch
    import torch.nn.functional as F

    import flashcute
    from flashcute import _C, _torch

    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's (b, h, s, d), as FA users pass it

    def sync(_: Any) -> None:
        torch.cuda.synchronize()

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fc(q, k, v):
        return flashcute.flash_attn_func(q, k, v, causal=True)

    sdpa_c, fc_c = torch.compile(sdpa, fullgraph=True), torch.compile(fc, fullgraph=True)
    scale = D**-0.5
    # The parts of a flashcute eager call, for the breakdown.
    out = torch.empty_like(q)
    descs = [_torch._desc(t) for t in (q, k, v, out)]
    stream = torch.cuda.current_stream().cuda_stream
    # A decode step (the module docstring).
    qd = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(1, 256, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((1,), 256, dtype=torch.int32, device="cuda")
    qdt, kct, vct = (x.transpose(1, 2) for x in (qd, kc, vc))
    return [
        ("torch eager: SDPA", lambda: sdpa(qt, kt, vt), sync),
        ("torch eager: flashcute.flash_attn_func", lambda: fc(q, k, v), sync),
        ("torch eager: torch.ops.flashcute.fwd (the op)",
         lambda: torch.ops.flashcute.fwd.default(q, k, v, scale, True, -1, -1, 0.0), sync),
        ("torch.compile: SDPA", lambda: sdpa_c(qt, kt, vt), sync),
        ("torch.compile: flashcute.flash_attn_func", lambda: fc_c(q, k, v), sync),
        ("  part: _C.fwd, descriptors made (validate + launch)",
         lambda: _C.fwd(*descs, None, (scale, True, -1, -1, 0.0), stream, 0, False), sync),
        ("  part: q.new_empty(q.shape)", lambda: q.new_empty(q.shape), sync),
        ("  part: 4 descriptors", lambda: [_torch._desc(t) for t in (q, k, v, out)], sync),
        ("  part: torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream(0).cuda_stream, sync),
        ("  part: torch._C._cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(0), sync),
        ("torch eager decode: SDPA (enable_gqa)", lambda: F.scaled_dot_product_attention(qdt, kct, vct, enable_gqa=True),
         sync),
        ("torch eager decode: flashcute.flash_attn_with_kvcache",
         lambda: flashcute.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens), sync),
    ]


def jax_rows() -> List[Tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    import jax
    import jax.numpy as jnp

    import flashcute

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(kk, (B, S, H, D), dtype=jnp.bfloat16) for kk in keys)

    def sync(x: Any) -> None:
        jax.block_until_ready(x)

    fc = jax.jit(lambda q, k, v: flashcute.flash_attn_func(q, k, v, causal=True))
    ref = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
    return [
        ("jax.jit: jax.nn.dot_product_attention", lambda: ref(q, k, v), sync),
        ("jax.jit: flashcute.flash_attn_func", lambda: fc(q, k, v), sync),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results: Dict[str, float] = {}
    for make in (torch_rows, jax_rows):
        try:
            rows = make()
        except ImportError as exc:
            print(f"skipped {make.__name__}: {exc}")
            continue
        best = best_of_rounds(rows, args.calls, args.repeats)
        for name, _, _ in rows:
            results[name] = best[name]
            print(f"{name:52s} {results[name]:7.1f} us/call", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape (b, s, h, d)": [B, S, H, D], "dtype": "bfloat16", "us_per_call": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
