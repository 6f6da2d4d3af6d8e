# Build options: which GPU architectures, kernel head dims and dtypes get compiled.
#
# Each list option takes ";" or "," as separator ("64,128" survives shells, pip's
# config settings and SKBUILD_CMAKE_DEFINE, where ";" is a separator of its own).
# After this file:
#   FLASHCUTE_ARCH_LIST, FLASHCUTE_HEAD_DIM_LIST, FLASHCUTE_DTYPE_LIST  the parsed lists
#   FLASHCUTE_PORTABLE_ARCH_LIST  the arch list with 90a read as 90: what the sm80 (mma.sync)
#                                 family and every other target build for (with
#                                 FLASHCUTE_ONE_ARCH, its oldest arch alone)
#   FLASHCUTE_SM90A               ON when 90a is listed: the sm90 (wgmma + TMA) family is built
#   CMAKE_CUDA_ARCHITECTURES      SASS for every portable arch, PTX for the newest one
# cmake/FlashcuteKernelList.cmake turns the lists into kernels.
#
# FLASHCUTE_ONE_ARCH=ON compiles each kernel family for one architecture: the sm80 family (and
# the C++ tests and tools) for the oldest arch of FLASHCUTE_CUDA_ARCHS alone, SASS and PTX, and
# the sm90 family for sm_90a as always. Every kernel of the list is still compiled, through
# ptxas to SASS, and each nvcc compiles one architecture instead of two. With the default archs
# "80;90a" the sm80 kernels then have no sm_90 SASS, so an H100 JIT-compiles their PTX at first
# use (its backward, KV-cache and varlen calls). For CI, which runs no kernel (.ci/run sets it),
# and for quicker builds while developing.

set(FLASHCUTE_CUDA_ARCHS "80;90a" CACHE STRING
    "Compute capabilities to build kernels for, 80 or newer (SASS for each, PTX for the newest); 90a adds the Hopper (wgmma + TMA) forward")
set(FLASHCUTE_HEAD_DIMS "32;64;96;128;192;256" CACHE STRING
    "Kernel head dims to build, from 32;64;96;128;192;256 (a head dim runs on the next one built)")
set(FLASHCUTE_DTYPES "fp16;bf16" CACHE STRING "Element types to build: fp16, bf16 or both")
if(SKBUILD)
  set(_flashcute_python_default ON)
else()
  set(_flashcute_python_default OFF)
endif()
option(FLASHCUTE_BACKWARD "Build the backward kernels (dq, dk, dv) beside the forward ones" ON)
option(FLASHCUTE_KVCACHE "Build the KV-cache kernels (flash_attn_with_kvcache: split-KV, paged) beside the forward ones" ON)
option(FLASHCUTE_BUILD_PYTHON "Build the Python extension flashcute._C" ${_flashcute_python_default})
option(FLASHCUTE_BUILD_TESTS "Build the C++ tests and register them with ctest" OFF)
option(FLASHCUTE_TEST_EXAMPLE_DEFAULT_LIST
       "With the tests: also build and run examples/cpp with the installed list of every kernel, in one TU (slow; for GPU machines)" OFF)
option(FLASHCUTE_BUILD_TUNING "Build benchmarks/tune_fwd, tune_bwd, tune_decode and tune_bwd_sm90 (config sweeps; no test runs them)" OFF)
set(FLASHCUTE_ONE_ARCH OFF CACHE STRING
    "ON: compile each kernel family for one architecture (sm80: the oldest of FLASHCUTE_CUDA_ARCHS; sm90: sm_90a), e.g. for CI")
option(FLASHCUTE_PTXAS_VERBOSE "Print each kernel's register and shared-memory use (-Xptxas -v)" OFF)

# _flashcute_parse_list(<option> <out-var>): splits on ";" or ",", strips blanks, drops duplicates.
function(_flashcute_parse_list option out_var)
  string(REPLACE "," ";" items "${${option}}")
  list(TRANSFORM items STRIP)
  list(REMOVE_ITEM items "")
  list(REMOVE_DUPLICATES items)
  if(NOT items)
    message(FATAL_ERROR "${option} is empty: name at least one value.")
  endif()
  set(${out_var} "${items}" PARENT_SCOPE)
endfunction()

# --- head dims (checked against the catalog in cmake/FlashcuteKernelList.cmake) -----------
_flashcute_parse_list(FLASHCUTE_HEAD_DIMS FLASHCUTE_HEAD_DIM_LIST)
list(SORT FLASHCUTE_HEAD_DIM_LIST COMPARE NATURAL)

# --- dtypes (checked against the catalog in cmake/FlashcuteKernelList.cmake) --------------
_flashcute_parse_list(FLASHCUTE_DTYPES FLASHCUTE_DTYPE_LIST)
list(TRANSFORM FLASHCUTE_DTYPE_LIST TOLOWER)

# --- architectures -------------------------------------------------------------------
_flashcute_parse_list(FLASHCUTE_CUDA_ARCHS FLASHCUTE_ARCH_LIST)
foreach(a IN LISTS FLASHCUTE_ARCH_LIST)
  if(NOT a MATCHES "^([0-9]+)[af]?$" OR CMAKE_MATCH_1 LESS 80)
    message(FATAL_ERROR "FLASHCUTE_CUDA_ARCHS: '${a}' is not a compute capability of 80 or more "
                        "(80 for A100, 86 for RTX 30xx, 89 for L4/L40, 90 for H100/H200). "
                        "'native' and 'all' are not accepted: name the GPUs to build for.")
  endif()
endforeach()
list(SORT FLASHCUTE_ARCH_LIST COMPARE NATURAL)
# 90a (sm_90a: wgmma, setmaxnreg) is 90 plus features that run on compute capability 9.0 only.
# Its code is not forward-compatible, so only the sm90 family is built for it; everything else
# builds for 90 in its place, with PTX for the newest portable arch.
set(FLASHCUTE_SM90A OFF)
set(FLASHCUTE_PORTABLE_ARCH_LIST "")
foreach(a IN LISTS FLASHCUTE_ARCH_LIST)
  if(a STREQUAL "90a")
    set(FLASHCUTE_SM90A ON)
    list(APPEND FLASHCUTE_PORTABLE_ARCH_LIST 90)
  elseif(a MATCHES "^([0-9]+)[af]$")
    message(FATAL_ERROR "FLASHCUTE_CUDA_ARCHS: '${a}': of the arch-specific targets only 90a is supported "
                        "(the Hopper forward); name ${CMAKE_MATCH_1} for the portable kernels.")
  else()
    list(APPEND FLASHCUTE_PORTABLE_ARCH_LIST ${a})
  endif()
endforeach()
list(REMOVE_DUPLICATES FLASHCUTE_PORTABLE_ARCH_LIST)
list(SORT FLASHCUTE_PORTABLE_ARCH_LIST COMPARE NATURAL)
# --- one architecture per family (FLASHCUTE_ONE_ARCH) --------------------------------------
string(TOUPPER "${FLASHCUTE_ONE_ARCH}" _flashcute_one_arch)
if(NOT _flashcute_one_arch MATCHES "^(ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
  message(FATAL_ERROR "FLASHCUTE_ONE_ARCH: '${FLASHCUTE_ONE_ARCH}' is not ON or OFF (ON compiles each kernel "
                      "family for one architecture: sm80 for the oldest of FLASHCUTE_CUDA_ARCHS, sm90 for sm_90a).")
endif()
if(FLASHCUTE_ONE_ARCH)
  list(GET FLASHCUTE_PORTABLE_ARCH_LIST 0 _flashcute_oldest_arch)
  set(FLASHCUTE_PORTABLE_ARCH_LIST ${_flashcute_oldest_arch})
endif()
# Targets without a family of their own (tests, examples) build for all of them.
set(CMAKE_CUDA_ARCHITECTURES "${FLASHCUTE_PORTABLE_ARCH_LIST}")
list(TRANSFORM CMAKE_CUDA_ARCHITECTURES APPEND "-real")
list(POP_BACK CMAKE_CUDA_ARCHITECTURES)
list(GET FLASHCUTE_PORTABLE_ARCH_LIST -1 _flashcute_newest_arch)
list(APPEND CMAKE_CUDA_ARCHITECTURES "${_flashcute_newest_arch}")

if(FLASHCUTE_ONE_ARCH)
  message(STATUS "flashcute: FLASHCUTE_ONE_ARCH: one architecture per kernel family (sm80 family: "
                 "${FLASHCUTE_PORTABLE_ARCH_LIST} alone)")
endif()
message(STATUS "flashcute: archs ${FLASHCUTE_ARCH_LIST} (CUDA_ARCHITECTURES ${CMAKE_CUDA_ARCHITECTURES}), "
               "head dims ${FLASHCUTE_HEAD_DIM_LIST}, dtypes ${FLASHCUTE_DTYPE_LIST}")
