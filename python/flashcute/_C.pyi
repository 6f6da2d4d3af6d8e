"""flashcute._C: the compiled core of flashcute (FlashAttention forward kernels on CUTLASS/CuTe).

Low-level backend of :func:`flashcute.flash_attn_func`. Importing it never initialises CUDA.

Arrays are taken through DLPack (``__dlpack__``), the buffer protocol, or as raw DLPack capsules
("dltensor" / "dltensor_versioned"). Problems are reported as Python exceptions whose message
starts with the name of the offending argument:

* ``TypeError``: not an array, a wrong dtype, or not a CUDA array;
* ``ValueError``: a wrong rank, shape, stride, alignment or value, or arrays on different devices;
* ``NotImplementedError``: the dtype or head dim was left out of this build (build options
  ``FLASHCUTE_DTYPES`` / ``FLASHCUTE_HEAD_DIMS``);
* ``RuntimeError``: a CUDA runtime call or the launch failed.

The device check comes after every structural check, so all other messages can be produced
with CPU (e.g. NumPy) arrays.
"""

from typing import Any, Dict, List, Optional, Tuple

__version__: str
"""The flashcute version this module was built as."""

MAX_HEAD_DIM: int
"""The largest supported head dim (256)."""

KERNEL_HEAD_DIMS: Tuple[int, ...]
"""Every kernel head dim flashcute has (32, 64, 96, 128, 192, 256), compiled into this build or not."""

BUILD_OPTIONS: Dict[str, str]
"""The build options this module was built with, as CMake parsed them, ","-separated:
``{"FLASHCUTE_CUDA_ARCHS": "80,90", "FLASHCUTE_HEAD_DIMS": "32,64,...", "FLASHCUTE_DTYPES": "fp16,bf16"}``."""

def fwd(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Optional[Any],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    stream: int,
) -> None:
    """Runs the attention forward pass on ``stream``, writing ``out`` and, unless None, ``lse``.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), float16 or bfloat16.
        k: (batch, seqlen_k, nheads_k, headdim), q's dtype; nheads % nheads_k == 0.
        v: k's shape and q's dtype.
        out: q's shape and dtype; written, never read. Must not overlap itself (or q, k, v).
        lse: None, or float32 (batch, nheads, seqlen_q) with unit stride along seqlen_q: the
            natural-log logsumexp of each row of scaled, softcapped, masked scores (-inf for a row
            that sees no key).
        softmax_scale: finite, > 0.
        causal: bottom-right aligned causal mask (forces window_right = 0).
        window_left, window_right: -1 (unbounded) or >= 0. Query i sees key j iff
            ``i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right``.
        softcap: >= 0; > 0 applies ``softcap * tanh(scores / softcap)``.
        stream: a ``cudaStream_t`` as an int (0: default stream, 1: cudaStreamLegacy,
            2: cudaStreamPerThread); must belong to q's device.

    Requirements on q, k, v, out: headdim a multiple of 8 and <= 256; last dim contiguous
    (stride 1); batch, row and head strides non-negative multiples of 8 elements (16 bytes);
    data 16-byte aligned; all on one CUDA device. Strides of dims of extent 1 are ignored.

    A zero batch or seqlen_q returns without launching. seqlen_k == 0 writes out = 0 and
    lse = -inf. Releases the GIL during the launch; never synchronises.
    """

def cuda_device_count() -> int:
    """Number of visible CUDA devices; 0 when ``cudaGetDeviceCount`` fails (no driver, no device).

    Never raises; :func:`cuda_status` says why the count is 0.
    """

def cuda_status() -> str:
    """The outcome of ``cudaGetDeviceCount`` as text.

    ``"<cudaError name>: <description>"`` on failure (e.g. ``"cudaErrorInsufficientDriver: CUDA
    driver version is insufficient for CUDA runtime version"``), otherwise
    ``"cudaSuccess: <n> CUDA device(s)"`` or ``"cudaSuccess: no CUDA device found"``.
    """

def compiled_head_dims() -> List[int]:
    """Kernel head dims compiled into this build (``FLASHCUTE_ENABLE_HDIM<d>``), ascending."""

def compiled_dtypes() -> List[str]:
    """Dtypes compiled into this build (``FLASHCUTE_ENABLE_FP16/BF16``): ``"float16"``, ``"bfloat16"``."""

def kernel_head_dim(head_dim: int) -> int:
    """The kernel head dim ``head_dim`` runs on: the smallest compiled kernel head dim >= head_dim.

    Returns 0 if no such kernel is compiled. Raises ValueError unless head_dim is a multiple of 8
    in [8, 256].
    """

def stream_synchronize(stream: int, device: int) -> None:
    """Blocks (GIL released) until the work queued on ``stream`` of CUDA device ``device`` is done.

    Synchronises that one stream, never the device. Used by flash_attn_func for JAX, which has no
    stream that flashcute could order its work on.
    """
