// flashcute._C: the nanobind extension module.
//
// The binding takes any DLPack producer (torch, CuPy, JAX, NumPy, raw DLPack capsules),
// describes each array as a flashcute::TensorRef and hands the call to flashcute::plan_fwd(),
// the library's one validation (include/flashcute/host/validate_fwd.hpp). What it checks itself is
// only what the core cannot see: that an argument is an array at all, the stream handle, and
// (last) the device each array lives on. Errors become Python exceptions:
//   TypeError           not an array, wrong dtype, not a CUDA array       (Status kInvalidType)
//   ValueError          rank, shape, stride, alignment, value, device id  (Status kInvalidArgument)
//   NotImplementedError the dtype / head dim was left out of this build   (Status kNotCompiled)
//   RuntimeError        a CUDA runtime call failed                        (Status kCudaError)
// A validation error also carries the Status's structure as attributes of the exception:
// `arg`, `expected` and `got`.
//
// The device check comes LAST, so that every structural message can be tested with NumPy arrays
// on a machine without a GPU (CI). Only the host headers are included: the kernels live in the
// prebuilt flashcute_kernels library this module links against.
//
// The module is two files around src/ext_common.hpp: ext_ops.cpp defines the calls (src/ops.hpp's
// operations), this one the queries and the module itself.

#include <dlfcn.h>

#include "ext_common.hpp"

#ifdef FLASHCUTE_WITH_XLA_FFI
#include <algorithm>
#include <string>
#include <utility>
// src/xla_ffi.cpp: the XLA FFI handlers, (target name, handler) pairs.
std::vector<std::pair<const char*, void*>> flashcute_xla_ffi_handlers();
#endif

#ifndef FLASHCUTE_VERSION
#define FLASHCUTE_VERSION "0.0.0+unknown"
#endif

using namespace nb::literals;

namespace flashcute_ext {

// The sm80 backward's workspace, or, where the call may run on the sm90 backward, the larger sm90
// one (flashcute::bwd_workspace_floats with the head dim and dtype; head_dim 0: the sm80 size).
int64_t bwd_workspace_floats(int64_t batch, int64_t nheads, int64_t seqlen_q, int head_dim, const std::string& dtype,
                             int device) {
  if (head_dim <= 0) return flashcute::bwd_workspace_floats(batch, nheads, seqlen_q);
  return flashcute::bwd_workspace_floats(batch, nheads, seqlen_q, head_dim, dtype_from_name(dtype.c_str()), device);
}
// The same for a varlen batch of `batch` sequences and total_q queries.
int64_t bwd_varlen_workspace_floats(int64_t batch, int64_t nheads, int64_t total_q, int head_dim,
                                    const std::string& dtype, int device) {
  if (head_dim <= 0) return flashcute::bwd_workspace_floats(1, nheads, total_q);
  return flashcute::bwd_varlen_workspace_floats(batch, nheads, total_q, head_dim, dtype_from_name(dtype.c_str()),
                                                device);
}

// ---------------------------------------------------------------------------
// Device / build queries
// ---------------------------------------------------------------------------

std::pair<int, cudaError_t> query_device_count() {
  int count = 0;
  cudaError_t err;
  {
    nb::gil_scoped_release release;  // the first call loads and initialises the driver
    err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky, but keep the state clean
  }
  if (err != cudaSuccess) count = 0;
  return {count, err};
}

int cuda_device_count() { return query_device_count().first; }

// Whether the CUDA driver library can be loaded at all. Without it the runtime reports
// cudaErrorInsufficientDriver, whose text ("CUDA driver version is insufficient") would send a
// user of a machine without a GPU to upgrade a driver they do not have.
bool driver_library_present() {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) return false;
  dlclose(lib);
  return true;
}

std::string cuda_status() {
  auto [count, err] = query_device_count();
  if ((err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) && !driver_library_present())
    return std::string(cudaGetErrorName(err)) + ": no CUDA driver/GPU found (libcuda.so.1 cannot be loaded)";
  if (err != cudaSuccess) return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  if (count == 0) return "cudaSuccess: no CUDA device found";
  return "cudaSuccess: " + std::to_string(count) + " CUDA device(s)";
}

std::vector<int> compiled_head_dims() {
  std::vector<int> dims;
  for (int hd : flashcute::kKernelHeadDims)
    if (flashcute::kernel_head_dim(hd) == hd) dims.push_back(hd);
  return dims;
}

std::vector<std::string> compiled_dtypes() {
  std::vector<std::string> names;
  for (flashcute::DType d : {flashcute::DType::kFloat16, flashcute::DType::kBFloat16})
    if (flashcute::dtype_compiled(d)) names.emplace_back(flashcute::dtype_name(d));
  return names;
}

std::vector<std::tuple<std::string, std::string, std::string, int>> compiled_kernels() {
  std::vector<std::tuple<std::string, std::string, std::string, int>> list;
  for (const flashcute::KernelKey& key : flashcute::kCompiledKernels)
    list.emplace_back(flashcute::arch_name(key.arch), flashcute::kernel_kind_name(key),
                      flashcute::dtype_name(key.dtype), key.head_dim);
  return list;
}

std::string last_forward_path() { return flashcute::arch_name(flashcute::last_forward_arch().load()); }
std::string last_backward_path() { return flashcute::arch_name(flashcute::last_backward_arch().load()); }

std::tuple<int, int> last_forward_tile() {
  const uint32_t tile = flashcute::last_forward_tile().load();
  return {int(tile >> 16), int(tile & 0xffff)};
}

int kernel_head_dim(int64_t d) {
  if (d <= 0 || d % 8 != 0 || d > flashcute::kMaxHeadDim)
    value_error("headdim must be a multiple of 8 and <= " + std::to_string(flashcute::kMaxHeadDim) + ", got " +
                std::to_string(d));
  return flashcute::kernel_head_dim(static_cast<int>(d));
}

nb::dict xla_ffi_targets() {
  nb::dict targets;
#ifdef FLASHCUTE_WITH_XLA_FFI
  for (const auto& [name, handler] : flashcute_xla_ffi_handlers()) {
    PyObject* capsule = PyCapsule_New(handler, nullptr, nullptr);
    if (!capsule) throw nb::python_error();
    targets[name] = nb::steal(capsule);
  }
#endif
  return targets;
}

}  // namespace flashcute_ext

using namespace flashcute_ext;

NB_MODULE(_C, m) {
  m.doc() =
      "flashcute._C: the compiled core of flashcute (FlashAttention kernels on CUTLASS/CuTe).\n\n"
      "Use flashcute.flash_attn_func(); this module is its low-level backend.";

  m.attr("__version__") = FLASHCUTE_VERSION;
  m.attr("MAX_HEAD_DIM") = flashcute::kMaxHeadDim;
  {
    // The build options as CMake parsed them (flashcute/build_config.hpp), ","-separated.
    nb::dict opts;
    opts["FLASHCUTE_CUDA_ARCHS"] = flashcute::kBuildCudaArchs;
    opts["FLASHCUTE_HEAD_DIMS"] = flashcute::kBuildHeadDims;
    opts["FLASHCUTE_DTYPES"] = flashcute::kBuildDtypes;
    opts["FLASHCUTE_BACKWARD"] = flashcute::kBuildBackward;
    opts["FLASHCUTE_KVCACHE"] = flashcute::kBuildKvcache;
    m.attr("BUILD_OPTIONS") = opts;
  }
  {
    nb::list all;
    for (int hd : flashcute::kKernelHeadDims) all.append(hd);
    m.attr("KERNEL_HEAD_DIMS") = nb::steal<nb::tuple>(PySequence_Tuple(all.ptr()));
  }

  // The arrays are taken as plain objects (None included) so that each entry itself can say which
  // argument is wrong and why, instead of nanobind's generic overload error. Every entry takes
  // either source of arrays: DLPack arrays (device -1, the default) or (data_ptr, shape, strides,
  // dtype name) descriptors on CUDA device `device` (the torch binding's fast path: no DLPack
  // export; the caller checked the devices, and check_stream_device=False says `stream` is the
  // framework's current stream there).
  m.def("fwd", &fwd, "q"_a.none(), "k"_a.none(), "v"_a.none(), "out"_a.none(), "lse"_a.none(), "options"_a,
        "stream"_a, "device"_a = -1, "check_stream_device"_a = true, "cu_seqlens_q"_a.none() = nb::none(),
        "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0,
        "Runs the attention forward pass, writing `out` (and `lse` unless None) on `stream`.\n\n"
        "q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim); float16 or\n"
        "bfloat16, all the same; the last dim contiguous, batch/row/head strides multiples of 8 elements,\n"
        "16-byte aligned. out: like q, writable. lse: None or float32 (batch, nheads, seqlen_q). options:\n"
        "(softmax_scale or None, causal, window_left, window_right, softcap). stream: a cudaStream_t as an\n"
        "int. Never synchronises. Raises TypeError / ValueError naming the argument (with .arg, .expected\n"
        "and .got), NotImplementedError for a dtype / head dim left out of the build, RuntimeError for CUDA\n"
        "errors.\n\n"
        "Variable-length batch: cu_seqlens_q and cu_seqlens_k, int32 (batch + 1,) CUDA arrays, with\n"
        "max_seqlen_q / max_seqlen_k; q, k, v, out are then (total, heads, headdim) and lse (nheads, total_q).");
  m.def("fwd_kvcache", &fwd_kvcache, "q"_a.none(), "k_cache"_a.none(), "v_cache"_a.none(), "out"_a.none(),
        "lse"_a.none(), "k"_a.none(), "v"_a.none(), "cache_seqlens"_a.none(), "block_table"_a.none(),
        "workspace_alloc"_a.none(), "options"_a, "num_splits"_a, "stream"_a, "device"_a = -1,
        "check_stream_device"_a = true,
        "Attention over a KV cache (flash_attn_with_kvcache), writing `out` (and `lse` unless None) on\n"
        "`stream`; returns the number of key splits that ran.\n\n"
        "k_cache, v_cache: (batch, seqlen_cache, nheads_k, headdim), or paged (num_blocks, page_size,\n"
        "nheads_k, headdim) with block_table int32 (batch, max_num_blocks_per_seq). cache_seqlens: None or\n"
        "int32 (batch,). k, v: None or (batch, seqlen_new, nheads_k, headdim), written into the cache at\n"
        "cache_seqlens before attending. num_splits: 0 chooses. workspace_alloc(n): returns a float32\n"
        "array (a descriptor, for descriptors) of n elements, asked only when the keys are split. Never\n"
        "synchronises.");
  m.def("check_fwd", &check_fwd, "q"_a, "k"_a, "v"_a, "options"_a, "cu_seqlens_q"_a.none() = nb::none(),
        "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0,
        "The validation of fwd() for arrays as tracers see them (torch.compile, jax.jit): descriptors whose\n"
        "strides may be None (contiguous); out is taken to be like q. Raises what fwd() would raise for\n"
        "them; launches nothing.");
  m.def("check_options", &check_options, "options"_a, "num_splits"_a = 0, "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0,
        "The rules of the plain arguments (the options tuple of fwd(), num_splits, the varlen max seqlens)\n"
        "alone, as fwd() applies them: raises ValueError naming the argument.");
  m.def("bwd", &bwd, "dout"_a.none(), "q"_a.none(), "k"_a.none(), "v"_a.none(), "out"_a.none(), "lse"_a.none(),
        "dq"_a.none(), "dk"_a.none(), "dv"_a.none(), "workspace"_a.none(), "options"_a, "deterministic"_a, "stream"_a,
        "device"_a = -1, "check_stream_device"_a = true, "cu_seqlens_q"_a.none() = nb::none(),
        "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0, "partial_keys"_a = false,
        "Runs the attention backward pass, writing dq, dk and dv on `stream`.\n\n"
        "dout, dq: like q; dk, dv: like k; out, lse: the forward's; workspace: float32 with at least\n"
        "bwd_workspace_floats(batch, nheads, seqlen_q) elements. partial_keys: k and v are part of the keys\n"
        "out and lse cover (ring attention), so D is rowsum(dout * out) for every row. The same rules and\n"
        "errors as fwd().");
  m.def("merge", &merge, "out_a"_a.none(), "lse_a"_a.none(), "out_b"_a.none(), "lse_b"_a.none(), "out"_a.none(),
        "lse"_a.none(), "stream"_a, "device"_a = -1, "check_stream_device"_a = true,
        "merge_attn_states: writes out and lse, the attention over the union of two disjoint key sets, from\n"
        "each set's (out, lse), on `stream`. out_*: (batch, seqlen, nheads, headdim) or (total, nheads, headdim),\n"
        "float16 / bfloat16 / float32; lse_*: float32 (batch, nheads, seqlen) or (nheads, total). out may be\n"
        "out_a (in place). The same error rules as fwd().");
  m.def("bwd_workspace_floats", &bwd_workspace_floats, "batch"_a, "nheads"_a, "seqlen_q"_a, "head_dim"_a = 0,
        "dtype"_a = "", "device"_a = -1,
        "float32 elements of workspace a backward call of these shapes needs: with head_dim and dtype, on\n"
        "`device` (-1: the current one), enough for the sm90 backward where that may run.");
  m.def("bwd_varlen_workspace_floats", &bwd_varlen_workspace_floats, "batch"_a, "nheads"_a, "total_q"_a,
        "head_dim"_a = 0, "dtype"_a = "", "device"_a = -1,
        "bwd_workspace_floats for a varlen batch of `batch` sequences (len(cu_seqlens_q) - 1) and total_q\n"
        "queries.");
  m.def("xla_ffi_targets", &xla_ffi_targets,
        "The XLA FFI handlers compiled into this build, {name: PyCapsule}, for jax.ffi.register_ffi_target\n"
        "(platform 'CUDA'); empty when the build found no XLA FFI headers (build option FLASHCUTE_XLA_FFI).");
  m.def("cuda_device_count", &cuda_device_count,
        "Number of visible CUDA devices; 0 when cudaGetDeviceCount fails (no driver, no device).");
  m.def("cuda_status", &cuda_status,
        "Why cuda_device_count() returned what it did, e.g. 'cudaErrorInsufficientDriver: no CUDA driver/GPU "
        "found (libcuda.so.1 cannot be loaded)' or 'cudaSuccess: 1 CUDA device(s)'.");
  m.def("compiled_head_dims", &compiled_head_dims, "Kernel head dims compiled into this build, ascending.");
  m.def("compiled_dtypes", &compiled_dtypes, "Dtypes compiled into this build: a subset of ['float16', 'bfloat16'].");
  m.def("compiled_kernels", &compiled_kernels,
        "The kernels compiled into this build, as (family, direction, dtype, head dim) tuples,\n"
        "e.g. ('sm80', 'fwd', 'bfloat16', 128): the list CMake generated (flashcute/build_config.hpp).");
  m.def("last_forward_path", &last_forward_path,
        "The kernel family the last forward launch of this process ran on: 'sm90' (wgmma + TMA, Hopper) or\n"
        "'sm80' (mma.sync); 'sm80' before any launch. A diagnostic for tests and benchmarks.");
  m.def("last_backward_path", &last_backward_path,
        "The kernel family the last backward launch of this process ran on: 'sm90' or 'sm80' (before any\n"
        "launch too). FLASHCUTE_BACKWARD_PATH=sm80 keeps calls off the Hopper backward. A diagnostic.");
  m.def("last_forward_tile", &last_forward_tile,
        "The tile (block_m, block_n) of the kernel the last forward launch of this process ran on; (0, 0)\n"
        "before any. FLASHCUTE_SM90_TILES=auto|base|long chooses the sm90 tiles. A diagnostic.");
  m.def("kernel_head_dim", &kernel_head_dim, "head_dim"_a,
        "The kernel head dim a user head dim runs on (the smallest compiled one >= head_dim), 0 if none.\n"
        "Raises ValueError unless head_dim is a multiple of 8 in [8, 256].");
}
