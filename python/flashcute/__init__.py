"""flashcute: FlashAttention kernels for NVIDIA GPUs, on CUTLASS/CuTe.

>>> import torch, flashcute
>>> q = torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16)
>>> k = torch.randn(2, 1024, 4, 128, device="cuda", dtype=torch.bfloat16)
>>> v = torch.randn_like(k)
>>> out = flashcute.flash_attn_func(q, k, v, causal=True)  # (2, 1024, 16, 128)

Inputs may be torch tensors, CuPy arrays or JAX arrays (any DLPack CUDA array);
the output comes back in the caller's framework. See :func:`flash_attn_func`, whose
signature is FlashAttention-2's. :mod:`flashcute.testing` holds the reference attention and
the tolerance rule flashcute is tested with. Importing flashcute never initialises CUDA.
"""

import sys as _sys

try:
    from . import _C
except ImportError as e:  # pragma: no cover - only for broken installs / source checkouts
    raise ImportError(
        "flashcute: the compiled extension flashcute._C could not be imported "
        f"({e}). Install the package (pip install .) rather than importing it from the source tree."
    ) from e

from .flash_attn_interface import (flash_attn_bwd, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                                   flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                                   flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache, merge_attn_states)

if _sys.modules.get("torch") is not None:  # torch is there: register torch.ops.flashcute.* now
    from . import _torch  # noqa: F401  (otherwise the first call with a torch tensor registers it)

__version__: str = _C.__version__  # not in the generated _C.pyi: nanobind's stubgen leaves dunders out

# The public names; everything else in this namespace is a submodule or private.
__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_bwd",
    "merge_attn_states",
    "__version__",
    "is_available",
    "cuda_status",
    "compiled_head_dims",
    "compiled_dtypes",
    "compiled_kernels",
    "kernel_head_dim",
    "last_forward_path",
    "last_forward_tile",
    "last_backward_path",
]


def is_available() -> bool:
    """Whether a CUDA device is usable (the driver loads and at least one device is visible)."""
    return _C.cuda_device_count() > 0


def cuda_status() -> str:
    """Why :func:`is_available` says what it does, e.g. ``"cudaErrorInsufficientDriver: ..."``."""
    return _C.cuda_status()


def compiled_head_dims() -> list[int]:
    """Kernel head dims compiled into this build (build option FLASHCUTE_HEAD_DIMS), ascending.

    A head dim d (a multiple of 8, <= 256) runs on the smallest of these that is >= d.
    """
    return list(_C.compiled_head_dims())


def compiled_dtypes() -> list[str]:
    """Dtypes compiled into this build (build option FLASHCUTE_DTYPES): ``"float16"``, ``"bfloat16"``."""
    return list(_C.compiled_dtypes())


def compiled_kernels() -> list[tuple[str, str, str, int]]:
    """The kernels compiled into this build, as ``(family, direction, dtype, head dim)`` tuples,
    e.g. ``("sm80", "fwd", "bfloat16", 128)``: the list the build generated."""
    return list(_C.compiled_kernels())


def last_forward_path() -> str:
    """The kernel family the last forward launch of this process ran on: ``"sm90"`` (the Hopper
    wgmma + TMA kernels) or ``"sm80"`` (mma.sync, every GPU from sm80 on; ``"sm80"`` before any).

    On a compute capability 9.0 GPU a forward call runs on the sm90 kernels when the build has them
    (build option ``FLASHCUTE_CUDA_ARCHS`` naming ``90a``, the default) and TMA can read its arrays
    (strides multiples of 16 bytes); a KV-cache call (``flash_attn_with_kvcache``) does with 64
    query rows or more, and runs on the sm80 split-KV kernels below that (decode).
    ``FLASHCUTE_FORWARD_PATH=sm80`` in the environment keeps every call on the sm80 kernels. Under
    CUDA-graph capture or torch.compile this reports the launch made at capture time.
    """
    return _C.last_forward_path()


def last_backward_path() -> str:
    """The kernel family the last backward launch of this process ran on: ``"sm90"`` (the Hopper
    wgmma + TMA backward) or ``"sm80"`` (mma.sync; also before any launch).

    On a compute capability 9.0 GPU a call runs on the Hopper backward where the build has it and
    it can take the call: head dims up to 128, a fixed-length or varlen batch, strides TMA can read.
    ``FLASHCUTE_BACKWARD_PATH=sm80`` in the
    environment keeps every call on the mma.sync backward (``auto``, the default, and ``sm90``
    take the Hopper one); any other value is a ValueError naming the variable. A diagnostic, like
    :func:`last_forward_path`.
    """
    return _C.last_backward_path()


def last_forward_tile() -> tuple[int, int]:
    """The tile ``(block_m, block_n)`` of the kernel the last forward launch of this process ran on:
    query rows per tile and keys per main-loop step; ``(0, 0)`` before any launch.

    On the sm90 kernels some head dims have a second, long-sequence tile (head dim 64: 192 x 128
    instead of 256 x 64), which a call takes when it is long enough to gain from it.
    ``FLASHCUTE_SM90_TILES`` in the environment chooses: ``auto`` (the default), ``base`` (the
    first tiles always) or ``long`` (the long-sequence tiles wherever a head dim has them); any
    other value is a ValueError naming the variable. A diagnostic, like :func:`last_forward_path`.
    """
    return _C.last_forward_tile()


def kernel_head_dim(head_dim: int) -> int:
    """The kernel head dim that ``head_dim`` runs on in this build, or 0 if none is compiled."""
    return _C.kernel_head_dim(head_dim)


del _sys
