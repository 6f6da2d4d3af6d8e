"""CPU tests of the benchmark CLI (python -m flashcute.bench): arguments, grid, FLOP counting,
reports, and the clear failure on a machine without a GPU. No GPU, torch or CuPy needed.

bench.py is loaded from the source tree by path, so these tests run whether or not flashcute's
extension is built; the extension itself is replaced by a fake module where a test needs one.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

BENCH_PY = Path(__file__).resolve().parents[2] / "python" / "flashcute" / "bench.py"


@pytest.fixture(scope="module")
def bench() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("flashcute_bench_under_test", BENCH_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def fake_extension(count: int, status: str) -> types.ModuleType:
    ext = types.ModuleType("flashcute._C")
    ext.cuda_device_count = lambda: count
    ext.cuda_status = lambda: status
    return ext


# ------------------------------------------------------------------------------------ arguments


def test_import_needs_only_the_standard_library():
    # Block the optional packages (an import of a None entry raises ImportError), then load bench.py.
    code = (
        "import importlib.util, sys\n"
        "for m in ('torch', 'cupy', 'numpy', 'matplotlib', 'rich', 'tqdm', 'flashcute', 'flashcute._C'):\n"
        "    sys.modules[m] = None\n"
        f"spec = importlib.util.spec_from_file_location('b', {str(BENCH_PY)!r})\n"
        "mod = importlib.util.module_from_spec(spec); sys.modules['b'] = mod; spec.loader.exec_module(mod)\n"
        "mod.build_grid(mod.parse_args(['--quick']))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_defaults_are_the_fa_grid(bench):
    cfg = bench.parse_args([])
    assert cfg.headdims == (64, 128, 256)
    assert cfg.seqlens == (512, 1024, 2048, 4096, 8192, 16384)
    assert cfg.causals == (False, True)
    assert cfg.dtypes == ("bf16",)
    assert (cfg.batch, cfg.nheads, cfg.nheads_k) == (None, None, None)
    assert cfg.impls == ("flashcute", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
    assert (cfg.warmup, cfg.iters) == (10, 30)
    assert cfg.out_dir == Path("bench-results") and cfg.plot


def test_quick_grid_and_explicit_flags_win(bench):
    quick = bench.parse_args(["--quick"])
    assert quick.headdims == (64, 128) and quick.seqlens == (1024, 4096)
    assert quick.causals == (False, True) and quick.dtypes == ("bf16",)
    assert len(bench.build_grid(quick)) == 8
    cfg = bench.parse_args(["--quick", "--headdims", "256", "--causal", "yes", "--dtype", "both"])
    assert cfg.headdims == (256,) and cfg.seqlens == (1024, 4096)
    assert cfg.causals == (True,) and cfg.dtypes == ("bf16", "fp16")


def test_flags_parse(bench, tmp_path):
    cfg = bench.parse_args(
        [
            "--headdims",
            "64,72",
            "--seqlens",
            "128,4096",
            "--causal",
            "no",
            "--dtype",
            "fp16",
            "--batch",
            "3",
            "--nheads",
            "8",
            "--nheads-k",
            "2",
            "--warmup",
            "2",
            "--iters",
            "7",
            "--impls",
            "flashcute,sdpa-cudnn",
            "--out-dir",
            str(tmp_path),
            "--no-plot",
            "--framework",
            "cupy",
        ]
    )
    assert cfg.headdims == (64, 72) and cfg.seqlens == (128, 4096)
    assert cfg.causals == (False,) and cfg.dtypes == ("fp16",)
    assert (cfg.batch, cfg.nheads, cfg.nheads_k) == (3, 8, 2)
    assert (cfg.warmup, cfg.iters) == (2, 7)
    assert cfg.impls == ("flashcute", "sdpa-cudnn")
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
        ["--fa-grid", "--batch", "2"],  # contradictory
        ["--nheads", "0"],
        ["--iters", "0"],
    ],
)
def test_bad_arguments_are_usage_errors(bench, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ grid


def test_fa_grid_sizes(bench):
    points = bench.build_grid(bench.parse_args(["--fa-grid", "--causal", "no"]))
    assert len(points) == 3 * 6
    for p in points:
        assert p.batch * p.seqlen == 16384 and p.nheads * p.headdim == 2048
        assert p.nheads_k == p.nheads
    by_key = {(p.headdim, p.seqlen): p for p in points}
    assert (by_key[64, 512].batch, by_key[64, 512].nheads) == (32, 32)
    assert (by_key[128, 4096].batch, by_key[128, 4096].nheads) == (4, 16)
    assert (by_key[256, 16384].batch, by_key[256, 16384].nheads) == (1, 8)


def test_grid_order_and_explicit_sizes(bench):
    cfg = bench.parse_args(
        [
            "--dtype",
            "both",
            "--headdims",
            "64,128",
            "--seqlens",
            "256,32768",
            "--batch",
            "2",
            "--nheads",
            "16",
            "--nheads-k",
            "4",
        ]
    )
    points = bench.build_grid(cfg)
    assert len(points) == 2 * 2 * 2 * 2
    assert [(p.dtype, p.headdim, p.causal, p.seqlen) for p in points[:4]] == [
        ("bf16", 64, False, 256),
        ("bf16", 64, False, 32768),
        ("bf16", 64, True, 256),
        ("bf16", 64, True, 32768),
    ]
    assert all((p.batch, p.nheads, p.nheads_k) == (2, 16, 4) for p in points)
    # Beyond 16k tokens the FA grid keeps one sequence per batch.
    long = bench.build_grid(bench.parse_args(["--seqlens", "32768", "--headdims", "128"]))
    assert {p.batch for p in long} == {1}


def test_gqa_must_divide(bench):
    with pytest.raises(ValueError, match="multiple"):
        bench.build_grid(bench.parse_args(["--headdims", "96", "--nheads-k", "4"]))  # 2048 // 96 = 21 heads


def test_flops_like_flashattention(bench):
    assert bench.attention_flops(1, 1, 128, 128, 64, causal=False) == 4 * 128 * 128 * 64
    assert bench.attention_flops(4, 16, 4096, 4096, 128, causal=True) == 4 * 4 * 16 * 4096 * 4096 * 128 // 2
    assert bench.attention_flops(2, 3, 100, 300, 32, causal=False) == 4 * 2 * 3 * 100 * 300 * 32
    p = bench.Point("bf16", 128, True, 4096, 4, 16, 16)
    assert p.flops == 2 * 4 * 16 * 4096 * 4096 * 128
    full = bench.Point("bf16", 128, False, 4096, 4, 16, 16)
    assert full.flops == 2 * p.flops
    # FA grid, d=128, non-causal: 4 * 16384 tokens * 4096 * 2048 hidden = 549.8 GFLOP at every seqlen 4k point
    assert full.flops == 4 * 16384 * 4096 * 2048
    assert bench.tflops(10**12, 1000.0) == pytest.approx(1.0)
    assert bench.tflops(full.flops, 1.5) == pytest.approx(full.flops / 1.5e-3 / 1e12)


def test_input_rotation_only_when_l2_resident(bench):
    mib = 1 << 20
    assert bench.input_sets_needed(256 * mib, 50 * mib) == 1  # the FA grid: 4 x 64 MiB
    assert bench.input_sets_needed(10 * mib, 50 * mib) == 15  # ceil(3 * 50 / 10)
    assert bench.input_sets_needed(1, 50 * mib) == bench.MAX_INPUT_SETS


def test_fa_tolerance(bench):
    assert bench.fa_tolerance(naive_err=0.01, rounding_slack=0.002) == pytest.approx(0.022)


# --------------------------------------------------------------------------------------- reports


def _result(bench, seqlen: int, fc_ms: float | None, flash_ms: float | None, passed: bool = True):
    point = bench.Point("bf16", 128, False, seqlen, 16384 // seqlen, 16, 16)
    check = bench.CheckResult(passed, 1e-3 if passed else float("nan"), 2e-2, 5e-3, passed, "b0 h[0, 15]")
    impls = {
        "flashcute": bench.ImplResult("ok" if passed else "fail", [fc_ms] * 3 if fc_ms else [], check=check),
        "sdpa-flash": bench.ImplResult("ok", [flash_ms] * 3, layout="view")
        if flash_ms
        else bench.ImplResult("n/a", note="No available kernel"),
    }
    return bench.PointResult(point, impls)


def test_summary_line(bench):
    results = [_result(bench, 512, 2.0, 1.0), _result(bench, 1024, 1.0, 1.0), _result(bench, 4096, 1.0, 2.0)]
    line = bench.summary_line(results, "NVIDIA H200")
    assert line.startswith("flashcute.bench summary [NVIDIA H200]: 3/3 points correct")
    assert "fc/flash seqlen>=1k: min 1.00x geomean 1.41x (2 pts)" in line
    assert "fc/flash seqlen<1k: min 0.50x geomean 0.50x (1 pts)" in line
    with_failure = results + [_result(bench, 2048, 0.01, 1.0, passed=False)]  # a wrong result's speed is ignored
    line = bench.summary_line(with_failure, "NVIDIA H200")
    assert "3/4 points correct" in line and "fc/flash seqlen>=1k: min 1.00x geomean 1.41x (2 pts)" in line
    failing = [_result(bench, 1024, 1.0, None, passed=False)]
    line = bench.summary_line(failing, "gpu")
    assert "0/1 points correct" in line and "no SDPA comparison" in line
    assert failing[0].flashcute_failed


def test_table_csv_json(bench, tmp_path):
    results = [_result(bench, 1024, 1.0, 2.0), _result(bench, 2048, 4.0, None, passed=False)]
    header, rows = bench.table_rows(results, ["flashcute", "sdpa-flash"])
    assert header[:6] == ["dtype", "d", "causal", "seqlen", "batch", "heads"]
    assert "fc/flash" in header and header[-1] == "check"
    assert rows[0][header.index("fc/flash")] == "2.00"
    assert rows[1][header.index("sdpa-flash TF/s")] == "n/a"
    assert rows[1][-1].startswith("FAIL")

    bench.write_csv(tmp_path / "r.csv", results)
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert len(lines) == 1 + 4 and lines[0].startswith("dtype,headdim,causal,seqlen")

    bench.write_json(tmp_path / "r.json", results, {"gpu": {"name": "test"}})
    doc = json.loads((tmp_path / "r.json").read_text())  # strict JSON: NaN errors became strings
    assert doc["meta"]["gpu"]["name"] == "test"
    first = doc["points"][0]
    assert first["flops"] == 4 * 16 * 1024 * 1024 * 16 * 128
    assert first["impls"]["flashcute"]["times_ms"] == [1.0, 1.0, 1.0]
    assert first["impls"]["flashcute"]["tflops"] == pytest.approx(first["flops"] / 1e-3 / 1e12)
    assert doc["points"][1]["impls"]["flashcute"]["check"]["max_err"] == "nan"
    assert doc["points"][1]["impls"]["sdpa-flash"]["status"] == "n/a"


# ------------------------------------------------------------------------------------------ main


def test_main_without_gpu_fails_clearly(bench, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(
        sys.modules, "flashcute._C", fake_extension(0, "cudaGetDeviceCount: no CUDA-capable device is detected")
    )
    rc = bench.main(["--quick", "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1
    assert (
        "flashcute.bench: no CUDA GPU found (cudaGetDeviceCount: no CUDA-capable device is detected): "
        "this benchmark needs an sm80+ NVIDIA GPU"
    ) in err
    assert not any(tmp_path.iterdir())  # nothing written, nothing faked


def test_main_without_extension_fails_clearly(bench, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flashcute._C", None)  # import raises ImportError
    assert bench.main([]) == 1
    assert "flashcute._C cannot be imported" in capsys.readouterr().err


def test_main_without_torch_or_cupy(bench, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flashcute._C", fake_extension(1, "ok"))
    monkeypatch.setattr(bench, "_import_optional", lambda name: None)
    assert bench.main([]) == 2
    err = capsys.readouterr().err
    assert "neither torch nor CuPy" in err and "torch is not installed" in err and "cupy is not installed" in err


def test_main_when_torch_sees_no_gpu(bench, monkeypatch, capsys):
    fake_torch = types.SimpleNamespace(__version__="2.11.0+cpu", cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "flashcute._C", fake_extension(1, "ok"))
    monkeypatch.setattr(bench, "_import_optional", lambda name: fake_torch if name == "torch" else None)
    assert bench.main(["--framework", "torch"]) == 1
    assert "no CUDA GPU found (torch 2.11.0+cpu sees no CUDA device)" in capsys.readouterr().err


def test_main_reports_impossible_gqa_before_looking_for_a_gpu(bench, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flashcute._C", None)
    assert bench.main(["--headdims", "96", "--nheads-k", "4"]) == 2
    assert "not a multiple of --nheads-k 4" in capsys.readouterr().err


def test_check_slice(bench):
    small = bench.Point("bf16", 64, False, 256, 2, 4, 4)
    assert bench.check_slice(small) == ("full", slice(0, 2), [0, 1, 2, 3])
    fa_point = bench.Point("bf16", 128, True, 4096, 4, 16, 4)
    assert bench.check_slice(fa_point) == ("b0 h[0, 15]", slice(0, 1), [0, 15])
    many_heads = bench.Point("bf16", 64, False, 128, 64, 64, 64)  # few scores, but 4096 (b, h) pairs
    assert bench.check_slice(many_heads)[0] == "b0 h[0, 63]"
