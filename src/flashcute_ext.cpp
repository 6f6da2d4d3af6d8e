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
#include <vector>

#include "flashcute/host/api.hpp"

#ifdef FLASHCUTE_WITH_XLA_FFI
#include <utility>
// src/xla_ffi.cpp: the XLA FFI handlers, (target name, handler) pairs.
std::vector<std::pair<const char*, void*>> flashcute_xla_ffi_handlers();
#endif

#ifndef FLASHCUTE_VERSION
#define FLASHCUTE_VERSION "0.0.0+unknown"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

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

// A failed Status as the matching Python exception, with arg / expected / got attached.
[[noreturn]] void raise_status(const flashcute::Status& st) {
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

flashcute::DType to_dtype(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return flashcute::DType::kOther;
  if (dt.code == uint8_t(C::Float) && dt.bits == 16) return flashcute::DType::kFloat16;
  if (dt.code == uint8_t(C::Bfloat) && dt.bits == 16) return flashcute::DType::kBFloat16;
  if (dt.code == uint8_t(C::Float) && dt.bits == 32) return flashcute::DType::kFloat32;
  if (dt.code == uint8_t(C::Int) && dt.bits == 32) return flashcute::DType::kInt32;
  return flashcute::DType::kOther;
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

[[noreturn]] void not_an_array(const char* name, nb::handle obj) {
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

Input import_input(const char* name, nb::handle obj) {
  Input in;
  if (!obj.is_valid() || obj.is_none() || !nb::try_cast<InArray>(obj, in.array, /*convert=*/false) ||
      !in.array.is_valid())
    not_an_array(name, obj);
  in.describe();
  return in;
}

Output import_output(const char* name, nb::handle obj) {
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

template <class Array>
void check_device(const char* name, const Array& a, const InArray& q) {
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

bool is_special_stream(int64_t s) {
  // 0: the default stream; 1: cudaStreamLegacy; 2: cudaStreamPerThread.
  return s == 0 || s == 1 || s == 2;
}

// Launches a plan without the GIL, with `device` current. check_stream_device: ask the runtime
// which device a user-given stream belongs to (a framework's own current stream needs no check).
template <class Plan>
void launch_on_device(const Plan& plan, int device, int64_t stream, bool check_stream_device) {
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

bool given(nb::handle h) { return h.is_valid() && !h.is_none(); }

void check_varlen_pair(nb::handle cu_q, nb::handle cu_k) {
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
    // Moved into the optionals: their refs must name the dtype strings at their new address.
    cu_q->ref.dtype_label = cu_q->dtype_label.c_str();
    cu_k->ref.dtype_label = cu_k->dtype_label.c_str();
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
// fwd
// ---------------------------------------------------------------------------

void fwd(nb::handle q_obj, nb::handle k_obj, nb::handle v_obj, nb::handle out_obj, nb::handle lse_obj,
         double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
         int64_t stream, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
         int64_t max_seqlen_k) {
  // 1. Import. Nothing here touches the device.
  const Input q = import_input("q", q_obj);
  const Input k = import_input("k", k_obj);
  const Input v = import_input("v", v_obj);
  const Output out = import_output("out", out_obj);
  std::optional<Output> lse;
  if (lse_obj.is_valid() && !lse_obj.is_none()) {
    lse = import_output("lse", lse_obj);
    lse->ref.dtype_label = lse->dtype_label.c_str();  // moved: name the string at its new address
  }
  const VarlenInputs varlen(cu_seqlens_q, cu_seqlens_k);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));

  // 2. The library's validation.
  flashcute::FwdArgs args;
  args.q = q.ref;
  args.k = k.ref;
  args.v = v.ref;
  args.out = out.ref;
  if (lse) args.lse = lse->ref;
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  args.varlen = varlen.args(max_seqlen_q, max_seqlen_k);
  flashcute::FwdPlan plan;
  if (flashcute::Status st = flashcute::plan_fwd(args, plan); !st.ok()) raise_status(st);

  // 3. Devices, last.
  check_device("q", q.array, q.array);
  check_device("k", k.array, q.array);
  check_device("v", v.array, q.array);
  check_device("out", out.array, q.array);
  if (lse) check_device("lse", lse->array, q.array);
  varlen.check_devices(q.array);
  if (plan.empty) return;

  // 4. Launch.
  launch_on_device(plan, q.array.device_id(), stream, /*check_stream_device=*/true);
}

// ---------------------------------------------------------------------------
// fwd_raw: the same call with arrays described by plain values (the framework's eager fast path)
// ---------------------------------------------------------------------------

flashcute::DType dtype_from_name(const std::string& name) {
  if (name == "float16") return flashcute::DType::kFloat16;
  if (name == "bfloat16") return flashcute::DType::kBFloat16;
  if (name == "float32") return flashcute::DType::kFloat32;
  if (name == "int32") return flashcute::DType::kInt32;
  return flashcute::DType::kOther;
}

// A tuple of ints (torch.Size and Tensor.stride() are tuples) into out[]; returns its length.
// Read with the tuple API: this runs four times on every eager call.
size_t read_ints(const char* name, PyObject* seq, int64_t* out) {
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
Ref ref_from_desc(const char* name, nb::handle desc, std::string& label) {
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

// Arrays whose framework already checked that they live on one CUDA device, `device`; `stream`
// is that framework's current stream of the device (or one the caller named, checked when
// check_stream_device). No DLPack export: the descriptors are built in Python from the arrays'
// own attributes, which costs less per call.
// The varlen arguments of a raw call: descriptors like the arrays'.
std::optional<flashcute::VarlenArgs> varlen_from_desc(nb::handle cu_q, nb::handle cu_k, int64_t max_q, int64_t max_k,
                                                      std::string* labels) {
  check_varlen_pair(cu_q, cu_k);
  if (!given(cu_q)) return std::nullopt;
  return flashcute::VarlenArgs{ref_from_desc<flashcute::TensorRef>("cu_seqlens_q", cu_q, labels[0]),
                               ref_from_desc<flashcute::TensorRef>("cu_seqlens_k", cu_k, labels[1]), max_q, max_k};
}

void fwd_raw(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, double softmax_scale,
             bool causal, int64_t window_left, int64_t window_right, double softcap, int device, int64_t stream,
             bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, int64_t max_seqlen_q,
             int64_t max_seqlen_k) {
  std::string labels[7];
  flashcute::FwdArgs args;
  args.q = ref_from_desc<flashcute::TensorRef>("q", q, labels[0]);
  args.k = ref_from_desc<flashcute::TensorRef>("k", k, labels[1]);
  args.v = ref_from_desc<flashcute::TensorRef>("v", v, labels[2]);
  args.out = ref_from_desc<flashcute::MutableTensorRef>("out", out, labels[3]);
  if (lse.is_valid() && !lse.is_none()) args.lse = ref_from_desc<flashcute::MutableTensorRef>("lse", lse, labels[4]);
  args.varlen = varlen_from_desc(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, labels + 5);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  if (device < 0) value_error("device: expected a CUDA device index >= 0, got " + std::to_string(device));
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  flashcute::FwdPlan plan;
  if (flashcute::Status st = flashcute::plan_fwd(args, plan); !st.ok()) raise_status(st);
  if (!plan.empty) launch_on_device(plan, device, stream, check_stream_device);
}

// ---------------------------------------------------------------------------
// bwd, bwd_raw: the backward pass (DLPack arrays / plain descriptors)
// ---------------------------------------------------------------------------

void bwd(nb::handle dout_obj, nb::handle q_obj, nb::handle k_obj, nb::handle v_obj, nb::handle out_obj,
         nb::handle lse_obj, nb::handle dq_obj, nb::handle dk_obj, nb::handle dv_obj, nb::handle workspace_obj,
         double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
         bool deterministic, int64_t stream, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
         int64_t max_seqlen_q, int64_t max_seqlen_k) {
  const Input dout = import_input("dout", dout_obj);
  const Input q = import_input("q", q_obj);
  const Input k = import_input("k", k_obj);
  const Input v = import_input("v", v_obj);
  const Input out = import_input("out", out_obj);
  const Input lse = import_input("lse", lse_obj);
  const Output dq = import_output("dq", dq_obj);
  const Output dk = import_output("dk", dk_obj);
  const Output dv = import_output("dv", dv_obj);
  const Output workspace = import_output("workspace", workspace_obj);
  const VarlenInputs varlen(cu_seqlens_q, cu_seqlens_k);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));

  flashcute::BwdArgs args;
  args.dout = dout.ref;
  args.q = q.ref;
  args.k = k.ref;
  args.v = v.ref;
  args.out = out.ref;
  args.lse = lse.ref;
  args.dq = dq.ref;
  args.dk = dk.ref;
  args.dv = dv.ref;
  args.workspace = workspace.ref;
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  args.deterministic = deterministic;
  args.varlen = varlen.args(max_seqlen_q, max_seqlen_k);
  flashcute::BwdPlan plan;
  if (flashcute::Status st = flashcute::plan_bwd(args, plan); !st.ok()) raise_status(st);

  varlen.check_devices(q.array);
  check_device("dout", dout.array, q.array);
  check_device("q", q.array, q.array);
  check_device("k", k.array, q.array);
  check_device("v", v.array, q.array);
  check_device("out", out.array, q.array);
  check_device("lse", lse.array, q.array);
  check_device("dq", dq.array, q.array);
  check_device("dk", dk.array, q.array);
  check_device("dv", dv.array, q.array);
  check_device("workspace", workspace.array, q.array);
  if (plan.empty) return;
  launch_on_device(plan, q.array.device_id(), stream, /*check_stream_device=*/true);
}

void bwd_raw(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle dq,
             nb::handle dk, nb::handle dv, nb::handle workspace, double softmax_scale, bool causal,
             int64_t window_left, int64_t window_right, double softcap, bool deterministic, int device,
             int64_t stream, bool check_stream_device, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
             int64_t max_seqlen_q, int64_t max_seqlen_k) {
  std::string labels[12];
  flashcute::BwdArgs args;
  args.dout = ref_from_desc<flashcute::TensorRef>("dout", dout, labels[0]);
  args.q = ref_from_desc<flashcute::TensorRef>("q", q, labels[1]);
  args.k = ref_from_desc<flashcute::TensorRef>("k", k, labels[2]);
  args.v = ref_from_desc<flashcute::TensorRef>("v", v, labels[3]);
  args.out = ref_from_desc<flashcute::TensorRef>("out", out, labels[4]);
  args.lse = ref_from_desc<flashcute::TensorRef>("lse", lse, labels[5]);
  args.dq = ref_from_desc<flashcute::MutableTensorRef>("dq", dq, labels[6]);
  args.dk = ref_from_desc<flashcute::MutableTensorRef>("dk", dk, labels[7]);
  args.dv = ref_from_desc<flashcute::MutableTensorRef>("dv", dv, labels[8]);
  args.workspace = ref_from_desc<flashcute::MutableTensorRef>("workspace", workspace, labels[9]);
  args.varlen = varlen_from_desc(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, labels + 10);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  if (device < 0) value_error("device: expected a CUDA device index >= 0, got " + std::to_string(device));
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  args.deterministic = deterministic;
  flashcute::BwdPlan plan;
  if (flashcute::Status st = flashcute::plan_bwd(args, plan); !st.ok()) raise_status(st);
  if (!plan.empty) launch_on_device(plan, device, stream, check_stream_device);
}

// ---------------------------------------------------------------------------
// merge, merge_raw: merge_attn_states (DLPack arrays / plain descriptors)
// ---------------------------------------------------------------------------

void merge(nb::handle out_a_obj, nb::handle lse_a_obj, nb::handle out_b_obj, nb::handle lse_b_obj, nb::handle out_obj,
           nb::handle lse_obj, int64_t stream) {
  const Input out_a = import_input("out_a", out_a_obj);
  const Input lse_a = import_input("lse_a", lse_a_obj);
  const Input out_b = import_input("out_b", out_b_obj);
  const Input lse_b = import_input("lse_b", lse_b_obj);
  const Output out = import_output("out", out_obj);
  const Output lse = import_output("lse", lse_obj);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  flashcute::MergeArgs args{out_a.ref, lse_a.ref, out_b.ref, lse_b.ref, out.ref, lse.ref};
  flashcute::MergePlan plan;
  if (flashcute::Status st = flashcute::plan_merge(args, plan); !st.ok()) raise_status(st);
  check_device("out_a", out_a.array, out_a.array);
  check_device("lse_a", lse_a.array, out_a.array);
  check_device("out_b", out_b.array, out_a.array);
  check_device("lse_b", lse_b.array, out_a.array);
  check_device("out", out.array, out_a.array);
  check_device("lse", lse.array, out_a.array);
  if (plan.empty) return;
  launch_on_device(plan, out_a.array.device_id(), stream, /*check_stream_device=*/true);
}

void merge_raw(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out, nb::handle lse,
               int device, int64_t stream, bool check_stream_device) {
  std::string labels[6];
  flashcute::MergeArgs args;
  args.out_a = ref_from_desc<flashcute::TensorRef>("out_a", out_a, labels[0]);
  args.lse_a = ref_from_desc<flashcute::TensorRef>("lse_a", lse_a, labels[1]);
  args.out_b = ref_from_desc<flashcute::TensorRef>("out_b", out_b, labels[2]);
  args.lse_b = ref_from_desc<flashcute::TensorRef>("lse_b", lse_b, labels[3]);
  args.out = ref_from_desc<flashcute::MutableTensorRef>("out", out, labels[4]);
  args.lse = ref_from_desc<flashcute::MutableTensorRef>("lse", lse, labels[5]);
  if (stream < 0) value_error("stream: expected a CUDA stream handle >= 0, got " + std::to_string(stream));
  if (device < 0) value_error("device: expected a CUDA device index >= 0, got " + std::to_string(device));
  flashcute::MergePlan plan;
  if (flashcute::Status st = flashcute::plan_merge(args, plan); !st.ok()) raise_status(st);
  if (!plan.empty) launch_on_device(plan, device, stream, check_stream_device);
}

int64_t bwd_workspace_floats(int64_t batch, int64_t nheads, int64_t seqlen_q) {
  return flashcute::bwd_workspace_floats(batch, nheads, seqlen_q);
}

// The validation alone, for contiguous arrays of the given shapes and dtype names, as a tracer
// (torch.compile's fake tensors, jax.jit) sees them: raises what fwd would, launches nothing.
void check_fwd(std::vector<int64_t> q_shape, std::vector<int64_t> k_shape, std::vector<int64_t> v_shape,
               std::string q_dtype, std::string k_dtype, std::string v_dtype, double softmax_scale, bool causal,
               int64_t window_left, int64_t window_right, double softcap,
               std::optional<std::vector<int64_t>> cu_seqlens_q_shape, std::optional<std::vector<int64_t>> cu_seqlens_k_shape,
               std::string cu_seqlens_q_dtype, std::string cu_seqlens_k_dtype, int64_t max_seqlen_q,
               int64_t max_seqlen_k) {
  // Never dereferenced: 256-byte aligned stand-ins for the buffers a framework will allocate.
  auto contiguous = [](const void* data, const std::vector<int64_t>& shape, const std::string& dtype) {
    flashcute::TensorRef r;
    r.data = data;
    r.rank = int(shape.size());
    int64_t stride = 1;
    for (int i = std::min(r.rank, flashcute::TensorRef::kMaxRank) - 1; i >= 0; --i) {
      r.shape[i] = shape[size_t(i)];
      r.stride[i] = stride;
      stride *= std::max<int64_t>(shape[size_t(i)], 1);
    }
    r.dtype = dtype_from_name(dtype);
    return r;
  };
  const void* fake = reinterpret_cast<const void*>(std::uintptr_t{256});
  flashcute::FwdArgs args;
  args.q = contiguous(fake, q_shape, q_dtype);
  args.q.dtype_label = q_dtype.c_str();
  args.k = contiguous(fake, k_shape, k_dtype);
  args.k.dtype_label = k_dtype.c_str();
  args.v = contiguous(fake, v_shape, v_dtype);
  args.v.dtype_label = v_dtype.c_str();
  static_cast<flashcute::TensorRef&>(args.out) = contiguous(fake, q_shape, q_dtype);  // made like q
  args.out.dtype_label = q_dtype.c_str();
  args.set_options(softmax_scale, causal, window_left, window_right, softcap);
  if (cu_seqlens_q_shape.has_value() != cu_seqlens_k_shape.has_value())
    value_error("cu_seqlens_k: a variable-length call takes both cu_seqlens_q and cu_seqlens_k");
  if (cu_seqlens_q_shape) {
    flashcute::VarlenArgs vl{contiguous(fake, *cu_seqlens_q_shape, cu_seqlens_q_dtype),
                             contiguous(fake, *cu_seqlens_k_shape, cu_seqlens_k_dtype), max_seqlen_q, max_seqlen_k};
    vl.cu_seqlens_q.dtype_label = cu_seqlens_q_dtype.c_str();
    vl.cu_seqlens_k.dtype_label = cu_seqlens_k_dtype.c_str();
    args.varlen = vl;
  }
  flashcute::FwdPlan plan;
  if (flashcute::Status st = flashcute::plan_fwd(args, plan); !st.ok()) raise_status(st);
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
    list.emplace_back(flashcute::arch_name(key.arch), flashcute::direction_name(key.direction),
                      flashcute::dtype_name(key.dtype), key.head_dim);
  return list;
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

}  // namespace

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
    m.attr("BUILD_OPTIONS") = opts;
  }
  {
    nb::list all;
    for (int hd : flashcute::kKernelHeadDims) all.append(hd);
    m.attr("KERNEL_HEAD_DIMS") = nb::steal<nb::tuple>(PySequence_Tuple(all.ptr()));
  }

  // The arrays are taken as plain objects (None included) so that fwd() itself can say which
  // argument is wrong and why, instead of nanobind's generic overload error.
  m.def("fwd", &fwd, "q"_a.none(), "k"_a.none(), "v"_a.none(), "out"_a.none(), "lse"_a.none(), "softmax_scale"_a,
        "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "stream"_a, "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0,
        "Runs the attention forward pass, writing `out` (and `lse` unless None) on `stream`.\n\n"
        "q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim); float16 or\n"
        "bfloat16, all the same; the last dim contiguous, batch/row/head strides multiples of 8 elements,\n"
        "16-byte aligned. out: like q, writable. lse: None or float32 (batch, nheads, seqlen_q). stream:\n"
        "a cudaStream_t as an int. Never synchronises. Raises TypeError / ValueError naming the argument\n"
        "(with .arg, .expected and .got), NotImplementedError for a dtype / head dim left out of the\n"
        "build, RuntimeError for CUDA errors.\n\n"
        "Variable-length batch: cu_seqlens_q and cu_seqlens_k, int32 (batch + 1,) CUDA arrays, with\n"
        "max_seqlen_q / max_seqlen_k; q, k, v, out are then (total, heads, headdim) and lse (nheads, total_q).");
  m.def("fwd_raw", &fwd_raw, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "softmax_scale"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "softcap"_a, "device"_a, "stream"_a, "check_stream_device"_a, "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0,
        "fwd() for arrays described as (data_ptr, shape, strides, dtype name) tuples on CUDA device `device`\n"
        "(the caller checked that). The eager fast path of the torch binding: no DLPack export.");
  m.def("check_fwd", &check_fwd, "q_shape"_a, "k_shape"_a, "v_shape"_a, "q_dtype"_a, "k_dtype"_a, "v_dtype"_a,
        "softmax_scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a,
        "cu_seqlens_q_shape"_a.none() = nb::none(), "cu_seqlens_k_shape"_a.none() = nb::none(),
        "cu_seqlens_q_dtype"_a = "int32", "cu_seqlens_k_dtype"_a = "int32", "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0,
        "The validation of fwd() for contiguous arrays of these shapes and dtype names, as tracers see them\n"
        "(torch.compile, jax.jit): raises what fwd() would raise for them; launches nothing.");
  m.def("bwd", &bwd, "dout"_a.none(), "q"_a.none(), "k"_a.none(), "v"_a.none(), "out"_a.none(), "lse"_a.none(),
        "dq"_a.none(), "dk"_a.none(), "dv"_a.none(), "workspace"_a.none(), "softmax_scale"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a, "stream"_a, "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0,
        "Runs the attention backward pass, writing dq, dk and dv on `stream`.\n\n"
        "dout, dq: like q; dk, dv: like k; out, lse: the forward's; workspace: float32 with at least\n"
        "bwd_workspace_floats(batch, nheads, seqlen_q) elements. The same rules and errors as fwd().");
  m.def("bwd_raw", &bwd_raw, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "workspace"_a,
        "softmax_scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a, "device"_a,
        "stream"_a, "check_stream_device"_a, "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0,
        "bwd() for arrays described as (data_ptr, shape, strides, dtype name) tuples (see fwd_raw).");
  m.def("merge", &merge, "out_a"_a.none(), "lse_a"_a.none(), "out_b"_a.none(), "lse_b"_a.none(), "out"_a.none(),
        "lse"_a.none(), "stream"_a,
        "merge_attn_states: writes out and lse, the attention over the union of two disjoint key sets, from\n"
        "each set's (out, lse), on `stream`. out_*: (batch, seqlen, nheads, headdim) or (total, nheads, headdim),\n"
        "float16 / bfloat16 / float32; lse_*: float32 (batch, nheads, seqlen) or (nheads, total). out may be\n"
        "out_a (in place). The same error rules as fwd().");
  m.def("merge_raw", &merge_raw, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a, "device"_a, "stream"_a,
        "check_stream_device"_a, "merge() for arrays described as (data_ptr, shape, strides, dtype name) tuples.");
  m.def("bwd_workspace_floats", &bwd_workspace_floats, "batch"_a, "nheads"_a, "seqlen_q"_a,
        "float32 elements of workspace a backward call of these shapes needs.");
  m.def("xla_ffi_targets", &xla_ffi_targets,
        "The XLA FFI handlers compiled into this build, {name: PyCapsule}, for jax.ffi.register_ffi_target\n"
        "(platform 'CUDA'); empty when the build found no XLA FFI headers (build option FLASHCUTE_XLA_FFI).");
  m.def("cuda_device_count", &cuda_device_count,
        "Number of visible CUDA devices; 0 when cudaGetDeviceCount fails (no driver, no device).");
  m.def("cuda_status", &cuda_status,
        "Why cuda_device_count() returned what it did, e.g. 'cudaErrorInsufficientDriver: CUDA driver version "
        "is insufficient for CUDA runtime version' or 'cudaSuccess: 1 CUDA device(s)'.");
  m.def("compiled_head_dims", &compiled_head_dims, "Kernel head dims compiled into this build, ascending.");
  m.def("compiled_dtypes", &compiled_dtypes, "Dtypes compiled into this build: a subset of ['float16', 'bfloat16'].");
  m.def("compiled_kernels", &compiled_kernels,
        "The kernels compiled into this build, as (family, direction, dtype, head dim) tuples,\n"
        "e.g. ('sm80', 'fwd', 'bfloat16', 128): the list CMake generated (flashcute/build_config.hpp).");
  m.def("kernel_head_dim", &kernel_head_dim, "head_dim"_a,
        "The kernel head dim a user head dim runs on (the smallest compiled one >= head_dim), 0 if none.\n"
        "Raises ValueError unless head_dim is a multiple of 8 in [8, 256].");
}
