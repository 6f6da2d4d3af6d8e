// flashcute._C: the nanobind extension module.
//
// The binding takes any DLPack producer (torch, CuPy, JAX, NumPy, raw DLPack
// capsules), checks everything the kernels rely on, fills a
// flashcute::FwdParams and calls flashcute::run_fwd() on the caller's stream.
//
// Error policy: every problem is reported as a Python exception whose message
// starts with the name of the offending argument:
//   TypeError           not an array, wrong dtype, not a CUDA array
//   ValueError          rank, shape, stride, alignment, value, device id
//   NotImplementedError the dtype / head dim was left out of this build
//   RuntimeError        a CUDA runtime call failed
// The checks run in a fixed order and the device check comes LAST, so that
// every structural message can be tested with NumPy arrays on a machine
// without a GPU (CI).
//
// Only flashcute/api.hpp is included: the kernels themselves live in the
// prebuilt flashcute_kernels library this module links against.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "flashcute/api.hpp"

#ifndef FLASHCUTE_VERSION
#define FLASHCUTE_VERSION "0.0.0+unknown"
#endif
// The build options as CMake parsed them (cmake/FlashcutePython.cmake); "" when built some other way.
#ifndef FLASHCUTE_BUILD_ARCHS
#define FLASHCUTE_BUILD_ARCHS ""
#endif
#ifndef FLASHCUTE_BUILD_HEAD_DIMS
#define FLASHCUTE_BUILD_HEAD_DIMS ""
#endif
#ifndef FLASHCUTE_BUILD_DTYPES
#define FLASHCUTE_BUILD_DTYPES ""
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Read-only import is the most permissive one nanobind offers: a producer that
// flags its export read-only (JAX may) is still accepted. The output arrays are
// written through a const_cast; flash_attn_func only ever passes outputs it
// allocated itself or that the caller handed over as `out=`.
using Array = nb::ndarray<nb::ro>;

// DLPack device types (dlpack.h, DLDeviceType).
constexpr int kDLCUDA = 2;
constexpr int kDLCUDAManaged = 13;

// ---------------------------------------------------------------------------
// Exceptions
// ---------------------------------------------------------------------------

[[noreturn]] void raise(PyObject* type, const std::string& msg) {
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}
[[noreturn]] void type_error(const std::string& msg) { raise(PyExc_TypeError, msg); }
[[noreturn]] void value_error(const std::string& msg) { raise(PyExc_ValueError, msg); }

std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

[[noreturn]] void cuda_fail(cudaError_t err, const std::string& call) {
  raise(PyExc_RuntimeError, "flashcute: " + call + " failed: " + cuda_error_text(err));
}

// ---------------------------------------------------------------------------
// Formatting helpers
// ---------------------------------------------------------------------------

std::string shape_str(const Array& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape_ptr()[i]);
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

std::string strides_str(const Array& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.stride_ptr()[i]);
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

std::string tuple_str(std::initializer_list<int64_t> v) {
  std::string s = "(";
  bool first = true;
  for (int64_t x : v) {
    if (!first) s += ", ";
    s += std::to_string(x);
    first = false;
  }
  return s + ")";
}

std::string dtype_name(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<C>(dt.code)) {
    case C::Int: base = "int" + std::to_string(dt.bits); break;
    case C::UInt: base = "uint" + std::to_string(dt.bits); break;
    case C::Float: base = "float" + std::to_string(dt.bits); break;
    case C::Bfloat: base = "bfloat" + std::to_string(dt.bits); break;
    case C::Complex: base = "complex" + std::to_string(dt.bits); break;
    case C::Bool: base = "bool"; break;
    case C::Float8_E4M3FN: base = "float8_e4m3fn"; break;
    case C::Float8_E5M2: base = "float8_e5m2"; break;
    default:
      base = "dtype(code=" + std::to_string(dt.code) + ", bits=" + std::to_string(dt.bits) + ")";
  }
  if (dt.lanes != 1) base += "x" + std::to_string(dt.lanes);
  return base;
}

std::string device_type_name(int t) {
  switch (t) {
    case 1: return "CPU";
    case 2: return "CUDA";
    case 3: return "CUDA host (pinned)";
    case 4: return "OpenCL";
    case 7: return "Vulkan";
    case 8: return "Metal";
    case 9: return "VPI";
    case 10: return "ROCm";
    case 11: return "ROCm host";
    case 12: return "ExtDev";
    case 13: return "CUDA managed";
    case 14: return "oneAPI";
    case 15: return "WebGPU";
    case 16: return "Hexagon";
    default: return "unknown";
  }
}

std::string hex_ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s.empty() ? "none" : s;
}

// ---------------------------------------------------------------------------
// Build configuration
// ---------------------------------------------------------------------------

std::vector<int> compiled_head_dims() {
  std::vector<int> dims;
  for (int hd : flashcute::kKernelHeadDims)
    if (flashcute::head_dim_compiled(hd)) dims.push_back(hd);
  return dims;
}

std::vector<std::string> compiled_dtypes() {
  std::vector<std::string> names;
  if (flashcute::dtype_compiled(flashcute::DType::kFloat16)) names.emplace_back("float16");
  if (flashcute::dtype_compiled(flashcute::DType::kBFloat16)) names.emplace_back("bfloat16");
  return names;
}

const char* dtype_label(flashcute::DType d) { return d == flashcute::DType::kFloat16 ? "float16" : "bfloat16"; }
const char* dtype_option(flashcute::DType d) { return d == flashcute::DType::kFloat16 ? "fp16" : "bf16"; }

bool head_dim_valid(int64_t d) { return d > 0 && d % 8 == 0 && d <= flashcute::kMaxHeadDim; }

std::string headdim_message(int64_t d) {
  return "headdim must be a multiple of 8 and <= " + std::to_string(flashcute::kMaxHeadDim) + ", got " +
         std::to_string(d);
}

// NotImplementedError for a dtype / head dim that this build left out.
[[noreturn]] void not_compiled_dtype(flashcute::DType dt) {
  raise(PyExc_NotImplementedError,
        std::string("flashcute was built without ") + dtype_label(dt) +
            " kernels: the build option FLASHCUTE_DTYPES left " + dtype_option(dt) +
            " out (this build has: " +
            [] {
              std::string s;
              for (auto& n : compiled_dtypes()) s += (s.empty() ? "" : ", ") + n;
              return s.empty() ? std::string("none") : s;
            }() +
            "); rebuild with e.g. pip install . -C cmake.define.FLASHCUTE_DTYPES=fp16,bf16");
}

[[noreturn]] void not_compiled_head_dim(int64_t d) {
  const int needed = flashcute::kernel_head_dim_for(static_cast<int>(d));
  std::string list;
  for (int hd : flashcute::kKernelHeadDims)
    if (hd >= needed) list += (list.empty() ? "" : ", ") + std::to_string(hd);
  raise(PyExc_NotImplementedError,
        "flashcute has no kernel for head dim " + std::to_string(d) + " in this build: it runs on kernel head dim " +
            std::to_string(needed) + " (or a larger one: " + list +
            "), which the build option FLASHCUTE_HEAD_DIMS left out (this build has kernel head dims: " +
            join_ints(compiled_head_dims()) + "); rebuild with e.g. pip install . -C cmake.define.FLASHCUTE_HEAD_DIMS=" +
            [&] {
              std::vector<int> dims = compiled_head_dims();
              dims.push_back(needed);
              std::sort(dims.begin(), dims.end());
              std::string s;
              for (int hd : dims) s += (s.empty() ? "" : ",") + std::to_string(hd);
              return s;
            }());
}

// ---------------------------------------------------------------------------
// Array checks
// ---------------------------------------------------------------------------

bool is_half_dtype(nb::dlpack::dtype dt) {
  return dt.lanes == 1 && dt.bits == 16 &&
         (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) ||
          dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat));
}

bool is_float32(nb::dlpack::dtype dt) {
  return dt.lanes == 1 && dt.bits == 32 && dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float);
}

std::string py_type_name(nb::handle h) {
  nb::handle tp = (PyObject*)Py_TYPE(h.ptr());
  std::string mod;
  if (nb::hasattr(tp, "__module__")) {
    nb::object m = tp.attr("__module__");
    if (nb::isinstance<nb::str>(m)) mod = nb::cast<std::string>(m);
  }
  std::string name = nb::cast<std::string>(tp.attr("__qualname__"));
  return (mod.empty() || mod == "builtins") ? name : mod + "." + name;
}

Array import_array(const char* name, nb::handle obj) {
  Array a;
  if (!obj.is_valid() || obj.is_none() || !nb::try_cast<Array>(obj, a, /*convert=*/false) || !a.is_valid())
    type_error(std::string(name) +
               ": expected an array (an object implementing __dlpack__ or the buffer protocol, "
               "e.g. a torch.Tensor, cupy.ndarray or jax.Array), got " +
               (obj.is_valid() ? py_type_name(obj) : std::string("nothing")));
  return a;
}

void check_rank(const char* name, const Array& a, size_t rank, const char* dims) {
  if (a.ndim() != rank)
    value_error(std::string(name) + ": expected " + std::to_string(rank) + " dims " + dims + ", got " +
                std::to_string(a.ndim()));
}

void check_same_dtype(const char* name, const Array& a, const Array& q) {
  if (a.dtype() != q.dtype())
    type_error(std::string(name) + ": expected " + dtype_name(q.dtype()) + " like q, got " + dtype_name(a.dtype()));
}

int64_t dim(const Array& a, int i) { return a.shape_ptr()[i]; }

// The stride the kernel should use for dim i: the array's own, except for a dim
// of extent <= 1, where the stride never multiplies a non-zero index (and some
// producers report arbitrary values for it), so it is replaced by 0.
int64_t kstride(const Array& a, int i) { return dim(a, i) <= 1 ? 0 : a.stride_ptr()[i]; }

// True if two distinct index tuples of `a` can address the same element.
// Sufficient test for "no overlap": with the dims of extent > 1 sorted by
// stride, each stride must exceed the largest offset reachable by the smaller
// ones. Rejects only layouts that overlap or are exotically interleaved.
bool self_overlapping(const Array& a) {
  if (a.size() == 0) return false;  // no element to alias
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent)
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (dim(a, i) > 1) dims.emplace_back(a.stride_ptr()[i], dim(a, i));
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // largest offset reachable with the dims seen so far
  for (auto [stride, extent] : dims) {
    if (stride <= reach) return true;
    reach += stride * (extent - 1);
  }
  return false;
}

// Head-dim contiguity, non-negative strides, and batch/row/head strides in
// whole 16-byte vectors (multiples of 8 halves): the kernel moves Q/K/V/O with
// 16-byte cp.async / vector stores.
void check_strides_4d(const char* name, const Array& a) {
  if (a.size() == 0) return;  // no element is ever addressed (producers report arbitrary strides here)
  const int64_t* st = a.stride_ptr();
  if (dim(a, 3) > 1 && st[3] != 1)
    value_error(std::string(name) + ": the last dim must be contiguous (stride 1), got stride " +
                std::to_string(st[3]) + " (strides " + strides_str(a) + ")");
  for (int i = 0; i < 3; ++i) {
    if (kstride(a, i) < 0)
      value_error(std::string(name) + ": negative strides are not supported, got strides " + strides_str(a));
  }
  static const char* kNames[3] = {"batch", "row (seqlen)", "head"};
  for (int i = 0; i < 3; ++i) {
    if (kstride(a, i) % 8 != 0)
      value_error(std::string(name) + ": the " + kNames[i] + " stride must be a multiple of 8 elements (16 bytes), got " +
                  std::to_string(st[i]) + " (strides " + strides_str(a) + ")");
  }
}

void check_aligned(const char* name, const Array& a, unsigned alignment) {
  if (a.size() == 0) return;  // never dereferenced
  const auto addr = reinterpret_cast<std::uintptr_t>(a.data());
  if (addr % alignment != 0)
    value_error(std::string(name) + ": the data pointer must be " + std::to_string(alignment) +
                "-byte aligned (the kernel uses " + std::to_string(alignment) + "-byte vector accesses), got " +
                hex_ptr(a.data()) + " (" + std::to_string(addr % alignment) + " bytes past a boundary)");
}

void check_int32(const char* what, int64_t v) {
  if (v > INT_MAX)
    value_error(std::string(what) + " " + std::to_string(v) + " exceeds the supported maximum " + std::to_string(INT_MAX));
}

bool is_cuda_device_type(int t) { return t == kDLCUDA || t == kDLCUDAManaged; }

void check_device(const char* name, const Array& a, const Array& q) {
  if (!is_cuda_device_type(a.device_type()))
    type_error(std::string(name) + ": expected a CUDA array, got a " + device_type_name(a.device_type()) +
               " array (device type " + std::to_string(a.device_type()) + ")");
  if (a.device_id() != q.device_id())
    value_error(std::string(name) + ": on cuda:" + std::to_string(a.device_id()) + " but q is on cuda:" +
                std::to_string(q.device_id()));
}

// ---------------------------------------------------------------------------
// Device guard: makes `device` current for the duration of a scope (the
// legacy / per-thread stream handles and kernel launches refer to the current
// device) and restores the previous one. Called with the GIL released.
// ---------------------------------------------------------------------------

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    err_ = cudaGetDevice(&prev_);
    where_ = "cudaGetDevice()";
    if (err_ != cudaSuccess) return;
    if (prev_ != device) {
      err_ = cudaSetDevice(device);
      where_ = "cudaSetDevice(" + std::to_string(device) + ")";
      if (err_ == cudaSuccess) switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  cudaError_t error() const { return err_; }
  const std::string& where() const { return where_; }

 private:
  int prev_ = -1;
  bool switched_ = false;
  cudaError_t err_ = cudaSuccess;
  std::string where_;
};

bool is_special_stream(int64_t s) {
  // 0: the default stream; 1: cudaStreamLegacy; 2: cudaStreamPerThread.
  return s == 0 || s == 1 || s == 2;
}

// ---------------------------------------------------------------------------
// fwd
// ---------------------------------------------------------------------------

void fwd(nb::handle q_obj, nb::handle k_obj, nb::handle v_obj, nb::handle out_obj, nb::handle lse_obj,
         double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
         int64_t stream) {
  // 1. Import. Nothing below touches the device.
  Array q = import_array("q", q_obj);
  Array k = import_array("k", k_obj);
  Array v = import_array("v", v_obj);
  Array out = import_array("out", out_obj);
  const bool has_lse = lse_obj.is_valid() && !lse_obj.is_none();
  Array lse;
  if (has_lse) lse = import_array("lse", lse_obj);

  // 2. Rank and dtype.
  check_rank("q", q, 4, "(batch, seqlen_q, nheads, headdim)");
  if (!is_half_dtype(q.dtype()))
    type_error("q: expected a float16 or bfloat16 array, got " + dtype_name(q.dtype()));
  check_rank("k", k, 4, "(batch, seqlen_k, nheads_k, headdim)");
  check_same_dtype("k", k, q);
  check_rank("v", v, 4, "(batch, seqlen_k, nheads_k, headdim)");
  check_same_dtype("v", v, q);
  check_rank("out", out, 4, "(batch, seqlen_q, nheads, headdim) like q");
  check_same_dtype("out", out, q);

  // 3. Shapes.
  const int64_t batch = dim(q, 0), seqlen_q = dim(q, 1), nheads = dim(q, 2), head_dim = dim(q, 3);
  const int64_t seqlen_k = dim(k, 1), nheads_k = dim(k, 2);
  if (dim(k, 0) != batch)
    value_error("k: batch " + std::to_string(dim(k, 0)) + " does not match q's batch " + std::to_string(batch) +
                " (k is " + shape_str(k) + ", q is " + shape_str(q) + ")");
  if (dim(k, 3) != head_dim)
    value_error("k: headdim " + std::to_string(dim(k, 3)) + " does not match q's headdim " + std::to_string(head_dim) +
                " (k is " + shape_str(k) + ", q is " + shape_str(q) + ")");
  {
    static const char* kDims[4] = {"batch", "seqlen_k", "nheads_k", "headdim"};
    for (int i = 0; i < 4; ++i) {
      if (dim(v, i) != dim(k, i))
        value_error("v: expected shape " + shape_str(k) + " like k, got " + shape_str(v) + " (" + kDims[i] +
                    " differs: " + std::to_string(dim(v, i)) + " vs " + std::to_string(dim(k, i)) + ")");
    }
  }
  if (nheads < 1) value_error("q: nheads must be >= 1, got " + std::to_string(nheads));
  if (nheads_k < 1) value_error("k: nheads_k must be >= 1, got " + std::to_string(nheads_k));
  if (nheads % nheads_k != 0)
    value_error("nheads (" + std::to_string(nheads) + ") must be a multiple of nheads_k (" + std::to_string(nheads_k) +
                ")");
  if (!head_dim_valid(head_dim)) value_error(headdim_message(head_dim));
  for (int i = 0; i < 4; ++i) {
    if (dim(out, i) != dim(q, i))
      value_error("out: expected shape " + shape_str(q) + " like q, got " + shape_str(out));
  }
  if (has_lse) {
    const std::string expect = "lse: expected float32 (batch, nheads, seqlen_q) = " +
                               tuple_str({batch, nheads, seqlen_q}) + " contiguous in seqlen_q";
    if (!is_float32(lse.dtype())) type_error(expect + ", got dtype " + dtype_name(lse.dtype()));
    if (lse.ndim() != 3 || dim(lse, 0) != batch || dim(lse, 1) != nheads || dim(lse, 2) != seqlen_q)
      value_error(expect + ", got shape " + shape_str(lse));
  }
  check_int32("batch", batch);
  check_int32("seqlen_q", seqlen_q);
  check_int32("seqlen_k", seqlen_k);
  check_int32("nheads", nheads);

  // 4. Strides.
  check_strides_4d("q", q);
  check_strides_4d("k", k);
  check_strides_4d("v", v);
  check_strides_4d("out", out);
  if (self_overlapping(out))
    value_error("out: its strides " + strides_str(out) + " make distinct elements overlap; out must not alias itself");
  if (has_lse && lse.size() > 0) {  // an empty lse has no element to address: its strides are arbitrary
    if (dim(lse, 2) > 1 && lse.stride_ptr()[2] != 1)
      value_error("lse: expected float32 (batch, nheads, seqlen_q) contiguous in seqlen_q (stride 1), got strides " +
                  strides_str(lse));
    if (kstride(lse, 0) < 0 || kstride(lse, 1) < 0)
      value_error("lse: negative strides are not supported, got strides " + strides_str(lse));
    if (self_overlapping(lse))
      value_error("lse: its strides " + strides_str(lse) + " make distinct elements overlap; lse must not alias itself");
  }

  // 5. Alignment.
  check_aligned("q", q, 16);
  check_aligned("k", k, 16);
  check_aligned("v", v, 16);
  check_aligned("out", out, 16);
  if (has_lse) check_aligned("lse", lse, 4);

  // 6. Scalars.
  if (!std::isfinite(softmax_scale) || !(softmax_scale > 0.0) || !std::isfinite(static_cast<float>(softmax_scale)) ||
      static_cast<float>(softmax_scale) == 0.f)
    value_error("softmax_scale must be a finite number > 0, got " + std::to_string(softmax_scale));
  if (!std::isfinite(softcap) || softcap < 0.0 || !std::isfinite(static_cast<float>(softcap)))
    value_error("softcap must be a finite number >= 0 (0 disables it), got " + std::to_string(softcap));
  if (window_left < -1)
    value_error("window_left must be >= -1 (-1: unbounded), got " + std::to_string(window_left));
  if (window_right < -1)
    value_error("window_right must be >= -1 (-1: unbounded), got " + std::to_string(window_right));
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));

  // 7. Build configuration.
  const flashcute::DType dtype =
      q.dtype().code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) ? flashcute::DType::kFloat16
                                                                            : flashcute::DType::kBFloat16;
  if (!flashcute::dtype_compiled(dtype)) not_compiled_dtype(dtype);
  if (flashcute::dispatch_head_dim(static_cast<int>(head_dim)) == 0) not_compiled_head_dim(head_dim);

  // 8. Devices, last.
  check_device("q", q, q);
  check_device("k", k, q);
  check_device("v", v, q);
  check_device("out", out, q);
  if (has_lse) check_device("lse", lse, q);

  if (batch == 0 || seqlen_q == 0) return;  // empty output: nothing to launch

  // 9. Parameters.
  flashcute::FwdParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.o = const_cast<void*>(out.data());
  p.lse = has_lse ? static_cast<float*>(const_cast<void*>(lse.data())) : nullptr;
  p.q_batch_stride = kstride(q, 0), p.q_row_stride = kstride(q, 1), p.q_head_stride = kstride(q, 2);
  p.k_batch_stride = kstride(k, 0), p.k_row_stride = kstride(k, 1), p.k_head_stride = kstride(k, 2);
  p.v_batch_stride = kstride(v, 0), p.v_row_stride = kstride(v, 1), p.v_head_stride = kstride(v, 2);
  p.o_batch_stride = kstride(out, 0), p.o_row_stride = kstride(out, 1), p.o_head_stride = kstride(out, 2);
  if (has_lse) p.lse_batch_stride = kstride(lse, 0), p.lse_head_stride = kstride(lse, 1);
  if (seqlen_k == 0) {
    // No key is visible: run_fwd writes out = 0 and lse = -inf without reading
    // K or V, but it wants valid pointers and strides, and an empty array's
    // data pointer may be null. Hand it q's (never dereferenced as K/V).
    p.k = p.v = q.data();
    p.k_batch_stride = p.v_batch_stride = p.q_batch_stride;
    p.k_row_stride = p.v_row_stride = p.q_row_stride;
    p.k_head_stride = p.v_head_stride = p.q_head_stride;
  }
  p.batch = static_cast<int>(batch);
  p.seqlen_q = static_cast<int>(seqlen_q);
  p.seqlen_k = static_cast<int>(seqlen_k);
  p.nheads = static_cast<int>(nheads);
  p.nheads_k = static_cast<int>(nheads_k);
  p.head_dim = static_cast<int>(head_dim);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.softcap = static_cast<float>(softcap);
  p.causal = causal;
  // A bound beyond INT_MAX covers any sequence (seqlens are <= INT_MAX): unbounded.
  p.window_left = window_left > INT_MAX ? -1 : static_cast<int>(window_left);
  p.window_right = window_right > INT_MAX ? -1 : static_cast<int>(window_right);
  p.dtype = dtype;

  // 10. Launch, without the GIL, on q's device.
  const int device = q.device_id();
  auto cuda_stream = reinterpret_cast<cudaStream_t>(static_cast<std::intptr_t>(stream));
  flashcute::Status status;
  cudaError_t guard_err = cudaSuccess, stream_err = cudaSuccess;
  int stream_device = device;
  std::string guard_where;
  {
    nb::gil_scoped_release release;
    DeviceGuard guard(device);
    guard_err = guard.error();
    guard_where = guard.where();
    if (guard_err == cudaSuccess) {
#if CUDART_VERSION >= 12080
      if (!is_special_stream(stream)) stream_err = cudaStreamGetDevice(cuda_stream, &stream_device);
#endif
      if (stream_err == cudaSuccess && stream_device == device) status = flashcute::run_fwd(p, cuda_stream);
    }
  }
  if (guard_err != cudaSuccess) cuda_fail(guard_err, guard_where);
  if (stream_err != cudaSuccess)
    raise(PyExc_RuntimeError, "flashcute: cudaStreamGetDevice(stream=" + hex_ptr(cuda_stream) +
                                  ") failed: " + cuda_error_text(stream_err) + "; is it a valid CUDA stream?");
  if (stream_device != device)
    value_error("stream: belongs to cuda:" + std::to_string(stream_device) + " but q is on cuda:" +
                std::to_string(device));

  switch (status.code) {
    case flashcute::StatusCode::kSuccess:
      return;
    case flashcute::StatusCode::kInvalidArgument:
      value_error(std::string("flashcute: invalid argument: ") + status.message);
    case flashcute::StatusCode::kNotCompiled:
      // The checks above should have caught this; keep the message useful anyway.
      if (!flashcute::dtype_compiled(dtype)) not_compiled_dtype(dtype);
      if (flashcute::dispatch_head_dim(p.head_dim) == 0) not_compiled_head_dim(head_dim);
      raise(PyExc_NotImplementedError,
            std::string("flashcute: ") + status.message + " (dtype " + dtype_label(dtype) + ", head dim " +
                std::to_string(head_dim) + "; see the build options FLASHCUTE_HEAD_DIMS / FLASHCUTE_DTYPES)");
    case flashcute::StatusCode::kCudaError:
      raise(PyExc_RuntimeError, std::string("flashcute: CUDA error in ") + status.message + ": " +
                                    cuda_error_text(status.cuda_error));
  }
  raise(PyExc_RuntimeError, "flashcute: unknown status code " + std::to_string(static_cast<int>(status.code)));
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

std::string cuda_status() {
  auto [count, err] = query_device_count();
  if (err != cudaSuccess) return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  if (count == 0) return "cudaSuccess: no CUDA device found";
  return "cudaSuccess: " + std::to_string(count) + " CUDA device(s)";
}

int kernel_head_dim(int64_t d) {
  if (!head_dim_valid(d)) value_error(headdim_message(d));
  return flashcute::dispatch_head_dim(static_cast<int>(d));
}

void stream_synchronize(int64_t stream, int device) {
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  if (device < 0) value_error("device: expected a CUDA device index >= 0, got " + std::to_string(device));
  auto s = reinterpret_cast<cudaStream_t>(static_cast<std::intptr_t>(stream));
  cudaError_t err;
  std::string where;
  {
    nb::gil_scoped_release release;
    DeviceGuard guard(device);
    err = guard.error();
    where = guard.where();
    if (err == cudaSuccess) {
      err = cudaStreamSynchronize(s);
      where = "cudaStreamSynchronize(" + hex_ptr(s) + ")";
    }
  }
  if (err != cudaSuccess) cuda_fail(err, where);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() =
      "flashcute._C: the compiled core of flashcute (FlashAttention forward kernels on CUTLASS/CuTe).\n\n"
      "Use flashcute.flash_attn_func(); this module is its low-level backend.";

  m.attr("__version__") = FLASHCUTE_VERSION;
  m.attr("MAX_HEAD_DIM") = flashcute::kMaxHeadDim;
  {
    nb::dict opts;
    opts["FLASHCUTE_CUDA_ARCHS"] = FLASHCUTE_BUILD_ARCHS;
    opts["FLASHCUTE_HEAD_DIMS"] = FLASHCUTE_BUILD_HEAD_DIMS;
    opts["FLASHCUTE_DTYPES"] = FLASHCUTE_BUILD_DTYPES;
    m.attr("BUILD_OPTIONS") = opts;
  }
  {
    nb::list all;
    for (int hd : flashcute::kKernelHeadDims) all.append(hd);
    m.attr("KERNEL_HEAD_DIMS") = nb::steal<nb::tuple>(PySequence_Tuple(all.ptr()));
  }

  // The arrays are taken as plain objects (None included) so that fwd() itself can
  // say which argument is wrong and why, instead of nanobind's generic overload error.
  m.def("fwd", &fwd, "q"_a.none(), "k"_a.none(), "v"_a.none(), "out"_a.none(), "lse"_a.none(), "softmax_scale"_a, "causal"_a, "window_left"_a,
        "window_right"_a, "softcap"_a, "stream"_a,
        "Runs the attention forward pass, writing `out` (and `lse` unless None) on `stream`.\n\n"
        "q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim); float16 or\n"
        "bfloat16, all the same; the last dim contiguous, batch/row/head strides multiples of 8 elements,\n"
        "16-byte aligned. out: like q. lse: None or float32 (batch, nheads, seqlen_q). stream: a\n"
        "cudaStream_t as an int. Never synchronises. Raises TypeError / ValueError naming the argument,\n"
        "NotImplementedError for a dtype / head dim left out of the build, RuntimeError for CUDA errors.");
  m.def("cuda_device_count", &cuda_device_count,
        "Number of visible CUDA devices; 0 when cudaGetDeviceCount fails (no driver, no device).");
  m.def("cuda_status", &cuda_status,
        "Why cuda_device_count() returned what it did, e.g. 'cudaErrorInsufficientDriver: CUDA driver version "
        "is insufficient for CUDA runtime version' or 'cudaSuccess: 1 CUDA device(s)'.");
  m.def("compiled_head_dims", &compiled_head_dims, "Kernel head dims compiled into this build, ascending.");
  m.def("compiled_dtypes", &compiled_dtypes, "Dtypes compiled into this build: a subset of ['float16', 'bfloat16'].");
  m.def("kernel_head_dim", &kernel_head_dim, "head_dim"_a,
        "The kernel head dim a user head dim runs on (the smallest compiled one >= head_dim), 0 if none.\n"
        "Raises ValueError unless head_dim is a multiple of 8 in [8, 256].");
  m.def("stream_synchronize", &stream_synchronize, "stream"_a, "device"_a,
        "Waits (GIL released) for the work queued on one stream of one device; never synchronises the device.");
}
