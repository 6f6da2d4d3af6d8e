# CUTLASS/CuTe headers, pinned and never committed.
#
# Defines the INTERFACE target flashcute_cutlass (exported as flashcute::cutlass) and
# FLASHCUTE_CUTLASS_INCLUDE_DIR, from the first of:
#   1. -DCUTLASS_DIR=<dir>: any CUTLASS tree with include/cute (a git checkout, an
#      installed nvidia-cutlass wheel's cutlass_library/source, ...);
#   2. third_party/cutlass/include, left by an earlier configure or by hand;
#   3. the nvidia-cutlass wheel pinned in third_party/fetch_headers.py (version and
#      sha256), downloaded with pip at configure time and reduced to its headers.
#
# Needs find_package(CUDAToolkit) first. Installs the headers (component cpp) to
# <prefix>/include/flashcute/third_party/cutlass, out of the way of any other CUTLASS.

set(CUTLASS_DIR "" CACHE PATH "CUTLASS source tree to use instead of the pinned headers (must contain include/cute)")

set(_flashcute_cutlass_local "${CMAKE_CURRENT_LIST_DIR}/cutlass")
if(CUTLASS_DIR)
  if(NOT EXISTS "${CUTLASS_DIR}/include/cute/tensor.hpp")
    message(FATAL_ERROR "CUTLASS_DIR='${CUTLASS_DIR}' has no include/cute/tensor.hpp: "
                        "point it at a CUTLASS tree (the directory that contains include/).")
  endif()
  set(FLASHCUTE_CUTLASS_INCLUDE_DIR "${CUTLASS_DIR}/include")
  message(STATUS "flashcute: CUTLASS headers from CUTLASS_DIR: ${FLASHCUTE_CUTLASS_INCLUDE_DIR}")
elseif(EXISTS "${_flashcute_cutlass_local}/include/cute/tensor.hpp")
  set(FLASHCUTE_CUTLASS_INCLUDE_DIR "${_flashcute_cutlass_local}/include")
  message(STATUS "flashcute: CUTLASS headers from ${FLASHCUTE_CUTLASS_INCLUDE_DIR}")
else()
  if(NOT Python_EXECUTABLE)
    find_package(Python 3.9 COMPONENTS Interpreter REQUIRED)
  endif()
  message(STATUS "flashcute: fetching the pinned CUTLASS headers into ${_flashcute_cutlass_local}")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${CMAKE_CURRENT_LIST_DIR}/fetch_headers.py" cutlass --dest "${_flashcute_cutlass_local}"
    RESULT_VARIABLE _flashcute_fetch_result)
  if(NOT _flashcute_fetch_result EQUAL 0)
    message(FATAL_ERROR
      "flashcute: could not fetch the CUTLASS headers (see the fetch_headers output above). Either\n"
      "  - run `python3 third_party/fetch_headers.py cutlass` on a machine with network access and copy\n"
      "    third_party/cutlass/ into this checkout, or\n"
      "  - pass -DCUTLASS_DIR=<a CUTLASS source tree> (pip: -C cmake.define.CUTLASS_DIR=<dir>).")
  endif()
  set(FLASHCUTE_CUTLASS_INCLUDE_DIR "${_flashcute_cutlass_local}/include")
endif()

include(GNUInstallDirs)
set(FLASHCUTE_CUTLASS_INSTALL_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}/flashcute/third_party/cutlass")

add_library(flashcute_cutlass INTERFACE)
set_target_properties(flashcute_cutlass PROPERTIES EXPORT_NAME cutlass)
# SYSTEM: CUTLASS's own warnings are not ours to fix. (Consumers of the installed,
# imported target get that by default; CMake would not relocate an installed SYSTEM path.)
target_include_directories(flashcute_cutlass SYSTEM INTERFACE "$<BUILD_INTERFACE:${FLASHCUTE_CUTLASS_INCLUDE_DIR}>")
target_include_directories(flashcute_cutlass INTERFACE "$<INSTALL_INTERFACE:${FLASHCUTE_CUTLASS_INSTALL_INCLUDEDIR}>")
include("${PROJECT_SOURCE_DIR}/cmake/flashcuteCudaCompat.cmake")  # flashcute_find_cccl_include()
flashcute_find_cccl_include(_flashcute_cccl)
if(_flashcute_cccl)
  # The installed package finds this directory anew on the consumer's machine (flashcuteConfig.cmake).
  target_include_directories(flashcute_cutlass SYSTEM INTERFACE "$<BUILD_INTERFACE:${_flashcute_cccl}>")
endif()
# CuTe calls constexpr host functions from device code.
target_compile_options(flashcute_cutlass INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)

install(DIRECTORY "${FLASHCUTE_CUTLASS_INCLUDE_DIR}/cute" "${FLASHCUTE_CUTLASS_INCLUDE_DIR}/cutlass"
        DESTINATION "${FLASHCUTE_CUTLASS_INSTALL_INCLUDEDIR}" COMPONENT cpp)
