"""``python -m flashcute.bench prefill``: KV-cache attention of many new tokens (chunked prefill,
prefix caching) against the fixed-length call and SDPA, in TFLOP/s.

At every point (new x cached tokens; ``--batch`` sequences, bf16, one head dim) each sequence's
``new`` queries attend to its ``cached`` keys and the new ones, causal (unless ``--no-causal``)
bottom-right aligned as in FlashAttention-2: query i sees keys j <= i + seqlen_k - seqlen_q. Timed
in one process on the same keys:

- ``fc``: :func:`flashcute.flash_attn_with_kvcache` on a contiguous cache of cached + new keys,
  cache_seqlens = cached + new (nothing appended: the call is the attention alone); ``fc-paged16``,
  ``fc-paged64`` (``--pages``): the same keys in shuffled pages. Each runs on every path of
  ``--paths`` (``FLASHCUTE_FORWARD_PATH``, set before its calls and its graph capture): ``auto``
  gives ``fc``, ``sm80`` ``fc@sm80``...; its ``path`` is :func:`flashcute.last_forward_path`;
- ``fc-fixed``: :func:`flashcute.flash_attn_func` on the same q and keys (path auto): the same work
  through the fixed-length call, the reference the targets are stated against;
- ``sdpa-flash``, ``sdpa-cudnn``: ``torch.nn.functional.scaled_dot_product_attention`` with that
  backend on (batch, heads, seq, dim) views, ``enable_gqa``, mask
  ``torch.nn.attention.bias.causal_lower_right`` (flash runs its own causal kernel; other backends
  get the mask materialised in the call); a backend that refuses a point is reported n/a.

FLOPs: FlashAttention's 4 * batch * nheads * headdim a visible (query, key) pair, the causal mask's
hidden pairs taken out exactly: new * (cached + new) pairs without a mask, causal the sum over
i < new of (cached + i + 1) = new * cached + new * (new + 1) / 2. Timed as ``decode`` is
(:mod:`flashcute.bench.timing`, ``--timing``; CUDA-graph replays unless ``--eager``), after a check
of every output against fc-fixed's (max |diff| printed). Ratios: fc subjects over fc-fixed and over
the faster SDPA backend. Writes ``prefill-<date>.csv``/``.json`` and a plot to ``--out-dir``. torch only.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import flashcute

from . import timing
from .arrays import TorchLib, versions
from .decode import (PATH_VAR, PATHS, SDPA, _heads, _ints, _list, _tag, check_choices, graph_replay, open_torch,
                     parse_timing, plot_panels)
from .impls import env_var
from .timing import Subject, Timing, time_subjects

PROG = "flashcute.bench prefill"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    p.add_argument("--news", type=_ints, default=[512, 1024, 2048, 4096],
                   help="new (query) tokens a sequence (default 512,1024,2048,4096)")
    p.add_argument("--caches", type=_ints, default=[4096, 16384, 65536],
                   help="cached tokens before them (default 4096,16384,65536)")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--heads", type=_heads, default=[(32, 8)], help="nheads:nheads_k pairs (default 32:8)")
    p.add_argument("--headdim", type=int, default=128, help="head dim (default 128)")
    p.add_argument("--no-causal", dest="causal", action="store_false",
                   help="no mask (default: causal, aligned to the bottom right)")
    p.add_argument("--pages", type=_ints, default=[16, 64], help="page sizes of the paged caches (default 16,64)")
    p.add_argument("--paths", type=_list, default=["auto"],
                   help="FLASHCUTE_FORWARD_PATH values to run the fc subjects on (default auto; e.g. sm90,sm80)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--graph", action="store_true", default=True, help="time CUDA-graph replays (default)")
    mode.add_argument("--eager", dest="graph", action="store_false", help="time eager calls (host time included)")
    p.add_argument("--timing", choices=timing.TIMINGS, default=timing.STANDARD,
                   help="standard (default): each subject after a warm-up, every timed call after an L2 flush, in "
                        "order then in reverse; turns: in turns (--rounds), no flush (flashcute.bench --help)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before each subject's timed ones (default 5)")
    p.add_argument("--iters", type=int, default=20, help="timed calls of each subject; their median (default 20)")
    p.add_argument("--rounds", type=int, help=f"--timing turns only: rounds of iters/rounds timed calls of each "
                                              f"subject (default {timing.DEFAULT_TURN_ROUNDS}, at most iters)")
    p.add_argument("--out-dir", type=Path, default=Path("bench-results"))
    p.add_argument("--no-plot", action="store_true")
    return p


def prefill_flops(b: int, h: int, d: int, new: int, cached: int, causal: bool) -> int:
    """4 * b * h * d times the visible (query, key) pairs; causal: bottom-right aligned, exact."""
    return 4 * b * h * d * (new * cached + new * (new + 1) // 2 if causal else new * (cached + new))


def subject_names(pages: Sequence[int], paths: Sequence[str]) -> list[str]:
    """The timed subjects in order: the fc ones on each path, then fc-fixed and SDPA's."""
    return [base + _tag(path) for path in paths for base in ("fc", *(f"fc-paged{x}" for x in pages))] + \
        ["fc-fixed", *SDPA]


def run_point(lib: TorchLib, how: Timing, graph: bool, flush: Callable[[], Any] | None, b: int, new: int,
              cached: int, h: int, hk: int, d: int, causal: bool, pages: Sequence[int],
              paths: Sequence[str]) -> dict[str, Any]:
    """Checks and times every subject at one point (one process, the same keys)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    torch = lib.m
    dt, n = torch.bfloat16, cached + new
    q = torch.randn(b, new, h, d, device="cuda", dtype=dt)
    k = torch.randn(b, n, hk, d, device="cuda", dtype=dt)  # (batch, cached + new, hk, d): new keys included
    v = torch.randn_like(k)
    seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    caches = {"fc": (k, v, None)}  # name: (k_cache, v_cache, block_table)
    for page in pages:
        per = -(-n // page)  # pages a sequence; the last one zero-padded
        perm = torch.randperm(b * per, device="cuda")
        kp, vp = (torch.empty(b * per, page, hk, d, device="cuda", dtype=dt) for _ in range(2))
        for src, dst in ((k, kp), (v, vp)):
            dst[perm] = F.pad(src, (0, 0, 0, 0, 0, per * page - n)).reshape(b * per, page, hk, d)
        caches[f"fc-paged{page}"] = (kp, vp, perm.view(b, per).to(torch.int32))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    mask = causal_lower_right(new, n) if causal else None

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=h != hk).transpose(1, 2)
        return run

    runs: dict[str, tuple[str | None, Callable[[], Any]]] = {}  # name: (FLASHCUTE_FORWARD_PATH, call)
    for path in paths:
        for base, (kc, vc, table) in caches.items():
            runs[base + _tag(path)] = (path, lambda kc=kc, vc=vc, table=table: flashcute.flash_attn_with_kvcache(
                q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=causal))
    runs["fc-fixed"] = ("auto", lambda: flashcute.flash_attn_func(q, k, v, causal=causal))
    runs.update({s: (None, sdpa(be)) for s, be in zip(SDPA, (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION))})
    outs, errors, kinds, calls = {}, {}, {}, {}
    for name, (path, run) in runs.items():
        try:  # the variable is read when a call is planned: a graph records the launch made at capture
            with env_var(PATH_VAR, path):
                outs[name] = run()
                if name.startswith("fc"):
                    kinds[name] = flashcute.last_forward_path()
                calls[name] = graph_replay(torch, run) if graph else run
        except Exception as exc:  # an SDPA backend that refuses this point, or a flashcute failure
            errors[name] = exc
    subjects = [Subject(name, [call], lambda path=runs[name][0]: env_var(PATH_VAR, path))
                for name, call in calls.items()]
    timed = time_subjects(lib, subjects, how, flush)
    notes = {name: f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"
             for name, exc in {**errors, **timed.errors}.items()}
    ms = {name: statistics.median(ts) for name, ts in timed.times_ms.items() if name not in timed.errors}
    ref = outs.get("fc-fixed")
    diffs = {name: (out.float() - ref.float()).abs().max().item() for name, out in outs.items()
             if name != "fc-fixed"} if ref is not None else {}
    flops = prefill_flops(b, h, d, new, cached, causal)
    return {"batch": b, "new": new, "cached": cached, "nheads": h, "nheads_k": hk, "headdim": d, "causal": causal,
            "flops": flops, "ms": ms, "tflops": {name: flops / (t * 1e-3) / 1e12 for name, t in ms.items()},
            "path": kinds, "max_abs_diff_vs_fixed": diffs, "unavailable": notes}


def ratios(r: dict[str, Any], name: str) -> tuple[float | None, float | None]:
    """name's speed over fc-fixed's and over the faster SDPA backend's (None: one of them missing)."""
    t = r["tflops"]
    fixed, best = t.get("fc-fixed"), max((t[s] for s in SDPA if s in t), default=None)
    return (t[name] / fixed if name in t and fixed else None), (t[name] / best if name in t and best else None)


def line(r: dict[str, Any], names: Sequence[str], fc: Sequence[str]) -> str:
    t = r["tflops"]
    cells = " ".join(f"{t[n]:{max(8, len(n))}.1f}" if n in t else f"{'-':>{max(8, len(n))}}" for n in names)
    rs = []
    for n in fc:
        fx, sd = ratios(r, n)
        rs.append(f"{'-' if fx is None else f'{fx:.2f}'}/{'-' if sd is None else f'{sd:.2f}'} "
                  f"{r['path'].get(n, '-')}".rjust(max(14, len(n))))
    diff = max((r["max_abs_diff_vs_fixed"][n] for n in fc if n in r["max_abs_diff_vs_fixed"]), default=None)
    return (f"{r['nheads']:3d}:{r['nheads_k']:<2d} {r['new']:5d} {r['cached']:7d} | {cells} | {' '.join(rs)} | "
            + ("-" if diff is None else f"{diff:.1e}"))


def write_plot(path: Path, rows: Sequence[dict[str, Any]], names: Sequence[str], title: str) -> bool:
    return plot_panels(path, rows, lambda r: (r["nheads"], r["nheads_k"], r["cached"]),
                       lambda k: f"cached {k[2]}, heads {k[0]}:{k[1]}", "new", "tflops", names, title,
                       "new tokens", "TFLOP/s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    how = parse_timing(parser, a)
    if a.batch < 1 or not a.news or not a.caches or min(a.news) < 1 or min(a.caches) < 0:
        parser.error("--batch and --news must be positive, --caches >= 0")
    if a.headdim % 8 or not 8 <= a.headdim <= 256 or any(hk < 1 or h % hk for h, hk in a.heads):
        parser.error("--headdim must be a multiple of 8 in [8, 256], --heads' nheads a multiple of nheads_k")
    if not a.pages or any(x < 16 or x & (x - 1) for x in a.pages):
        parser.error(f"--pages: the paged kernels take powers of two >= 16, got {a.pages}")
    check_choices(parser, "--paths", a.paths, PATHS)
    opened = open_torch(PROG, how)
    if opened is None:
        return 1
    lib, flush_nbytes, flush = opened
    torch = lib.m
    gpu = torch.cuda.get_device_name()
    names = subject_names(a.pages, a.paths)
    fc = [n for n in names if n.startswith("fc") and n != "fc-fixed"]
    mode, method = "CUDA-graph replays" if a.graph else "eager calls", how.method(flush_nbytes)
    mask = "causal (bottom right)" if a.causal else "no mask"
    print(f"# {PROG}: {gpu}, torch {torch.__version__}, flashcute {flashcute.__version__}, bf16, d {a.headdim}, "
          f"batch {a.batch}, {mask}, {mode}; paged: {','.join(map(str, a.pages))}-token pages; "
          f"paths {','.join(a.paths)}")
    print(f"# {PROG}: {method}")
    print(f"{'heads':>6} {'new':>5} {'cached':>7} | " + " ".join(f"{n:>{max(8, len(n))}}" for n in names)
          + " | " + " ".join(f"{n:>{max(14, len(n))}}" for n in fc)
          + " | diff   (TFLOP/s | fc subjects: x fc-fixed / x faster SDPA, path | max |diff| vs fc-fixed)")
    rows, told, failed = [], set(), False
    for h, hk in a.heads:
        for cached in a.caches:
            for new in a.news:
                r = run_point(lib, how, a.graph, flush, a.batch, new, cached, h, hk, a.headdim, a.causal,
                              a.pages, a.paths)
                rows.append(r)
                print(line(r, names, fc), flush=True)
                failed |= any(name.startswith("fc") for name in r["unavailable"])
                for name, note in sorted(r["unavailable"].items() - told):  # say once why a subject cannot run
                    print(f"#   {name} n/a: {note}")
                told.update(r["unavailable"].items())
                torch.cuda.empty_cache()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    stem = a.out_dir / f"prefill-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    meta = {"gpu": gpu, "versions": versions(), "argv": list(sys.argv[1:] if argv is None else argv), "mode": mode,
            "timing_kind": how.kind, "timing": method, "iters": how.timed_calls, "warmup": how.warmup,
            "pages": a.pages, "paths": a.paths, "causal": a.causal,
            "flops_formula": "4 * batch * nheads * headdim * visible (query, key) pairs; causal (bottom right): "
                             "new * cached + new * (new + 1) / 2, else new * (cached + new)"}
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "points": rows}, indent=1))
    keys = ("batch", "new", "cached", "nheads", "nheads_k", "headdim", "causal", "flops")
    with open(stem.with_suffix(".csv"), "w") as f:
        f.write(",".join(keys) + ",impl,path,timing,ms,tflops,vs_fixed,vs_best_sdpa,max_abs_diff_vs_fixed\n")
        for r in rows:
            for n, ms in r["ms"].items():
                fx, sd = ("" if x is None else f"{x:.4f}" for x in ratios(r, n))
                f.write(",".join(str(int(r[key])) for key in keys) + f",{n},{r['path'].get(n, '')},{how.kind},"
                        f"{ms:.5f},{r['tflops'][n]:.2f},{fx},{sd},{r['max_abs_diff_vs_fixed'].get(n, '')}\n")
    written = [stem.with_suffix(".csv"), stem.with_suffix(".json")]
    title = f"flashcute prefill over a KV cache on {gpu} ({mask}, {mode}, {how.summary})"
    if not a.no_plot and write_plot(stem.with_suffix(".png"), rows, names, title):
        written.append(stem.with_suffix(".png"))
    print(f"# {PROG}: wrote " + ", ".join(map(str, written)))
    parts = [f"{n}/{what} min {min(v):.2f} geomean {statistics.geometric_mean(v):.2f}"
             for n in fc for i, what in enumerate(("fc-fixed", "best-sdpa"))
             if (v := [x for r in rows if (x := ratios(r, n)[i])])]
    print(f"{PROG} summary [{gpu}, {how.summary}]: " + ("; ".join(parts) or "nothing timed"))
    return 3 if failed else 0
