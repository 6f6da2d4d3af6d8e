"""``python -m flashcute.bench decode``: KV-cache decode speed against SDPA, as effective bandwidth.

At every point (batch x seqlen_k x heads; bf16, one head dim) one new query token per sequence
attends to a KV cache of seqlen_k keys. Timed, in one process on the same keys:

- ``fc``: :func:`flashcute.flash_attn_with_kvcache` on the contiguous cache, cache_seqlens given;
- ``fc-paged``: the same keys in a paged cache (``--page`` tokens a page, pages shuffled). Both run
  on every path of ``--paths`` (``FLASHCUTE_FORWARD_PATH``, set before the calls and the graph
  capture): ``auto`` gives ``fc``, ``sm80`` ``fc@sm80``...; the row's ``path`` is what
  :func:`flashcute.last_forward_path` said; ``--splits 8,32`` adds ``fc/s8``, ``fc/s32``...: the
  contiguous call with ``num_splits`` forced (``fc`` lets the library choose); ``--append`` adds
  ``fc+append`` and ``fc-paged+append``: the step as FlashAttention-2's decode runs it, the new
  token's key and value appended in place (``k``, ``v`` given, cache_seqlens one short; the token
  appended is the cache's last, so the cache does not change);
- ``sdpa-flash``, ``sdpa-cudnn``: ``torch.nn.functional.scaled_dot_product_attention`` with that
  backend, on the contiguous cache transposed to (batch, heads, seq, dim), ``enable_gqa=True``;
- ``copy``: a 1 GiB device-to-device ``Tensor.copy_`` (bytes read + written, timed eagerly), the
  reference the targets are stated against.

Bandwidth is the bytes of K and V over the median time of ``--iters`` timed calls, by the same
timer and schedules as the forward bench (:mod:`flashcute.bench.timing`, ``--timing``): by default
the standard timing (each implementation after a warm-up, every timed call after an L2 flush
outside its events, in order and then in reverse, the median of both passes), so a cache smaller
than L2 is read from memory as in a served step. The flush writes a buffer and then reads another,
so that L2 holds clean lines: after a write alone each call also wrote back the flush's dirty
lines, 11-13 us on an H200, which a served step, whose neighbours write little, does not pay; ``--timing turns --rounds N`` takes them in
turns. ``--modes graph`` (the default, or ``--graph``) times CUDA-graph replays of each call: the
GPU's time, as a served decode step runs; ``--modes eager`` (``--eager``) times plain calls, which
include each call's host time; ``--modes graph,eager`` gives both, a row each.
Before timing, flashcute's outputs are checked against SDPA flash's (max |diff| printed; the
numerical tests are in tests/python).

Writes ``decode-<date>.csv``/``.json`` and a plot to ``--out-dir``. torch only.
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
from .timing import Subject, Timing, time_calls, time_subjects

PROG = "flashcute.bench decode"
IMPLS = ("fc", "fc-paged", "sdpa-flash", "sdpa-cudnn")
SDPA = ("sdpa-flash", "sdpa-cudnn")
PATH_VAR = "FLASHCUTE_FORWARD_PATH"
PATHS = ("auto", "sm90", "sm80")
MODES = ("graph", "eager")


def _list(text: str) -> list[str]:
    return list(dict.fromkeys(x for x in text.split(",") if x))


def _tag(path: str) -> str:
    return "" if path == "auto" else f"@{path}"


def check_choices(parser: argparse.ArgumentParser, flag: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    """A usage error (exit code 2) unless `values` is a non-empty subset of `allowed`."""
    if not values or not set(values) <= set(allowed):
        parser.error(f"{flag}: expected {', '.join(allowed)}, comma-separated, got {','.join(values)!r}")


def subject_names(paths: Sequence[str], splits: Sequence[int] = (), append: bool = False) -> list[str]:
    """The timed subjects in order: fc and fc-paged on each path, fc with each forced split count
    on each path, both with the in-place append on each path (`append`), then SDPA's."""
    return ([base + _tag(path) for path in paths for base in ("fc", "fc-paged")]
            + [f"fc{_tag(path)}/s{n}" for path in paths for n in splits]
            + [base + _tag(path) + "+append" for path in paths for base in ("fc", "fc-paged") if append]
            + list(SDPA))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _heads(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in pair.split(":")) for pair in text.split(",") if pair]  # type: ignore[misc]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=_ints, default=[1, 16, 64])
    p.add_argument("--seqlens", type=_ints, default=[4096, 16384, 65536, 131072], help="seqlen_k values")
    p.add_argument("--heads", type=_heads, default=[(32, 8), (8, 8)], help="nheads:nheads_k pairs (default 32:8,8:8)")
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--page", type=int, default=64, help="page size of the paged cache (default 64)")
    p.add_argument("--max-gb", type=float, default=9.0,
                   help="skip points whose KV cache is larger (default 9: the cache, its paged copy and SDPA's "
                        "inputs fit in 80 GB)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--modes", type=_list, default=["graph"],
                      help="graph (CUDA-graph replays, the default), eager (plain calls, host time included), or "
                           "graph,eager: a row each")
    mode.add_argument("--graph", dest="modes", action="store_const", const=["graph"], help="--modes graph")
    mode.add_argument("--eager", dest="modes", action="store_const", const=["eager"], help="--modes eager")
    p.add_argument("--splits", type=_ints, default=[],
                   help="num_splits values to time fc with besides the library's choice, e.g. 8,32 (1-128)")
    p.add_argument("--append", action="store_true",
                   help="also time fc and fc-paged with the new token's key and value appended in place")
    p.add_argument("--paths", type=_list, default=["auto"],
                   help="forward paths (FLASHCUTE_FORWARD_PATH) to time flashcute on, comma-separated: auto (default), "
                        "sm90, sm80")
    p.add_argument("--timing", choices=timing.TIMINGS, default=timing.STANDARD,
                   help="standard (default): each implementation after a warm-up, every timed call after an L2 "
                        "flush, in order then in reverse, the median of both passes; turns: in turns (--rounds), "
                        "no flush (flashcute.bench --help says more)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed calls before each implementation's timed ones (default 5)")
    p.add_argument("--iters", type=int, default=20,
                   help="individually timed calls of each implementation; the median is reported (default 20)")
    p.add_argument("--rounds", type=int,
                   help=f"--timing turns only: rounds of iters/rounds timed calls of each implementation "
                        f"(default {timing.DEFAULT_TURN_ROUNDS}, at most iters)")
    p.add_argument("--out-dir", type=Path, default=Path("bench-results"))
    p.add_argument("--no-plot", action="store_true")
    return p


def parse_timing(parser: argparse.ArgumentParser, a: argparse.Namespace) -> Timing:
    """The Timing of the parsed arguments; usage errors (exit code 2) through `parser`."""
    if a.warmup < 0 or a.iters < 1 or (a.rounds is not None and a.rounds < 1):
        parser.error("--warmup must be >= 0, --iters and --rounds >= 1")
    if a.rounds is not None and a.timing != timing.TURNS:
        parser.error(f"--rounds sets the rounds of --timing turns; the {a.timing} timing has none "
                     "(add --timing turns, or drop --rounds)")
    return Timing(a.timing, a.warmup, a.iters, a.rounds if a.rounds is not None else timing.DEFAULT_TURN_ROUNDS)


def graph_replay(torch: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn captured in a CUDA graph: the returned call replays it."""
    fn()  # lazy initialisation and allocations outside the capture
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def copy_tbps(lib: TorchLib, how: Timing) -> float:
    """TB/s of a 1 GiB Tensor.copy_ (bytes read + written), the median of how.iters eager calls
    after how.warmup: 2 GiB of traffic a call, far beyond L2, so no flush is needed. Eager in either
    mode: captured in a graph it becomes a memcpy node, which the H100 ran at 2.4 TB/s against 3.0
    for the kernel eager calls get."""
    torch = lib.m
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()  # 1 GiB
    dst = torch.empty_like(src)
    ms = statistics.median(time_calls(lib, [lambda: dst.copy_(src)], how.warmup, how.iters))
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e12


def run_point(lib: TorchLib, how: Timing, modes: Sequence[str], flush: Callable[[], Any] | None, b: int, s: int,
              h: int, hk: int, d: int, page: int, paths: Sequence[str] = ("auto",),
              splits: Sequence[int] = (), append: bool = False) -> list[dict[str, Any]]:
    """Checks and times every subject at one point (one process, the same keys): a row for each of
    `modes`."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .._torch import _kvcache_launch
    from .impls import env_var

    torch = lib.m
    dt = torch.bfloat16
    q = torch.randn(b, 1, h, d, device="cuda", dtype=dt)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dt)
    v = torch.randn(b, s, hk, d, device="cuda", dtype=dt)
    seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    pages = b * s // page
    perm = torch.randperm(pages, device="cuda")
    kp = torch.empty(pages, page, hk, d, device="cuda", dtype=dt)
    vp = torch.empty_like(kp)
    kp[perm] = k.view(pages, page, hk, d)
    vp[perm] = v.view(pages, page, hk, d)
    table = perm.view(b, s // page).to(torch.int32)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=h != hk).transpose(1, 2)
        return run

    runs: dict[str, tuple[str | None, Callable[[], Any]]] = {}  # name: (FLASHCUTE_FORWARD_PATH, call)
    for path in paths:
        runs["fc" + _tag(path)] = (path, lambda: flashcute.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens))
        runs["fc-paged" + _tag(path)] = (path, lambda: flashcute.flash_attn_with_kvcache(
            q, kp, vp, cache_seqlens=seqlens, block_table=table))
    for path in paths:
        for n in splits:
            runs[f"fc{_tag(path)}/s{n}"] = (path, lambda n=n: flashcute.flash_attn_with_kvcache(
                q, k, v, cache_seqlens=seqlens, num_splits=n))
    if append:  # the last key and value appended again: the same cache, and the same output
        kn, vn = k[:, s - 1:].clone(), v[:, s - 1:].clone()
        short = seqlens - 1
        for path in paths:
            runs["fc" + _tag(path) + "+append"] = (path, lambda: flashcute.flash_attn_with_kvcache(
                q, k, v, kn, vn, cache_seqlens=short))
            runs["fc-paged" + _tag(path) + "+append"] = (path, lambda: flashcute.flash_attn_with_kvcache(
                q, kp, vp, kn, vn, cache_seqlens=short, block_table=table))
    runs.update({n: (None, sdpa(be)) for n, be in zip(SDPA, (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION))})
    outs, notes, kinds = {}, {}, {}
    for name, (path, run) in list(runs.items()):
        try:  # the variable is read when a call is planned: a graph records the launch made at capture
            with env_var(PATH_VAR, path):
                outs[name] = run()
                if name.startswith("fc"):
                    kinds[name] = flashcute.last_forward_path()
        except RuntimeError as exc:  # an SDPA backend that refuses this point
            notes[name] = str(exc).splitlines()[0][:120]
            del runs[name]
    kv_bytes = 2 * b * s * hk * d * 2
    ref = outs.get("sdpa-flash")
    diff = max(((o.float() - ref.float()).abs().max().item() for n, o in outs.items() if n.startswith("fc")),
               default=None) if ref is not None else None
    splits = _kvcache_launch(q, k, v, None, None, seqlens, None, torch.empty_like(q), None,
                             (d ** -0.5, False, -1, -1, 0.0), 0, q.get_device(),
                             torch.cuda.current_stream().cuda_stream, False)
    rows = []
    for mode in modes:
        subjects = []
        for name, (path, run) in runs.items():
            with env_var(PATH_VAR, path):
                call = graph_replay(torch, run) if mode == "graph" else run
            subjects.append(Subject(name, [call], lambda path=path: env_var(PATH_VAR, path)))
        timed = time_subjects(lib, subjects, how, flush)
        mode_notes = dict(notes)
        for name, exc in timed.errors.items():
            mode_notes[name] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"
        ms = {name: statistics.median(ts) for name, ts in timed.times_ms.items() if name not in timed.errors}
        rows.append({"batch": b, "seqlen_k": s, "nheads": h, "nheads_k": hk, "headdim": d, "mode": mode,
                     "kv_bytes": kv_bytes, "num_splits": splits, "path": kinds, "ms": ms,
                     "tbps": {n: kv_bytes / (t * 1e-3) / 1e12 for n, t in ms.items()},
                     "max_abs_diff_vs_sdpa_flash": diff, "unavailable": mode_notes})
    return rows


def line(r: dict[str, Any], copy: float, names: Sequence[str]) -> str:
    """A row: TB/s of every subject in `names`, then the first path's fc against the copy, the
    faster SDPA backend and its paged call."""
    t = r["tbps"]
    fc, paged = names[0], names[1]
    cells = " ".join(f"{t[n]:9.2f}" if n in t else "        -" for n in names)
    best = max((t[n] for n in SDPA if n in t), default=None)
    ratio = f"{t[fc] / best:7.2f}" if best and fc in t else "      -"
    own = f"{t[fc] / copy:7.2f}" if fc in t else "      -"
    pag = f"{t[paged] / t[fc]:8.2f}" if fc in t and paged in t else "       -"
    return (f"{r['mode']:>5} {r['batch']:5d} {r['seqlen_k']:7d} {r['nheads']:3d}:{r['nheads_k']:<2d} "
            f"{r['kv_bytes'] / 1e6:7.0f} {r['num_splits']:6d} | {cells} | {own} {ratio} {pag}")


def plot_panels(path: Path, rows: Sequence[dict[str, Any]], panel: Callable[[dict[str, Any]], tuple],
                panel_title: Callable[[tuple], str], x: str, y: str, names: Sequence[str], title: str,
                xlabel: str, ylabel: str, hline: tuple[float, str] | None = None) -> bool:
    """A PNG with a panel per distinct panel(row), a line per name: row[y][name] against row[x] (log2
    x axis), and `hline` (value, label) dashed across each. False, writing nothing, without
    matplotlib. decode and prefill plot with it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = list(dict.fromkeys(panel(r) for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, key in zip(axes[0], panels):
        sel = [r for r in rows if panel(r) == key]
        for name in names:
            pts = [(r[x], r[y][name]) for r in sel if name in r[y]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        if hline is not None:
            ax.axhline(hline[0], color="gray", ls="--", lw=1, label=hline[1])
        ax.set_xscale("log", base=2)
        ax.set_title(panel_title(key))
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_plot(path: Path, rows: Sequence[dict[str, Any]], copy: float, title: str,
               names: Sequence[str] = IMPLS) -> bool:
    return plot_panels(path, rows, lambda r: (r["nheads"], r["nheads_k"], r["batch"], r.get("mode", "graph")),
                       lambda k: f"batch {k[2]}, heads {k[0]}:{k[1]}, {k[3]}", "seqlen_k", "tbps", names, title,
                       "seqlen_k", "TB/s of K+V", hline=(copy, "copy"))


def open_torch(prog: str, how: Timing, clean_l2: bool = False
               ) -> tuple[TorchLib, int | None, Callable[[], None] | None] | None:
    """torch with a CUDA device flashcute runs on, and the L2 flush `how` asks for: (lib, flush
    bytes, flusher; None and None without flushes), or None once stderr says why not. decode and
    prefill open it so; decode with `clean_l2` (ArrayLib.l2_flusher)."""
    try:
        lib = TorchLib.load()
    except Exception as exc:  # LibraryUnavailable: no torch, or no GPU
        print(f"{prog}: needs torch with a CUDA device ({exc})", file=sys.stderr)
        return None
    if not flashcute.is_available():
        print(f"{prog}: flashcute cannot run: {flashcute.cuda_status()}", file=sys.stderr)
        return None
    flush_nbytes = timing.flush_bytes(lib.device_info().l2_bytes) if how.flushes else None
    return lib, flush_nbytes, (lib.l2_flusher(flush_nbytes, clean=clean_l2) if flush_nbytes else None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    how = parse_timing(parser, a)
    check_choices(parser, "--modes", a.modes, MODES)
    check_choices(parser, "--paths", a.paths, PATHS)
    if not all(1 <= n <= 128 for n in a.splits):
        parser.error(f"--splits: expected split counts in 1..128, got {','.join(map(str, a.splits))!r}")
    opened = open_torch(PROG, how, clean_l2=True)
    if opened is None:
        return 1
    lib, flush_nbytes, flush = opened
    torch = lib.m
    gpu = torch.cuda.get_device_name()
    copy = copy_tbps(lib, how)
    modes = " and ".join({"graph": "CUDA-graph replays", "eager": "eager calls"}[m] for m in a.modes)
    method = how.method(flush_nbytes, clean=True)
    names = subject_names(a.paths, a.splits, a.append)
    print(f"# {PROG}: {gpu}, torch {torch.__version__}, flashcute {flashcute.__version__}, bf16, d {a.headdim}, "
          f"{modes}; copy {copy:.2f} TB/s; paged: {a.page}-token pages; paths {','.join(a.paths)}")
    print(f"# {PROG}: {method}")
    print(f"{'mode':>5} {'batch':>5} {'seqlen_k':>7} {'heads':>6} {'kv_MB':>7} {'splits':>6} | "
          + " ".join(f"{n:>9}"[-9:] for n in names)
          + f" | {'fc/copy':>7} {'fc/sdpa':>7} {'paged/fc':>8}   (TB/s of K+V)")
    rows = []
    for h, hk in a.heads:
        for b in a.batches:
            for s in a.seqlens:
                if 2 * b * s * hk * a.headdim * 2 > a.max_gb * 1e9 or s % a.page:
                    continue
                for r in run_point(lib, how, a.modes, flush, b, s, h, hk, a.headdim, a.page, a.paths, a.splits,
                                   a.append):
                    rows.append(r)
                    print(line(r, copy, names), flush=True)
                torch.cuda.empty_cache()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    stem = a.out_dir / f"decode-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    meta = {"gpu": gpu, "versions": versions(), "argv": list(sys.argv[1:] if argv is None else argv), "modes": a.modes,
            "paths": a.paths, "splits": a.splits, "append": a.append, "copy_tbps": copy, "timing_kind": how.kind, "timing": method,
            "iters": how.timed_calls, "warmup": how.warmup, "page": a.page}
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "points": rows}, indent=1))
    with open(stem.with_suffix(".csv"), "w") as f:
        f.write("mode,batch,seqlen_k,nheads,nheads_k,headdim,kv_bytes,num_splits,impl,path,timing,ms,tbps,"
                "fraction_of_copy\n")
        for r in rows:
            for n, ms in r["ms"].items():
                f.write(f"{r['mode']},{r['batch']},{r['seqlen_k']},{r['nheads']},{r['nheads_k']},{r['headdim']},"
                        f"{r['kv_bytes']},{r['num_splits']},{n},{r['path'].get(n, '')},{how.kind},{ms:.5f},"
                        f"{r['tbps'][n]:.4f},{r['tbps'][n] / copy:.4f}\n")
    written = [stem.with_suffix(".csv"), stem.with_suffix(".json")]
    title = f"flashcute decode on {gpu} ({modes}, {how.summary})"
    if not a.no_plot and write_plot(stem.with_suffix(".png"), rows, copy, title, names):
        written.append(stem.with_suffix(".png"))
    print(f"# {PROG}: wrote " + ", ".join(map(str, written)))
    for mode in a.modes:
        print(summary(rows, mode, names, copy, gpu, how))
    return 0


def summary(rows: Sequence[dict[str, Any]], mode: str, names: Sequence[str], copy: float, gpu: str,
            how: Timing) -> str:
    """One mode's line against the targets: fc against the copy where the cache is >= 256 MB, against
    the faster SDPA backend, and paged against contiguous, for the first path's fc."""
    fc, paged = names[0], names[1]
    sel = [r for r in rows if r["mode"] == mode and fc in r["tbps"]]
    big = [r for r in sel if r["kv_bytes"] >= 256e6]
    worst_copy = min(r["tbps"][fc] / copy for r in big) if big else float("nan")
    ratios = [r["tbps"][fc] / max(r["tbps"][n] for n in SDPA if n in r["tbps"])
              for r in sel if any(n in r["tbps"] for n in SDPA)]
    pag = [r["tbps"][paged] / r["tbps"][fc] for r in sel if paged in r["tbps"]]
    return (f"{PROG} summary [{gpu}, {mode}, {how.summary}]: {fc}/copy min {worst_copy:.2f} where the cache is "
            f">= 256 MB; {fc}/best-sdpa min {min(ratios, default=float('nan')):.2f}, "
            f"geomean {statistics.geometric_mean(ratios) if ratios else float('nan'):.2f}; "
            f"paged/contiguous min {min(pag, default=float('nan')):.2f}")
