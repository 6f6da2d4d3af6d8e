# Teaches CMake what it does not know yet about nvcc, for flashcute's own build and for
# the installed flashcuteConfig.cmake. Both need the CUDA language (C++20 shim) and
# find_package(CUDAToolkit) (CCCL directory) first.

# flashcute_cuda_cxx20_compat()
#
# CMake before 3.25.2 (Debian 12 ships 3.25.1) does not know nvcc's -std=c++20: it
# silently compiles CUDA_STANDARD 20 as C++17 and rejects the cuda_std_20 feature.
# nvcc has the flag since CUDA 12.0. A macro: it sets the variables in the caller's scope.
macro(flashcute_cuda_cxx20_compat)
  if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0
     AND NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
endmacro()

# flashcute_find_cccl_include(<out-var>)
#
# CUDA 13 keeps libcu++, CUB and Thrust under <toolkit>/include/cccl. nvcc searches
# there on its own, but a host compiler does not, and CMake (3.25 at least) does not add
# that directory to CUDA::toolkit or CUDA::cudart: a C++ (not CUDA) translation unit that
# includes CuTe then fails on <cuda/std/utility>. Sets <out-var> to that directory, or to
# "" when the toolkit has none (CUDA 12 keeps those headers in include/ itself).
function(flashcute_find_cccl_include out_var)
  set(found "")
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(IS_DIRECTORY "${dir}/cccl")
      set(found "${dir}/cccl")
      break()
    endif()
  endforeach()
  set(${out_var} "${found}" PARENT_SCOPE)
endfunction()
