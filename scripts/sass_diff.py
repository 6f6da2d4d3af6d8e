#!/usr/bin/env python3
"""Compares the SASS of two builds' forward kernels, kernel by kernel (docs/perf-notes.md).

    python3 scripts/sass_diff.py OLD_LIB NEW_LIB       (libflashcute_kernels.a or any cubin holder)

Kernels are paired by (dtype, head dim) read from their demangled names. Instructions are compared
by opcode and operands with addresses, line info and constant-bank offsets (kernel parameter
positions, which move when the parameter struct changes) masked out. Prints one line per kernel:
instruction counts and how many differ. Needs cuobjdump and c++filt.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict


def sass_by_kernel(path: str) -> dict[str, list[str]]:
    text = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    kernels: dict[str, list[str]] = defaultdict(list)
    name = None
    arch = ""
    for line in text.splitlines():
        if m := re.match(r"\s*arch = (sm_\w+)", line):
            arch = m[1]
        if m := re.match(r"\s*Function : (\S+)", line):
            name = f"{arch} {m[1]}"
        elif name and (m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)):
            ins = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][P]", m[1])  # parameter offsets
            kernels[name].append(ins)
    return kernels


def key_of(name: str) -> str | None:
    arch, mangled = name.split(" ", 1)
    demangled = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
    if "fwd_kernel" not in demangled:
        return None
    dt = re.search(r"DType\)(\d)|DType::k(\w+)", demangled)
    hd = re.search(r"FwdConfig\{(\d+)", demangled) or re.search(r"head_dim=(\d+)", demangled)
    dtype = (dt[1] or dt[2]) if dt else "?"
    return f"{arch} dtype={dtype} hdim={hd[1] if hd else '?'}"


def main() -> int:
    old, new = (sass_by_kernel(p) for p in sys.argv[1:3])
    pair: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for side, kernels in (("old", old), ("new", new)):
        for name, ins in kernels.items():
            if (k := key_of(name)) is not None:
                pair[k][side] = ins
    worst = 0
    for k in sorted(pair):
        o, n = pair[k].get("old"), pair[k].get("new")
        if o is None or n is None:
            print(f"{k}: only in {'new' if o is None else 'old'}")
            continue
        diff = sum(a != b for a, b in zip(o, n)) + abs(len(o) - len(n))
        worst = max(worst, diff)
        print(f"{k}: {len(o)} vs {len(n)} instructions, {diff} differ")
    print(f"sass_diff: {len(pair)} kernels, at most {worst} differing instructions per kernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
