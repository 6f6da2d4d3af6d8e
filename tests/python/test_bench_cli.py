"""CPU tests of the benchmark, python -m flashcute.bench: arguments, grid, FLOP counting, the check
and timing flow on fake arrays, the reports and files, and the clear failure without a GPU.

No GPU, torch or CuPy needed. The tests that run points use NumPy arrays through a fake array
library (a NumPy "GPU" whose CUDA events always read 0.5 ms) and are skipped without NumPy. The
timer's schedules on their own: test_bench_timing.py.
"""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import flashcute
import flashcute.bench.cli as cli
import flashcute.bench.files as files
import flashcute.bench.report as report
import flashcute.bench.timing as timing
import pytest
from flashcute.bench.arrays import ArrayLib, DeviceInfo, Inputs
from flashcute.bench.check import check_slice
from flashcute.bench.grid import Point, attention_flops, build_grid, tflops
from flashcute.bench.impls import DEFAULT_IMPLS, IMPLS, FlashAttn4, Flashcute, Impl, Runner
from flashcute.bench.results import ImplResult, PointResult
import flashcute.bench.run as run_mod
from flashcute.bench.run import run_point
from flashcute.bench.timing import STANDARD, TURNS, Timing
from flashcute.testing import Check

MODULES = ("arrays", "check", "cli", "decode", "files", "grid", "impls", "prefill", "report", "results", "ring",
           "run", "timing", "varlen")
OPTIONAL = ("torch", "cupy", "numpy", "matplotlib", "rich")


# ----------------------------------------------------------------------------------------- imports


def test_importing_the_bench_pulls_in_no_optional_package():
    # An import of a module whose sys.modules entry is None raises ImportError.
    code = f"""
import importlib, pkgutil, sys
for name in {OPTIONAL!r}:
    sys.modules[name] = None
import flashcute.bench
found = sorted(m.name for m in pkgutil.iter_modules(flashcute.bench.__path__) if m.name != "__main__")
assert found == sorted({MODULES!r}), found
for name in found:
    importlib.import_module("flashcute.bench." + name)
from flashcute.bench import cli, grid, report
assert len(grid.build_grid(cli.parse_args(["--quick"]).grid)) == 8
console = report.Console()  # no rich: plain prints
assert console.rich is None
console.log("plain line")
assert all(sys.modules[name] is None for name in {OPTIONAL!r})
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "plain line\n"


def test_python_dash_m_reports_usage_errors():
    proc = subprocess.run(
        [sys.executable, "-m", "flashcute.bench", "--headdims", "65"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "head dims must be multiples of 8" in proc.stderr


# --------------------------------------------------------------------------------------- arguments


def test_defaults_are_the_fa_grid():
    cfg = cli.parse_args([])
    g = cfg.grid
    assert g.headdims == (64, 128, 256)
    assert g.seqlens == (512, 1024, 2048, 4096, 8192, 16384)
    assert g.causals == (False, True)
    assert g.dtypes == ("bf16",)
    assert (g.batch, g.nheads, g.nheads_k) == (None, None, None)
    assert cfg.impls == ("flashcute", "flashcute-sm80", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "fa4")
    assert cfg.impls == DEFAULT_IMPLS
    assert set(IMPLS) == {*DEFAULT_IMPLS, "flashcute-base", "flashcute-sm90bwd", "flashcute-det"}
    # The standard timing by default: 10 warm-up calls, 30 timed calls (15 a pass).
    assert cfg.timing == Timing(STANDARD, warmup=10, iters=30) and cfg.timing.plan() == (2, 15)
    assert (cfg.seed, cfg.framework) == (0, "auto")
    assert cfg.out_dir == Path("bench-results") and cfg.plot


def test_quick_grid_and_explicit_flags_win():
    quick = cli.parse_args(["--quick"]).grid
    assert quick.headdims == (64, 128) and quick.seqlens == (1024, 4096)
    assert quick.causals == (False, True) and quick.dtypes == ("bf16",)
    assert len(build_grid(quick)) == 8
    g = cli.parse_args(["--quick", "--headdims", "256", "--causal", "yes", "--dtype", "both"]).grid
    assert g.headdims == (256,) and g.seqlens == (1024, 4096)
    assert g.causals == (True,) and g.dtypes == ("bf16", "fp16")


def test_flags_parse(tmp_path):
    argv = "--headdims 64,72 --seqlens 128,4096 --causal no --dtype fp16 --batch 3 --nheads 8 --nheads-k 2"
    argv += " --warmup 2 --iters 7 --timing turns --rounds 3 --impls flashcute,sdpa-cudnn,flashcute --no-plot"
    argv += " --framework cupy"
    argv += " --seed 5"
    cfg = cli.parse_args(argv.split() + ["--out-dir", str(tmp_path)])
    g = cfg.grid
    assert g.headdims == (64, 72) and g.seqlens == (128, 4096)
    assert g.causals == (False,) and g.dtypes == ("fp16",)
    assert (g.batch, g.nheads, g.nheads_k) == (3, 8, 2)
    assert cfg.timing == Timing(TURNS, warmup=2, iters=7, rounds=3) and cfg.seed == 5
    assert cfg.impls == ("flashcute", "sdpa-cudnn")  # duplicates dropped
    assert cfg.out_dir == tmp_path and not cfg.plot and cfg.framework == "cupy"


@pytest.mark.parametrize(
    "argv",
    [
        ["--headdims", "65"],  # not a multiple of 8
        ["--headdims", "512"],  # above 256
        ["--seqlens", "0"],
        ["--seqlens", "1k"],
        ["--impls", "flashcute,xformers"],
        ["--causal", "maybe"],
        ["--dtype", "fp8"],
        ["--framework", "jax"],
        ["--fa-grid", "--batch", "2"],  # contradictory
        ["--nheads", "0"],
        ["--nheads-k", "-1"],
        ["--iters", "0"],
        ["--warmup", "-1"],
        ["--rounds", "0", "--timing", "turns"],
        ["--timing", "fast"],
        ["--rounds", "3"],  # rounds are the turns timing's
    ],
)
def test_bad_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_timing_option():
    assert cli.parse_args(["--timing", "turns"]).timing == Timing(TURNS, 10, 30, 30)  # --rounds defaults to 30
    assert cli.parse_args(["--timing", "standard", "--iters", "40"]).timing == Timing(STANDARD, 10, 40)


def test_rounds_without_the_turns_timing_says_why(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--rounds", "5"])
    assert exc.value.code == 2
    assert "--rounds sets the rounds of --timing turns; the standard timing has none" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------- grid


def test_fa_grid_sizes():
    points = build_grid(cli.parse_args(["--fa-grid", "--causal", "no"]).grid)
    assert len(points) == 3 * 6
    for p in points:
        assert p.batch * p.seqlen == 16384 and p.nheads * p.headdim == 2048
        assert p.nheads_k == p.nheads
    by_key = {(p.headdim, p.seqlen): p for p in points}
    assert (by_key[64, 512].batch, by_key[64, 512].nheads) == (32, 32)
    assert (by_key[128, 4096].batch, by_key[128, 4096].nheads) == (4, 16)
    assert (by_key[256, 16384].batch, by_key[256, 16384].nheads) == (1, 8)


def test_grid_order_and_explicit_sizes():
    argv = "--dtype both --headdims 64,128 --seqlens 256,32768 --batch 2 --nheads 16 --nheads-k 4"
    points = build_grid(cli.parse_args(argv.split()).grid)
    assert len(points) == 2 * 2 * 2 * 2
    assert [(p.dtype, p.headdim, p.causal, p.seqlen) for p in points[:4]] == [
        ("bf16", 64, False, 256),
        ("bf16", 64, False, 32768),
        ("bf16", 64, True, 256),
        ("bf16", 64, True, 32768),
    ]
    assert points[-1].dtype == "fp16"
    assert all((p.batch, p.nheads, p.nheads_k) == (2, 16, 4) for p in points)
    assert points[0].label == "bf16 d=64 full s=256 b=2 h=16/4"
    # Beyond 16k tokens the FA grid keeps one sequence per batch.
    long = build_grid(cli.parse_args(["--seqlens", "32768", "--headdims", "128"]).grid)
    assert {p.batch for p in long} == {1}


def test_gqa_must_divide():
    with pytest.raises(ValueError, match="multiple"):
        build_grid(cli.parse_args(["--headdims", "96", "--nheads-k", "4"]).grid)  # 2048 // 96 = 21 heads


def test_flops_like_flashattention():
    assert attention_flops(1, 1, 128, 128, 64, causal=False) == 4 * 128 * 128 * 64
    assert attention_flops(4, 16, 4096, 4096, 128, causal=True) == 4 * 4 * 16 * 4096 * 4096 * 128 // 2
    assert attention_flops(2, 3, 100, 300, 32, causal=False) == 4 * 2 * 3 * 100 * 300 * 32
    causal = Point("bf16", 128, True, 4096, 4, 16, 16)
    assert causal.flops == 2 * 4 * 16 * 4096 * 4096 * 128
    full = Point("bf16", 128, False, 4096, 4, 16, 16)
    assert full.flops == 2 * causal.flops
    # FA grid, d=128, non-causal: 4 * 16384 tokens * 4096 * 2048 hidden = 549.8 GFLOP at seqlen 4k
    assert full.flops == 4 * 16384 * 4096 * 2048
    assert tflops(10**12, 1000.0) == pytest.approx(1.0)
    assert tflops(full.flops, 1.5) == pytest.approx(full.flops / 1.5e-3 / 1e12)


def test_backward_passes_count_flops_like_flashattention():
    fwd = Point("bf16", 128, True, 4096, 4, 16, 16)
    assert Point("bf16", 128, True, 4096, 4, 16, 16, "bwd").flops == int(2.5 * fwd.flops)
    assert Point("bf16", 128, True, 4096, 4, 16, 16, "fwd+bwd").flops == int(3.5 * fwd.flops)
    assert Point("bf16", 128, True, 4096, 4, 16, 16, "bwd").label.endswith(" bwd")
    assert fwd.label.endswith("h=16")


def test_pass_option():
    assert cli.parse_args([]).grid.pass_ == "fwd"
    for name in ("bwd", "fwd+bwd"):
        cfg = cli.parse_args(["--pass", name, "--quick"])
        assert cfg.grid.pass_ == name and all(p.pass_ == name for p in build_grid(cfg.grid))
    with pytest.raises(SystemExit):
        cli.parse_args(["--pass", "backward"])
    # The backward passes go through torch autograd: CuPy arrays cannot time them.
    assert IMPLS["flashcute"].supports("torch", "bwd") and not IMPLS["flashcute"].supports("cupy", "bwd")
    assert IMPLS["flashcute"].supports("cupy", "fwd")


def test_input_rotation_only_when_l2_resident():
    mib = 1 << 20
    assert timing.input_sets_needed(256 * mib, 50 * mib) == 1  # the FA grid: 4 x 64 MiB
    assert timing.input_sets_needed(10 * mib, 50 * mib) == 15  # ceil(3 * 50 / 10)
    assert timing.input_sets_needed(1, 50 * mib) == timing.MAX_INPUT_SETS
    assert timing.input_sets_needed(200 * mib, None) == 2  # unknown L2: assume 128 MiB


def test_check_slice():
    small = check_slice(Point("bf16", 64, False, 256, 2, 4, 4))
    assert (small.scope, small.batches, small.heads) == ("full", slice(0, 2), [0, 1, 2, 3])
    fa_point = check_slice(Point("bf16", 128, True, 4096, 4, 16, 4))
    assert (fa_point.scope, fa_point.batches, fa_point.heads) == ("b0 h[0, 15]", slice(0, 1), [0, 15])
    many_heads = Point("bf16", 64, False, 128, 64, 64, 64)  # few scores, but 4096 (b, h) pairs
    assert check_slice(many_heads).scope == "b0 h[0, 63]"
    assert check_slice(Point("bf16", 64, False, 8192, 1, 1, 1)).heads == [0]


# ------------------------------------------------------------------------------- runs on fake arrays


class FakeEvent:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def record(self) -> None:
        self.log.append("event")


class NumpyLib(ArrayLib):
    """NumPy arrays posing as a GPU library: every timed call takes 0.5 ms. `log` records event
    records and L2 flushes; `flush_buffers` the size of every flush buffer allocated."""

    name = "numpy"

    def __init__(self, module: Any) -> None:
        super().__init__(module)
        self.log: list[str] = []
        self.flush_buffers: list[int] = []

    @classmethod
    def load(cls) -> NumpyLib:
        return cls(pytest.importorskip("numpy"))

    @staticmethod
    def installed_versions() -> dict[str, Any]:
        return {}

    def device_info(self) -> DeviceInfo:
        return DeviceInfo("Fake GPU", "9.0", 132, 50 << 20, 80 << 30)

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        assert dtype == "fp16"  # NumPy has no bfloat16
        return self.m.random.default_rng(seed).standard_normal(shape).astype(self.m.float16)

    def is_oom(self, exc: BaseException) -> bool:
        return False

    def event(self) -> Any:
        return FakeEvent(self.log)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return 0.5

    def synchronize(self) -> None:
        pass

    def l2_flusher(self, nbytes: int, clean: bool = False) -> Any:
        self.flush_buffers.append(nbytes)
        return lambda: self.log.append("flush")


def naive_attention(q: Any, k: Any, v: Any, *, softmax_scale: float, causal: bool, kv_head_zero: bool = False) -> Any:
    """Attention computed plainly in float16 (it passes the check); with kv_head_zero every query
    head reads KV head 0 (wrong under GQA)."""
    from flashcute.testing import attention_ref

    if kv_head_zero:
        k, v = k[:, :, :1], v[:, :, :1]
    out, _ = attention_ref(q, k, v, softmax_scale=softmax_scale, causal=causal, lowp="float16")
    return out.astype("float16")


class FakeImpl(Impl):
    def __init__(self, name: str, fn: Any) -> None:
        self.name, self.fn = name, fn

    def prepare(self, point: Point, input_sets: Any, softmax_scale: float) -> Runner:
        def call(x: Inputs) -> Any:
            return lambda: self.fn(x.q, x.k, x.v, softmax_scale=softmax_scale, causal=point.causal)

        return Runner([call(x) for x in input_sets])


class FakeFlashcute(Flashcute):
    """flashcute's name and error handling around a fake kernel."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def prepare(self, point: Point, input_sets: Any, softmax_scale: float) -> Runner:
        return FakeImpl(self.name, self.fn).prepare(point, input_sets, softmax_scale)


def _raise(exc: BaseException) -> Any:
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fn


def test_run_point_checks_gqa_slices_and_times():
    lib = NumpyLib.load()
    point = Point("fp16", 8, True, 16, 1, 80, 4)  # 80 (b, h) pairs: checked on heads 0 and 79
    impls = [
        FakeImpl("flashcute", naive_attention),
        FakeImpl("peer-wrong", lambda *a, **kw: naive_attention(*a, **kw, kv_head_zero=True)),
        FakeImpl("peer-raises", _raise(RuntimeError("No available kernel\nmore"))),
    ]
    pr = run_point(lib, impls, point, seed=0, timing=Timing(TURNS, 2, 5, 1), l2_bytes=None)
    assert pr.input_sets == timing.MAX_INPUT_SETS  # a few KiB of inputs sit in L2, and nothing flushes it
    fc = pr.impls["flashcute"]
    assert fc.status == "ok" and fc.check is not None and fc.check.ok
    assert fc.check_scope == "b0 h[0, 79]" and fc.times_ms == [0.5] * 5
    wrong = pr.impls["peer-wrong"]  # a peer's wrong output is recorded, not a failure of the run
    assert wrong.status == "ok" and wrong.check is not None and not wrong.check.ok
    assert pr.impls["peer-raises"].status == "n/a"
    assert pr.impls["peer-raises"].note == "RuntimeError: No available kernel"
    assert not pr.failed


def test_run_point_times_the_impls_in_turns():
    """Round r times every implementation in turn, in the listed order in even rounds and the
    reverse in odd ones; the first round takes the whole warm-up, later ones ROUND_WARMUP calls.
    An implementation that raises in a later round is an error; the others go on."""
    lib = NumpyLib.load()
    point = Point("fp16", 8, False, 16, 1, 2, 2)
    log: list[str] = []

    def logged(name: str, fail_after: int | None = None) -> Any:
        def fn(*args: Any, **kwargs: Any) -> Any:
            log.append(name)
            if fail_after is not None and log.count(name) > fail_after:
                raise RuntimeError("launch failed")
            return naive_attention(*args, **kwargs)

        return fn

    impls = [FakeFlashcute(logged("fc")), FakeImpl("peer", logged("peer")), FakeImpl("late", logged("late", 6))]
    pr = run_mod.run_point(lib, impls, point, seed=0, timing=Timing(TURNS, 3, 5, 3), l2_bytes=None,
                           flush=lambda: log.append("flush"))
    assert "flush" not in log  # the turns timing does not flush
    w = timing.ROUND_WARMUP
    first = 1 + 3 + 2  # the checked call, the warm-up, two timed calls
    later = w + 2
    # Each impl is checked once, in order, before any timing.
    assert log[:3] == ["fc", "peer", "late"]
    runs = [(name, len(list(group))) for name, group in itertools.groupby(log[3:])]
    # (groupby joins the last impl of a round with the first of the next: the same impl.)
    assert runs == [("fc", first - 1), ("peer", first - 1),  # round 0, in order
                    ("late", first - 1 + 1),  # round 0's last, then round 1's first, which fails at once
                    ("peer", later), ("fc", later + later),  # the rest of round 1, reversed; round 2's first
                    ("peer", later)]  # round 2: late is out
    assert pr.impls["flashcute"].status == "ok" and pr.impls["flashcute"].times_ms == [0.5] * 6
    assert pr.impls["peer"].times_ms == [0.5] * 6
    assert pr.impls["late"].status == "n/a" and pr.impls["late"].note == "RuntimeError: launch failed"
    assert list(pr.impls) == ["flashcute", "peer", "late"]
    assert pr.timing == TURNS


def test_run_point_standard_timing_in_order_then_reverse_with_l2_flushes():
    """The standard timing: each implementation checked once, then timed alone (warm-up, then
    flushed timed calls) in the listed order, then all again in reverse; one input set (the flush
    keeps L2 cold), and an implementation that raises while timed is dropped from the second pass."""
    lib = NumpyLib.load()
    point = Point("fp16", 8, False, 16, 1, 2, 2)  # a few KiB: the turns timing would rotate 64 sets
    log = lib.log

    def logged(name: str, fail_after: int | None = None) -> Any:
        def fn(*args: Any, **kwargs: Any) -> Any:
            log.append(name)
            if fail_after is not None and log.count(name) > fail_after:
                raise RuntimeError("launch failed")
            return naive_attention(*args, **kwargs)

        return fn

    impls = [FakeFlashcute(logged("fc")), FakeImpl("peer", logged("peer")), FakeImpl("late", logged("late", 4))]
    flush = lib.l2_flusher(256 << 20)
    pr = run_mod.run_point(lib, impls, point, seed=0, timing=Timing(STANDARD, 2, 4), l2_bytes=50 << 20, flush=flush)
    assert pr.input_sets == 1 and pr.timing == STANDARD

    def batch(name: str) -> list[str]:  # warm-up 2, then 4 / 2 passes = 2 flushed timed calls
        return [name, name] + ["flush", "event", name, "event"] * 2

    assert log[:3] == ["fc", "peer", "late"]  # the checks, before any timing
    # late's 5th call (the check, 2 warm-up, 1 timed, then this) raises: no end event.
    late_fails = ["late", "late", "flush", "event", "late", "event", "flush", "event", "late"]
    assert log[3:] == batch("fc") + batch("peer") + late_fails + batch("peer") + batch("fc")
    assert pr.impls["flashcute"].times_ms == [0.5] * 4 and pr.impls["peer"].times_ms == [0.5] * 4
    assert pr.impls["late"].status == "n/a" and pr.impls["late"].note == "RuntimeError: launch failed"


def test_run_point_standard_timing_needs_the_flush():
    lib = NumpyLib.load()
    with pytest.raises(ValueError, match="flush"):
        run_point(lib, [FakeImpl("flashcute", naive_attention)], Point("fp16", 8, False, 16, 1, 2, 2), seed=0,
                  timing=Timing(STANDARD, 0, 2), l2_bytes=None)


@pytest.mark.parametrize(
    ("fn", "status"),
    [
        (lambda *a, **kw: naive_attention(*a, **kw, kv_head_zero=True), "fail"),
        (_raise(RuntimeError("launch failed")), "error"),
        (_raise(NotImplementedError("head dim 8 is not compiled")), "n/a"),
    ],
)
def test_run_point_verdicts_for_flashcute(fn, status):
    lib = NumpyLib.load()
    point = Point("fp16", 8, False, 16, 1, 80, 4)
    pr = run_point(lib, [FakeFlashcute(fn)], point, seed=0, timing=Timing(STANDARD, 0, 2), l2_bytes=None,
                   flush=lambda: None)
    assert pr.impls["flashcute"].status == status
    assert pr.failed == (status != "n/a")
    if status == "fail":
        assert "max error" in pr.impls["flashcute"].note


@pytest.fixture
def fake_gpu(monkeypatch):
    """A machine whose flashcute sees a GPU, with NumPy as its array library and a NumPy
    flash_attn_func that computes correct attention."""
    lib = NumpyLib.load()
    monkeypatch.lib = lib  # the tests read its log
    monkeypatch.setitem(IMPLS, "fa4", FlashAttn4())  # a fresh one: whether it imports is not cached across tests
    monkeypatch.setattr(flashcute._C, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(flashcute._C, "cuda_status", lambda: "ok")
    monkeypatch.setattr(cli, "select_array_lib", lambda framework: lib)
    monkeypatch.setattr(flashcute, "compiled_dtypes", lambda: ["float16"])
    monkeypatch.setattr(flashcute, "kernel_head_dim", lambda d: 64 if d <= 64 else 0)
    monkeypatch.setattr(flashcute, "flash_attn_func", naive_attention)
    return monkeypatch


SMALL_RUN = "--dtype fp16 --headdims 64,128 --seqlens 64,512 --batch 1 --nheads 2 --nheads-k 1"
SMALL_RUN += " --warmup 1 --iters 3 --no-plot --impls flashcute,sdpa-flash,sdpa-cudnn"


def test_main_end_to_end_on_a_fake_gpu(fake_gpu, capsys, tmp_path):
    rc = cli.main(SMALL_RUN.split() + ["--out-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "numpy is in use, so only flashcute can be timed" in err  # the SDPA backends need torch
    assert "flashcute.bench: Fake GPU (sm_90, 132 SMs), numpy, 8 points, impls flashcute\n" in out
    assert ("flashcute.bench: standard timing: CUDA events around each call; per implementation 1 warm-up calls, "
            "then 2 timed calls, each after an L2 flush (a 256 MiB buffer written outside the events)") in out
    assert "flashcute forward, TFLOP/s (standard timing, median of 4) on Fake GPU" in out
    assert fake_gpu.lib.flush_buffers == [256 << 20]  # one buffer for the run: max(256 MiB, 2 x 50 MiB)
    assert fake_gpu.lib.log.count("flush") == 4 * 4  # 4 timed calls at each of the 4 points flashcute ran
    assert "fp16 d=64 causal s=512 b=1 h=2/1: flashcute 0.1  [check pass " in out
    assert "flashcute n/a: no kernel for head dim 128 in this build (compiled: " in out
    assert out.splitlines()[-1] == (
        "flashcute.bench summary [Fake GPU, standard timing]: 4/4 points correct (4 n/a); no SDPA comparison"
    )

    (csv_path,) = tmp_path.glob("bench-*.csv")
    (json_path,) = tmp_path.glob("bench-*.json")
    assert csv_path.stem == json_path.stem and len(csv_path.stem) == len("bench-YYYYmmdd-HHMMSS")
    assert not list(tmp_path.glob("*.png"))  # --no-plot
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["status"] for r in rows] == ["ok"] * 4 + ["n/a"] * 4
    assert rows[0]["check"] == "pass" and rows[0]["check_scope"] == "full" and rows[0]["iters"] == "4"
    assert {r["timing"] for r in rows} == {"standard"}  # every record names its timing
    doc = json.loads(json_path.read_text())
    meta = doc["meta"]
    assert meta["gpu"]["name"] == "Fake GPU" and meta["framework"] == "numpy"
    assert meta["argv"][:2] == ["--dtype", "fp16"] and meta["config"]["grid"]["nheads_k"] == 1
    assert meta["flops_formula"].startswith("4 * batch * nheads")
    assert meta["timing_kind"] == "standard" and meta["timing"].startswith("standard timing: ")
    assert meta["config"]["timing"] == {"kind": "standard", "warmup": 1, "iters": 3, "rounds": 30}
    assert meta["versions"]["flashcute"] == flashcute.__version__
    assert doc["results"][0]["times_ms"] == [0.5] * 4


def test_main_with_the_turns_timing_says_so_everywhere(fake_gpu, capsys, tmp_path):
    rc = cli.main(SMALL_RUN.split() + ["--timing", "turns", "--rounds", "3", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "flashcute.bench: turns timing: CUDA events around each call; the implementations timed in turns, 3 " \
           "rounds of 1 timed calls" in out
    assert "(turns timing, median of 3)" in out
    assert out.splitlines()[-1].startswith("flashcute.bench summary [Fake GPU, turns timing]: 4/4 points correct")
    assert fake_gpu.lib.flush_buffers == [] and "flush" not in fake_gpu.lib.log
    (csv_path,) = tmp_path.glob("bench-*.csv")
    rows = list(csv.DictReader(csv_path.open()))
    assert {r["timing"] for r in rows} == {"turns"} and rows[0]["iters"] == "3"
    meta = json.loads(next(tmp_path.glob("bench-*.json")).read_text())["meta"]
    assert meta["timing_kind"] == "turns" and meta["timing"].startswith("turns timing: ")


def test_main_exit_code_3_when_flashcute_is_wrong_and_the_run_goes_on(fake_gpu, capsys, tmp_path):
    fake_gpu.setattr(flashcute, "flash_attn_func", lambda q, k, v, **kw: q * 0)
    rc = cli.main(SMALL_RUN.split() + ["--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 3
    assert out.count("(fail: out: max error") == 4  # every point ran
    assert "summary [Fake GPU, standard timing]: 0/4 points correct (4 n/a)" in out


def _no_fa4(monkeypatch) -> None:
    """flash_attn.cute does not import (an import of a module whose sys.modules entry is None fails)."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)


def _fake_fa4(monkeypatch, fn: Any) -> None:
    """A flash_attn.cute module whose flash_attn_func is `fn`."""
    pkg, cute = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = fn  # type: ignore[attr-defined]
    pkg.cute = cute  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)


def test_main_without_fa4_skips_it_in_one_line(fake_gpu, capsys, tmp_path):
    _no_fa4(fake_gpu)
    rc = cli.main(SMALL_RUN.replace("--impls flashcute,sdpa-flash,sdpa-cudnn", "--impls flashcute,fa4").split()
                  + ["--out-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    lines = [ln for ln in err.splitlines() if "fa4" in ln]
    assert lines == ["flashcute.bench: fa4 skipped: flash_attn.cute is not importable (ModuleNotFoundError: "
                     "import of flash_attn.cute halted; None in sys.modules)"]
    assert "is in use, so only" not in err  # fa4 was left out for its import, not for the array library
    assert "impls flashcute\n" in out
    assert not [ln for ln in out.splitlines() if "fa4" in ln and " wrote " not in ln]  # (tmp_path has "fa4")
    (csv_path,) = tmp_path.glob("bench-*.csv")
    assert {r["impl"] for r in csv.DictReader(csv_path.open())} == {"flashcute"}


def test_main_with_only_fa4_missing_is_a_usage_error(fake_gpu, capsys, tmp_path):
    _no_fa4(fake_gpu)
    assert cli.main(["--impls", "fa4", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "fa4 skipped: flash_attn.cute is not importable" in err and "none of --impls fa4 can run" in err


def test_fa4_is_timed_like_a_peer_after_its_jit_compile(monkeypatch):
    """prepare makes the first call (FlashAttention-4 compiles each configuration on it), the output
    is the first of (out, lse), and the calls are timed like any other implementation's."""
    calls: list[dict[str, Any]] = []

    def fa4_func(q: Any, k: Any, v: Any, softmax_scale: float, causal: bool) -> Any:
        calls.append({"softmax_scale": softmax_scale, "causal": causal})
        return naive_attention(q, k, v, softmax_scale=softmax_scale, causal=causal), "lse"

    _fake_fa4(monkeypatch, fa4_func)
    fa4 = FlashAttn4()
    assert fa4.missing() is None and fa4.supports("torch", "fwd+bwd") and not fa4.supports("cupy")
    lib = NumpyLib.load()
    point = Point("fp16", 8, True, 16, 1, 2, 2)
    pr = run_point(lib, [FakeImpl("flashcute", naive_attention), fa4], point, seed=0, timing=Timing(STANDARD, 1, 2),
                   l2_bytes=None, flush=lambda: None)
    r = pr.impls["fa4"]
    assert r.status == "ok" and r.check is not None and r.check.ok and r.times_ms == [0.5] * 2
    # The compile call in prepare, the checked call, then per pass 1 warm-up and 1 timed call.
    assert len(calls) == 1 + 1 + 2 * 2
    assert calls[0] == {"softmax_scale": pytest.approx(8 ** -0.5), "causal": True}


def test_fa4_that_refuses_a_point_is_n_a(monkeypatch):
    _fake_fa4(monkeypatch, _raise(AssertionError("head_dim must be divisible by 8")))
    pr = run_point(NumpyLib.load(), [FakeImpl("flashcute", naive_attention), FlashAttn4()],
                   Point("fp16", 8, False, 16, 1, 2, 2), seed=0, timing=Timing(STANDARD, 0, 2), l2_bytes=None,
                   flush=lambda: None)
    assert pr.impls["fa4"].status == "n/a" and pr.impls["fa4"].note == "AssertionError: head_dim must be divisible by 8"
    assert pr.impls["flashcute"].status == "ok" and not pr.failed


def test_fa4_not_importable_is_unsupported_at_every_point(monkeypatch):
    _no_fa4(monkeypatch)
    fa4 = FlashAttn4()
    assert fa4.missing().startswith("flash_attn.cute is not importable (ModuleNotFoundError")
    pr = run_point(NumpyLib.load(), [fa4], Point("fp16", 8, False, 16, 1, 2, 2), seed=0,
                   timing=Timing(STANDARD, 0, 2), l2_bytes=None, flush=lambda: None)
    assert pr.impls["fa4"].status == "n/a" and "not importable" in pr.impls["fa4"].note


def test_main_with_no_impl_for_the_library(fake_gpu, capsys, tmp_path):
    assert cli.main(["--impls", "sdpa-flash", "--out-dir", str(tmp_path)]) == 2
    assert "none of --impls sdpa-flash can run --pass fwd on numpy arrays" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- reports


def _result(seqlen: int, fc_ms: float | None, flash_ms: float | None, passed: bool = True) -> PointResult:
    point = Point("bf16", 128, False, seqlen, 16384 // seqlen, 16, 16)
    message = "" if passed else "out: max error nan > bound 2.000e-02"
    check = Check(passed, 1e-3 if passed else float("nan"), 2e-2, 5e-3, message=message)
    fc = ImplResult("ok" if passed else "fail", [fc_ms] * 3 if fc_ms else [], check=check, check_scope="b0 h[0, 15]")
    if not passed:
        fc.note = message
    flash = ImplResult("ok", [flash_ms] * 3, layout="view") if flash_ms else ImplResult("n/a", note="No kernel")
    return PointResult(point, {"flashcute": fc, "sdpa-flash": flash}, timing="standard")


def test_summary_line():
    results = [_result(512, 2.0, 1.0), _result(1024, 1.0, 1.0), _result(4096, 1.0, 2.0)]
    line = report.summary_line(results, "NVIDIA H200", "standard timing")
    assert line.startswith("flashcute.bench summary [NVIDIA H200, standard timing]: 3/3 points correct")
    assert "fc/flash seqlen>=1k: min 1.00x geomean 1.41x (2 pts)" in line
    assert "fc/flash seqlen<1k: min 0.50x geomean 0.50x (1 pts)" in line
    assert "fc/cudnn" not in line
    with_failure = results + [_result(2048, 0.01, 1.0, passed=False)]  # a wrong result's speed is ignored
    line = report.summary_line(with_failure, "NVIDIA H200", "standard timing")
    assert "3/4 points correct" in line and "fc/flash seqlen>=1k: min 1.00x geomean 1.41x (2 pts)" in line
    failing = [_result(1024, 1.0, None, passed=False)]
    line = report.summary_line(failing, "gpu", "turns timing")
    assert "0/1 points correct" in line and "no SDPA comparison" in line
    assert failing[0].failed


def test_summary_line_with_cudnn():
    pr = _result(2048, 1.0, 2.0)
    pr.impls["sdpa-cudnn"] = ImplResult("ok", [0.5])
    line = report.summary_line([pr], "gpu", "standard timing")
    assert line.endswith(
        "fc/flash seqlen>=1k: min 2.00x geomean 2.00x (1 pts); fc/cudnn seqlen>=1k: min 0.50x geomean 0.50x (1 pts)"
    )


def test_fa4_is_compared_in_the_summary_and_the_table():
    pr = _result(2048, 1.0, 2.0)
    pr.impls["fa4"] = ImplResult("ok", [0.8])
    line = report.summary_line([pr], "gpu", "standard timing")
    assert line.endswith("fc/fa4 seqlen>=1k: min 0.80x geomean 0.80x (1 pts)")
    header, rows = report.table_rows([pr], ["flashcute", "sdpa-flash", "fa4"])
    assert header[6:] == ["flashcute TF/s", "sdpa-flash TF/s", "fa4 TF/s", "fc/flash", "fc/fa4", "check"]
    assert rows[0][header.index("fc/fa4")] == "0.80"


def test_point_line_and_table():
    ok, bad = _result(1024, 1.0, 2.0), _result(2048, 4.0, None, passed=False)
    line = report.point_line(ok, ["flashcute", "sdpa-flash"])
    assert line == "bf16 d=128 full s=1024 b=16 h=16: flashcute 137.4, sdpa-flash 68.7  [check pass 1.0e-03<=2.0e-02]"
    line = report.point_line(bad, ["flashcute", "sdpa-flash"])
    assert "(fail: out: max error nan" in line and "sdpa-flash n/a" in line
    assert line.endswith("[check FAIL nan<=2.0e-02]")

    header, rows = report.table_rows([ok, bad], ["flashcute", "sdpa-flash"])
    assert header[:6] == ["dtype", "d", "causal", "seqlen", "batch", "heads"]
    assert header[6:] == ["flashcute TF/s", "sdpa-flash TF/s", "fc/flash", "check"]
    assert rows[0][header.index("fc/flash")] == "2.00"
    assert rows[1][header.index("sdpa-flash TF/s")] == "n/a"
    assert rows[1][-1].startswith("FAIL")


def test_a_variant_of_flashcute_is_checked_like_it():
    # Timed without "flashcute", a variant's check is the point's; a variant's failure fails the run.
    bad = _result(2048, 4.0, 2.0, passed=False)
    bad.impls = {"flashcute-sm90bwd": bad.impls["flashcute"], "sdpa-flash": bad.impls["sdpa-flash"]}
    assert bad.subject is bad.impls["flashcute-sm90bwd"] and bad.failed
    assert report.point_line(bad, ["flashcute-sm90bwd", "sdpa-flash"]).endswith("[check FAIL nan<=2.0e-02]")
    ok = _result(2048, 1.0, 2.0)
    ok.impls["flashcute-sm80"] = ImplResult("fail", [1.0] * 3, note="out: max error nan")
    assert ok.subject is ok.impls["flashcute"] and ok.failed
    assert not _result(2048, 1.0, 2.0).failed


def test_plain_console_table(capsys):
    console = report.Console()
    console.rich = None  # what it is without rich
    console.table("title", ["dtype", "d", "causal", "TF/s", "check"], [["bf16", "64", "no", "123.4", "pass"]])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["title", "dtype  d   causal   TF/s  check", "bf16   64  no      123.4  pass "]


def test_rich_console_keeps_lines_whole_off_a_terminal(capsys):
    pytest.importorskip("rich", reason="rich (the bench extra) is not installed")
    console = report.Console()
    assert console.rich is not None and console.rich.width == report.LOG_WIDTH
    long = "x" * 300
    console.log(long)
    with console.progress(3, "benchmark") as advance:  # no bar off a terminal
        advance()
    assert capsys.readouterr().out == long + "\n"


def test_csv_and_json_hold_the_same_records(tmp_path):
    results = [_result(1024, 1.0, 2.0), _result(2048, 4.0, None, passed=False)]
    files.write_csv(tmp_path / "r.csv", results)
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == 4
    assert list(rows[0])[:7] == ["dtype", "headdim", "causal", "seqlen", "batch", "nheads", "nheads_k"]
    assert "times_ms" not in rows[0] and rows[0]["iters"] == "3"
    assert (rows[0]["impl"], rows[0]["check"], rows[0]["check_scope"]) == ("flashcute", "pass", "b0 h[0, 15]")
    assert [r["timing"] for r in rows] == ["standard"] * 4
    assert rows[2]["status"] == "fail" and rows[2]["max_err"] == "nan"

    files.write_json(tmp_path / "r.json", results, {"gpu": {"name": "test"}})
    doc = json.loads((tmp_path / "r.json").read_text())  # strict JSON: NaN errors became strings
    assert doc["meta"]["gpu"]["name"] == "test"
    first = doc["results"][0]
    assert first["flops"] == 4 * 16 * 1024 * 1024 * 16 * 128
    assert first["times_ms"] == [1.0, 1.0, 1.0]
    assert first["tflops"] == pytest.approx(first["flops"] / 1e-3 / 1e12)
    assert doc["results"][2]["max_err"] == "nan"
    assert doc["results"][3]["status"] == "n/a" and doc["results"][3]["note"] == "No kernel"
    for row, rec in zip(rows, doc["results"]):  # one record builder: the same fields, times aside
        assert list(row) == [k for k in rec if k != "times_ms"]
        assert row["status"] == rec["status"] and row["impl"] == rec["impl"]


def test_output_names():
    import datetime

    stem = files.output_stem(Path("out"), datetime.datetime(2026, 1, 2, 3, 4, 5))
    assert stem == Path("out/bench-20260102-030405")


def test_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the bench extra) is not installed")
    results = [_result(1024, 1.0, 2.0), _result(2048, 4.0, None, passed=False)]
    assert files.write_plot(tmp_path / "r.png", results, ["flashcute", "sdpa-flash"], "title")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_plot_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert not files.write_plot(tmp_path / "r.png", [_result(1024, 1.0, 2.0)], ["flashcute"], "title")
    assert not (tmp_path / "r.png").exists()


# ------------------------------------------------------------------------------------- no GPU here


def _fake_extension(monkeypatch, count: int, status: str) -> None:
    monkeypatch.setattr(flashcute._C, "cuda_device_count", lambda: count)
    monkeypatch.setattr(flashcute._C, "cuda_status", lambda: status)


def test_main_without_gpu_fails_clearly(monkeypatch, capsys, tmp_path):
    _fake_extension(monkeypatch, 0, "cudaGetDeviceCount: no CUDA-capable device is detected")
    rc = cli.main(["--quick", "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1
    assert (
        "flashcute.bench: no CUDA GPU found (cudaGetDeviceCount: no CUDA-capable device is detected): "
        "this benchmark needs an sm80+ NVIDIA GPU"
    ) in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_main_without_torch_or_cupy(monkeypatch, capsys):
    _fake_extension(monkeypatch, 1, "ok")
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "neither torch nor CuPy" in err and "torch is not installed" in err and "cupy is not installed" in err


def _fake_torch(available: bool, major: int = 9, minor: int = 0) -> types.SimpleNamespace:
    props = types.SimpleNamespace(
        name="Old GPU", major=major, minor=minor, multi_processor_count=80, L2_cache_size=6 << 20, total_memory=1 << 34
    )
    cuda = types.SimpleNamespace(
        is_available=lambda: available, current_device=lambda: 0, get_device_properties=lambda i: props
    )
    return types.SimpleNamespace(__version__="2.11.0+cpu", cuda=cuda)


def test_main_when_torch_sees_no_gpu(monkeypatch, capsys):
    _fake_extension(monkeypatch, 1, "ok")
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=False))
    assert cli.main(["--framework", "torch"]) == 1
    assert "no CUDA GPU found (torch 2.11.0+cpu sees no CUDA device)" in capsys.readouterr().err


def test_main_refuses_a_gpu_older_than_sm80(monkeypatch, capsys):
    _fake_extension(monkeypatch, 1, "ok")
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(available=True, major=7, minor=5))
    assert cli.main(["--framework", "torch"]) == 1
    assert "no CUDA GPU found (Old GPU is sm_75): this benchmark needs an sm80+ NVIDIA GPU" in capsys.readouterr().err


def test_main_reports_impossible_gqa_before_looking_for_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(flashcute._C, "cuda_device_count", _raise(AssertionError("must not be asked")))
    assert cli.main(["--headdims", "96", "--nheads-k", "4"]) == 2
    assert "not a multiple of --nheads-k 4" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ decode


def test_decode_mode_parses_and_needs_torch_with_a_gpu(monkeypatch, capsys, tmp_path):
    from flashcute.bench import decode

    a = decode.build_parser().parse_args(["--batches", "1,64", "--heads", "32:8", "--eager", "--page", "256"])
    assert a.batches == [1, 64] and a.heads == [(32, 8)] and a.modes == ["eager"] and a.page == 256
    assert decode.build_parser().parse_args([]).modes == ["graph"]  # CUDA-graph replays by default
    a = decode.build_parser().parse_args(["--modes", "graph,eager", "--paths", "auto,sm80"])
    assert a.modes == ["graph", "eager"] and a.paths == ["auto", "sm80"]
    assert decode.subject_names(a.paths) == ["fc", "fc-paged", "fc@sm80", "fc-paged@sm80", "sdpa-flash", "sdpa-cudnn"]
    a = decode.build_parser().parse_args(["--paths", "auto,sm80", "--splits", "8,32"])
    assert a.splits == [8, 32] and decode.build_parser().parse_args([]).splits == []
    assert decode.subject_names(a.paths, a.splits) == ["fc", "fc-paged", "fc@sm80", "fc-paged@sm80", "fc/s8", "fc/s32",
                                                       "fc@sm80/s8", "fc@sm80/s32", "sdpa-flash", "sdpa-cudnn"]
    a = decode.build_parser().parse_args(["--append"])
    assert a.append and not decode.build_parser().parse_args([]).append
    assert decode.subject_names(a.paths, [], a.append) == ["fc", "fc-paged", "fc+append", "fc-paged+append",
                                                          "sdpa-flash", "sdpa-cudnn"]
    parser = decode.build_parser()
    assert decode.parse_timing(parser, parser.parse_args([])) == Timing(STANDARD, 5, 20)
    turns = parser.parse_args(["--timing", "turns", "--rounds", "4", "--iters", "8"])
    assert decode.parse_timing(parser, turns) == Timing(TURNS, 5, 8, 4)
    monkeypatch.setitem(sys.modules, "torch", None)
    assert cli.main(["decode", "--out-dir", str(tmp_path)]) == 1
    assert "needs torch with a CUDA device" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_decode_flushes_to_a_clean_l2(monkeypatch):
    """The decode bench's flush leaves clean lines in L2 (a write, then a read of another buffer):
    after a write alone each timed call also wrote back the flush's lines. The forward bench keeps
    the write alone, as triton's do_bench has it."""
    from flashcute.bench import decode

    asked = []

    class FakeLib:
        def device_info(self) -> DeviceInfo:
            return DeviceInfo("Fake GPU", "9.0", 132, 50 << 20, 80 << 30)

        def l2_flusher(self, nbytes: int, clean: bool = False) -> Any:
            asked.append((nbytes, clean))
            return lambda: None

    monkeypatch.setattr(decode.TorchLib, "load", classmethod(lambda cls: FakeLib()))
    monkeypatch.setattr(flashcute, "is_available", lambda: True)
    how = Timing(STANDARD, 5, 20)
    assert decode.open_torch("p", how, clean_l2=True)[1] == 256 << 20
    assert decode.open_torch("p", how)[1] == 256 << 20
    assert asked == [(256 << 20, True), (256 << 20, False)]
    assert decode.open_torch("p", Timing(TURNS, 5, 8, 4), clean_l2=True)[1:] == (None, None)  # turns: no flush
    assert "(a 256 MiB buffer written, then another read outside the events)" in how.method(256 << 20, clean=True)
    assert "(a 256 MiB buffer written outside the events)" in how.method(256 << 20)
    opened = []
    monkeypatch.setattr(decode, "open_torch", lambda prog, how, clean_l2=False: opened.append(clean_l2))
    assert decode.main([]) == 1 and opened == [True]  # what main asks for


def test_decode_rows_and_summary_per_mode():
    from flashcute.bench import decode

    names = decode.subject_names(["sm80"])
    rows = [{"mode": m, "batch": 1, "seqlen_k": 4096, "nheads": 32, "nheads_k": 8, "kv_bytes": 300e6, "num_splits": 4,
             "tbps": {"fc@sm80": f, "fc-paged@sm80": f * 0.9, "sdpa-flash": 1.0, "sdpa-cudnn": 2.0}}
            for m, f in (("graph", 2.4), ("eager", 1.0))]
    assert "graph" in decode.line(rows[0], 3.0, names) and "   0.80    1.20     0.90" in decode.line(rows[0], 3.0, names)
    out = decode.summary(rows, "eager", names, 3.0, "GPU", Timing(STANDARD, 5, 20))
    assert "eager" in out and "fc@sm80/copy min 0.33" in out and "min 0.50" in out and "paged/contiguous min 0.90" in out


@pytest.mark.parametrize("argv", [["--rounds", "2"], ["--timing", "turns", "--rounds", "0"], ["--iters", "0"],
                                  ["--modes", "replay"], ["--paths", "sm70"], ["--graph", "--modes", "eager"],
                                  ["--splits", "0"], ["--splits", "8,129"]])
def test_decode_timing_usage_errors(argv, capsys):
    # decode's --rounds once meant "best of this many medians"; it now means what the forward's does.
    with pytest.raises(SystemExit) as exc:
        cli.main(["decode", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: --" in err or "error: argument --" in err


def test_python_dash_m_decode_help():
    proc = subprocess.run([sys.executable, "-m", "flashcute.bench", "decode", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--page" in proc.stdout and "--graph" in proc.stdout and "--timing" in proc.stdout


# ----------------------------------------------------------------------------------------- prefill


def test_prefill_mode_parses_and_needs_torch_with_a_gpu(monkeypatch, capsys, tmp_path):
    from flashcute.bench import prefill

    a = prefill.build_parser().parse_args([])
    assert (a.news, a.caches, a.batch, a.heads, a.headdim) == ([512, 1024, 2048, 4096], [4096, 16384, 65536], 1,
                                                               [(32, 8)], 128)
    assert a.causal and a.graph and a.pages == [16, 64] and a.paths == ["auto"]  # CUDA-graph replays by default
    argv = "--news 256 --caches 0,8192 --heads 16:16 --no-causal --eager --pages 128 --paths sm90,sm80,sm90"
    a = prefill.build_parser().parse_args(argv.split())
    assert (a.news, a.caches, a.heads, a.causal, a.graph) == ([256], [0, 8192], [(16, 16)], False, False)
    assert a.pages == [128] and a.paths == ["sm90", "sm80"]
    parser = prefill.build_parser()
    turns = parser.parse_args(["--timing", "turns", "--rounds", "4", "--iters", "8"])
    assert prefill.parse_timing(parser, turns) == Timing(TURNS, 5, 8, 4)
    assert prefill.subject_names([16, 64], ["auto"]) == ["fc", "fc-paged16", "fc-paged64", "fc-fixed", "sdpa-flash",
                                                         "sdpa-cudnn"]
    assert prefill.subject_names([64], ["auto", "sm80"])[:4] == ["fc", "fc-paged64", "fc@sm80", "fc-paged64@sm80"]
    monkeypatch.setitem(sys.modules, "torch", None)
    assert cli.main(["prefill", "--out-dir", str(tmp_path)]) == 1
    assert "flashcute.bench prefill: needs torch with a CUDA device" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("new,cached", [(1, 0), (5, 0), (3, 7), (8, 2)])
def test_prefill_flops_count_the_visible_pairs(new, cached):
    from flashcute.bench import prefill

    seqlen_k = cached + new  # bottom-right aligned: query i sees keys j <= i + seqlen_k - new
    visible = sum(j <= i + seqlen_k - new for i in range(new) for j in range(seqlen_k))
    assert prefill.prefill_flops(2, 3, 8, new, cached, causal=True) == 4 * 2 * 3 * 8 * visible
    assert prefill.prefill_flops(2, 3, 8, new, cached, causal=False) == 4 * 2 * 3 * 8 * new * seqlen_k
    if cached == 0:  # no cache: the fixed-length causal count, s * (s + 1) / 2 pairs
        assert visible == new * (new + 1) // 2


@pytest.mark.parametrize(
    "argv",
    [["--rounds", "2"], ["--iters", "0"], ["--pages", "24"], ["--pages", "8"], ["--paths", "sm70"],
     ["--paths", ","], ["--heads", "32:5"], ["--news", "0"], ["--caches", "-1"], ["--headdim", "100"],
     ["--batch", "0"], ["--news", "1k"]],
)
def test_prefill_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["prefill", *argv])
    assert exc.value.code == 2
    assert "python -m flashcute.bench prefill: error: " in capsys.readouterr().err  # prefill's parser, not the forward's


def _prefill_row(prefill: Any, new: int, cached: int, ms: dict[str, float]) -> dict[str, Any]:
    flops = prefill.prefill_flops(1, 32, 128, new, cached, True)
    return {"batch": 1, "new": new, "cached": cached, "nheads": 32, "nheads_k": 8, "headdim": 128, "causal": True,
            "flops": flops, "ms": ms, "tflops": {n: flops / (t * 1e-3) / 1e12 for n, t in ms.items()},
            "path": {n: "sm90" for n in ms if n.startswith("fc")}, "max_abs_diff_vs_fixed": {"fc": 1e-3},
            "unavailable": {"sdpa-cudnn": "RuntimeError: No available kernel"}}


def test_prefill_main_reports_and_writes_the_points(monkeypatch, capsys, tmp_path):
    """main on fake points (no GPU here): the per-point line with the ratios, the CSV, the JSON, the summary."""
    from flashcute.bench import prefill

    class FakeLib:
        m = types.SimpleNamespace(__version__="2.11.0", cuda=types.SimpleNamespace(
            get_device_name=lambda: "Fake GPU", empty_cache=lambda: None))

        def device_info(self) -> DeviceInfo:
            return DeviceInfo("Fake GPU", "9.0", 132, 50 << 20, 80 << 30)

        def l2_flusher(self, nbytes: int, clean: bool = False) -> Any:
            return lambda: None

    seen = []

    def fake_point(lib, how, graph, flush, b, new, cached, h, hk, d, causal, pages, paths):
        seen.append((new, cached, pages, paths, graph))
        return _prefill_row(prefill, new, cached, {"fc": 1.0, "fc-paged16": 1.25, "fc-fixed": 0.8, "sdpa-flash": 2.0})

    monkeypatch.setattr(prefill.TorchLib, "load", classmethod(lambda cls: FakeLib()))
    monkeypatch.setattr(flashcute, "is_available", lambda: True)
    monkeypatch.setattr(prefill, "run_point", fake_point)
    argv = ["--news", "512,1024", "--caches", "4096", "--pages", "16", "--no-plot", "--out-dir", str(tmp_path)]
    assert prefill.main(argv) == 0
    assert seen == [(512, 4096, [16], ["auto"], True), (1024, 4096, [16], ["auto"], True)]
    out = capsys.readouterr().out.splitlines()
    point = next(x for x in out if x.startswith(" 32:8    512"))
    assert "0.80/2.00 sm90" in point and "0.64/1.60 sm90" in point and point.endswith("| 1.0e-03")
    assert sum("sdpa-cudnn n/a: RuntimeError: No available kernel" in x for x in out) == 1  # said once
    assert out[-1] == ("flashcute.bench prefill summary [Fake GPU, standard timing]: fc/fc-fixed min 0.80 geomean "
                       "0.80; fc/best-sdpa min 2.00 geomean 2.00; fc-paged16/fc-fixed min 0.64 geomean 0.64; "
                       "fc-paged16/best-sdpa min 1.60 geomean 1.60")
    (csv_path,) = tmp_path.glob("prefill-*.csv")
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 2 * 4 and rows[0]["impl"] == "fc" and rows[0]["path"] == "sm90"
    assert (rows[0]["causal"], rows[0]["vs_fixed"], rows[0]["vs_best_sdpa"]) == ("1", "0.8000", "2.0000")
    assert int(rows[0]["flops"]) == 4 * 32 * 128 * (512 * 4096 + 512 * 513 // 2)
    (json_path,) = tmp_path.glob("prefill-*.json")
    doc = json.loads(json_path.read_text())
    assert doc["meta"]["paths"] == ["auto"] and doc["meta"]["timing_kind"] == "standard"
    assert [p["new"] for p in doc["points"]] == [512, 1024]


def test_python_dash_m_prefill_help():
    proc = subprocess.run([sys.executable, "-m", "flashcute.bench", "prefill", "--help"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    for option in ("--news", "--caches", "--pages", "--paths", "--graph", "--no-causal", "--timing"):
        assert option in proc.stdout


# ------------------------------------------------------------------------------ benchmarks/bwd_speed


def test_bwd_speed_is_the_bench_backward_pass_on_its_grid():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bwd_speed.py"
    spec = importlib.util.spec_from_file_location("bwd_speed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = cli.parse_args(mod.bench_argv([]))
    assert cfg.grid.pass_ == "bwd" and cfg.grid.dtypes == ("bf16",)
    assert cfg.grid.headdims == (64, 128, 256) and cfg.grid.seqlens == (1024, 4096, 16384)
    assert cfg.impls == ("flashcute", "sdpa-flash", "sdpa-cudnn", "fa4")
    assert cfg.timing == Timing(STANDARD, warmup=5, iters=20)
    cfg = cli.parse_args(mod.bench_argv(["--pass", "fwd+bwd", "--dims", "128", "--timing", "turns", "--iters", "9"]))
    assert cfg.grid.pass_ == "fwd+bwd" and cfg.grid.headdims == (128,)
    assert cfg.timing == Timing(TURNS, warmup=5, iters=9, rounds=30)  # options after the grid's are passed on


def test_ring_bench_needs_gpus_and_whole_chunks(capsys):
    """bench ring: --world beyond the visible GPUs, or a seqlen that the zigzag chunks do not
    divide, exit 2 with the reason, before any process starts."""
    pytest.importorskip("torch")
    import torch

    import flashcute.bench.ring as ring

    assert ring.main(["--world", str(torch.cuda.device_count() + 1)]) == 2
    assert "--world: expected" in capsys.readouterr().err
    if torch.cuda.device_count():
        assert ring.main(["--world", "1", "--seqlens", "1001"]) == 2
        assert "not a multiple of 2" in capsys.readouterr().err


def test_ring_bench_capacity_is_a_line_through_the_longest_points():
    import flashcute.bench.ring as ring

    rows = [{"seqlen": s, "causal": True, "1gpu_peak_gb": 1.0 + s / 1000, "1gpu_ms": 1.0, "ring_peak_gb": None,
             "ring_ms": 1.0} for s in (1000, 2000, 4000)]
    cap = ring._capacity(rows, {"gpu_memory_gb": 81.0})
    assert cap == {"1gpu_causal": {"gb_per_1k_tokens": pytest.approx(1.024), "tokens": 80000}}
    assert ring._flops(1024, 2, 64, True) == 3.5 * 4 * 2 * 1024 * 1024 * 64 / 2


def test_varlen_mode_takes_out_dir_and_writes_a_csv(monkeypatch, capsys, tmp_path):
    # scripts/device_run.sh's bench stage adds --out-dir to every mode: varlen must take it.
    from flashcute.bench import varlen

    with pytest.raises(SystemExit) as exc:
        cli.main(["varlen", "--out-dir", str(tmp_path), "--paths", "sm70"])
    assert exc.value.code == 2
    assert "--paths: expected sm90, sm80, comma-separated, got 'sm70'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "torch", None)
    assert cli.main(["varlen", "--out-dir", str(tmp_path)]) == 1
    assert "flashcute.bench varlen: needs torch with a CUDA device" in capsys.readouterr().err
    path = tmp_path / "v.csv"
    rows = [{"mode": "graph", "headdim": 64, "subject": "varlen sm90", "ms": 0.5, "tflops": 612.345},
            {"mode": "graph", "headdim": 64, "subject": "fixed", "ms": 0.25, "tflops": 700.0}]
    varlen.write_csv(path, rows, pass_="fwd", causal=True, heads=(32, 8), lens=[1024, 1024, 512], timing_kind="standard")
    got = list(csv.DictReader(open(path)))
    assert [r["subject"] for r in got] == ["varlen sm90", "fixed"]
    assert got[0] == {"mode": "graph", "pass": "fwd", "causal": "1", "nheads": "32", "nheads_k": "8", "sequences": "3", "tokens": "2560",
                      "longest": "1024", "headdim": "64", "subject": "varlen sm90", "timing": "standard",
                      "ms": "0.50000", "tflops": "612.35"}


@pytest.mark.parametrize("argv,message", [
    (["--modes", "replay"], "--modes: expected eager, graph, comma-separated, got 'replay'"),
    (["--modes", ","], "--modes: expected eager, graph, comma-separated, got ''"),
    (["--modes", "eager,graph", "--pass", "bwd"], "--modes graph times the forward only"),
])
def test_varlen_modes_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["varlen", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
