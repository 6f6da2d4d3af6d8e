#!/usr/bin/env python3
"""Fetch the pinned CUTLASS/CuTe headers into third_party/cutlass/include.

flashcute never commits CUTLASS. Its headers come from the nvidia-cutlass wheel on
PyPI, pinned by version and sha256; only cutlass_library/source/include/ (the cute/
and cutlass/ header trees, about 26 MB) is extracted. CMake runs this script at
configure time when no CUTLASS is found (third_party/cutlass.cmake); run it by hand
on a machine with network access to prepare a checkout for an offline one:

    python3 third_party/fetch_cutlass.py          # then carry third_party/cutlass along

The download goes through `pip download`, so pip's own configuration (index URL,
proxy, certificates) applies.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "nvidia-cutlass"
VERSION = "4.2.0.0"
WHEEL = "nvidia_cutlass-4.2.0.0-py3-none-any.whl"
SHA256 = "f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6"
INCLUDE_PREFIX = "cutlass_library/source/include/"

DEFAULT_DEST = Path(__file__).resolve().parent / "cutlass"


class FetchError(Exception):
    pass


def download(workdir: Path) -> Path:
    """Download the pinned wheel into workdir with pip and return its path."""
    # Few retries and a short timeout: an offline machine should fail in seconds, not minutes.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--retries", "1", "--timeout", "30",
           f"{PACKAGE}=={VERSION}", "-d", str(workdir)]
    # Inside pip's isolated build environment (pip install .), PYTHONPATH points at a
    # sitecustomize that hides the interpreter's own site-packages, pip included.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    print("fetch_cutlass:", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wheel = workdir / WHEEL
    if result.returncode != 0 or not wheel.is_file():
        raise FetchError(f"`pip download {PACKAGE}=={VERSION}` failed (offline?):\n{result.stdout.strip()}")
    return wheel


def verify(wheel: Path) -> None:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != SHA256:
        raise FetchError(f"{wheel.name}: sha256 {digest} does not match the pinned {SHA256}")


def extract(wheel: Path, dest: Path) -> int:
    """Extract the header tree of the wheel to dest/include; returns the number of files.

    Extracts next to the destination and renames at the end, so an interrupted run
    never leaves a half-filled include directory behind.
    """
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".include-", dir=dest))
    count = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.is_dir() or not info.filename.startswith(INCLUDE_PREFIX):
                    continue
                rel = Path(info.filename[len(INCLUDE_PREFIX):])
                if rel.is_absolute() or ".." in rel.parts:
                    raise FetchError(f"{wheel.name}: unsafe path {info.filename}")
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                count += 1
        if not (staging / "cute" / "tensor.hpp").is_file():
            raise FetchError(f"{wheel.name}: no {INCLUDE_PREFIX}cute/tensor.hpp inside")
        final = dest / "include"
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST,
                        help=f"directory that receives include/cute and include/cutlass (default: {DEFAULT_DEST})")
    parser.add_argument("--force", action="store_true", help="fetch again even if dest/include/cute exists")
    args = parser.parse_args()

    dest = args.dest.resolve()
    if (dest / "include" / "cute").is_dir() and not args.force:
        print(f"fetch_cutlass: {dest / 'include'} already exists (use --force to fetch again)")
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="flashcute-cutlass-") as tmp:
            wheel = download(Path(tmp))
            verify(wheel)
            count = extract(wheel, dest)
    except FetchError as err:
        print(f"fetch_cutlass: error: {err}", file=sys.stderr)
        return 1
    print(f"fetch_cutlass: {PACKAGE} {VERSION} (sha256 {SHA256[:12]}...): {count} headers -> {dest / 'include'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
