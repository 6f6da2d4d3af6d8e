#!/usr/bin/env bash
# scripts/device_ab.sh: same-machine A/B of kernel variants, for the GPU machine.
#
# Builds the working tree (variant "A") and one copy of it per variant script, in parallel, each
# with only the head dims it needs, then runs the bench on every build in turn, twice (A, B, ...,
# A, B, ...), so that each comparison is taken on one machine within a minute: a fresh machine
# moves results by up to 8% (docs/perf-notes.md). Optionally runs pytest on A and ncu on A.
#
#   scripts/device_ab.sh VARIANT.sh [VARIANT.sh ...]
#
# A variant script runs in its copy's root with $ROOT set to the working tree; it edits the copy
# (typically a sed on include/flashcute/sm90/config.hpp) and exits non-zero if the edit did not
# apply. VARIANT.dims beside it, if present, holds its head dims (default: $DIMS). Example:
#   sed -i 's/case 64: return {\(.*\)};/case 64: return {\1, .stages = 3};/' include/flashcute/sm90/config.hpp
#   grep -q "stages = 3" include/flashcute/sm90/config.hpp
#
# A variant can also apply a patch carried with the checkout: `patch -p1 < "$ROOT/build/ab/x.patch"`.
#
# Environment: DIMS (A's head dims, default 64,128,256), DTYPES (default bf16), BENCH_ARGS (more
# bench arguments, e.g. "--seqlens 1024,8192"), BENCH=decode (time `flashcute.bench decode` at the
# first head dim of each build instead of the forward grid; builds the KV-cache kernels), PYTEST (pytest targets run on A, e.g.
# tests/python/test_forward_path.py), NCU=1 (ncu --set full on A over scripts/ncu_fwd.py, or with
# BENCH=decode scripts/ncu_decode.py; NCU_SHAPES picks its shapes, e.g. 64:causal:1024 or 16:16384),
# PYTEST_TIMEOUT (seconds one test may take, default 120),
# BENCH_TIMEOUT (seconds one bench run may take, default 240: a variant that hangs loses its own
# runs only), EXTRA (a shell command run last with A's package on PYTHONPATH, e.g. a bench with
# FLASHCUTE_SM90_TILES set; its output goes to the log).
# Everything lands in $OUT/results.tgz (the device returns at most 8 files).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
OUT="${OUT:-$PWD/build/device-out}"
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
DIMS=${DIMS:-64,128,256}
KVCACHE=OFF
[[ "${BENCH:-fwd}" == decode ]] && KVCACHE=ON
NB=$(python3 -c "import nanobind; print(nanobind.cmake_dir())")

build() {  # build NAME SRC DIMS: configure and build flashcute._C, stage it as a package in $WORK/pkg_NAME
  cmake -S "$2" -B "$WORK/b_$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCUTE_CUDA_ARCHS=90a \
    -DFLASHCUTE_HEAD_DIMS="$3" -DFLASHCUTE_DTYPES="${DTYPES:-bf16}" -DFLASHCUTE_BACKWARD=OFF \
    -DFLASHCUTE_KVCACHE="$KVCACHE" -DFLASHCUTE_BUILD_TESTS=OFF -DFLASHCUTE_BUILD_PYTHON=ON \
    -DFLASHCUTE_PTXAS_VERBOSE=ON -Dnanobind_DIR="$NB" > "$WORK/cfg_$1.log" 2>&1
  cmake --build "$WORK/b_$1" --target _C flashcute_C_stub -j 16 > "$WORK/build_$1.log" 2>&1
  local rc=$?
  mkdir -p "$WORK/pkg_$1" && cp -r "$2/python/flashcute" "$WORK/pkg_$1/" && cp "$WORK"/b_$1/_C*.so "$WORK/pkg_$1/flashcute/"
  cp "$WORK/b_$1/_C.pyi" "$WORK/pkg_$1/flashcute/" 2> /dev/null  # the stub test_module.py checks
  echo "build $1: rc $rc, $(grep -c 'spill stores' "$WORK/build_$1.log") kernels, $(grep -h 'C7518' "$WORK/build_$1.log" | wc -l) wgmma serialisation warnings"
}

t0=$SECONDS
VARS=(A)
declare -A VDIMS=([A]=$DIMS)
build A "$ROOT" "$DIMS" &
for script in "$@"; do
  name=$(basename "$script" .sh)
  VARS+=("$name")
  mkdir -p "$WORK/src_$name"
  tar --exclude=./build --exclude=./third_party/cutlass --exclude=./.deps --exclude=./.git -cf - . | tar -xf - -C "$WORK/src_$name"
  ln -s "$ROOT/third_party/cutlass" "$WORK/src_$name/third_party/cutlass"
  dims=$(cat "${script%.sh}.dims" 2> /dev/null || echo "$DIMS")
  VDIMS[$name]=$dims
  if (cd "$WORK/src_$name" && ROOT=$ROOT bash "$ROOT/$script"); then
    build "$name" "$WORK/src_$name" "$dims" &
  else
    echo "variant $name: the script did not apply"
  fi
done
wait
echo "builds: ${VARS[*]} in $((SECONDS - t0)) s"

bench() {  # bench REP
  local name
  for name in "${VARS[@]}"; do
    echo "== bench $name rep $1"
    if [[ "${BENCH:-fwd}" == decode ]]; then
      PYTHONPATH="$WORK/pkg_$name" timeout "${BENCH_TIMEOUT:-240}" python3 -m flashcute.bench decode \
        --headdim "${VDIMS[$name]%%,*}" ${BENCH_ARGS:-} --out-dir "$WORK/bench_${name}_$1" 2>&1 | grep "^ *graph\|^ *eager\|rror\|summary"
      continue
    fi
    PYTHONPATH="$WORK/pkg_$name" timeout "${BENCH_TIMEOUT:-240}" python3 -m flashcute.bench --headdims "${VDIMS[$name]}" --dtype "${DTYPES:-bf16}" ${BENCH_ARGS:-} \
      --impls flashcute,sdpa-cudnn --no-plot --out-dir "$WORK/bench_${name}_$1" 2>&1 | grep "d=\|rror\|runs on\|matmul"
  done
}
# Each test gets PYTEST_TIMEOUT seconds (pytest-timeout, which the device has): a variant whose
# kernel hangs then fails one test instead of taking the whole call (a hung A/B once cost a call).
[[ -n "${PYTEST:-}" ]] && PYTHONPATH="$WORK/pkg_A" python3 -m pytest --timeout="${PYTEST_TIMEOUT:-120}" \
  --timeout-method=thread $PYTEST -q -rs 2>&1 | tail -25
bench 1
if [[ -n "${NCU:-}" ]]; then
  ncu_target=(scripts/ncu_fwd.py)
  [[ "${BENCH:-fwd}" == decode ]] && ncu_target=(scripts/ncu_decode.py --headdim "${DIMS%%,*}")
  PYTHONPATH="$WORK/pkg_A" timeout 300 ncu --clock-control none --set full --nvtx --nvtx-include "prof/" \
    -o "$WORK/prof" -f python3 "${ncu_target[@]}" ${NCU_SHAPES:+--shapes "$NCU_SHAPES"} > "$WORK/ncu.log" 2>&1
  echo "ncu: rc $?"
  ncu --import "$WORK/prof.ncu-rep" --page details > "$WORK/ncu_details.txt" 2>&1
  ncu --import "$WORK/prof.ncu-rep" --page raw --csv > "$WORK/ncu_raw.csv" 2>&1
  ncu --import "$WORK/prof.ncu-rep" --page source --csv --print-source sass --kernel-name regex:fwd_kernel \
    --launch-count 1 > "$WORK/ncu_source_first.csv" 2>&1
  if [[ "${BENCH:-fwd}" == decode ]]; then
    ncu --import "$WORK/prof.ncu-rep" --page source --csv --print-source sass --kernel-name regex:combine_kernel \
      --launch-count 1 > "$WORK/ncu_source_combine.csv" 2>&1
  fi
  rm -f "$WORK/prof.ncu-rep"
fi
bench 2
if [[ -n "${EXTRA:-}" ]]; then
  echo "== extra on A: $EXTRA"
  PYTHONPATH="$WORK/pkg_A" timeout "${BENCH_TIMEOUT:-240}" bash -c "$EXTRA" 2>&1
fi
mkdir -p "$OUT"
(cd "$WORK" && tar czf "$OUT/results.tgz" --exclude='./b_*' --exclude='./src_*' --exclude='./pkg_*' .)
ls -la "$OUT"
