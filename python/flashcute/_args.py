"""The arguments of flashcute's Python API: which framework an array belongs to (without importing
one the caller did not use), and the plain arguments checked, each error naming its argument."""

from __future__ import annotations

import math
import numbers
import operator
import sys
from typing import Any, Optional, Tuple

# DLPack device types (dlpack.h, DLDeviceType).
_KDL_CUDA = 2
_KDL_CUDA_MANAGED = 13
_DEVICE_TYPE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed"}

_TORCH, _CUPY, _JAX, _NUMPY, _DLPACK = "torch", "cupy", "jax", "numpy", "dlpack"
_FRAMEWORK_TYPE_NAMES = {
    _TORCH: "torch.Tensor",
    _CUPY: "cupy.ndarray",
    _JAX: "jax.Array",
    _NUMPY: "numpy.ndarray",
}


# ---------------------------------------------------------------------------
# Framework detection (never imports a framework: only looks in sys.modules)
# ---------------------------------------------------------------------------


def _framework(x: Any) -> Optional[str]:
    """Which framework `x` belongs to, or None if it is not an array at all."""
    mods = sys.modules
    torch = mods.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _TORCH
    cupy = mods.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return _CUPY
    jax = mods.get("jax")
    if jax is not None and isinstance(x, getattr(jax, "Array", ())):
        return _JAX
    np = mods.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return _NUMPY
    if hasattr(type(x), "__dlpack__") and hasattr(type(x), "__dlpack_device__"):
        return _DLPACK
    return None


def _type_name(x: Any) -> str:
    fw = _framework(x)
    if fw in _FRAMEWORK_TYPE_NAMES:
        return _FRAMEWORK_TYPE_NAMES[fw]
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _jax_is_concrete(x: Any) -> bool:
    # Concrete arrays are jaxlib's C++ ArrayImpl; tracers (inside jit / vmap / grad) are Python
    # classes of the jax package itself.
    t = type(x)
    return t.__module__.split(".")[0] == "jaxlib" or t.__name__ == "ArrayImpl"


def _check_cuda_array(name: str, x: Any) -> str:
    """Returns x's framework, or raises TypeError naming `name` if x is not a CUDA array."""
    fw = _framework(x)
    if fw is None:
        raise TypeError(
            f"{name}: expected a CUDA array (torch.Tensor, cupy.ndarray, jax.Array or another "
            f"DLPack producer), got {_type_name(x)}"
        )
    if fw == _NUMPY:
        raise TypeError(f"{name}: expected a CUDA array, got a CPU numpy.ndarray")
    if fw == _TORCH or fw == _CUPY:
        return fw  # torch: its path checks the device; CuPy arrays are CUDA arrays
    if fw == _JAX:
        if not _jax_is_concrete(x):
            return fw  # a tracer: where it runs is XLA's to decide (the FFI target is CUDA-only)
        ndev = len(x.devices())
        if ndev != 1:
            raise ValueError(f"{name}: a jax.Array sharded over {ndev} devices; flashcute needs single-device arrays")
    dev_type = int(x.__dlpack_device__()[0])
    if dev_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        where = _DEVICE_TYPE_NAMES.get(dev_type, f"device type {dev_type}")
        raise TypeError(f"{name}: expected a CUDA array, got a {where} {_type_name(x)}")
    return fw


# ---------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------


def _as_int(name: str, value: Any) -> int:
    if type(value) is int:  # the common case first: these run on every call
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {_type_name(value)}") from None


def _as_bool(name: str, value: Any) -> bool:
    if value is True or value is False:
        return value
    if type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name}: expected a bool, got {_type_name(value)}")


def _parse_window_size(window_size: Any) -> Tuple[int, int]:
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(
            f"window_size: expected a tuple (left, right) of two ints (-1: unbounded), got {window_size!r}"
        )
    left, right = (_as_int("window_size", w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size: each bound must be >= -1 (-1: unbounded), got {(left, right)!r}")
    return left, right


def _as_real(name: str, value: Any) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {_type_name(value)}")
    return float(value)


def _parse_options(softmax_scale: Any, causal: Any, window_size: Any,
                   softcap: Any) -> Tuple[Optional[float], bool, int, int, float]:
    """The attention options both passes take, checked: (softmax_scale or None, causal,
    window_left, window_right, softcap)."""
    window_left, window_right = _parse_window_size(window_size)
    softcap = _as_real("softcap", softcap)
    if not 0 <= softcap < math.inf:  # comparisons, not math.isfinite: also fine under torch.compile
        raise ValueError(f"softcap must be a finite number >= 0 (0 disables it), got {softcap!r}")
    if softmax_scale is not None:
        softmax_scale = _as_real("softmax_scale", softmax_scale)
        if not 0 < softmax_scale < math.inf:
            raise ValueError(f"softmax_scale must be a finite number > 0, got {softmax_scale!r}")
    return softmax_scale, _as_bool("causal", causal), window_left, window_right, softcap


def _kernel_args(q: Any, softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
                 softcap: float, dims: str = "(batch, seqlen_q, nheads, headdim)") -> Tuple[float, bool, int, int, float]:
    """The options as the bindings take them, the scale defaulting to 1 / sqrt(headdim) of q, whose
    dims (named for the error) end in headdim."""
    rank = dims.count(",") + 1
    if len(q.shape) != rank:
        raise ValueError(f"q: expected {rank} dims {dims}, got {len(q.shape)}")
    if softmax_scale is None:
        headdim = int(q.shape[-1])
        softmax_scale = 1.0 / math.sqrt(headdim) if headdim > 0 else 1.0  # headdim 0 is rejected by the validation
    return (float(softmax_scale), causal, window_left, window_right, softcap)


def _parse_stream(stream: Any) -> Optional[int]:
    """The stream handle as an int, or None for "the framework's current stream"."""
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise TypeError("stream: expected None, an int handle or a stream object, got bool")
    if isinstance(stream, numbers.Integral):
        handle = int(stream)
    elif hasattr(stream, "__cuda_stream__"):
        # CUDA stream protocol (cuda.core and friends): __cuda_stream__() -> (version, handle).
        proto = stream.__cuda_stream__
        proto = proto() if callable(proto) else proto
        try:
            _, handle = proto
            handle = operator.index(handle)
        except (TypeError, ValueError):
            raise TypeError(f"stream: __cuda_stream__ must return (version, handle), got {proto!r}") from None
    elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        handle = operator.index(stream.cuda_stream)
    elif hasattr(stream, "ptr"):  # cupy.cuda.Stream
        handle = operator.index(stream.ptr)
    else:
        raise TypeError(
            "stream: expected None, an int handle (cudaStream_t), or an object with __cuda_stream__, "
            f".cuda_stream or .ptr, got {_type_name(stream)}"
        )
    if handle < 0:
        raise ValueError(f"stream: expected a handle >= 0, got {handle}")
    return handle


def _check_fa2_only(dropout_p: Any, alibi_slopes: Any) -> None:
    """The FlashAttention-2 keywords flashcute accepts only at their default."""
    dropout_p = _as_real("dropout_p", dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p: expected a probability in [0, 1), got {dropout_p!r}")
    if dropout_p > 0.0:
        raise NotImplementedError(
            f"dropout_p: flashcute has no dropout yet, so dropout_p must be 0.0, got {dropout_p!r}"
        )
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: flashcute has no ALiBi yet, so alibi_slopes must be None")


def _one_framework(first: Tuple[str, Any], *named: Tuple[str, Any], optional: Tuple[str, ...] = ()) -> str:
    """The framework of the named arrays, which must all be CUDA arrays of the first one's framework;
    raises naming the first that is not. Those named in `optional` may be None (not given)."""
    first_name, x0 = first
    fw = _check_cuda_array(first_name, x0)
    for name, x in named:
        if x is None and name in optional:
            continue
        if _check_cuda_array(name, x) != fw:
            raise TypeError(f"{name}: is a {_type_name(x)} but {first_name} is a {_type_name(x0)}; all arrays must "
                            "come from the same framework")
    return fw
