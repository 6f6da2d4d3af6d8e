# The JAX binding: XLA's FFI handler (src/xla_ffi.cpp), compiled into flashcute._C when XLA's FFI
# API headers are found. They are header-only and come, in order, from
#   1. -DXLA_FFI_INCLUDE_DIR=<dir> (the directory that contains xla/ffi/api/ffi.h);
#   2. the jaxlib installed for the Python that builds flashcute (jax.ffi.include_dir());
#   3. third_party/xla_ffi/include, left by an earlier fetch;
#   4. with FLASHCUTE_XLA_FFI=ON only: the jaxlib wheel pinned in third_party/fetch_headers.py
#      (version and sha256), downloaded with pip and reduced to its three headers.
# FLASHCUTE_XLA_FFI=AUTO (the default) builds without the binding when none of 1-3 is there, and
# says so in one line; OFF never builds it. Nothing of JAX is linked either way.
#
# Defines FLASHCUTE_XLA_FFI_INCLUDE_DIR ("" when the binding is not built).

set(FLASHCUTE_XLA_FFI "AUTO" CACHE STRING "Build the JAX binding (XLA FFI handler): AUTO, ON or OFF")
set_property(CACHE FLASHCUTE_XLA_FFI PROPERTY STRINGS AUTO ON OFF)
set(XLA_FFI_INCLUDE_DIR "" CACHE PATH "Directory with xla/ffi/api/ffi.h (default: the installed jaxlib's)")
string(TOUPPER "${FLASHCUTE_XLA_FFI}" _flashcute_xla_mode)
if(NOT _flashcute_xla_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "FLASHCUTE_XLA_FFI: '${FLASHCUTE_XLA_FFI}' is not AUTO, ON or OFF.")
endif()

set(FLASHCUTE_XLA_FFI_INCLUDE_DIR "")
set(_flashcute_xla_local "${PROJECT_SOURCE_DIR}/third_party/xla_ffi")
if(_flashcute_xla_mode STREQUAL "OFF")
  message(STATUS "flashcute: JAX binding off (FLASHCUTE_XLA_FFI=OFF)")
  return()
endif()
if(XLA_FFI_INCLUDE_DIR)
  if(NOT EXISTS "${XLA_FFI_INCLUDE_DIR}/xla/ffi/api/ffi.h")
    message(FATAL_ERROR "XLA_FFI_INCLUDE_DIR='${XLA_FFI_INCLUDE_DIR}' has no xla/ffi/api/ffi.h.")
  endif()
  set(FLASHCUTE_XLA_FFI_INCLUDE_DIR "${XLA_FFI_INCLUDE_DIR}")
endif()
if(NOT FLASHCUTE_XLA_FFI_INCLUDE_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import jax.ffi; print(jax.ffi.include_dir())"
    OUTPUT_VARIABLE _flashcute_jax_include OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
    RESULT_VARIABLE _flashcute_jax_result)
  if(_flashcute_jax_result EQUAL 0 AND EXISTS "${_flashcute_jax_include}/xla/ffi/api/ffi.h")
    set(FLASHCUTE_XLA_FFI_INCLUDE_DIR "${_flashcute_jax_include}")
  endif()
endif()
if(NOT FLASHCUTE_XLA_FFI_INCLUDE_DIR AND EXISTS "${_flashcute_xla_local}/include/xla/ffi/api/ffi.h")
  set(FLASHCUTE_XLA_FFI_INCLUDE_DIR "${_flashcute_xla_local}/include")
endif()
if(NOT FLASHCUTE_XLA_FFI_INCLUDE_DIR AND _flashcute_xla_mode STREQUAL "ON")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/third_party/fetch_headers.py" xla_ffi
            --dest "${_flashcute_xla_local}"
    RESULT_VARIABLE _flashcute_fetch_result)
  if(NOT _flashcute_fetch_result EQUAL 0)
    message(FATAL_ERROR "flashcute: FLASHCUTE_XLA_FFI=ON, but no jaxlib is installed for ${Python_EXECUTABLE} and "
                        "the pinned headers could not be fetched (see above). Install jax, pass "
                        "-DXLA_FFI_INCLUDE_DIR=<dir>, or run `python3 third_party/fetch_headers.py xla_ffi` online.")
  endif()
  set(FLASHCUTE_XLA_FFI_INCLUDE_DIR "${_flashcute_xla_local}/include")
endif()

if(FLASHCUTE_XLA_FFI_INCLUDE_DIR)
  message(STATUS "flashcute: JAX binding (XLA FFI) with the headers in ${FLASHCUTE_XLA_FFI_INCLUDE_DIR}")
else()
  message(STATUS "flashcute: no XLA FFI headers (no jaxlib for ${Python_EXECUTABLE}): building without the JAX "
                 "binding; FLASHCUTE_XLA_FFI=ON fetches the pinned headers")
endif()
