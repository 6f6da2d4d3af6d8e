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

include(FlashcuteXlaFfi)
nanobind_add_module(_C NB_STATIC "${PROJECT_SOURCE_DIR}/src/flashcute_ext.cpp" "${PROJECT_SOURCE_DIR}/src/ext_ops.cpp")
target_link_libraries(_C PRIVATE flashcute_kernels CUDA::cudart_static)
if(FLASHCUTE_XLA_FFI_INCLUDE_DIR)
  target_sources(_C PRIVATE "${PROJECT_SOURCE_DIR}/src/xla_ffi.cpp")
  target_include_directories(_C SYSTEM PRIVATE "${FLASHCUTE_XLA_FFI_INCLUDE_DIR}")
  target_compile_definitions(_C PRIVATE FLASHCUTE_WITH_XLA_FFI)
endif()
target_compile_definitions(_C PRIVATE "FLASHCUTE_VERSION=\"${PROJECT_VERSION}\"")  # flashcute._C.__version__
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  # Seen on a machine whose toolchain linked libstdc++ statically into the module: its
  # 4000+ exported C++ runtime symbols crashed a later `import torch`. Export only
  # PyInit__C, whatever the toolchain links in.
  target_link_options(_C PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/src/flashcute_ext.map"
                      "LINKER:--exclude-libs,ALL")
  set_property(TARGET _C APPEND PROPERTY LINK_DEPENDS "${PROJECT_SOURCE_DIR}/src/flashcute_ext.map")
endif()
install(TARGETS _C LIBRARY DESTINATION flashcute COMPONENT python)

# flashcute/_C.pyi, generated from the built module by nanobind's stubgen (signatures and
# docstrings as the module has them), installed beside it.
nanobind_add_stub(flashcute_C_stub MODULE _C OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/_C.pyi"
                  PYTHON_PATH "$<TARGET_FILE_DIR:_C>" DEPENDS _C)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/_C.pyi" DESTINATION flashcute COMPONENT python)
