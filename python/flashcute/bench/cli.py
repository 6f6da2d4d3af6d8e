"""The command line of ``python -m flashcute.bench``: arguments, and the run from end to end."""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import flashcute

from . import timing
from .arrays import ArrayLib, DeviceInfo, LibraryUnavailable, select_array_lib, versions
from .files import output_stem, write_csv, write_json, write_plot
from .grid import FA_HIDDEN, FA_TOKENS, FLOPS_FORMULA, PASSES, GridSpec, build_grid
from .impls import DEFAULT_IMPLS, IMPLS, SUBJECT
from .report import PROG, Console, point_line, summary_line, table_rows
from .results import NOT_AVAILABLE, PointResult
from .run import run_point
from .timing import Timing

EXIT_OK, EXIT_NO_GPU, EXIT_USAGE, EXIT_CHECK_FAILED = 0, 1, 2, 3

DTYPES = ("bf16", "fp16")
DEFAULT_HEADDIMS = (64, 128, 256)
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_HEADDIMS = (64, 128)
QUICK_SEQLENS = (1024, 4096)


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


def _csv(values: Sequence[Any]) -> str:
    return ",".join(map(str, values))


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface. Grid options default to None so that --quick can fill them."""
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Benchmark flashcute's forward or backward pass against torch SDPA, "
        "after checking it against a float32 reference. `python -m flashcute.bench decode --help`: the "
        "KV-cache decode benchmark.",
        epilog="Exit codes: 0 ok; 1 no usable GPU / flashcute not built; 2 usage error or no torch/CuPy; "
        "3 a flashcute correctness check failed or flashcute raised.",
    )
    g = p.add_argument_group("grid")
    g.add_argument("--headdims", type=_int_list, help=f"head dims (default {_csv(DEFAULT_HEADDIMS)})")
    g.add_argument("--seqlens", type=_int_list, help=f"seqlen_q = seqlen_k values (default {_csv(DEFAULT_SEQLENS)})")
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
        "--pass",
        dest="pass_",
        choices=PASSES,
        default="fwd",
        help="what is timed: the forward (default), the backward alone (after one untimed forward; "
        "FLOPs 2.5x the forward's), or both (3.5x); the backward passes need torch",
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help=f"small grid (~20 s): d {_csv(QUICK_HEADDIMS)}; seqlen {_csv(QUICK_SEQLENS)}; causal both; bf16 "
        "(explicit flags still win)",
    )
    t = p.add_argument_group("timing")
    t.add_argument(
        "--timing",
        choices=timing.TIMINGS,
        default=timing.STANDARD,
        help="standard (default): each implementation after a warm-up, back-to-back calls each timed by CUDA "
        "events with L2 flushed between them (outside the events), one implementation after the other in the "
        "listed order and then in reverse, the median of both passes (as triton's do_bench); turns: the "
        "implementations timed in turns (--rounds), without an L2 flush. Every report names the timing used",
    )
    t.add_argument(
        "--warmup", type=int, default=10,
        help="untimed calls of each implementation before its timed ones: before each of its two passes "
        "(standard), before its first round (turns; 2 before later rounds) (default 10)",
    )
    t.add_argument(
        "--iters", type=int, default=30,
        help="individually timed calls of each implementation; the median is reported (default 30: 15 in each "
        "pass of the standard timing)",
    )
    t.add_argument(
        "--rounds",
        type=int,
        help=f"--timing turns only: this many rounds of iters/rounds timed calls of each implementation, so that "
        f"all of them see the GPU's clocks at the same moments (default {timing.DEFAULT_TURN_ROUNDS}: with the "
        "default iters, one timed call each per round)",
    )
    t.add_argument(
        "--impls", type=_impl_list, default=list(DEFAULT_IMPLS),
        help=f"implementations (default {_csv(DEFAULT_IMPLS)}; also flashcute-base: the first sm90 tile table "
             "only; flashcute-sm90bwd: the Hopper backward forced; flashcute-det: deterministic=True)"
    )
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

    grid: GridSpec
    impls: tuple[str, ...]
    framework: str  # "auto", "torch" or "cupy"
    seed: int
    out_dir: Path
    plot: bool
    timing: Timing = Timing()  # the schedule, warm-up and timed calls (--timing, --warmup, --iters, --rounds)


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
    if a.warmup < 0 or a.iters < 1 or (a.rounds is not None and a.rounds < 1):
        parser.error("--warmup must be >= 0, --iters and --rounds >= 1")
    if a.rounds is not None and a.timing != timing.TURNS:
        parser.error(f"--rounds sets the rounds of --timing turns; the {a.timing} timing has none "
                     "(add --timing turns, or drop --rounds)")
    how = Timing(a.timing, a.warmup, a.iters, a.rounds if a.rounds is not None else timing.DEFAULT_TURN_ROUNDS)
    headdims = a.headdims or list(QUICK_HEADDIMS if a.quick else DEFAULT_HEADDIMS)
    bad = [d for d in headdims if d % 8 or d > 256]
    if bad:
        parser.error(f"head dims must be multiples of 8 in [8, 256], got {bad}")
    grid = GridSpec(
        dtypes=DTYPES if a.dtype == "both" else (a.dtype or "bf16",),
        headdims=tuple(headdims),
        causals={"both": (False, True), "yes": (True,), "no": (False,)}[a.causal or "both"],
        seqlens=tuple(a.seqlens or (QUICK_SEQLENS if a.quick else DEFAULT_SEQLENS)),
        batch=a.batch,
        nheads=a.nheads,
        nheads_k=a.nheads_k,
        pass_=a.pass_,
    )
    return BenchConfig(grid, tuple(a.impls), a.framework, a.seed, a.out_dir, not a.no_plot, how)


class BenchExit(Exception):
    """Ends the run before any point: the message goes to stderr, the code is the exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _no_gpu(reason: str) -> BenchExit:
    return BenchExit(EXIT_NO_GPU, f"no CUDA GPU found ({reason}): this benchmark needs an sm80+ NVIDIA GPU")


def find_device(framework: str) -> tuple[ArrayLib, DeviceInfo]:
    """The array library and an sm80+ device to run on; raises BenchExit saying why there is none."""
    if not flashcute.is_available():
        raise _no_gpu(flashcute.cuda_status())
    try:
        lib = select_array_lib(framework)
    except LibraryUnavailable as exc:
        if exc.no_gpu:
            raise _no_gpu(str(exc)) from None
        raise BenchExit(
            EXIT_USAGE,
            f"neither torch nor CuPy can be used ({exc}): install one of them to make inputs and time calls",
        ) from None
    device = lib.device_info()
    if device.major < 8:
        raise _no_gpu(f"{device.name} is {device.arch}")
    return lib, device


def matmul_ceiling(n: int = 8192, warmup: int = 5, iters: int = 20) -> float:
    """TFLOP/s of a torch bf16 (n x n) @ (n x n) matmul on the current GPU, median of `iters` after
    `warmup`, CUDA events: the dense tensor-core rate (cuBLAS's wgmma kernels on Hopper) that
    attention's GEMMs can at best reach."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(warmup):
        a @ b
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return 2 * n**3 / (times[len(times) // 2] * 1e-3) / 1e12


def metadata(
    cfg: BenchConfig, argv: Sequence[str] | None, lib: ArrayLib, device: DeviceInfo, flush_nbytes: int | None = None
) -> dict[str, Any]:
    """What the JSON file records about the run besides its results; "timing" says how every number
    was measured ("timing_kind": standard or turns, as in the CSV's timing column)."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "gpu": asdict(device),
        "flashcute_cuda_status": flashcute.cuda_status(),
        "framework": lib.name,
        "versions": versions(),
        "platform": platform.platform(),
        "config": {**asdict(cfg), "out_dir": str(cfg.out_dir)},
        "flops_formula": FLOPS_FORMULA,
        "timing_kind": cfg.timing.kind,
        "timing": cfg.timing.method(flush_nbytes),
    }


def write_outputs(
    console: Console, cfg: BenchConfig, results: Sequence[PointResult], impls: Sequence[str], meta: dict[str, Any]
) -> None:
    """The CSV, the JSON and (unless --no-plot) the PNG, in --out-dir."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    stem = output_stem(cfg.out_dir)
    write_csv(stem.with_suffix(".csv"), results)
    write_json(stem.with_suffix(".json"), results, meta)
    written = [stem.with_suffix(".csv"), stem.with_suffix(".json")]
    if cfg.plot:
        what = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}[cfg.grid.pass_]
        if write_plot(stem.with_suffix(".png"), results, impls, f"flashcute {what} on {meta['gpu']['name']}"):
            written.append(stem.with_suffix(".png"))
        else:
            console.log(f"{PROG}: matplotlib is not installed: no plot")
    console.log(f"{PROG}: wrote " + ", ".join(map(str, written)))


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code (see the package docstring). A first argument
    ``decode`` runs the KV-cache decode benchmark instead (:mod:`.decode`), ``varlen`` the packed
    against padded prefill (:mod:`.varlen`), ``prefill`` many new tokens over a KV cache
    (:mod:`.prefill`), ``ring`` context parallelism over the GPUs of one host (:mod:`.ring`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["decode"]:
        from . import decode

        return decode.main(args[1:])
    if args[:1] == ["varlen"]:
        from . import varlen

        return varlen.main(args[1:])
    if args[:1] == ["prefill"]:
        from . import prefill

        return prefill.main(args[1:])
    if args[:1] == ["ring"]:
        from . import ring

        return ring.main(args[1:])
    cfg = parse_args(argv)
    try:
        try:
            points = build_grid(cfg.grid)
        except ValueError as exc:
            raise BenchExit(EXIT_USAGE, str(exc)) from None
        lib, device = find_device(cfg.framework)
        missing = {name: why for name in cfg.impls if (why := IMPLS[name].missing())}
        for name, why in missing.items():  # an optional peer whose package is not there: one line
            print(f"{PROG}: {name} skipped: {why}", file=sys.stderr)
        wanted = [IMPLS[name] for name in cfg.impls if name not in missing]
        impls = [impl for impl in wanted if impl.supports(lib.name, cfg.grid.pass_)]
        if not impls:
            raise BenchExit(
                EXIT_USAGE, f"none of --impls {_csv(cfg.impls)} can run --pass {cfg.grid.pass_} on {lib.name} arrays"
            )
    except BenchExit as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.code
    names = [impl.name for impl in impls]
    if len(names) < len(wanted):
        print(f"{PROG}: {lib.name} is in use, so only {_csv(names)} can be timed", file=sys.stderr)

    console = Console()
    how = cfg.timing
    flush_nbytes = timing.flush_bytes(device.l2_bytes) if how.flushes else None
    flush = lib.l2_flusher(flush_nbytes) if flush_nbytes else None
    console.log(
        f"{PROG}: {device.name} ({device.arch}, {device.sm_count} SMs), {lib.name}, {len(points)} points, "
        f"impls {_csv(names)}"
    )
    console.log(f"{PROG}: {how.method(flush_nbytes)}")
    ceiling = None
    if lib.name == "torch" and cfg.grid.pass_ == "fwd":
        ceiling = matmul_ceiling()
        console.log(f"{PROG}: torch bf16 matmul 8192^3: {ceiling:.1f} TFLOP/s (the tensor-core ceiling of this run)")
    results: list[PointResult] = []
    told: set[tuple[str, str]] = set()
    with console.progress(len(points), "benchmark") as advance:
        for point in points:
            pr = run_point(lib, impls, point, seed=cfg.seed, timing=how, l2_bytes=device.l2_bytes, flush=flush)
            results.append(pr)
            console.log(point_line(pr, names))
            for name, r in pr.impls.items():  # say once why an implementation cannot run
                if r.layout.startswith("path ") and (name, r.layout) not in told:  # and which kernels ran
                    told.add((name, r.layout))
                    family, _, tile = r.layout[5:].partition(" ")
                    console.log(f"  {name} runs on the {family} forward kernels, {tile} tiles "
                                f"(first at {pr.point.label})")
                if r.status == NOT_AVAILABLE and (name, r.note) not in told:
                    told.add((name, r.note))
                    console.log(f"  {name} n/a: {r.note}")
            advance()

    what = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}[cfg.grid.pass_]
    console.table(f"flashcute {what}, TFLOP/s ({how.summary}, median of {how.timed_calls}) on {device.name}",
                  *table_rows(results, names))
    meta = metadata(cfg, argv, lib, device, flush_nbytes)
    if ceiling is not None:
        meta["matmul_tflops"] = ceiling
        fractions = [t / ceiling for pr in results if not pr.failed and (t := pr.tflops(SUBJECT))]
        if fractions:
            console.log(f"{PROG}: flashcute at {min(fractions):.0%}-{max(fractions):.0%} of the matmul ceiling "
                        f"({ceiling:.1f} TFLOP/s)")
    write_outputs(console, cfg, results, names, meta)
    console.log(summary_line(results, device.name, how.summary))
    return EXIT_CHECK_FAILED if any(pr.failed for pr in results) else EXIT_OK
