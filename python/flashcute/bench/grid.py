"""The benchmark grid: which problems are timed, and how many FLOPs each one is worth."""

from __future__ import annotations

from dataclasses import dataclass

# FlashAttention's benchmark grid (benchmarks/benchmark_flash_attention.py): hidden size 2048 and
# 16k tokens per batch, so batch = 16384 // seqlen and nheads = 2048 // headdim.
FA_TOKENS = 16384
FA_HIDDEN = 2048

FLOPS_FORMULA = ("4 * batch * nheads * seqlen_q * seqlen_k * headdim, halved when causal; "
                 "times 2.5 for the backward, 3.5 for forward + backward")

# What a point times: the forward, the backward alone (after one untimed forward), or both.
PASSES = ("fwd", "bwd", "fwd+bwd")
PASS_FLOPS = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # FlashAttention's convention: backward = 2.5x forward


def attention_flops(batch: int, nheads: int, seqlen_q: int, seqlen_k: int, headdim: int, causal: bool) -> int:
    """Forward FLOPs as FlashAttention counts them: two GEMMs of 2*Sq*Sk*D each, halved when causal."""
    flops = 4 * batch * nheads * seqlen_q * seqlen_k * headdim
    return flops // 2 if causal else flops


def tflops(flops: int, ms: float) -> float:
    """TFLOP/s of `flops` done in `ms` milliseconds."""
    return flops / (ms * 1e-3) / 1e12


@dataclass(frozen=True)
class GridSpec:
    """The axes of the grid, and the sizes that are fixed instead of following FlashAttention's grid."""

    dtypes: tuple[str, ...]  # "bf16", "fp16"
    headdims: tuple[int, ...]
    causals: tuple[bool, ...]
    seqlens: tuple[int, ...]
    batch: int | None = None  # None: FA_TOKENS // seqlen
    nheads: int | None = None  # None: FA_HIDDEN // headdim
    nheads_k: int | None = None  # None: nheads
    pass_: str = "fwd"  # one of PASSES


@dataclass(frozen=True)
class Point:
    """One benchmark problem. seqlen_q == seqlen_k, so SDPA's top-left causal mask matches ours."""

    dtype: str
    headdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int
    nheads_k: int
    pass_: str = "fwd"  # one of PASSES

    @property
    def flops(self) -> int:
        fwd = attention_flops(self.batch, self.nheads, self.seqlen, self.seqlen, self.headdim, self.causal)
        return int(fwd * PASS_FLOPS[self.pass_])

    @property
    def heads(self) -> str:
        """Query heads, and KV heads after a slash when they differ (GQA/MQA): "16" or "16/4"."""
        return str(self.nheads) + (f"/{self.nheads_k}" if self.nheads_k != self.nheads else "")

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "full"
        label = f"{self.dtype} d={self.headdim} {mask} s={self.seqlen} b={self.batch} h={self.heads}"
        return label if self.pass_ == "fwd" else f"{label} {self.pass_}"


def build_grid(spec: GridSpec) -> list[Point]:
    """All points, ordered dtype, head dim, causal, seqlen. Raises ValueError on impossible GQA."""
    points = []
    for dtype in spec.dtypes:
        for d in spec.headdims:
            for causal in spec.causals:
                for s in spec.seqlens:
                    batch = spec.batch if spec.batch is not None else max(1, FA_TOKENS // s)
                    nheads = spec.nheads if spec.nheads is not None else max(1, FA_HIDDEN // d)
                    nheads_k = spec.nheads_k if spec.nheads_k is not None else nheads
                    if nheads % nheads_k:
                        raise ValueError(f"nheads ({nheads} at d={d}) is not a multiple of --nheads-k {nheads_k}")
                    points.append(Point(dtype, d, causal, s, batch, nheads, nheads_k, spec.pass_))
    return points
