"""flashcute's forward benchmark: ``python -m flashcute.bench``.

At every point of a grid (dtype x head dim x causal x seqlen) it

1. checks flashcute's output against a float32 reference, with FlashAttention's rule: the error vs
   float32 must be at most twice the error of naive attention computed in the input dtype, plus the
   dtype's rounding slack (a failure makes the exit code non-zero; the other points still run);
2. times flashcute and torch SDPA's flash, cuDNN and memory-efficient backends in the same process,
   on the same inputs: CUDA-event medians of individually timed calls after a warm-up;
3. reports TFLOP/s (FlashAttention's count: 4*B*H*Sq*Sk*D, halved when causal) in a table, a CSV, a
   JSON file (GPU, versions, date, every timing) and a PNG plot.

With CuPy and no torch it times flashcute alone. With no GPU it says why and exits 1.

Exit codes: 0 all checked points passed; 1 no usable GPU or flashcute not built; 2 usage error or
neither torch nor CuPy installed; 3 a flashcute correctness check failed or flashcute raised.

Importing this module needs only the standard library: torch, CuPy, rich, tqdm and matplotlib are
imported when used.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import importlib
import json
import math
import os
import platform
import re
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

PROG = "flashcute.bench"

IMPLS: tuple[str, ...] = ("flashcute", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
SDPA_BACKENDS: dict[str, str] = {  # impl name -> torch.nn.attention.SDPBackend member
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
}
DTYPES: tuple[str, ...] = ("bf16", "fp16")

# FlashAttention's benchmark grid (benchmarks/benchmark_flash_attention.py): hidden size 2048 and
# 16k tokens per batch, so batch = 16384 // seqlen and nheads = 2048 // headdim.
FA_TOKENS = 16384
FA_HIDDEN = 2048
DEFAULT_HEADDIMS = (64, 128, 256)
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_HEADDIMS = (64, 128)
QUICK_SEQLENS = (1024, 4096)

# Correctness is checked on the whole problem when it is this small (scores, and (batch, head) pairs,
# which the reference loops over), else on batch 0 and two heads: the first and the last, so two
# different KV heads under GQA.
FULL_CHECK_MAX_SCORES = 1 << 27
FULL_CHECK_MAX_HEADS = 64
# Reference rows are processed in chunks of at most this many scores (64 MiB of float32).
REFERENCE_CHUNK_SCORES = 1 << 24
# Inputs are rotated between timed calls only when one set would sit in L2: below this many L2s.
ROTATE_BELOW_L2_MULTIPLE = 2
MAX_INPUT_SETS = 64
ASSUMED_L2_BYTES = 128 << 20  # used only when the runtime does not report the L2 size

EXIT_OK, EXIT_NO_GPU, EXIT_USAGE, EXIT_CHECK_FAILED = 0, 1, 2, 3

_NOT_COMPILED = re.compile(r"not compiled|compiled into this build|left out of this build", re.IGNORECASE)


# --------------------------------------------------------------------------------------------- CLI


def _int_list(text: str) -> list[int]:
    try:
        values = [int(tok) for tok in text.split(",") if tok.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _impl_list(text: str) -> list[str]:
    names = [tok.strip() for tok in text.split(",") if tok.strip()]
    unknown = [n for n in names if n not in IMPLS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown implementation(s) {unknown or text!r}; choose from {','.join(IMPLS)}"
        )
    return list(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface. Grid options default to None so that --quick can fill them."""
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Benchmark flashcute's forward pass against torch SDPA, "
        "after checking it against a float32 reference.",
        epilog="Exit codes: 0 ok; 1 no usable GPU / flashcute not built; 2 usage error or no torch/CuPy; "
        "3 a flashcute correctness check failed.",
    )
    g = p.add_argument_group("grid")
    g.add_argument("--headdims", type=_int_list, help=f"head dims (default {','.join(map(str, DEFAULT_HEADDIMS))})")
    g.add_argument(
        "--seqlens", type=_int_list, help=f"seqlen_q = seqlen_k values (default {','.join(map(str, DEFAULT_SEQLENS))})"
    )
    g.add_argument("--causal", choices=("both", "yes", "no"), help="causal masking (default both)")
    g.add_argument("--dtype", choices=("bf16", "fp16", "both"), help="input dtype (default bf16)")
    g.add_argument(
        "--fa-grid",
        action="store_true",
        help=f"FlashAttention's sizes: batch = {FA_TOKENS} // seqlen, nheads = {FA_HIDDEN} // headdim (the default)",
    )
    g.add_argument("--batch", type=int, help="fixed batch size instead of the FA grid's")
    g.add_argument("--nheads", type=int, help="fixed number of query heads instead of the FA grid's")
    g.add_argument("--nheads-k", type=int, help="number of KV heads (GQA/MQA); default: nheads")
    g.add_argument(
        "--quick",
        action="store_true",
        help="small grid (~20 s): d 64,128; seqlen 1024,4096; causal both; bf16 (explicit flags still win)",
    )
    t = p.add_argument_group("timing")
    t.add_argument("--warmup", type=int, default=10, help="untimed calls before timing (default 10)")
    t.add_argument(
        "--iters", type=int, default=30, help="individually timed calls; the median is reported (default 30)"
    )
    t.add_argument("--impls", type=_impl_list, default=list(IMPLS), help=f"implementations (default {','.join(IMPLS)})")
    t.add_argument(
        "--framework",
        choices=("auto", "torch", "cupy"),
        default="auto",
        help="array library for inputs and timing (default auto: torch if it has CUDA, else CuPy)",
    )
    t.add_argument("--seed", type=int, default=0, help="input RNG seed (default 0)")
    o = p.add_argument_group("output")
    o.add_argument(
        "--out-dir", type=Path, default=Path("bench-results"), help="where CSV/JSON/PNG go (default bench-results/)"
    )
    o.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    return p


@dataclass(frozen=True)
class BenchConfig:
    """The resolved command line: what to run and how."""

    headdims: tuple[int, ...]
    seqlens: tuple[int, ...]
    causals: tuple[bool, ...]
    dtypes: tuple[str, ...]
    batch: int | None  # None: FA grid
    nheads: int | None  # None: FA grid
    nheads_k: int | None  # None: = nheads
    warmup: int
    iters: int
    impls: tuple[str, ...]
    framework: str
    seed: int
    out_dir: Path
    plot: bool


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    """Parses argv (sys.argv[1:] when None) into a BenchConfig; usage errors exit with code 2."""
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.fa_grid and (a.batch is not None or a.nheads is not None):
        parser.error("--fa-grid sets batch and nheads itself: drop --batch/--nheads, or drop --fa-grid")
    for name in ("batch", "nheads", "nheads_k"):
        value = getattr(a, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if a.warmup < 0 or a.iters < 1:
        parser.error("--warmup must be >= 0 and --iters >= 1")
    headdims = a.headdims or list(QUICK_HEADDIMS if a.quick else DEFAULT_HEADDIMS)
    bad = [d for d in headdims if d % 8 or d > 256]
    if bad:
        parser.error(f"head dims must be multiples of 8 in [8, 256], got {bad}")
    causal = a.causal or "both"
    return BenchConfig(
        headdims=tuple(headdims),
        seqlens=tuple(a.seqlens or (QUICK_SEQLENS if a.quick else DEFAULT_SEQLENS)),
        causals={"both": (False, True), "yes": (True,), "no": (False,)}[causal],
        dtypes=DTYPES if a.dtype == "both" else (a.dtype or "bf16",),
        batch=a.batch,
        nheads=a.nheads,
        nheads_k=a.nheads_k,
        warmup=a.warmup,
        iters=a.iters,
        impls=tuple(a.impls),
        framework=a.framework,
        seed=a.seed,
        out_dir=a.out_dir,
        plot=not a.no_plot,
    )


# -------------------------------------------------------------------------------------------- grid


def attention_flops(batch: int, nheads: int, seqlen_q: int, seqlen_k: int, headdim: int, causal: bool) -> int:
    """Forward FLOPs as FlashAttention counts them: two GEMMs of 2*Sq*Sk*D each, halved when causal."""
    flops = 4 * batch * nheads * seqlen_q * seqlen_k * headdim
    return flops // 2 if causal else flops


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

    @property
    def flops(self) -> int:
        return attention_flops(self.batch, self.nheads, self.seqlen, self.seqlen, self.headdim, self.causal)

    @property
    def label(self) -> str:
        heads = f"h={self.nheads}" + (f"/{self.nheads_k}" if self.nheads_k != self.nheads else "")
        mask = "causal" if self.causal else "full"
        return f"{self.dtype} d={self.headdim} {mask} s={self.seqlen} b={self.batch} {heads}"


def build_grid(cfg: BenchConfig) -> list[Point]:
    """All points, ordered dtype, head dim, causal, seqlen. Raises ValueError on impossible GQA."""
    points = []
    for dtype in cfg.dtypes:
        for d in cfg.headdims:
            for causal in cfg.causals:
                for s in cfg.seqlens:
                    batch = cfg.batch if cfg.batch is not None else max(1, FA_TOKENS // s)
                    nheads = cfg.nheads if cfg.nheads is not None else max(1, FA_HIDDEN // d)
                    nheads_k = cfg.nheads_k if cfg.nheads_k is not None else nheads
                    if nheads % nheads_k:
                        raise ValueError(f"nheads ({nheads} at d={d}) is not a multiple of --nheads-k {nheads_k}")
                    points.append(Point(dtype, d, causal, s, batch, nheads, nheads_k))
    return points


def tflops(flops: int, ms: float) -> float:
    """TFLOP/s of `flops` done in `ms` milliseconds."""
    return flops / (ms * 1e-3) / 1e12


# ------------------------------------------------------------------------------ device & framework


def cuda_device_info() -> tuple[int, str]:
    """(device count, reason) from flashcute's extension. Raises ImportError if it is not built."""
    ext = importlib.import_module("flashcute._C")
    return int(ext.cuda_device_count()), str(ext.cuda_status())


def _import_optional(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or a broken install that fails while importing
        return None


class TorchOps:
    """The array operations the reference needs, for torch tensors (any device)."""

    def __init__(self, torch: Any) -> None:
        self.t = torch

    def dtype(self, name: str) -> Any:
        return {"bf16": self.t.bfloat16, "fp16": self.t.float16}[name]

    def f32(self, x: Any) -> Any:
        return x.to(self.t.float32)

    def round_to(self, x: Any, dtype: Any) -> Any:
        return x.to(dtype).to(self.t.float32)

    def zeros(self, shape: tuple[int, ...], like: Any) -> Any:
        return self.t.zeros(shape, dtype=self.t.float32, device=like.device)

    def arange(self, start: int, stop: int, like: Any) -> Any:
        return self.t.arange(start, stop, device=like.device)

    def rowmax(self, x: Any) -> Any:
        return self.t.amax(x, dim=-1, keepdim=True)

    def rowsum(self, x: Any) -> Any:
        return self.t.sum(x, dim=-1, keepdim=True)

    def where(self, c: Any, a: Any, b: Any) -> Any:
        return self.t.where(c, a, b)

    def exp(self, x: Any) -> Any:
        return self.t.exp(x)

    def log(self, x: Any) -> Any:
        return self.t.log(x)

    def tanh(self, x: Any) -> Any:
        return self.t.tanh(x)

    def isfinite(self, x: Any) -> Any:
        return self.t.isfinite(x)

    def max_abs(self, x: Any) -> float:
        return float(x.abs().max().item()) if x.numel() else 0.0

    def all_finite(self, x: Any) -> bool:
        return bool(self.t.isfinite(x).all().item())

    @contextlib.contextmanager
    def exact_fp32(self) -> Iterator[None]:
        """float32 matmuls without TF32 while the reference runs."""
        old = self.t.get_float32_matmul_precision()
        self.t.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            self.t.set_float32_matmul_precision(old)


class CupyOps:
    """The array operations the reference needs, for CuPy arrays."""

    def __init__(self, cupy: Any) -> None:
        self.cp = cupy
        self._bf16: Any | None = None
        ml_dtypes = _import_optional("ml_dtypes")
        if ml_dtypes is not None:
            try:  # CuPy supports bfloat16 (through ml_dtypes) only in recent releases
                cupy.zeros(1, dtype=ml_dtypes.bfloat16).astype(cupy.float32)
                self._bf16 = ml_dtypes.bfloat16
            except Exception:
                self._bf16 = None

    def dtype(self, name: str) -> Any:
        if name == "fp16":
            return self.cp.float16
        if self._bf16 is None:
            raise Unsupported("this CuPy has no bfloat16 (it needs ml_dtypes and a CuPy that supports it)")
        return self._bf16

    def f32(self, x: Any) -> Any:
        return x.astype(self.cp.float32)

    def round_to(self, x: Any, dtype: Any) -> Any:
        return x.astype(dtype).astype(self.cp.float32)

    def zeros(self, shape: tuple[int, ...], like: Any) -> Any:
        return self.cp.zeros(shape, dtype=self.cp.float32)

    def arange(self, start: int, stop: int, like: Any) -> Any:
        return self.cp.arange(start, stop)

    def rowmax(self, x: Any) -> Any:
        return x.max(axis=-1, keepdims=True)

    def rowsum(self, x: Any) -> Any:
        return x.sum(axis=-1, keepdims=True)

    def where(self, c: Any, a: Any, b: Any) -> Any:
        return self.cp.where(c, a, b)

    def exp(self, x: Any) -> Any:
        return self.cp.exp(x)

    def log(self, x: Any) -> Any:
        return self.cp.log(x)

    def tanh(self, x: Any) -> Any:
        return self.cp.tanh(x)

    def isfinite(self, x: Any) -> Any:
        return self.cp.isfinite(x)

    def max_abs(self, x: Any) -> float:
        return float(self.cp.abs(x).max()) if x.size else 0.0

    def all_finite(self, x: Any) -> bool:
        return bool(self.cp.isfinite(x).all())

    @contextlib.contextmanager
    def exact_fp32(self) -> Iterator[None]:
        # CuPy uses TF32 for float32 matmuls only when CUPY_TF32=1; main() records that setting.
        yield


class Unsupported(Exception):
    """An implementation (or the array library) cannot run this point: reported as n/a."""


class EventTimer:
    """CUDA events on the current stream, for torch or CuPy."""

    def __init__(self, framework: str, module: Any) -> None:
        self.framework, self.m = framework, module

    def event(self) -> Any:
        if self.framework == "torch":
            return self.m.cuda.Event(enable_timing=True)
        return self.m.cuda.Event()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        if self.framework == "torch":
            return float(start.elapsed_time(end))
        return float(self.m.cuda.get_elapsed_time(start, end))

    def synchronize(self) -> None:
        if self.framework == "torch":
            self.m.cuda.synchronize()
        else:
            self.m.cuda.Device().synchronize()


@dataclass
class Backend:
    """The array library that makes inputs, computes the reference and times calls."""

    framework: str  # "torch" or "cupy"
    module: Any
    ops: TorchOps | CupyOps
    timer: EventTimer

    def device_info(self) -> dict[str, Any]:
        """Name, compute capability, SM count, L2 and memory size of the current device."""
        if self.framework == "torch":
            props = self.module.cuda.get_device_properties(self.module.cuda.current_device())
            return {
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "sm_count": props.multi_processor_count,
                "l2_bytes": getattr(props, "L2_cache_size", None),
                "memory_bytes": props.total_memory,
            }
        rt = self.module.cuda.runtime
        props = rt.getDeviceProperties(self.module.cuda.Device().id)
        name = props["name"]
        return {
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "capability": f"{props['major']}.{props['minor']}",
            "sm_count": props["multiProcessorCount"],
            "l2_bytes": props.get("l2CacheSize"),
            "memory_bytes": props["totalGlobalMem"],
        }

    def versions(self) -> dict[str, Any]:
        """Library and CUDA versions worth recording next to the numbers."""
        v: dict[str, Any] = {"python": platform.python_version()}
        fc = _import_optional("flashcute")
        v["flashcute"] = getattr(fc, "__version__", None)
        torch, cupy = _import_optional("torch"), _import_optional("cupy")
        if torch is not None:
            v["torch"] = torch.__version__
            v["torch_cuda"] = torch.version.cuda
            with contextlib.suppress(Exception):
                v["cudnn"] = torch.backends.cudnn.version()
        if cupy is not None:
            v["cupy"] = cupy.__version__
            with contextlib.suppress(Exception):
                v["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
                v["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        v["cupy_tf32"] = os.environ.get("CUPY_TF32")
        return v

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        """Standard-normal inputs in `dtype` on the GPU (FlashAttention's benchmark uses randn)."""
        dt = self.ops.dtype(dtype)
        if self.framework == "torch":
            gen = self.module.Generator(device="cuda").manual_seed(seed)
            return self.module.randn(shape, generator=gen, device="cuda", dtype=dt)
        rng = self.module.random.default_rng(seed)
        return rng.standard_normal(shape, dtype=self.module.float32).astype(dt)

    def is_oom(self, exc: BaseException) -> bool:
        if self.framework == "torch":
            return isinstance(exc, self.module.cuda.OutOfMemoryError)
        return isinstance(exc, self.module.cuda.memory.OutOfMemoryError)


def select_backend(framework: str) -> tuple[Backend | None, str]:
    """The array library to use, or (None, why not). 'auto' prefers torch with CUDA, then CuPy."""
    reasons = []
    if framework in ("auto", "torch"):
        torch = _import_optional("torch")
        if torch is None:
            reasons.append("torch is not installed")
        elif not torch.cuda.is_available():
            reasons.append(f"torch {torch.__version__} sees no CUDA device")
        else:
            return Backend("torch", torch, TorchOps(torch), EventTimer("torch", torch)), ""
    if framework in ("auto", "cupy"):
        cupy = _import_optional("cupy")
        if cupy is None:
            reasons.append("cupy is not installed")
        else:
            try:
                count = cupy.cuda.runtime.getDeviceCount()
            except Exception as exc:  # CUDARuntimeError: no driver / no device
                count, exc_text = 0, f" ({exc})"
            else:
                exc_text = ""
            if count == 0:
                reasons.append(f"cupy sees no CUDA device{exc_text}")
            else:
                return Backend("cupy", cupy, CupyOps(cupy), EventTimer("cupy", cupy)), ""
    return None, "; ".join(reasons)


# ------------------------------------------------------------------------------------------ inputs


@dataclass
class Inputs:
    """q (b, s, h, d); k, v (b, s, hk, d), FlashAttention's layout, contiguous."""

    q: Any
    k: Any
    v: Any

    @property
    def nbytes(self) -> int:
        return sum(int(x.nbytes) for x in (self.q, self.k, self.v))


def make_inputs(backend: Backend, point: Point, seed: int) -> Inputs:
    """Random inputs for one point, reproducible from `seed`."""
    qshape = (point.batch, point.seqlen, point.nheads, point.headdim)
    kshape = (point.batch, point.seqlen, point.nheads_k, point.headdim)
    return Inputs(
        backend.randn(qshape, point.dtype, seed),
        backend.randn(kshape, point.dtype, seed + 1),
        backend.randn(kshape, point.dtype, seed + 2),
    )


def input_sets_needed(working_set_bytes: int, l2_bytes: int | None) -> int:
    """How many input sets to rotate through so that timed calls do not start with a warm L2.

    The FA grid's working sets (q, k, v and out: 4 x 64 MiB at 16k tokens and hidden 2048) are far
    larger than any L2, so this is 1 there; it matters only for small explicit --batch/--nheads.
    """
    l2 = l2_bytes or ASSUMED_L2_BYTES
    if working_set_bytes >= ROTATE_BELOW_L2_MULTIPLE * l2:
        return 1
    return min(MAX_INPUT_SETS, math.ceil(3 * l2 / max(1, working_set_bytes)))


# --------------------------------------------------------------------------- reference & checking


def reference_attention(
    ops: TorchOps | CupyOps,
    q: Any,
    k: Any,
    v: Any,
    *,
    softmax_scale: float,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    lowp_dtype: Any | None = None,
) -> tuple[Any, Any]:
    """Attention computed row-chunk by row-chunk in float32: returns (out (b,sq,h,d), lse (b,h,sq)).

    q (b, sq, h, d), k and v (b, sk, hk, d), any float dtype (upcast here). GQA maps query head i to
    KV head i // (h // hk). The mask is FlashAttention-2's, aligned to the bottom-right corner:
    query i sees key j iff i + sk - sq - left <= j <= i + sk - sq + right (a negative bound is
    unbounded; causal sets right = 0). A row that sees no key gets out = 0 and lse = -inf.

    With `lowp_dtype` it is FlashAttention's naive low-precision attention instead: q*scale, the
    scores, the probabilities and the output are rounded to that dtype, as a GEMM in that dtype with
    float32 accumulation and a softmax computed in float32 would round them.
    """
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    left, right = window
    if causal:
        right = 0
    rnd = (lambda x: ops.round_to(x, lowp_dtype)) if lowp_dtype is not None else (lambda x: x)
    q, k, v = ops.f32(q), ops.f32(k), ops.f32(v)
    out = ops.zeros((b, sq, h, d), like=q)
    lse = ops.zeros((b, h, sq), like=q)
    chunk = max(1, min(sq, REFERENCE_CHUNK_SCORES // max(1, sk)))
    cols = ops.arange(0, sk, like=q)[None, :]
    with ops.exact_fp32():
        for bi in range(b):
            for hi in range(h):
                kh, vh = k[bi, :, hi // (h // hk), :], v[bi, :, hi // (h // hk), :]
                for r0 in range(0, sq, chunk):
                    r1 = min(sq, r0 + chunk)
                    scores = rnd(rnd(q[bi, r0:r1, hi, :] * softmax_scale) @ kh.T)  # (rows, sk)
                    if softcap > 0:
                        scores = rnd(ops.tanh(scores / softcap) * softcap)
                    diag = ops.arange(r0, r1, like=q)[:, None] + (sk - sq)
                    visible = cols >= 0  # (1, sk) all true; broadcast below
                    if right >= 0:
                        visible = visible & (cols <= diag + right)
                    if left >= 0:
                        visible = visible & (cols >= diag - left)
                    scores = ops.where(visible, scores, -math.inf)
                    row_max = ops.rowmax(scores)
                    row_max = ops.where(ops.isfinite(row_max), row_max, 0.0)
                    p = ops.exp(scores - row_max)
                    row_sum = ops.rowsum(p)
                    seen = row_sum > 0
                    p = rnd(p / ops.where(seen, row_sum, 1.0))
                    out[bi, r0:r1, hi, :] = rnd(p @ vh)
                    lse[bi, hi, r0:r1] = ops.where(seen, ops.log(ops.where(seen, row_sum, 1.0)) + row_max, -math.inf)[
                        :, 0
                    ]
    return out, lse


def fa_tolerance(naive_err: float, rounding_slack: float) -> float:
    """FlashAttention's forward rule: allowed error vs float32 = 2 x naive low-precision error + slack."""
    return 2.0 * naive_err + rounding_slack


def rounding_slack(ops: TorchOps | CupyOps, ref: Any, dtype: Any) -> float:
    """FlashAttention-3's fwd_atol: 2 x max |((o + 0.3) - 0.3) - o|, each step rounded to the dtype."""
    o = ops.round_to(ref, dtype)
    return 2.0 * ops.max_abs(ops.round_to(ops.round_to(ops.round_to(o + 0.3, dtype) - 0.3, dtype) - o, dtype))


@dataclass
class Reference:
    """The float32 reference on the checked slice, and the bar an output must clear."""

    scope: str  # "full" or e.g. "b0 h[0, 31]"
    batch_index: slice
    heads: list[int]
    out: Any  # float32 (b', sq, len(heads), d)
    naive_err: float
    slack: float

    @property
    def tolerance(self) -> float:
        return fa_tolerance(self.naive_err, self.slack)


@dataclass
class CheckResult:
    passed: bool
    max_err: float
    tolerance: float
    naive_err: float
    finite: bool
    scope: str


def check_slice(point: Point) -> tuple[str, slice, list[int]]:
    """Which part of the output is checked: everything when small, else batch 0 and two heads."""
    pairs = point.batch * point.nheads
    if pairs <= FULL_CHECK_MAX_HEADS and pairs * point.seqlen * point.seqlen <= FULL_CHECK_MAX_SCORES:
        return "full", slice(0, point.batch), list(range(point.nheads))
    heads = sorted({0, point.nheads - 1})
    return f"b0 h{heads}", slice(0, 1), heads


def build_reference(backend: Backend, point: Point, inputs: Inputs, softmax_scale: float) -> Reference:
    """The float32 reference and the naive low-precision error on the checked slice."""
    ops = backend.ops
    scope, bsl, heads = check_slice(point)
    group = point.nheads // point.nheads_k
    kv_heads = [h // group for h in heads]
    q, k, v = inputs.q[bsl][:, :, heads], inputs.k[bsl][:, :, kv_heads], inputs.v[bsl][:, :, kv_heads]
    kw: dict[str, Any] = {"softmax_scale": softmax_scale, "causal": point.causal}
    ref, _ = reference_attention(ops, q, k, v, **kw)
    dt = ops.dtype(point.dtype)
    naive, _ = reference_attention(ops, q, k, v, lowp_dtype=dt, **kw)
    return Reference(scope, bsl, heads, ref, ops.max_abs(naive - ref), rounding_slack(ops, ref, dt))


def check_output(ops: TorchOps | CupyOps, out: Any, ref: Reference) -> CheckResult:
    """Applies FlashAttention's rule to an output in (b, s, h, d) layout; NaN fails."""
    finite = ops.all_finite(out)
    err = ops.max_abs(ops.f32(out[ref.batch_index][:, :, ref.heads]) - ref.out)
    passed = finite and err <= ref.tolerance  # a NaN error compares False
    return CheckResult(passed, err, ref.tolerance, ref.naive_err, finite, ref.scope)


# --------------------------------------------------------------------------------- implementations


@dataclass
class Runner:
    """Calls of one implementation, one per input set, and the context to enter around them."""

    calls: list[Callable[[], Any]]
    context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    to_bshd: Callable[[Any], Any] = lambda out: out  # output layout -> (b, s, h, d)
    layout: str = ""  # SDPA: "view" ((b,h,s,d) transposed views) or "contiguous" (copies)


def flashcute_runner(point: Point, sets: list[Inputs], softmax_scale: float) -> Runner:
    """flash_attn_func as users call it. Raises Unsupported for a dtype or head dim left out of the
    build (FLASHCUTE_DTYPES / FLASHCUTE_HEAD_DIMS)."""
    import flashcute  # the package's public API; imported here so this module loads without it

    dtype_name = {"bf16": "bfloat16", "fp16": "float16"}[point.dtype]
    if dtype_name not in flashcute.compiled_dtypes():
        raise Unsupported(f"{dtype_name} is not compiled into this build")
    if flashcute.kernel_head_dim(point.headdim) == 0:
        raise Unsupported(
            f"no kernel for head dim {point.headdim} in this build (compiled: {flashcute.compiled_head_dims()})"
        )

    def call(x: Inputs) -> Callable[[], Any]:
        return lambda: flashcute.flash_attn_func(x.q, x.k, x.v, softmax_scale=softmax_scale, causal=point.causal)

    return Runner([call(x) for x in sets])


def sdpa_runner(backend: Backend, impl: str, point: Point, sets: list[Inputs], softmax_scale: float) -> Runner:
    """torch SDPA restricted to one backend. Inputs become (b, h, s, d) `.transpose(1, 2)` views, as
    FlashAttention users pass them; a backend that refuses the views gets contiguous copies. Both are
    made here, outside the timed region. Raises Unsupported when the backend cannot run the point."""
    if backend.framework != "torch":
        raise Unsupported("needs torch")
    torch = backend.module
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdp_backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
    kwargs: dict[str, Any] = {"is_causal": point.causal, "scale": softmax_scale}
    if point.nheads != point.nheads_k:
        kwargs["enable_gqa"] = True

    def bind(q: Any, k: Any, v: Any) -> Callable[[], Any]:
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)

    def make(layout: str) -> Runner:
        calls = []
        for x in sets:
            q, k, v = (t.transpose(1, 2) for t in (x.q, x.k, x.v))
            if layout == "contiguous":
                q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            calls.append(bind(q, k, v))
        return Runner(calls, lambda: sdpa_kernel(sdp_backend), lambda out: out.transpose(1, 2), layout=layout)

    reasons: dict[str, str] = {}
    for layout in ("view", "contiguous"):
        runner = make(layout)
        with warnings.catch_warnings(record=True) as caught, runner.context():
            warnings.simplefilter("always")
            try:
                runner.calls[0]()
                backend.timer.synchronize()
                return runner
            except Exception as exc:  # RuntimeError "No available kernel", NotImplementedError, ...
                why = [str(w.message).splitlines()[0] for w in caught] + [str(exc).splitlines()[0]]
                reasons[layout] = " | ".join(why)
    if len(set(reasons.values())) == 1:
        raise Unsupported(reasons["view"])
    raise Unsupported("; ".join(f"{layout}: {why}" for layout, why in reasons.items()))


# ------------------------------------------------------------------------------------------ timing


def time_calls(timer: EventTimer, calls: list[Callable[[], Any]], warmup: int, iters: int) -> list[float]:
    """Milliseconds of `iters` individually timed calls (CUDA events around each), after `warmup`
    untimed ones. Calls rotate through `calls` (one per input set). All launches are queued before
    the single synchronisation, so the host stays ahead of the GPU for all but the tiniest problems."""
    for i in range(warmup):
        calls[i % len(calls)]()
    starts = [timer.event() for _ in range(iters)]
    ends = [timer.event() for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        calls[i % len(calls)]()
        ends[i].record()
    timer.synchronize()
    return [timer.elapsed_ms(s, e) for s, e in zip(starts, ends)]


# ------------------------------------------------------------------------------------- one point


@dataclass
class ImplResult:
    """One implementation at one point. status: ok | n/a | error | fail (wrong output)."""

    status: str
    times_ms: list[float] = field(default_factory=list)
    note: str = ""  # why it is n/a, or the error
    layout: str = ""
    check: CheckResult | None = None

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.times_ms else None


@dataclass
class PointResult:
    point: Point
    impls: dict[str, ImplResult]
    input_sets: int = 1
    working_set_bytes: int = 0

    def tflops(self, impl: str) -> float | None:
        r = self.impls.get(impl)
        ms = r.median_ms if r is not None else None
        return tflops(self.point.flops, ms) if ms else None

    def ratio(self, impl: str, base: str) -> float | None:
        a, b = self.tflops(impl), self.tflops(base)
        return a / b if a and b else None

    @property
    def flashcute_failed(self) -> bool:
        r = self.impls.get("flashcute")
        return r is not None and r.status in ("error", "fail")


def is_not_compiled_error(exc: BaseException) -> bool:
    """True for flashcute's error for a dtype or head dim left out of this build (FC_HEAD_DIMS etc.):
    a NotImplementedError (flashcute._C's documented type for it) or a message that says so."""
    return isinstance(exc, NotImplementedError) or bool(_NOT_COMPILED.search(str(exc)))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_point(backend: Backend, cfg: BenchConfig, point: Point, device: dict[str, Any]) -> PointResult:
    """Makes inputs, checks every implementation against the reference, then times each one."""
    scale = 1.0 / math.sqrt(point.headdim)
    try:
        first = make_inputs(backend, point, cfg.seed)
        out_bytes = int(first.q.nbytes)
        n_sets = input_sets_needed(first.nbytes + out_bytes, device.get("l2_bytes"))
        sets = [first] + [make_inputs(backend, point, cfg.seed + 3 * i) for i in range(1, n_sets)]
        ref = build_reference(backend, point, first, scale) if "flashcute" in cfg.impls else None
    except Unsupported as exc:
        return PointResult(point, {impl: ImplResult("n/a", note=str(exc)) for impl in cfg.impls})
    except Exception as exc:
        if not backend.is_oom(exc):
            raise
        return PointResult(
            point, {impl: ImplResult("n/a", note="out of memory for inputs/reference") for impl in cfg.impls}
        )

    results: dict[str, ImplResult] = {}
    for impl in cfg.impls:
        results[impl] = _run_impl(backend, cfg, impl, point, sets, scale, ref)
    return PointResult(point, results, n_sets, first.nbytes + out_bytes)


def _run_impl(
    backend: Backend, cfg: BenchConfig, impl: str, point: Point, sets: list[Inputs], scale: float, ref: Reference | None
) -> ImplResult:
    """Prepare, check (first call's output) and time one implementation; never raises for it."""
    try:
        runner = (
            flashcute_runner(point, sets, scale)
            if impl == "flashcute"
            else sdpa_runner(backend, impl, point, sets, scale)
        )
        with runner.context():
            out = runner.calls[0]()
            out = out[0] if isinstance(out, tuple) else out
            check = check_output(backend.ops, runner.to_bshd(out), ref) if ref is not None else None
            del out
            times = time_calls(backend.timer, runner.calls, cfg.warmup, cfg.iters)
    except Unsupported as exc:
        return ImplResult("n/a", note=str(exc))
    except Exception as exc:
        if backend.is_oom(exc):
            return ImplResult("n/a", note="out of memory")
        if impl == "flashcute" and not is_not_compiled_error(exc):
            return ImplResult("error", note=_short(exc))
        return ImplResult("n/a", note=_short(exc))
    status = "fail" if impl == "flashcute" and check is not None and not check.passed else "ok"
    return ImplResult(status, times, layout=runner.layout, check=check)


# ------------------------------------------------------------------------------------------ report


class Console:
    """Progress bar and log lines: rich if installed, else tqdm, else plain prints."""

    def __init__(self) -> None:
        self._rich: Any = _import_optional("rich.console")
        self._rich_progress: Any = _import_optional("rich.progress")
        self._tqdm: Any = _import_optional("tqdm")
        self._bar: Any = None
        self._task: Any = None
        # Off a terminal (a log file, CI), keep lines whole: wide enough for the table, no wrapping.
        width = None if sys.stdout.isatty() else 240
        self.console = self._rich.Console(width=width) if self._rich and self._rich_progress else None

    @contextlib.contextmanager
    def progress(self, total: int, description: str) -> Iterator[Callable[[], None]]:
        if self.console is not None:
            with self._rich_progress.Progress(console=self.console) as bar:
                self._bar, self._task = bar, bar.add_task(description, total=total)
                yield lambda: bar.advance(self._task)
        elif self._tqdm is not None:
            # Off a terminal the bar would only fill the log with carriage returns.
            with self._tqdm.tqdm(
                total=total, desc=description, file=sys.stdout, disable=not sys.stdout.isatty()
            ) as bar:
                self._bar = bar
                yield lambda: bar.update(1)
        else:
            yield lambda: None
        self._bar = None

    def log(self, message: str) -> None:
        if self.console is not None:
            self.console.print(message, markup=False, highlight=False, soft_wrap=True)
        elif self._bar is not None:
            self._tqdm.tqdm.write(message, file=sys.stdout)
        else:
            print(message, flush=True)


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def _check_cell(r: ImplResult | None) -> str:
    if r is None:
        return "-"
    if r.check is None:
        return r.status if r.status != "ok" else "-"
    c = r.check
    return f"{'pass' if c.passed else 'FAIL'} {c.max_err:.1e}<={c.tolerance:.1e}"


def point_line(pr: PointResult, impls: Sequence[str]) -> str:
    """One log line per point: TFLOP/s of every impl and flashcute's check."""
    parts = []
    for impl in impls:
        r = pr.impls[impl]
        why = f": {r.note[:160]}" if r.note and r.status in ("error", "fail") else ""
        parts.append(f"{impl} {_fmt(pr.tflops(impl))}" + ("" if r.status in ("ok", "n/a") else f" ({r.status}{why})"))
    return f"{pr.point.label}: " + ", ".join(parts) + f"  [check {_check_cell(pr.impls.get('flashcute'))}]"


def table_rows(results: Sequence[PointResult], impls: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary table (TFLOP/s; ratios of flashcute to SDPA flash and cuDNN)."""
    header = ["dtype", "d", "causal", "seqlen", "batch", "heads"] + [f"{i} TF/s" for i in impls]
    ratio_bases = [b for b in ("sdpa-flash", "sdpa-cudnn") if b in impls and "flashcute" in impls]
    header += [f"fc/{b.removeprefix('sdpa-')}" for b in ratio_bases] + ["check"]
    rows = []
    for pr in results:
        p = pr.point
        heads = str(p.nheads) + (f"/{p.nheads_k}" if p.nheads_k != p.nheads else "")
        row = [p.dtype, str(p.headdim), "yes" if p.causal else "no", str(p.seqlen), str(p.batch), heads]
        row += [_fmt(pr.tflops(i)) for i in impls]
        row += [_fmt(pr.ratio("flashcute", b), ".2f") for b in ratio_bases]
        row.append(_check_cell(pr.impls.get("flashcute")))
        rows.append(row)
    return header, rows


def print_table(console: Console, results: Sequence[PointResult], impls: Sequence[str], title: str) -> None:
    header, rows = table_rows(results, impls)
    if console.console is not None:
        table = importlib.import_module("rich.table").Table(title=title)
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i < 3 or h == "check" else "right")
        for row in rows:
            table.add_row(*row)
        console.console.print(table)
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print(title)
    for row in [header] + rows:
        print(
            "  ".join(c.rjust(w) if 3 <= i < len(row) - 1 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        )


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary_line(results: Sequence[PointResult], gpu: str) -> str:
    """One line: correctness counts, then min/geomean flashcute/sdpa-flash for seqlen >= 1k and < 1k."""
    checked = [
        pr for pr in results if pr.impls.get("flashcute") and pr.impls["flashcute"].status in ("ok", "fail", "error")
    ]
    failed = sum(pr.flashcute_failed for pr in results)
    skipped = sum(1 for pr in results if pr.impls.get("flashcute") and pr.impls["flashcute"].status == "n/a")
    parts = [f"{len(checked) - failed}/{len(checked)} points correct" + (f" ({skipped} n/a)" if skipped else "")]
    for base in ("sdpa-flash", "sdpa-cudnn"):
        for name, keep in (("seqlen>=1k", lambda s: s >= 1024), ("seqlen<1k", lambda s: s < 1024)):
            ratios = [
                r
                for pr in results  # a wrong result's speed is no result: failed points are left out
                if keep(pr.point.seqlen) and not pr.flashcute_failed and (r := pr.ratio("flashcute", base)) is not None
            ]
            if ratios:
                label = f"fc/{base.removeprefix('sdpa-')} {name}"
                parts.append(f"{label}: min {min(ratios):.2f}x geomean {_geomean(ratios):.2f}x ({len(ratios)} pts)")
    if len(parts) == 1:
        parts.append("no SDPA comparison")
    return f"{PROG} summary [{gpu}]: " + "; ".join(parts)


def csv_rows(results: Sequence[PointResult]) -> list[dict[str, Any]]:
    """One row per (point, implementation)."""
    rows = []
    for pr in results:
        for impl, r in pr.impls.items():
            c = r.check
            rows.append(
                {
                    **asdict(pr.point),
                    "flops": pr.point.flops,
                    "impl": impl,
                    "status": r.status,
                    "median_ms": r.median_ms,
                    "tflops": pr.tflops(impl),
                    "iters": len(r.times_ms),
                    "input_sets": pr.input_sets,
                    "check": None if c is None else ("pass" if c.passed else "fail"),
                    "max_err": None if c is None else c.max_err,
                    "tolerance": None if c is None else c.tolerance,
                    "naive_err": None if c is None else c.naive_err,
                    "check_scope": None if c is None else c.scope,
                    "layout": r.layout,
                    "note": r.note,
                }
            )
    return rows


def write_csv(path: Path, results: Sequence[PointResult]) -> None:
    rows = csv_rows(results)
    with path.open("w", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def write_json(path: Path, results: Sequence[PointResult], meta: dict[str, Any]) -> None:
    """Metadata plus every point with every implementation's raw per-call times."""
    points = []
    for pr in results:
        points.append(
            {
                **asdict(pr.point),
                "flops": pr.point.flops,
                "input_sets": pr.input_sets,
                "working_set_bytes": pr.working_set_bytes,
                "impls": {
                    impl: {
                        "status": r.status,
                        "median_ms": r.median_ms,
                        "tflops": pr.tflops(impl),
                        "times_ms": r.times_ms,
                        "layout": r.layout,
                        "note": r.note,
                        "check": None if r.check is None else asdict(r.check),
                    }
                    for impl, r in pr.impls.items()
                },
            }
        )
    doc = _json_safe({"meta": meta, "points": points})
    path.write_text(json.dumps(doc, indent=1, allow_nan=False, default=str))


def _json_safe(x: Any) -> Any:
    """NaN and infinities (a failed check's error) become strings: strict JSON has no such numbers."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_plot(path: Path, results: Sequence[PointResult], impls: Sequence[str], title: str) -> bool:
    """TFLOP/s vs seqlen, one subplot per (dtype, head dim, causal), one line per impl. False if
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        return False
    if not results:
        return False
    panels = list(dict.fromkeys((pr.point.dtype, pr.point.headdim) for pr in results))
    causals = list(dict.fromkeys(pr.point.causal for pr in results))
    fig, axes = plt.subplots(
        len(panels), len(causals), figsize=(5.5 * len(causals), 3.6 * len(panels)), squeeze=False, sharex=True
    )
    for (row, (dtype, d)), (col, causal) in ((r, c) for r in enumerate(panels) for c in enumerate(causals)):
        ax = axes[row][col]
        sel = [pr for pr in results if (pr.point.dtype, pr.point.headdim, pr.point.causal) == (dtype, d, causal)]
        for impl in impls:
            pts = [(pr.point.seqlen, pr.tflops(impl)) for pr in sel if pr.tflops(impl) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        bad = [(pr.point.seqlen, pr.tflops("flashcute") or 0.0) for pr in sel if pr.flashcute_failed]
        if bad:
            ax.scatter(*zip(*bad), marker="x", s=80, color="red", zorder=5, label="flashcute check failed")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({pr.point.seqlen for pr in sel}) or [1])
        ax.get_xaxis().set_major_formatter(ScalarFormatter())
        ax.set_title(f"{dtype} d={d} {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# -------------------------------------------------------------------------------------------- main


def _no_gpu(reason: str) -> int:
    print(f"{PROG}: no CUDA GPU found ({reason}): this benchmark needs an sm80+ NVIDIA GPU", file=sys.stderr)
    return EXIT_NO_GPU


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code (see the module docstring)."""
    cfg = parse_args(argv)
    try:
        points = build_grid(cfg)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        count, reason = cuda_device_info()
    except ImportError as exc:
        print(
            f"{PROG}: flashcute's extension flashcute._C cannot be imported ({exc}): "
            "build and install flashcute first (python -m pip install .)",
            file=sys.stderr,
        )
        return EXIT_NO_GPU
    if count == 0:
        return _no_gpu(reason)
    backend, why = select_backend(cfg.framework)
    if backend is None:
        if "sees no CUDA device" in why:
            return _no_gpu(why)
        print(
            f"{PROG}: neither torch nor CuPy can be used ({why}): install one of them to make inputs and time calls",
            file=sys.stderr,
        )
        return EXIT_USAGE
    device = backend.device_info()
    major = int(str(device["capability"]).split(".")[0])
    if major < 8:
        return _no_gpu(f"{device['name']} is sm_{str(device['capability']).replace('.', '')}")
    impls = [i for i in cfg.impls if i == "flashcute" or backend.framework == "torch"]
    if len(impls) < len(cfg.impls):
        print(f"{PROG}: torch is not in use, so only flashcute is timed", file=sys.stderr)
    cfg = replace(cfg, impls=tuple(impls))

    console = Console()
    console.log(
        f"{PROG}: {device['name']} (sm_{device['capability'].replace('.', '')}, {device['sm_count']} SMs), "
        f"{backend.framework}, {len(points)} points, impls {','.join(impls)}, warmup {cfg.warmup}, iters {cfg.iters}"
    )
    results: list[PointResult] = []
    reasons_told: set[tuple[str, str]] = set()
    with console.progress(len(points), "benchmark") as advance:
        for point in points:
            pr = run_point(backend, cfg, point, device)
            results.append(pr)
            console.log(point_line(pr, impls))
            for impl, r in pr.impls.items():  # say once why an implementation cannot run
                if r.status == "n/a" and (impl, r.note) not in reasons_told:
                    reasons_told.add((impl, r.note))
                    console.log(f"  {impl} n/a: {r.note}")
            advance()

    gpu = str(device["name"])
    print_table(console, results, impls, f"flashcute forward, TFLOP/s (median of {cfg.iters}) on {gpu}")
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "gpu": device,
        "flashcute_cuda_status": reason,
        "framework": backend.framework,
        "versions": backend.versions(),
        "platform": platform.platform(),
        "config": {**asdict(cfg), "out_dir": str(cfg.out_dir)},
        "flops_formula": "4 * batch * nheads * seqlen_q * seqlen_k * headdim, halved when causal",
        "timing": "CUDA events around each call; median; inputs rotate only if they would fit in L2",
    }
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    stem = cfg.out_dir / f"bench-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    write_csv(stem.with_suffix(".csv"), results)
    write_json(stem.with_suffix(".json"), results, meta)
    written = [stem.with_suffix(".csv"), stem.with_suffix(".json")]
    if cfg.plot:
        if write_plot(stem.with_suffix(".png"), results, impls, f"flashcute forward on {gpu}"):
            written.append(stem.with_suffix(".png"))
        else:
            console.log(f"{PROG}: matplotlib is not installed: no plot")
    console.log(f"{PROG}: wrote " + ", ".join(map(str, written)))
    console.log(summary_line(results, gpu))
    return EXIT_CHECK_FAILED if any(pr.flashcute_failed for pr in results) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
