// src/ext_common.hpp: what the parts of flashcute._C share (src/flashcute_ext.cpp says what the
// module is): array import from DLPack or from (data_ptr, shape, strides, dtype) descriptors, the
// exceptions, device checks, the launch without the GIL, and the entry points each part defines.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashcute/host/api.hpp"

namespace nb = nanobind;

namespace flashcute_ext {


// Inputs are imported read-only (the most permissive import: a producer that flags its export
// read-only is accepted); outputs writable, so a read-only array is refused as an output.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

// DLPack device types (dlpack.h, DLDeviceType).
constexpr int kDLCUDA = 2;
constexpr int kDLCUDAManaged = 13;

// ---------------------------------------------------------------------------
// Exceptions
// ---------------------------------------------------------------------------

[[noreturn]] inline void raise(PyObject* type, const std::string& msg) {
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}
[[noreturn]] inline void type_error(const std::string& msg) { raise(PyExc_TypeError, msg); }
[[noreturn]] inline void value_error(const std::string& msg) { raise(PyExc_ValueError, msg); }

inline std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

[[noreturn]] inline void cuda_fail(cudaError_t err, const std::string& call) {
  raise(PyExc_RuntimeError, "flashcute: " + call + " failed: " + cuda_error_text(err));
}

// A failed Status as the matching Python exception, with arg / expected / got attached.
[[noreturn]] inline void raise_status(const flashcute::Status& st) {
  PyObject* type = PyExc_RuntimeError;
  std::string msg = st.message;
  switch (st.code) {
    case flashcute::StatusCode::kInvalidType: type = PyExc_TypeError; break;
    case flashcute::StatusCode::kInvalidArgument: type = PyExc_ValueError; break;
    case flashcute::StatusCode::kNotCompiled: type = PyExc_NotImplementedError; break;
    case flashcute::StatusCode::kCudaError: msg = "flashcute: " + msg; break;
    case flashcute::StatusCode::kSuccess: msg = "flashcute: internal error: raise_status(success)"; break;
  }
  nb::object exc = nb::borrow(type)(msg);
  if (!st.arg.empty()) {
    exc.attr("arg") = st.arg;
    exc.attr("expected") = st.expected;
    exc.attr("got") = st.got;
  }
  PyErr_SetObject(type, exc.ptr());
  throw nb::python_error();
}

// ---------------------------------------------------------------------------
// Arrays
// ---------------------------------------------------------------------------

inline std::string dtype_name(nb::dlpack::dtype dt) {
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

inline flashcute::DType to_dtype(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return flashcute::DType::kOther;
  if (dt.code == uint8_t(C::Float) && dt.bits == 16) return flashcute::DType::kFloat16;
  if (dt.code == uint8_t(C::Bfloat) && dt.bits == 16) return flashcute::DType::kBFloat16;
  if (dt.code == uint8_t(C::Float) && dt.bits == 32) return flashcute::DType::kFloat32;
  if (dt.code == uint8_t(C::Int) && dt.bits == 32) return flashcute::DType::kInt32;
  return flashcute::DType::kOther;
}

inline std::string py_type_name(nb::handle h) {
  nb::handle tp = (PyObject*)Py_TYPE(h.ptr());
  std::string mod;
  if (nb::hasattr(tp, "__module__")) {
    nb::object m = tp.attr("__module__");
    if (nb::isinstance<nb::str>(m)) mod = nb::cast<std::string>(m);
  }
  std::string name = nb::cast<std::string>(tp.attr("__qualname__"));
  return (mod.empty() || mod == "builtins") ? name : mod + "." + name;
}

[[noreturn]] inline void not_an_array(const char* name, nb::handle obj) {
  type_error(std::string(name) +
             ": expected an array (an object implementing __dlpack__ or the buffer protocol, "
             "e.g. a torch.Tensor, cupy.ndarray or jax.Array), got " +
             (obj.is_valid() ? py_type_name(obj) : std::string("nothing")));
}

// One imported array: the ndarray that keeps it alive, its description for the core, and the
// storage of its dtype's name (TensorRef::dtype_label points into it).
template <class Array, class Ref>
struct Imported {
  Array array;
  Ref ref;
  std::string dtype_label;

  Imported() = default;
  // ref.dtype_label points into dtype_label: a copy or move (into a std::optional, say) re-points it.
  Imported(const Imported& o) : array(o.array), ref(o.ref), dtype_label(o.dtype_label) { relabel(); }
  Imported(Imported&& o) noexcept
      : array(std::move(o.array)), ref(o.ref), dtype_label(std::move(o.dtype_label)) { relabel(); }
  Imported& operator=(const Imported& o) { return *this = Imported(o); }
  Imported& operator=(Imported&& o) noexcept {
    array = std::move(o.array);
    ref = o.ref;
    dtype_label = std::move(o.dtype_label);
    relabel();
    return *this;
  }
  void relabel() { ref.dtype_label = dtype_label.c_str(); }

  void describe() {
    dtype_label = dtype_name(array.dtype());
    ref.data = array.data();
    ref.dtype = to_dtype(array.dtype());
    ref.dtype_label = dtype_label.c_str();
    ref.rank = int(array.ndim());
    for (int i = 0; i < ref.rank && i < flashcute::TensorRef::kMaxRank; ++i) {
      ref.shape[i] = array.shape_ptr()[i];
      ref.stride[i] = array.stride_ptr()[i];
    }
  }
};
using Input = Imported<InArray, flashcute::TensorRef>;
using Output = Imported<OutArray, flashcute::MutableTensorRef>;

inline Input import_input(const char* name, nb::handle obj) {
  Input in;
  if (!obj.is_valid() || obj.is_none() || !nb::try_cast<InArray>(obj, in.array, /*convert=*/false) ||
      !in.array.is_valid())
    not_an_array(name, obj);
  in.describe();
  return in;
}

inline Output import_output(const char* name, nb::handle obj) {
  Output out;
  if (!obj.is_valid() || obj.is_none()) not_an_array(name, obj);
  if (!nb::try_cast<OutArray>(obj, out.array, /*convert=*/false) || !out.array.is_valid()) {
    InArray ro;
    if (nb::try_cast<InArray>(obj, ro, /*convert=*/false) && ro.is_valid())
      type_error(std::string(name) + ": expected a writable array, got a read-only " + py_type_name(obj) +
                 " (flashcute writes its result into " + name + ")");
    not_an_array(name, obj);
  }
  out.describe();
  return out;
}

inline std::string device_type_name(int t) {
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

template <class Array>
inline void check_device(const char* name, const Array& a, const InArray& q) {
  const int t = a.device_type();
  if (t != kDLCUDA && t != kDLCUDAManaged)
    type_error(std::string(name) + ": expected a CUDA array, got a " + device_type_name(t) + " array (device type " +
               std::to_string(t) + ")");
  if (a.device_id() != q.device_id())
    value_error(std::string(name) + ": on cuda:" + std::to_string(a.device_id()) + " but q is on cuda:" +
                std::to_string(q.device_id()));
}

// ---------------------------------------------------------------------------
// Device guard: makes `device` current for the duration of a scope (the legacy / per-thread
// stream handles and kernel launches refer to the current device) and restores the previous
// one. Called with the GIL released.
// ---------------------------------------------------------------------------

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    err_ = cudaGetDevice(&prev_);
    if (err_ != cudaSuccess) {
      where_ = "cudaGetDevice()";
      return;
    }
    if (prev_ != device) {
      err_ = cudaSetDevice(device);
      if (err_ == cudaSuccess) switched_ = true;
      else where_ = "cudaSetDevice(" + std::to_string(device) + ")";
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

inline bool is_special_stream(int64_t s) {
  // 0: the default stream; 1: cudaStreamLegacy; 2: cudaStreamPerThread.
  return s == 0 || s == 1 || s == 2;
}

// Launches a plan without the GIL, with `device` current. check_stream_device: ask the runtime
// which device a user-given stream belongs to (a framework's own current stream needs no check).
template <class Plan>
inline void launch_on_device(const Plan& plan, int device, int64_t stream, bool check_stream_device) {
  auto cuda_stream = reinterpret_cast<cudaStream_t>(static_cast<std::intptr_t>(stream));
  flashcute::Status status;
  cudaError_t guard_err = cudaSuccess, stream_err = cudaSuccess;
  int stream_device = device;
  std::string guard_where;
  {
    nb::gil_scoped_release release;
    DeviceGuard guard(device);
    guard_err = guard.error();
    if (guard_err != cudaSuccess) guard_where = guard.where();
    if (guard_err == cudaSuccess) {
#if CUDART_VERSION >= 12080
      if (check_stream_device && !is_special_stream(stream))
        stream_err = cudaStreamGetDevice(cuda_stream, &stream_device);
#endif
      if (stream_err == cudaSuccess && stream_device == device) status = flashcute::launch(plan, cuda_stream);
    }
  }
  if (guard_err != cudaSuccess) cuda_fail(guard_err, guard_where);
  if (stream_err != cudaSuccess)
    raise(PyExc_RuntimeError, "flashcute: cudaStreamGetDevice(stream=" + flashcute::detail::hex_ptr(cuda_stream) +
                                  ") failed: " + cuda_error_text(stream_err) + "; is it a valid CUDA stream?");
  if (stream_device != device)
    value_error("stream: belongs to cuda:" + std::to_string(stream_device) + " but q is on cuda:" +
                std::to_string(device));
  if (!status.ok()) raise_status(status);
}

// ---------------------------------------------------------------------------
// varlen: the cu_seqlens arrays of a variable-length call (both None for a fixed-length one)
// ---------------------------------------------------------------------------

inline bool given(nb::handle h) { return h.is_valid() && !h.is_none(); }

inline void check_varlen_pair(nb::handle cu_q, nb::handle cu_k) {
  if (given(cu_q) != given(cu_k))
    value_error(std::string(given(cu_q) ? "cu_seqlens_k" : "cu_seqlens_q") +
                ": a variable-length call takes both cu_seqlens_q and cu_seqlens_k (int32 (batch + 1,) arrays), "
                "got only " + (given(cu_q) ? "cu_seqlens_q" : "cu_seqlens_k"));
}

// DLPack arrays: imported, and device-checked by the caller after the validation.
struct VarlenInputs {
  std::optional<Input> cu_q, cu_k;

  VarlenInputs(nb::handle q_obj, nb::handle k_obj) {
    check_varlen_pair(q_obj, k_obj);
    if (!given(q_obj)) return;
    cu_q = import_input("cu_seqlens_q", q_obj);
    cu_k = import_input("cu_seqlens_k", k_obj);
  }
  std::optional<flashcute::VarlenArgs> args(int64_t max_q, int64_t max_k) const {
    if (!cu_q) return std::nullopt;
    return flashcute::VarlenArgs{cu_q->ref, cu_k->ref, max_q, max_k};
  }
  void check_devices(const InArray& q) const {
    if (!cu_q) return;
    check_device("cu_seqlens_q", cu_q->array, q);
    check_device("cu_seqlens_k", cu_k->array, q);
  }
};


// ---------------------------------------------------------------------------
// fwd_raw: the same call with arrays described by plain values (the framework's eager fast path)
// ---------------------------------------------------------------------------

inline flashcute::DType dtype_from_name(const std::string& name) {
  if (name == "float16") return flashcute::DType::kFloat16;
  if (name == "bfloat16") return flashcute::DType::kBFloat16;
  if (name == "float32") return flashcute::DType::kFloat32;
  if (name == "int32") return flashcute::DType::kInt32;
  return flashcute::DType::kOther;
}

// A tuple of ints (torch.Size and Tensor.stride() are tuples) into out[]; returns its length.
// Read with the tuple API: this runs four times on every eager call.
inline size_t read_ints(const char* name, PyObject* seq, int64_t* out) {
  if (!PyTuple_Check(seq)) type_error(std::string(name) + ": expected the shape and strides as tuples of ints");
  const Py_ssize_t n = PyTuple_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n && i < flashcute::TensorRef::kMaxRank; ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
    if (out[i] == -1 && PyErr_Occurred()) throw nb::python_error();
  }
  return size_t(n);
}

// (data_ptr, shape, strides, dtype name) -> TensorRef; `label` keeps the dtype name alive.
template <class Ref>
inline Ref ref_from_desc(const char* name, nb::handle desc, std::string& label) {
  PyObject* t = desc.ptr();
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4)
    type_error(std::string(name) + ": expected a (data_ptr, shape, strides, dtype) descriptor");
  Ref r;
  const unsigned long long ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 0));
  if (PyErr_Occurred()) throw nb::python_error();
  r.data = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(ptr));
  const size_t rank = read_ints(name, PyTuple_GET_ITEM(t, 1), r.shape);
  if (read_ints(name, PyTuple_GET_ITEM(t, 2), r.stride) != rank)
    value_error(std::string(name) + ": shape and strides differ in length");
  r.rank = int(rank);
  label = nb::cast<std::string>(nb::handle(PyTuple_GET_ITEM(t, 3)));
  r.dtype = dtype_from_name(label);
  r.dtype_label = label.c_str();
  return r;
}


// The varlen arguments of a raw call: descriptors like the arrays'.
inline std::optional<flashcute::VarlenArgs> varlen_from_desc(nb::handle cu_q, nb::handle cu_k, int64_t max_q, int64_t max_k,
                                                      std::string* labels) {
  check_varlen_pair(cu_q, cu_k);
  if (!given(cu_q)) return std::nullopt;
  return flashcute::VarlenArgs{ref_from_desc<flashcute::TensorRef>("cu_seqlens_q", cu_q, labels[0]),
                               ref_from_desc<flashcute::TensorRef>("cu_seqlens_k", cu_k, labels[1]), max_q, max_k};
}

// The entry points. src/ext_dlpack.cpp: DLPack arrays (CuPy, any producer) and the trace-time check;
// src/ext_raw.cpp: descriptors (the torch fast path and ops).
void fwd(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, double softmax_scale, bool causal,
         int64_t window_left, int64_t window_right, double softcap, int64_t stream, nb::handle cu_seqlens_q,
         nb::handle cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k);
void fwd_raw(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, double softmax_scale,
             bool causal, int64_t window_left, int64_t window_right, double softcap, int device, int64_t stream,
             bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
             int64_t max_seqlen_k);
void bwd(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle dq,
         nb::handle dk, nb::handle dv, nb::handle workspace, double softmax_scale, bool causal, int64_t window_left,
         int64_t window_right, double softcap, bool deterministic, int64_t stream, nb::handle cu_seqlens_q,
         nb::handle cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k);
void bwd_raw(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle dq,
             nb::handle dk, nb::handle dv, nb::handle workspace, double softmax_scale, bool causal,
             int64_t window_left, int64_t window_right, double softcap, bool deterministic, int device,
             int64_t stream, bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
             int64_t max_seqlen_q, int64_t max_seqlen_k);
void merge(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out, nb::handle lse,
           int64_t stream);
void merge_raw(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out, nb::handle lse,
               int device, int64_t stream, bool check_stream_device);
int fwd_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse, nb::handle k,
                nb::handle v, nb::handle cache_seqlens, nb::handle block_table, nb::handle workspace_alloc,
                double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
                int64_t num_splits, int64_t stream);
int fwd_kvcache_raw(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse, nb::handle k,
                    nb::handle v, nb::handle cache_seqlens, nb::handle block_table, nb::handle workspace_alloc,
                    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
                    int64_t num_splits, int device, int64_t stream, bool check_stream_device);
void check_fwd(std::vector<int64_t> q_shape, std::vector<int64_t> k_shape, std::vector<int64_t> v_shape,
               std::string q_dtype, std::string k_dtype, std::string v_dtype, double softmax_scale, bool causal,
               int64_t window_left, int64_t window_right, double softcap,
               std::optional<std::vector<int64_t>> cu_seqlens_q_shape, std::optional<std::vector<int64_t>> cu_seqlens_k_shape,
               std::string cu_seqlens_q_dtype, std::string cu_seqlens_k_dtype, int64_t max_seqlen_q,
               int64_t max_seqlen_k);

}  // namespace flashcute_ext
