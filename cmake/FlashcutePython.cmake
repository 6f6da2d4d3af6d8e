# The Python extension flashcute._C (nanobind), installed into the wheel's flashcute/
# next to the pure-Python package (component python).
#
# It links the CUDA runtime statically, so `import flashcute` works on a machine with
# no GPU driver; errors surface only when a kernel is actually run.

find_package(Python 3.9 COMPONENTS Interpreter Development.Module REQUIRED)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
  OUTPUT_VARIABLE nanobind_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _flashcute_nanobind_result)
if(NOT _flashcute_nanobind_result EQUAL 0)
  message(FATAL_ERROR "flashcute: nanobind is not installed for ${Python_EXECUTABLE}. "
                      "`pip install .` brings it along; for a plain CMake build run "
                      "`${Python_EXECUTABLE} -m pip install nanobind`, or pass -DFLASHCUTE_BUILD_PYTHON=OFF.")
endif()
find_package(nanobind CONFIG REQUIRED)

nanobind_add_module(_C NB_STATIC "${PROJECT_SOURCE_DIR}/src/flashcute_ext.cpp")
target_link_libraries(_C PRIVATE flashcute_kernels CUDA::cudart_static)
target_compile_definitions(_C PRIVATE "FLASHCUTE_VERSION=\"${PROJECT_VERSION}\"")  # flashcute._C.__version__
# flashcute._C.BUILD_OPTIONS: the parsed build options, ","-separated, so that a build's own
# tests can check what it registered against what it was asked for (tests/python/test_module.py).
foreach(_flashcute_opt IN ITEMS ARCH HEAD_DIM DTYPE)
  string(REPLACE ";" "," _flashcute_value "${FLASHCUTE_${_flashcute_opt}_LIST}")
  target_compile_definitions(_C PRIVATE "FLASHCUTE_BUILD_${_flashcute_opt}S=\"${_flashcute_value}\"")
endforeach()
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  # Seen on a machine whose toolchain linked libstdc++ statically into the module: its
  # 4000+ exported C++ runtime symbols crashed a later `import torch`. Export only
  # PyInit__C, whatever the toolchain links in.
  target_link_options(_C PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/src/flashcute_ext.map"
                      "LINKER:--exclude-libs,ALL")
  set_property(TARGET _C APPEND PROPERTY LINK_DEPENDS "${PROJECT_SOURCE_DIR}/src/flashcute_ext.map")
endif()
install(TARGETS _C LIBRARY DESTINATION flashcute COMPONENT python)
