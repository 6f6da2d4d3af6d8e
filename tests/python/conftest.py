"""Shared pytest setup for flashcute's Python tests.

Markers:
  gpu    needs a CUDA device; skipped (with the CUDA runtime's reason) when
         flashcute._C.cuda_device_count() == 0, e.g. in CI.
  large  needs lots of GPU memory and time (deselect with -m "not large").

Fixtures `torch`, `cupy` and `jax` skip the test when the framework is missing or
cannot see a GPU; every GPU test uses one of them or the `gpu` marker, so on a
machine without a GPU they skip, never pass. `require_kernel` skips a test whose
dtype / head dim this build left out. The reference and the tolerance rule are the
package's own: flashcute.testing.
"""

from __future__ import annotations

import os

import pytest

# JAX preallocates 75% of GPU memory on first use, which would starve torch and
# CuPy in the same process. Must be set before jax is imported.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# flashcute itself is imported lazily: some tests (the bench CLI's) run without the extension.


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "large: needs > 24 GiB of free GPU memory and minutes of GPU time")


_DEVICE_COUNT: int | None = None
_CUDA_STATUS = ""


def cuda_device_count() -> int:
    global _DEVICE_COUNT, _CUDA_STATUS
    if _DEVICE_COUNT is None:
        from flashcute import _C

        _DEVICE_COUNT = _C.cuda_device_count()
        _CUDA_STATUS = _C.cuda_status()
    return _DEVICE_COUNT


def no_gpu_reason() -> str:
    cuda_device_count()
    return f"no CUDA device: {_CUDA_STATUS}"


def require_gpu() -> None:
    if cuda_device_count() == 0:
        pytest.skip(no_gpu_reason())


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None or item.get_closest_marker("large") is not None:
        require_gpu()


@pytest.fixture(scope="session")
def torch():
    """torch with a CUDA device, TF32 off (the fp32 references must be real fp32)."""
    require_gpu()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch cannot see a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


@pytest.fixture(scope="session")
def cupy():
    require_gpu()
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("CuPy cannot see a CUDA device")
    except Exception as e:  # cupy raises CUDARuntimeError without a driver
        pytest.skip(f"CuPy cannot see a CUDA device: {e}")
    return cupy


@pytest.fixture(scope="session")
def jax():
    require_gpu()
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError as e:
        pytest.skip(f"JAX has no GPU backend: {e}")
    return jax


def _require_kernel(dtype: str, head_dim: int) -> None:
    import flashcute

    if dtype not in flashcute.compiled_dtypes() or flashcute.kernel_head_dim(head_dim) == 0:
        pytest.skip(f"{dtype} / head dim {head_dim} is not compiled into this build "
                    "(build options FLASHCUTE_DTYPES / FLASHCUTE_HEAD_DIMS)")


@pytest.fixture(scope="session")
def require_kernel():
    """require_kernel(dtype, head_dim): skips the test, with the reason, when this build has no kernel
    for dtype ("float16" / "bfloat16") at head_dim."""
    return _require_kernel


def _sm90_why_not(torch, direction: str, head_dim: int, dtype: str) -> str:
    """'' when the sm90 kernels of `direction` ("fwd" / "bwd") take head_dim and dtype on this GPU
    and build, else why not."""
    import flashcute

    what = {"fwd": "forward", "bwd": "backward"}[direction]
    if torch.cuda.get_device_capability() != (9, 0):
        return f"the sm90 {what} runs on compute capability 9.0 only, this GPU is {torch.cuda.get_device_capability()}"
    if not any(k[:3] == ("sm90", direction, dtype) and k[3] >= head_dim for k in flashcute.compiled_kernels()):
        return f"this build has no sm90 {what} kernel for {dtype} head dim {head_dim}"
    return ""


@pytest.fixture(scope="session")
def sm90_bwd_why_not(torch):
    """sm90_bwd_why_not(head_dim, dtype): '' when the sm90 backward takes that head dim and dtype
    ("float16" / "bfloat16") on this GPU and build, else why not."""
    return lambda head_dim, dtype: _sm90_why_not(torch, "bwd", head_dim, dtype)


@pytest.fixture(scope="session")
def sm90_fwd_why_not(torch):
    """sm90_fwd_why_not(head_dim, dtype): the same for the sm90 forward."""
    return lambda head_dim, dtype: _sm90_why_not(torch, "fwd", head_dim, dtype)
