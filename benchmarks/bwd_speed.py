#!/usr/bin/env python3
"""Backward-pass speed: flashcute against SDPA's flash and cuDNN backends and, when it imports,
FlashAttention-4, in one process: ``python -m flashcute.bench --pass bwd`` on this script's grid.

    python3 benchmarks/bwd_speed.py [--dtype bf16] [--seqlens 1024,4096,16384] [--dims 64,128,256]
                                    [--pass bwd|fwd+bwd] [any other flashcute.bench option]

For each point (batch * seqlen = 16k tokens, 2048 / headdim heads, as FlashAttention's benchmark),
``--pass bwd`` (the default) runs the forward once with inputs that require grad and times the
backward alone, ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``; ``--pass fwd+bwd``
times the forward and the backward together. Every implementation's gradients are checked first
(flashcute's against the shared reference decide the exit code). Timed by the bench's standard
timing (5 warm-up calls, 20 timed calls, each after an L2 flush, in order then in reverse; the
options after the grid's, e.g. ``--timing turns``, are passed on). TFLOP/s count the backward as
2.5x the forward's 4 * b * h * s * s * d (3.5x for fwd+bwd), halved for causal (FlashAttention's
convention). The files go to bench-results/ (``--out-dir``), like the forward bench's.
"""

from __future__ import annotations

import argparse
import sys

IMPLS = "flashcute,sdpa-flash,sdpa-cudnn,fa4"  # fa4 is left out, in one line, where it does not import


def bench_argv(argv: list[str] | None = None) -> list[str]:
    """The flashcute.bench command line this script's arguments stand for."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other option (--timing, --iters, --out-dir, ...) is passed on: python -m flashcute.bench --help.",
    )
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "both"])
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--pass", dest="pass_", default="bwd", choices=["bwd", "fwd+bwd"])
    args, rest = parser.parse_known_args(argv)
    return ["--pass", args.pass_, "--dtype", args.dtype, "--seqlens", args.seqlens, "--headdims", args.dims,
            "--causal", "both", "--impls", IMPLS, "--warmup", "5", "--iters", "20", *rest]


def main(argv: list[str] | None = None) -> int:
    from flashcute.bench import main as bench_main

    return bench_main(bench_argv(argv))


if __name__ == "__main__":
    sys.exit(main())
