#!/usr/bin/env python3
"""Fetch pinned third-party headers from wheels on PyPI into third_party/<name>/include.

flashcute never commits third-party code. The headers it builds with come from wheels,
pinned by version and sha256, of which only the header tree is extracted:

    cutlass   the CUTLASS/CuTe headers (nvidia-cutlass's cutlass_library/source/include, 26 MB);
              CMake fetches them at configure time when no CUTLASS is found (third_party/cutlass.cmake)
    xla_ffi   XLA's FFI API headers (jaxlib's include/xla/ffi/api, 3 files), for the JAX binding;
              fetched when FLASHCUTE_XLA_FFI=ON finds no installed jaxlib (cmake/FlashcuteXlaFfi.cmake)

Run it by hand on a machine with network access to prepare a checkout for an offline one:

    python3 third_party/fetch_headers.py cutlass     # then carry third_party/cutlass along

The download goes through `pip download`, so pip's own configuration (index URL, proxy,
certificates) applies.
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
from dataclasses import dataclass
from pathlib import Path

@dataclass(frozen=True)
class Pin:
    package: str
    version: str
    wheel: str
    sha256: str
    include_prefix: str  # the header tree inside the wheel
    marker: str  # a file under include/ that proves the tree is complete
    pip_args: tuple = ()  # pip download options that select `wheel` whatever this interpreter is


PINS = {
    "cutlass": Pin("nvidia-cutlass", "4.2.0.0", "nvidia_cutlass-4.2.0.0-py3-none-any.whl",
                   "f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6",
                   "cutlass_library/source/include/", "cute/tensor.hpp"),
    # Any platform's jaxlib has the same headers: this one is pinned for its hash.
    "xla_ffi": Pin("jaxlib", "0.10.2", "jaxlib-0.10.2-cp311-cp311-manylinux_2_27_x86_64.whl",
                   "1faca3c5d4662cb4a6130a68105d68bb520764817e165d6eebfd6786c0d1f30f",
                   "jaxlib/include/", "xla/ffi/api/ffi.h",
                   ("--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                    "--platform", "manylinux_2_27_x86_64")),
}

THIRD_PARTY = Path(__file__).resolve().parent


class FetchError(Exception):
    pass


def download(pin: Pin, workdir: Path) -> Path:
    """Download the pinned wheel into workdir with pip and return its path."""
    # Few retries and a short timeout: an offline machine should fail in seconds, not minutes.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--retries", "1", "--timeout", "30", *pin.pip_args,
           f"{pin.package}=={pin.version}", "-d", str(workdir)]
    # Inside pip's isolated build environment (pip install .), PYTHONPATH points at a
    # sitecustomize that hides the interpreter's own site-packages, pip included.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    print("fetch_headers:", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wheel = workdir / pin.wheel
    if result.returncode != 0 or not wheel.is_file():
        raise FetchError(f"`pip download {pin.package}=={pin.version}` failed (offline?):\n{result.stdout.strip()}")
    return wheel


def verify(pin: Pin, wheel: Path) -> None:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != pin.sha256:
        raise FetchError(f"{wheel.name}: sha256 {digest} does not match the pinned {pin.sha256}")


def extract(pin: Pin, wheel: Path, dest: Path) -> int:
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
                if info.is_dir() or not info.filename.startswith(pin.include_prefix):
                    continue
                rel = Path(info.filename[len(pin.include_prefix):])
                if rel.is_absolute() or ".." in rel.parts:
                    raise FetchError(f"{wheel.name}: unsafe path {info.filename}")
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                count += 1
        if not (staging / pin.marker).is_file():
            raise FetchError(f"{wheel.name}: no {pin.include_prefix}{pin.marker} inside")
        final = dest / "include"
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(PINS), help="which headers")
    parser.add_argument("--dest", type=Path, help="directory that receives include/ (default: third_party/<name>)")
    parser.add_argument("--force", action="store_true", help="fetch again even if dest/include is complete")
    args = parser.parse_args()

    pin = PINS[args.name]
    dest = (args.dest or THIRD_PARTY / args.name).resolve()
    if (dest / "include" / pin.marker).is_file() and not args.force:
        print(f"fetch_headers: {dest / 'include'} already exists (use --force to fetch again)")
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix=f"flashcute-{args.name}-") as tmp:
            wheel = download(pin, Path(tmp))
            verify(pin, wheel)
            count = extract(pin, wheel, dest)
    except FetchError as err:
        print(f"fetch_headers: error: {err}", file=sys.stderr)
        return 1
    print(f"fetch_headers: {pin.package} {pin.version} (sha256 {pin.sha256[:12]}...): {count} headers -> "
          f"{dest / 'include'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
