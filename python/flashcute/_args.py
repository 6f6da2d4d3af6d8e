"""The arguments of flashcute's Python API: which framework an array belongs to (the framework
registry, which never imports a framework the caller did not use), and the plain arguments coerced
to the types the compiled module takes, each error naming its argument. Their ranges are the
compiled validation's (plan_*), asked through flashcute._C.check_options."""

from __future__ import annotations

import numbers
import operator
import sys
from typing import Any, Callable, Dict, Optional, Tuple

from . import _C

# DLPack device types (dlpack.h, DLDeviceType).
_KDL_CUDA = 2
_KDL_CUDA_MANAGED = 13
_DEVICE_TYPE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed"}


# ---------------------------------------------------------------------------
# The framework registry (never imports a framework: only looks in sys.modules)
# ---------------------------------------------------------------------------


class _Framework:
    """One kind of array: how to recognise it, what makes one usable, and its binding: the module
    (imported when the framework's first array is seen) that runs the calls for it, with the same
    functions for every framework: flash_attn, flash_attn_varlen, flash_attn_bwd,
    flash_attn_kvcache and merge_attn_states."""

    def __init__(self, name: str, module: str, type_path: str, type_name: str, load: Callable[[], Any]) -> None:
        self.name = name
        self.module = module  # its sys.modules key
        self.type_path = type_path  # the array type's attribute in that module
        self.type_name = type_name
        self.load = load  # imports the binding: an import statement, which torch.compile can trace
        self.binding: Any = None

    def array_type(self) -> Any:
        mod = sys.modules.get(self.module)
        return None if mod is None else getattr(mod, self.type_path, None)

    def check(self, name: str, x: Any) -> None:
        """Raises naming `name` unless x is a CUDA array flashcute can use (torch's binding checks
        the device itself; CuPy arrays are CUDA arrays)."""


def _load_torch() -> Any:
    from . import _torch
    return _torch


def _load_cupy() -> Any:
    from . import _cupy
    return _cupy


def _load_jax() -> Any:
    from . import _jax
    return _jax


def _load_dlpack() -> Any:
    from . import _dlpack
    return _dlpack


def _check_dlpack_device(name: str, x: Any) -> None:
    dev_type = int(x.__dlpack_device__()[0])
    if dev_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        where = _DEVICE_TYPE_NAMES.get(dev_type, f"device type {dev_type}")
        raise TypeError(f"{name}: expected a CUDA array, got a {where} {_type_name(x)}")


class _Numpy(_Framework):
    def check(self, name: str, x: Any) -> None:
        raise TypeError(f"{name}: expected a CUDA array, got a CPU numpy.ndarray")


class _Jax(_Framework):
    def check(self, name: str, x: Any) -> None:
        # Concrete arrays are jaxlib's C++ ArrayImpl; tracers (inside jit / vmap / grad) are Python
        # classes of the jax package itself, and where they run is XLA's to decide (the FFI target
        # is CUDA-only).
        t = type(x)
        if t.__module__.split(".")[0] != "jaxlib" and t.__name__ != "ArrayImpl":
            return
        ndev = len(x.devices())
        if ndev != 1:
            raise ValueError(f"{name}: a jax.Array sharded over {ndev} devices; flashcute needs single-device arrays")
        _check_dlpack_device(name, x)


class _AnyDlpack(_Framework):
    def array_type(self) -> Any:
        return None  # recognised by the protocol (_framework), not by a type

    def check(self, name: str, x: Any) -> None:
        _check_dlpack_device(name, x)


# In the order they are tried for a type seen the first time.
_FRAMEWORKS = (
    _Framework("torch", "torch", "Tensor", "torch.Tensor", _load_torch),
    _Framework("cupy", "cupy", "ndarray", "cupy.ndarray", _load_cupy),
    _Jax("jax", "jax", "Array", "jax.Array", _load_jax),
    _Numpy("numpy", "numpy", "ndarray", "numpy.ndarray", _load_dlpack),
)
_DLPACK = _AnyDlpack("dlpack", "", "", "", _load_dlpack)
_BY_TYPE: Dict[type, _Framework] = {}  # filled as types are seen: one dict lookup a call afterwards


def _framework(x: Any) -> Optional[_Framework]:
    """Which framework `x` belongs to, or None if it is not an array at all. The first array of a
    framework imports its binding."""
    fw = _BY_TYPE.get(type(x))
    if fw is not None:
        return fw
    for fw in _FRAMEWORKS:
        array_type = fw.array_type()
        if array_type is not None and isinstance(x, array_type):
            break
    else:
        if not (hasattr(type(x), "__dlpack__") and hasattr(type(x), "__dlpack_device__")):
            return None
        fw = _DLPACK
    if fw.binding is None:
        fw.binding = fw.load()
    _BY_TYPE[type(x)] = fw
    return fw


def _type_name(x: Any) -> str:
    fw = _framework(x)
    if fw is not None and fw.type_name:
        return fw.type_name
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _check_cuda_array(name: str, x: Any) -> _Framework:
    """Returns x's framework, or raises TypeError naming `name` if x is not a CUDA array."""
    fw = _framework(x)
    if fw is None:
        raise TypeError(
            f"{name}: expected a CUDA array (torch.Tensor, cupy.ndarray, jax.Array or another "
            f"DLPack producer), got {_type_name(x)}"
        )
    fw.check(name, x)
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
    return _as_int("window_size", window_size[0]), _as_int("window_size", window_size[1])


def _as_real(name: str, value: Any) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {_type_name(value)}")
    return float(value)


def _parse_options(softmax_scale: Any, causal: Any, window_size: Any,
                   softcap: Any) -> Tuple[Optional[float], bool, int, int, float]:
    """The options every attention call takes, as the compiled module takes them: the tuple
    (softmax_scale or None, causal, window_left, window_right, softcap). Only the types are
    coerced here: the ranges are plan_*'s rules, which the launch or the trace-time validation
    applies. A call whose arrays are refused before that asks flashcute._C.check_options first, so
    that a bad plain argument is reported before a bad array, as the compiled validation orders
    them, and a call that succeeds pays nothing for it."""
    window_left, window_right = _parse_window_size(window_size)
    return (None if softmax_scale is None else _as_real("softmax_scale", softmax_scale), _as_bool("causal", causal),
            window_left, window_right, _as_real("softcap", softcap))


def _never() -> bool:
    return False


# Whether a framework is tracing the call now (flashcute._torch sets torch.compiler.is_compiling):
# there the trace-time validation checks the plain arguments, and _C cannot be called.
_tracing = _never


def _check_scalars_first(*scalars: Any) -> None:
    """Called when an array is refused: raises for a bad plain argument instead (the arguments of
    flashcute._C.check_options), so that those are reported first, as the compiled validation
    orders them. A call that succeeds pays nothing for it: its validation checks them."""
    if not _tracing():
        _C.check_options(*scalars)


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


def _one_framework(first: Tuple[str, Any], *named: Tuple[str, Any], optional: Tuple[str, ...] = ()) -> _Framework:
    """The framework of the named arrays, which must all be CUDA arrays of the first one's framework;
    raises naming the first that is not. Those named in `optional` may be None (not given)."""
    first_name, x0 = first
    fw = _check_cuda_array(first_name, x0)
    for name, x in named:
        if x is None and name in optional:
            continue
        if _BY_TYPE.get(type(x)) is fw:  # a type seen before: skip the lookup's call
            fw.check(name, x)
        elif _check_cuda_array(name, x) is not fw:
            raise TypeError(f"{name}: is a {_type_name(x)} but {first_name} is a {_type_name(x0)}; all arrays must "
                            "come from the same framework")
    return fw
