// src/ext_common.hpp: what the parts of flashcute._C share (src/flashcute_ext.cpp says what the
// module is): the exceptions, the two array sources of the Python side (DLPack arrays, and
// (data_ptr, shape, strides, dtype) descriptors; src/ops.hpp says what a source is), the options
// tuple, the launch without the GIL, and the entry points each part defines.
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

#include "array_ref.hpp"
#include "flashcute/host/api.hpp"
#include "ops.hpp"

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
// The options: one tuple (softmax_scale or None, causal, window_left, window_right, softcap), as
// flashcute._args._parse_options makes it, read once into the AttnOptions that plan_* reads.
// ---------------------------------------------------------------------------

inline flashcute::AttnOptions options_from(nb::handle options) {
  PyObject* t = options.ptr();
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5)
    type_error("options: expected a tuple (softmax_scale or None, causal, window_left, window_right, softcap)");
  flashcute::AttnOptions o;
  PyObject* scale = PyTuple_GET_ITEM(t, 0);
  if (scale != Py_None) {
    o.softmax_scale = PyFloat_AsDouble(scale);
    if (PyErr_Occurred()) throw nb::python_error();
  }
  PyObject* causal = PyTuple_GET_ITEM(t, 1);
  if (!PyBool_Check(causal)) type_error("causal: expected a bool, got " + py_type_name(causal));
  o.causal = causal == Py_True;
  o.window_left = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
  o.window_right = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3));
  o.softcap = PyFloat_AsDouble(PyTuple_GET_ITEM(t, 4));
  if (PyErr_Occurred()) throw nb::python_error();
  return o;
}

// ---------------------------------------------------------------------------
// DlpackArrays: the array source of DLPack arrays (src/ops.hpp). nanobind imports each one (and
// keeps it alive); the device each lives on is checked after the validation, so that every
// structural message can be tested with NumPy arrays on a machine without a GPU.
// ---------------------------------------------------------------------------

class DlpackArrays {
 public:
  using In = nb::handle;
  using Out = nb::handle;
  static constexpr bool check_stream_device = true;  // a user-given stream: ask which device it is on

  static bool given(nb::handle h) { return h.is_valid() && !h.is_none(); }

  flashcute::TensorRef in(const char* name, nb::handle obj) {
    Kept& k = keep(name);
    if (!given(obj) || !nb::try_cast<InArray>(obj, k.in, /*convert=*/false) || !k.in.is_valid())
      not_an_array(name, obj);
    return describe<flashcute::TensorRef>(k, k.in);
  }

  flashcute::MutableTensorRef out(const char* name, nb::handle obj) {
    Kept& k = keep(name);
    if (!given(obj)) not_an_array(name, obj);
    if (!nb::try_cast<OutArray>(obj, k.out, /*convert=*/false) || !k.out.is_valid()) {
      InArray ro;
      if (nb::try_cast<InArray>(obj, ro, /*convert=*/false) && ro.is_valid())
        type_error(std::string(name) + ": expected a writable array, got a read-only " + py_type_name(obj) +
                   " (flashcute writes its result into " + name + ")");
      not_an_array(name, obj);
    }
    return describe<flashcute::MutableTensorRef>(k, k.out);
  }

  // Every array a CUDA array on the first one's device.
  void check_devices() const {
    for (int i = 0; i < n_; ++i) {
      const Kept& k = kept_[i];
      if (k.device_type != kDLCUDA && k.device_type != kDLCUDAManaged)
        type_error(std::string(k.name) + ": expected a CUDA array, got a " + device_type_name(k.device_type) +
                   " array (device type " + std::to_string(k.device_type) + ")");
      if (k.device_id != kept_[0].device_id)
        value_error(std::string(k.name) + ": on cuda:" + std::to_string(k.device_id) + " but " + kept_[0].name +
                    " is on cuda:" + std::to_string(kept_[0].device_id));
    }
  }
  int device() const { return n_ > 0 ? kept_[0].device_id : 0; }

 private:
  static constexpr int kMaxArrays = 12;  // the backward's 10 and its cu_seqlens
  struct Kept {
    InArray in;
    OutArray out;
    const char* name = "";
    int device_type = 0, device_id = 0;
    std::string label;  // a dtype flashcute has no DType for, by name
  };

  Kept& keep(const char* name) {
    if (n_ == kMaxArrays) raise(PyExc_RuntimeError, "flashcute: internal error: too many arrays in one call");
    Kept& k = kept_[n_++];
    k.name = name;
    return k;
  }

  template <class Ref, class Array>
  static Ref describe(Kept& k, const Array& a) {
    k.device_type = a.device_type();
    k.device_id = a.device_id();
    const flashcute::DType dtype = to_dtype(a.dtype());
    if (dtype == flashcute::DType::kOther) k.label = dtype_name(a.dtype());
    return array_ref<Ref>(a.data(), dtype, k.label.c_str(), int(a.ndim()), a.shape_ptr(), a.stride_ptr());
  }

  Kept kept_[kMaxArrays];
  int n_ = 0;
};

// ---------------------------------------------------------------------------
// Descriptors: the array source of (data_ptr, shape, strides, dtype name) tuples (src/ops.hpp),
// the torch binding's eager fast path: its framework already checked that the arrays live on
// one CUDA device, `device`, and the descriptors are built in Python from the arrays' own
// attributes, which costs less than a DLPack export. strides None: contiguous (a tracer's
// stand-in, check_fwd). Read with the tuple API: this runs four times on every eager call.
// ---------------------------------------------------------------------------

class Descriptors {
 public:
  using In = nb::handle;
  using Out = nb::handle;

  Descriptors(int device, bool check_stream) : check_stream_device(check_stream), device_(device) {}
  const bool check_stream_device;  // false: `stream` is the framework's current stream of `device`

  static bool given(nb::handle h) { return h.is_valid() && !h.is_none(); }
  flashcute::TensorRef in(const char* name, nb::handle desc) { return ref<flashcute::TensorRef>(name, desc); }
  flashcute::MutableTensorRef out(const char* name, nb::handle desc) {
    return ref<flashcute::MutableTensorRef>(name, desc);
  }
  void check_devices() const {}
  int device() const { return device_; }

 private:
  int device_;

  // A tuple of ints (torch.Size and Tensor.stride() are tuples) into out[]; returns its length.
  static int read_ints(const char* name, PyObject* seq, int64_t* out) {
    if (!PyTuple_Check(seq)) type_error(std::string(name) + ": expected the shape and strides as tuples of ints");
    const Py_ssize_t n = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n && i < flashcute::TensorRef::kMaxRank; ++i) {
      out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
      if (out[i] == -1 && PyErr_Occurred()) throw nb::python_error();
    }
    return int(n);
  }

  template <class Ref>
  static Ref ref(const char* name, nb::handle desc) {
    PyObject* t = desc.ptr();
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 3)))
      type_error(std::string(name) + ": expected a (data_ptr, shape, strides, dtype) descriptor");
    const unsigned long long ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 0));
    if (PyErr_Occurred()) throw nb::python_error();
    int64_t shape[flashcute::TensorRef::kMaxRank], strides[flashcute::TensorRef::kMaxRank];
    const int rank = read_ints(name, PyTuple_GET_ITEM(t, 1), shape);
    PyObject* stride_obj = PyTuple_GET_ITEM(t, 2);
    if (stride_obj != Py_None && read_ints(name, stride_obj, strides) != rank)
      value_error(std::string(name) + ": shape and strides differ in length");
    const char* label = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 3));  // lives as long as the descriptor
    if (!label) throw nb::python_error();
    return array_ref<Ref>(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(ptr)), dtype_from_name(label),
                          label, rank, shape, stride_obj == Py_None ? nullptr : strides);
  }
};

inline void check_stream(int64_t stream) {
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
}

inline void check_ok(const flashcute::Status& st) {
  if (!st.ok()) raise_status(st);
}

// After the validation: the devices, then (unless there is nothing to do) the launch.
template <class Source, class Plan>
void launch_checked(const Source& s, const Plan& plan, int64_t stream) {
  s.check_devices();
  if (!plan.empty) launch_on_device(plan, s.device(), stream, s.check_stream_device);
}

// Runs `op(source)` on the source the call's arrays come in: DLPack arrays (device < 0) or
// descriptors on CUDA device `device`.
template <class Op>
auto with_source(int device, bool check_stream_device, Op&& op) {
  if (device < 0) {
    DlpackArrays s;
    return op(s);
  }
  Descriptors s(device, check_stream_device);
  return op(s);
}

// The entry points: src/ext_ops.cpp (each operation, for either source), src/flashcute_ext.cpp
// (the module).
void fwd(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle options, int64_t stream,
         int device, bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
         int64_t max_seqlen_k);
void bwd(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle dq,
         nb::handle dk, nb::handle dv, nb::handle workspace, nb::handle options, bool deterministic, int64_t stream,
         int device, bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
         int64_t max_seqlen_k, bool partial_keys);
void merge(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out, nb::handle lse,
           int64_t stream, int device, bool check_stream_device);
int fwd_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse, nb::handle k,
                nb::handle v, nb::handle cache_seqlens, nb::handle block_table, nb::handle workspace_alloc,
                nb::handle options, int64_t num_splits, int64_t stream, int device, bool check_stream_device);
void check_fwd(nb::handle q, nb::handle k, nb::handle v, nb::handle options, nb::handle cu_seqlens_q,
               nb::handle cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k);
void check_options(nb::handle options, int64_t num_splits, int64_t max_seqlen_q, int64_t max_seqlen_k);

}  // namespace flashcute_ext
