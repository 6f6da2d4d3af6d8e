"""flashcute's binding for a DLPack producer it does not know (the registry's last entry,
flashcute._args): flashcute cannot allocate through it, so only :func:`flash_attn` with ``out=`` and
without the lse runs; every other call says what to do instead. The same functions as the other
bindings (flashcute._torch, _cupy, _jax)."""

from typing import Any, NoReturn, Optional, Tuple

from . import _C
from ._args import _type_name


def _unsupported(what: str, x: Any) -> NoReturn:
    raise TypeError(f"{what} allocates through torch or CuPy, and q is a {_type_name(x)}; convert the arrays")


def flash_attn(q: Any, k: Any, v: Any, out: Any, return_lse: bool, stream: Optional[int],
               options: tuple, deterministic: bool = False) -> Tuple[Any, None]:
    if out is None or return_lse:
        raise TypeError(
            f"q: flashcute allocates outputs through torch, CuPy or JAX, and q is a {_type_name(q)}; "
            "pass out= (a CUDA array like q) and return_lse=False, or convert the inputs"
        )
    # The DLPack protocol: the consumer names its stream (1 = legacy default, 0 is not allowed) and
    # the producer makes it wait for its pending work.
    handle = 0 if stream is None else stream
    dl_stream = 1 if handle == 0 else handle
    _C.fwd(*(a.__dlpack__(stream=dl_stream) for a in (q, k, v, out)), None, options, handle)
    return out, None


def flash_attn_varlen(q: Any, *args: Any) -> NoReturn:
    _unsupported("q: flash_attn_varlen_func", q)


def flash_attn_bwd(dout: Any, q: Any, *args: Any) -> NoReturn:
    _unsupported("q: flash_attn_bwd", q)


def flash_attn_kvcache(q: Any, *args: Any) -> NoReturn:
    raise TypeError("q: flash_attn_with_kvcache updates the cache in place, which needs torch or CuPy arrays, "
                    f"and q is a {_type_name(q)}")


def merge_attn_states(out_a: Any, *args: Any) -> NoReturn:
    raise TypeError(f"out_a: merge_attn_states allocates through torch, CuPy or JAX, and out_a is a "
                    f"{_type_name(out_a)}; convert the arrays")
