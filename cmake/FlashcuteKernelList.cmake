# The list of kernels: the one place that says which kernels exist and which a build compiles.
#
# From the catalog below and the build options (cmake/FlashcuteOptions.cmake) this file makes
#   - one generated translation unit per kernel, from src/kernel.cu.in, each explicitly
#     instantiating one launch function, compiled only for its family's architectures;
#   - flashcute/build_config.hpp (from src/build_config.hpp.in), which names the same kernels in
#     flashcute::kCompiledKernels: the host dispatch, the validation, the Python module and the
#     tests read that, never a list of their own;
#   - the static library flashcute_kernels.
#
# A kernel is (family, kind, dtype, head dim). Families:
#   sm80  mma.sync + cp.async (include/flashcute/sm80), for every arch in FLASHCUTE_CUDA_ARCHS
#         (90a read as 90; with FLASHCUTE_ONE_ARCH the oldest alone), every kind.
#   sm90  wgmma + TMA + warp specialisation (include/flashcute/sm90), the forward and (for the head
#         dims of _flashcute_sm90_bwd_head_dims) the backward, built for 90a-real alone, when
#         FLASHCUTE_CUDA_ARCHS names 90a.
# A kind is a direction (fwd, bwd) and a variant of it: fwd and bwd are the plain ones, splitkv
# is the forward over a KV cache (FLASHCUTE_KVCACHE). The kind names the generated TU
# (sm80_splitkv_bf16_hdim64) and its launch function (sm80::launch_splitkv).

# --- the catalog ---------------------------------------------------------------------------
# Head dims with a tile config in include/flashcute/sm80/config.hpp (static_assert-ed there).
set(FLASHCUTE_CATALOG_HEAD_DIMS 32 64 96 128 192 256)
set(FLASHCUTE_CATALOG_DTYPES fp16 bf16)
set(_flashcute_dtype_enum_fp16 kFloat16)
set(_flashcute_dtype_enum_bf16 kBFloat16)
set(FLASHCUTE_FAMILIES sm80)
if(FLASHCUTE_SM90A)
  list(APPEND FLASHCUTE_FAMILIES sm90)
endif()
set(_flashcute_sm80_kinds fwd)
set(_flashcute_sm90_kinds fwd)
if(FLASHCUTE_KVCACHE)
  list(APPEND _flashcute_sm80_kinds splitkv)
endif()
if(FLASHCUTE_BACKWARD)
  list(APPEND _flashcute_sm80_kinds bwd)
  list(APPEND _flashcute_sm90_kinds bwd)
endif()
# Each kind's direction, variant (flashcute::Direction, flashcute::Variant) and params type.
set(_flashcute_kind_fwd fwd plain FwdParams)
set(_flashcute_kind_splitkv fwd splitkv FwdParams)
set(_flashcute_kind_bwd bwd plain BwdParams)
set(_flashcute_sm80_archs ${FLASHCUTE_PORTABLE_ARCH_LIST})  # the mma.sync path runs everywhere from sm80 on
set(_flashcute_sm90_archs 90a)  # wgmma and setmaxnreg: compute capability 9.0 only, no PTX
# Head dims whose sm90 forward has a second, long-sequence tile config (sm90::long_fwd_config in
# include/flashcute/sm90/config.hpp; a head dim listed here without one fails a static_assert, one
# missing here fails the link): one more TU each,
# sm90_fwd_<dtype>_hdim<d>_long, instantiating sm90::launch_fwd_long. Not a kernel of its own in
# the list: the dispatch picks between the two per call. Every sm90 forward kernel also has a
# varlen twin in a TU of its own, sm90_fwd_<dtype>_hdim<d>_varlen (sm90::launch_fwd_varlen), which
# the dispatch takes for calls with cu_seqlens, and with FLASHCUTE_KVCACHE a KV-cache twin,
# sm90_fwd_<dtype>_hdim<d>_kvcache (sm90::launch_fwd_kvcache), for KV-cache calls.
set(_flashcute_sm90_long_head_dims 64)
# Head dims with an sm90 backward (sm90::default_bwd_config in include/flashcute/sm90/config.hpp);
# the others' backward runs on the sm80 kernels.
set(_flashcute_sm90_bwd_head_dims 64 128 192 256)

foreach(d IN LISTS FLASHCUTE_HEAD_DIM_LIST)
  if(NOT d IN_LIST FLASHCUTE_CATALOG_HEAD_DIMS)
    message(FATAL_ERROR "FLASHCUTE_HEAD_DIMS: '${d}' is not a kernel head dim. Choose from "
                        "${FLASHCUTE_CATALOG_HEAD_DIMS}; other head dims (multiples of 8) run on the next one up.")
  endif()
endforeach()
foreach(t IN LISTS FLASHCUTE_DTYPE_LIST)
  if(NOT t IN_LIST FLASHCUTE_CATALOG_DTYPES)
    message(FATAL_ERROR "FLASHCUTE_DTYPES: '${t}' is not supported. Choose from ${FLASHCUTE_CATALOG_DTYPES}.")
  endif()
endforeach()

# --- the list ------------------------------------------------------------------------------
# _flashcute_enumerator(<out> <name>): the C++ enumerator of a family, direction or variant, sm80 -> kSm80.
function(_flashcute_enumerator out name)
  string(SUBSTRING "${name}" 0 1 first)
  string(SUBSTRING "${name}" 1 -1 rest)
  string(TOUPPER "${first}" first)
  set(${out} "k${first}${rest}" PARENT_SCOPE)
endfunction()

set(_flashcute_generated_dir "${PROJECT_BINARY_DIR}/generated")
set(_flashcute_kernel_entries "")  # FLASHCUTE_KERNEL(...) spellings for build_config.hpp
set(_flashcute_object_libraries "")
set(FLASHCUTE_KERNEL_NAMES "")
foreach(_family IN LISTS FLASHCUTE_FAMILIES)
  set(_sources "")
  foreach(_kind IN LISTS _flashcute_${_family}_kinds)
    list(GET _flashcute_kind_${_kind} 0 _direction)
    list(GET _flashcute_kind_${_kind} 1 _variant)
    _flashcute_enumerator(_family_enum "${_family}")
    _flashcute_enumerator(_direction_enum "${_direction}")
    set(_variant_arg "")  # FLASHCUTE_KERNEL's optional fifth argument, for the variants but plain
    if(NOT _variant STREQUAL "plain")
      _flashcute_enumerator(_variant_enum "${_variant}")
      set(_variant_arg ", ${_variant_enum}")
    endif()
    foreach(_dtype IN LISTS FLASHCUTE_DTYPE_LIST)
      foreach(_hdim IN LISTS FLASHCUTE_HEAD_DIM_LIST)
        if(_family STREQUAL "sm90" AND _kind STREQUAL "bwd" AND NOT _hdim IN_LIST _flashcute_sm90_bwd_head_dims)
          continue()
        endif()
        set(KERNEL_NAME "${_family}_${_kind}_${_dtype}_hdim${_hdim}")
        set(KERNEL_FAMILY "${_family}")
        set(KERNEL_KIND "${_kind}")
        set(KERNEL_DIRECTION "${_direction}")
        set(KERNEL_VARIANT "${_variant}")
        set(KERNEL_DTYPE "${_flashcute_dtype_enum_${_dtype}}")
        set(KERNEL_HEAD_DIM "${_hdim}")
        list(GET _flashcute_kind_${_kind} 2 KERNEL_PARAMS)
        set(KERNEL_TILES "")
        set(KERNEL_TILES_NOTE "")
        configure_file("${PROJECT_SOURCE_DIR}/src/kernel.cu.in" "${_flashcute_generated_dir}/${KERNEL_NAME}.cu" @ONLY)
        list(APPEND _sources "${_flashcute_generated_dir}/${KERNEL_NAME}.cu")
        list(APPEND FLASHCUTE_KERNEL_NAMES "${KERNEL_NAME}")
        if(_family STREQUAL "sm90" AND _kind STREQUAL "fwd" AND _hdim IN_LIST _flashcute_sm90_long_head_dims)
          set(KERNEL_TILES "_long")
          set(KERNEL_TILES_NOTE ", long-sequence tiles")
          configure_file("${PROJECT_SOURCE_DIR}/src/kernel.cu.in" "${_flashcute_generated_dir}/${KERNEL_NAME}_long.cu"
                         @ONLY)
          list(APPEND _sources "${_flashcute_generated_dir}/${KERNEL_NAME}_long.cu")
          list(APPEND FLASHCUTE_KERNEL_NAMES "${KERNEL_NAME}_long")
        endif()
        if(_family STREQUAL "sm90" AND _kind STREQUAL "fwd")  # varlen batches: sm90::launch_fwd_varlen
          set(KERNEL_TILES "_varlen")
          set(KERNEL_TILES_NOTE ", variable-length batch")
          configure_file("${PROJECT_SOURCE_DIR}/src/kernel.cu.in" "${_flashcute_generated_dir}/${KERNEL_NAME}_varlen.cu"
                         @ONLY)
          list(APPEND _sources "${_flashcute_generated_dir}/${KERNEL_NAME}_varlen.cu")
          list(APPEND FLASHCUTE_KERNEL_NAMES "${KERNEL_NAME}_varlen")
        endif()
        if(_family STREQUAL "sm90" AND _kind STREQUAL "fwd" AND FLASHCUTE_KVCACHE)  # sm90::launch_fwd_kvcache
          set(KERNEL_TILES "_kvcache")
          set(KERNEL_TILES_NOTE ", KV cache")
          configure_file("${PROJECT_SOURCE_DIR}/src/kernel.cu.in" "${_flashcute_generated_dir}/${KERNEL_NAME}_kvcache.cu"
                         @ONLY)
          list(APPEND _sources "${_flashcute_generated_dir}/${KERNEL_NAME}_kvcache.cu")
          list(APPEND FLASHCUTE_KERNEL_NAMES "${KERNEL_NAME}_kvcache")
        endif()
        if(_family STREQUAL "sm80" AND _kind STREQUAL "splitkv")  # decode calls: sm80::launch_splitkv_decode(_paged)
          foreach(_twin decode decode_paged)
            set(KERNEL_TILES "_${_twin}")
            string(REPLACE "_" ", " KERNEL_TILES_NOTE ", ${_twin}")
            configure_file("${PROJECT_SOURCE_DIR}/src/kernel.cu.in" "${_flashcute_generated_dir}/${KERNEL_NAME}_${_twin}.cu"
                           @ONLY)
            list(APPEND _sources "${_flashcute_generated_dir}/${KERNEL_NAME}_${_twin}.cu")
            list(APPEND FLASHCUTE_KERNEL_NAMES "${KERNEL_NAME}_${_twin}")
          endforeach()
        endif()
        list(APPEND _flashcute_kernel_entries
             "FLASHCUTE_KERNEL(${_family_enum}, ${_direction_enum}, ${KERNEL_DTYPE}, ${_hdim}${_variant_arg})")
      endforeach()
    endforeach()
  endforeach()
  if(_sources AND _family STREQUAL "sm80")
    list(APPEND _sources "${PROJECT_SOURCE_DIR}/src/merge.cu")  # merge_attn_states, every dtype
    if(FLASHCUTE_KVCACHE)
      list(APPEND _sources "${PROJECT_SOURCE_DIR}/src/kvcache.cu")  # append and combine, every dtype
    endif()
  endif()
  if(_sources)
    # One object library per family: its own CUDA_ARCHITECTURES (SASS for each arch, PTX for the newest).
    set(_archs ${_flashcute_${_family}_archs})
    list(TRANSFORM _archs APPEND "-real" OUTPUT_VARIABLE _cuda_archs)
    if(NOT _family STREQUAL "sm90")  # PTX for the newest, except sm_90a code: it runs nowhere else
      list(POP_BACK _cuda_archs)
      list(GET _archs -1 _newest)
      list(APPEND _cuda_archs "${_newest}")
    endif()
    add_library(flashcute_kernels_${_family} OBJECT ${_sources})
    set_target_properties(flashcute_kernels_${_family} PROPERTIES
      CUDA_ARCHITECTURES "${_cuda_archs}" POSITION_INDEPENDENT_CODE ON)
    target_link_libraries(flashcute_kernels_${_family} PRIVATE flashcute_headers)
    list(LENGTH _archs _arch_count)
    set(_flags --use_fast_math -lineinfo)
    if(_arch_count GREATER 1)
      list(APPEND _flags --threads=2)  # compile the architectures of one TU in parallel
    endif()
    if(_family STREQUAL "sm90")
      # NDEBUG keeps CUTLASS's debug checks out of the kernels.
      list(APPEND _flags -DNDEBUG)
    endif()
    if(FLASHCUTE_PTXAS_VERBOSE)
      list(APPEND _flags -Xptxas=-v)
    endif()
    target_compile_options(flashcute_kernels_${_family} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:${_flags}>")
    list(APPEND _flashcute_object_libraries flashcute_kernels_${_family})
  endif()
endforeach()
list(LENGTH FLASHCUTE_KERNEL_NAMES _flashcute_kernel_count)

# --- flashcute/build_config.hpp ----------------------------------------------------------------
string(REPLACE ";" ", " BUILD_CATALOG_HEAD_DIMS "${FLASHCUTE_CATALOG_HEAD_DIMS}")
string(REPLACE ";" "," BUILD_CUDA_ARCHS "${FLASHCUTE_ARCH_LIST}")
string(REPLACE ";" "," BUILD_HEAD_DIMS "${FLASHCUTE_HEAD_DIM_LIST}")
string(REPLACE ";" "," BUILD_DTYPES "${FLASHCUTE_DTYPE_LIST}")
if(FLASHCUTE_BACKWARD)
  set(BUILD_BACKWARD "ON")
else()
  set(BUILD_BACKWARD "OFF")
endif()
if(FLASHCUTE_KVCACHE)
  set(BUILD_KVCACHE "ON")
else()
  set(BUILD_KVCACHE "OFF")
endif()
string(REPLACE ";" ", \\\n    " BUILD_KERNEL_LIST "${_flashcute_kernel_entries}")
configure_file("${PROJECT_SOURCE_DIR}/src/build_config.hpp.in"
               "${FLASHCUTE_GENERATED_INCLUDE_DIR}/flashcute/build_config.hpp" @ONLY)

# --- the library -----------------------------------------------------------------------------
set(_flashcute_objects "")
foreach(_lib IN LISTS _flashcute_object_libraries)
  list(APPEND _flashcute_objects "$<TARGET_OBJECTS:${_lib}>")
endforeach()
add_library(flashcute_kernels STATIC ${_flashcute_objects})
set_target_properties(flashcute_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON LINKER_LANGUAGE CUDA)
target_link_libraries(flashcute_kernels PUBLIC flashcute_headers CUDA::cudart_static)

# Report how long the kernels took: a timestamp before the first kernel TU compiles, the elapsed
# time once the library is archived ("flashcute: kernels (12 instantiations) built in 300 s").
set(_flashcute_timer_stamp "${PROJECT_BINARY_DIR}/flashcute_kernels.start")
add_custom_target(flashcute_kernels_timer
  COMMAND "${CMAKE_COMMAND}" -DACTION=start "-DSTAMP=${_flashcute_timer_stamp}"
          -P "${PROJECT_SOURCE_DIR}/cmake/BuildTimer.cmake"
  VERBATIM)
foreach(_lib IN LISTS _flashcute_object_libraries)
  add_dependencies(${_lib} flashcute_kernels_timer)
endforeach()
add_custom_command(TARGET flashcute_kernels POST_BUILD
  COMMAND "${CMAKE_COMMAND}" -DACTION=stop "-DSTAMP=${_flashcute_timer_stamp}"
          "-DWHAT=kernels (${_flashcute_kernel_count} instantiations)" -P "${PROJECT_SOURCE_DIR}/cmake/BuildTimer.cmake"
  VERBATIM)
message(STATUS "flashcute: ${_flashcute_kernel_count} kernels: ${FLASHCUTE_KERNEL_NAMES}")
