# `cmake --install <build> --component cpp`: the header-only C++ package.
#
#   <prefix>/include/flashcute/                          flashcute's headers, and build_config.hpp
#   <prefix>/include/flashcute/third_party/cutlass/      the CUTLASS/CuTe headers (third_party/cutlass.cmake)
#   <prefix>/lib/cmake/flashcute/                        flashcuteConfig.cmake and friends
#
# Consumers: find_package(flashcute CONFIG) and link flashcute::flashcute.
# The wheel installs only the component python, so none of this ends up in it.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(_flashcute_cmake_dir "${CMAKE_INSTALL_LIBDIR}/cmake/flashcute")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/flashcute" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT cpp
        PATTERN "*.md" EXCLUDE)
# The list of kernels this build was configured with (cmake/FlashcuteKernelList.cmake).
install(FILES "${FLASHCUTE_GENERATED_INCLUDE_DIR}/flashcute/build_config.hpp"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/flashcute" COMPONENT cpp)
install(TARGETS flashcute_cutlass flashcute_headers flashcute EXPORT flashcuteTargets COMPONENT cpp)
install(EXPORT flashcuteTargets NAMESPACE flashcute:: DESTINATION "${_flashcute_cmake_dir}" COMPONENT cpp)

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/flashcuteConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/flashcuteConfig.cmake" INSTALL_DESTINATION "${_flashcute_cmake_dir}")
# 0.x: a minor version may break the API.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/flashcuteConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/flashcuteConfig.cmake" "${PROJECT_BINARY_DIR}/flashcuteConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/flashcuteCudaCompat.cmake"
        DESTINATION "${_flashcute_cmake_dir}" COMPONENT cpp)
