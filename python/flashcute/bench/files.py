"""The files a run writes: bench-YYYYmmdd-HHMMSS.{csv,json,png}.

CSV and JSON hold the same records, one per (point, implementation), built by :func:`record`; each
names the timing that produced it (column ``timing``: "standard" or "turns"). The JSON adds the
run's metadata (``timing``: the whole method, with its counts) and keeps every timed call, the CSV
their count.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .impls import SUBJECT
from .results import ImplResult, PointResult


def output_stem(out_dir: Path, now: _dt.datetime | None = None) -> Path:
    """out_dir/bench-YYYYmmdd-HHMMSS (local time), to which .csv, .json and .png are added."""
    return out_dir / f"bench-{(now or _dt.datetime.now()).strftime('%Y%m%d-%H%M%S')}"


def record(pr: PointResult, impl: str, r: ImplResult) -> dict[str, Any]:
    """Everything known about one implementation at one point."""
    c = r.check
    return {
        **asdict(pr.point),
        "flops": pr.point.flops,
        "impl": impl,
        "status": r.status,
        "median_ms": r.median_ms,
        "tflops": pr.tflops(impl),
        "timing": pr.timing,
        "iters": len(r.times_ms),
        "input_sets": pr.input_sets,
        "working_set_bytes": pr.working_set_bytes,
        "check": None if c is None else ("pass" if c.ok else "fail"),
        "max_err": None if c is None else c.out_err,
        "tolerance": None if c is None else c.out_bound,
        "naive_err": None if c is None else c.out_naive_err,
        "check_scope": r.check_scope or None,
        "check_message": None if c is None else c.message,
        "layout": r.layout,
        "note": r.note,
        "times_ms": r.times_ms,
    }


def records(results: Sequence[PointResult]) -> list[dict[str, Any]]:
    """One record per (point, implementation), in the order they ran."""
    return [record(pr, impl, r) for pr in results for impl, r in pr.impls.items()]


def write_csv(path: Path, results: Sequence[PointResult]) -> None:
    """The records without the per-call times (their count is the "iters" column)."""
    rows = [{k: v for k, v in rec.items() if k != "times_ms"} for rec in records(results)]
    with path.open("w", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def _json_safe(x: Any) -> Any:
    """NaN and infinities (a failed check's error) become strings: strict JSON has no such numbers."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_json(path: Path, results: Sequence[PointResult], meta: dict[str, Any]) -> None:
    """{"meta": the run's metadata, "results": every record, with its per-call times}."""
    doc = _json_safe({"meta": meta, "results": records(results)})
    path.write_text(json.dumps(doc, indent=1, allow_nan=False, default=str))


def write_plot(path: Path, results: Sequence[PointResult], impls: Sequence[str], title: str) -> bool:
    """TFLOP/s vs seqlen, one panel per (dtype, head dim, causal), one line per implementation,
    failed flashcute checks marked with a red x. False (nothing written) without matplotlib."""
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
    for row, (dtype, d) in enumerate(panels):
        for col, causal in enumerate(causals):
            ax = axes[row][col]
            sel = [pr for pr in results if (pr.point.dtype, pr.point.headdim, pr.point.causal) == (dtype, d, causal)]
            for impl in impls:
                pts = [(pr.point.seqlen, pr.tflops(impl)) for pr in sel if pr.tflops(impl) is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=impl)
            bad = [(pr.point.seqlen, pr.tflops(SUBJECT) or 0.0) for pr in sel if pr.failed]
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
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))  # leave the suptitle its own line
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
