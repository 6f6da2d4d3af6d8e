# flashcute_kernels: the prebuilt launch_fwd<dtype, head dim> instantiations.
#
# One generated translation unit per dtype x kernel head dim (from
# src/fwd_instantiation.cu.in), so that a parallel build compiles them side by side.
# FLASHCUTE_ENABLE_* are PUBLIC: every translation unit that includes flashcute/api.hpp,
# the library's and its consumers' (the Python extension, the tests), sees the same set.

set(_flashcute_generated_dir "${PROJECT_BINARY_DIR}/generated")
set(_flashcute_kernel_sources "")
foreach(_flashcute_dtype IN LISTS FLASHCUTE_DTYPE_LIST)
  if(_flashcute_dtype STREQUAL "fp16")
    set(FLASHCUTE_DTYPE_ENUM "DType::kFloat16")
  else()
    set(FLASHCUTE_DTYPE_ENUM "DType::kBFloat16")
  endif()
  foreach(FLASHCUTE_HEAD_DIM IN LISTS FLASHCUTE_HEAD_DIM_LIST)
    set(_flashcute_tu "${_flashcute_generated_dir}/fwd_${_flashcute_dtype}_hdim${FLASHCUTE_HEAD_DIM}.cu")
    configure_file("${PROJECT_SOURCE_DIR}/src/fwd_instantiation.cu.in" "${_flashcute_tu}" @ONLY)
    list(APPEND _flashcute_kernel_sources "${_flashcute_tu}")
  endforeach()
endforeach()
list(LENGTH _flashcute_kernel_sources _flashcute_kernel_count)

add_library(flashcute_kernels STATIC ${_flashcute_kernel_sources})
set_target_properties(flashcute_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(flashcute_kernels PUBLIC flashcute_headers CUDA::cudart_static)
target_compile_definitions(flashcute_kernels PUBLIC ${FLASHCUTE_ENABLE_DEFINITIONS})

set(_flashcute_nvcc_flags --use_fast_math -lineinfo)
list(LENGTH FLASHCUTE_ARCH_LIST _flashcute_arch_count)
if(_flashcute_arch_count GREATER 1)
  list(APPEND _flashcute_nvcc_flags --threads=2)  # compile the architectures of one TU in parallel
endif()
if(FLASHCUTE_PTXAS_VERBOSE)
  list(APPEND _flashcute_nvcc_flags -Xptxas=-v)
endif()
target_compile_options(flashcute_kernels PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:${_flashcute_nvcc_flags}>")

# Report how long the kernels took: a timestamp before the first kernel TU compiles,
# the elapsed time once the library is archived ("flashcute: kernels (12 instantiations) built in 300 s").
set(_flashcute_timer_stamp "${PROJECT_BINARY_DIR}/flashcute_kernels.start")
add_custom_target(flashcute_kernels_timer
  COMMAND "${CMAKE_COMMAND}" -DACTION=start "-DSTAMP=${_flashcute_timer_stamp}"
          -P "${PROJECT_SOURCE_DIR}/cmake/BuildTimer.cmake"
  VERBATIM)
add_dependencies(flashcute_kernels flashcute_kernels_timer)
add_custom_command(TARGET flashcute_kernels POST_BUILD
  COMMAND "${CMAKE_COMMAND}" -DACTION=stop "-DSTAMP=${_flashcute_timer_stamp}"
          "-DWHAT=kernels (${_flashcute_kernel_count} instantiations)" -P "${PROJECT_SOURCE_DIR}/cmake/BuildTimer.cmake"
  VERBATIM)
