#!/usr/bin/env bash
# scripts/baseline.sh: another revision of flashcute beside this one, for before/after benchmarks in
# one call on the GPU machine (docs/perf-notes.md).
#
#   git archive <rev> | tar -x -C .deps/baseline          (here; .deps/ is git-ignored: carry it)
#   scripts/baseline.sh build .deps/baseline [pip -C options...]
#       installs that tree into $FC_BASELINE (default /tmp/flashcute-baseline), build dir beside it
#   scripts/baseline.sh bench [bench args...]
#       python3 -m flashcute.bench with the baseline package first on PYTHONPATH
#
# The baseline uses this checkout's third_party/cutlass (the device has no network).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
prefix="${FC_BASELINE:-/tmp/flashcute-baseline}"
case "${1:-}" in
  build)
    src="$2"
    shift 2
    python3 -m pip install --no-build-isolation --no-deps --no-index -q --target "$prefix/site" "$src" \
      -C "build-dir=$prefix/build" -C "cmake.define.CUTLASS_DIR=$PWD/third_party/cutlass" "$@"
    ;;
  bench)
    shift
    PYTHONPATH="$prefix/site${PYTHONPATH:+:$PYTHONPATH}" python3 -m flashcute.bench "$@"
    ;;
  *)
    sed -n '2,12p' "${BASH_SOURCE[0]}"
    exit 2
    ;;
esac
