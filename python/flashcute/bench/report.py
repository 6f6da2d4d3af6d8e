"""What the benchmark prints: a log line per point, the table and the summary line.

Output goes through rich when it is installed (the ``bench`` extra), else through plain prints
without a progress bar. Off a terminal, lines are kept whole so that logs can be grepped.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Callable

from .impls import SUBJECT
from .results import ERROR, FAIL, NOT_AVAILABLE, OK, ImplResult, PointResult

PROG = "flashcute.bench"
RATIO_BASES = ("sdpa-flash", "sdpa-cudnn", "fa4")  # the table and the summary compare flashcute with these
LOG_WIDTH = 240  # columns off a terminal: wide enough for the table, so nothing wraps


class Console:
    """Log lines, a progress bar and the table: rich if installed, else plain prints."""

    def __init__(self) -> None:
        try:
            from rich.console import Console as RichConsole
        except ImportError:
            self.rich: Any = None
        else:
            self.rich = RichConsole(width=None if sys.stdout.isatty() else LOG_WIDTH)

    def log(self, message: str) -> None:
        if self.rich is not None:
            self.rich.print(message, markup=False, highlight=False, soft_wrap=True)
        else:
            print(message, flush=True)

    @contextlib.contextmanager
    def progress(self, total: int, description: str) -> Iterator[Callable[[], None]]:
        """A progress bar on a terminal (with rich); yields the function that advances it."""
        if self.rich is None or not self.rich.is_terminal:
            yield lambda: None
            return
        from rich.progress import Progress

        with Progress(console=self.rich) as bar:
            task = bar.add_task(description, total=total)
            yield lambda: bar.advance(task)

    def table(self, title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """Text columns are left-aligned, numbers right-aligned."""
        left = [i < 3 or i == len(header) - 1 for i in range(len(header))]
        if self.rich is not None:
            from rich.table import Table

            table = Table(title=title)
            for h, is_left in zip(header, left):
                table.add_column(h, justify="left" if is_left else "right")
            for row in rows:
                table.add_row(*row)
            self.rich.print(table)
            return
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
        print(title)
        for row in [list(header)] + [list(r) for r in rows]:
            print("  ".join(c.ljust(w) if is_left else c.rjust(w) for c, w, is_left in zip(row, widths, left)))


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def check_cell(r: ImplResult | None) -> str:
    """flashcute's check, e.g. "pass 1.2e-03<=2.4e-03", or its status when it was not checked."""
    if r is None:
        return "-"
    if r.check is None:
        return r.status if r.status != OK else "-"
    c = r.check
    return f"{'pass' if c.ok else 'FAIL'} {c.out_err:.1e}<={c.out_bound:.1e}"


def point_line(pr: PointResult, impls: Sequence[str]) -> str:
    """One log line per point: TFLOP/s of every impl and flashcute's check."""
    parts = []
    for impl in impls:
        r = pr.impls[impl]
        text = f"{impl} {_fmt(pr.tflops(impl))}"
        if r.status not in (OK, NOT_AVAILABLE):
            text += f" ({r.status}" + (f": {r.note[:160]}" if r.note else "") + ")"
        parts.append(text)
    return f"{pr.point.label}: " + ", ".join(parts) + f"  [check {check_cell(pr.subject)}]"


def _ratio_bases(impls: Sequence[str]) -> list[str]:
    return [b for b in RATIO_BASES if b in impls and SUBJECT in impls]


def _ratio_label(base: str) -> str:
    """"fc/flash" for sdpa-flash, "fc/fa4" for fa4."""
    return "fc/" + base.removeprefix("sdpa-")


def table_rows(results: Sequence[PointResult], impls: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the table: TFLOP/s, ratios of flashcute to SDPA flash and cuDNN, check."""
    bases = _ratio_bases(impls)
    header = ["dtype", "d", "causal", "seqlen", "batch", "heads"] + [f"{i} TF/s" for i in impls]
    header += [_ratio_label(b) for b in bases] + ["check"]
    rows = []
    for pr in results:
        p = pr.point
        row = [p.dtype, str(p.headdim), "yes" if p.causal else "no", str(p.seqlen), str(p.batch), p.heads]
        row += [_fmt(pr.tflops(i)) for i in impls]
        row += [_fmt(pr.ratio(SUBJECT, b), ".2f") for b in bases]
        row.append(check_cell(pr.subject))
        rows.append(row)
    return header, rows


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary_line(results: Sequence[PointResult], gpu: str, timing: str) -> str:
    """One greppable line, "flashcute.bench summary [GPU, <timing>]: ...": how many points flashcute
    got right, then min/geomean of flashcute over SDPA flash, cuDNN and FlashAttention-4 (those that
    ran) for seqlen >= 1k and < 1k. `timing` names the timing that produced the numbers ("standard
    timing"). A wrong result's speed is no result: failed points are left out of the ratios."""
    ran = [pr.subject for pr in results if pr.subject is not None]
    checked = sum(r.status in (OK, FAIL, ERROR) for r in ran)
    failed = sum(pr.failed for pr in results)
    skipped = sum(r.status == NOT_AVAILABLE for r in ran)
    parts = [f"{checked - failed}/{checked} points correct" + (f" ({skipped} n/a)" if skipped else "")]
    for base in RATIO_BASES:
        for name, long in (("seqlen>=1k", True), ("seqlen<1k", False)):
            ratios = [
                r
                for pr in results
                if (pr.point.seqlen >= 1024) == long and not pr.failed and (r := pr.ratio(SUBJECT, base)) is not None
            ]
            if ratios:
                parts.append(
                    f"{_ratio_label(base)} {name}: min {min(ratios):.2f}x geomean {_geomean(ratios):.2f}x "
                    f"({len(ratios)} pts)"
                )
    if len(parts) == 1:
        parts.append("no SDPA comparison")
    return f"{PROG} summary [{gpu}, {timing}]: " + "; ".join(parts)
