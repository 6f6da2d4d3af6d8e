"""The array library the benchmark runs on, torch or CuPy: it makes the inputs, describes the device,
owns the CUDA events and the L2 flush the timer uses and recognises running out of memory.

One class per library; the rest of the benchmark talks to :class:`ArrayLib` only. The libraries
are imported when a class is loaded, never when this module is.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from .grid import Point


class Unsupported(Exception):
    """An implementation or the array library cannot run this point: it is reported as n/a."""


class LibraryUnavailable(Exception):
    """No array library can be used. `no_gpu`: one is installed but sees no CUDA device."""

    def __init__(self, reason: str, no_gpu: bool) -> None:
        super().__init__(reason)
        self.no_gpu = no_gpu


def import_optional(name: str) -> Any | None:
    """The module, or None when it is missing or its import fails (a broken install)."""
    try:
        return importlib.import_module(name)
    except Exception:
        return None


@dataclass(frozen=True)
class DeviceInfo:
    """The current CUDA device, as recorded next to the numbers."""

    name: str
    capability: str  # "9.0"
    sm_count: int
    l2_bytes: int | None  # None when the runtime does not say
    memory_bytes: int

    @property
    def arch(self) -> str:
        return "sm_" + self.capability.replace(".", "")

    @property
    def major(self) -> int:
        return int(self.capability.split(".")[0])


@dataclass
class Inputs:
    """q (b, s, h, d); k, v (b, s, hk, d): FlashAttention's layout, contiguous."""

    q: Any
    k: Any
    v: Any

    @property
    def nbytes(self) -> int:
        return sum(int(x.nbytes) for x in (self.q, self.k, self.v))


class ArrayLib(ABC):
    """A GPU array library: inputs, device facts, CUDA events, an L2 flush, and its out-of-memory
    error."""

    name: ClassVar[str]

    def __init__(self, module: Any) -> None:
        self.m = module

    @classmethod
    @abstractmethod
    def load(cls) -> ArrayLib:
        """The library on a CUDA device; raises LibraryUnavailable saying why not."""

    @staticmethod
    @abstractmethod
    def installed_versions() -> dict[str, Any]:
        """This library's versions, and those of the CUDA pieces it brings, if it is installed."""

    @abstractmethod
    def device_info(self) -> DeviceInfo: ...

    @abstractmethod
    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        """Standard-normal values in `dtype` ("bf16" or "fp16") on the GPU, reproducible from `seed`."""

    @abstractmethod
    def is_oom(self, exc: BaseException) -> bool: ...

    @abstractmethod
    def event(self) -> Any:
        """A CUDA event that can time (it has .record())."""

    @abstractmethod
    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def l2_flusher(self, nbytes: int, clean: bool = False) -> Callable[[], None]:
        """A call that writes a device buffer of `nbytes` (allocated once, here) on the current
        stream: run between timed calls, it evicts from L2 whatever the previous call left there.
        With `clean` it then reads a second buffer of `nbytes`, so the timed call starts on clean
        lines instead of writing back the flush's own (an H200 spends 11-13 us on that, a tenth of
        a 270 MB decode step; the decode bench asks for it)."""

    def make_inputs(self, point: Point, seed: int) -> Inputs:
        """Random inputs for one point (FlashAttention's benchmark uses randn), reproducible from `seed`."""
        qshape = (point.batch, point.seqlen, point.nheads, point.headdim)
        kshape = (point.batch, point.seqlen, point.nheads_k, point.headdim)
        return Inputs(
            self.randn(qshape, point.dtype, seed),
            self.randn(kshape, point.dtype, seed + 1),
            self.randn(kshape, point.dtype, seed + 2),
        )


class TorchLib(ArrayLib):
    name = "torch"

    @classmethod
    def load(cls) -> TorchLib:
        torch = import_optional("torch")
        if torch is None:
            raise LibraryUnavailable("torch is not installed", no_gpu=False)
        if not torch.cuda.is_available():
            raise LibraryUnavailable(f"torch {torch.__version__} sees no CUDA device", no_gpu=True)
        return cls(torch)

    @staticmethod
    def installed_versions() -> dict[str, Any]:
        torch = import_optional("torch")
        if torch is None:
            return {}
        v = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
        with contextlib.suppress(Exception):
            v["cudnn"] = torch.backends.cudnn.version()
        return v

    def device_info(self) -> DeviceInfo:
        props = self.m.cuda.get_device_properties(self.m.cuda.current_device())
        return DeviceInfo(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            memory_bytes=props.total_memory,
        )

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        dt = {"bf16": self.m.bfloat16, "fp16": self.m.float16}[dtype]
        gen = self.m.Generator(device="cuda").manual_seed(seed)
        return self.m.randn(shape, generator=gen, device="cuda", dtype=dt)

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, self.m.cuda.OutOfMemoryError)

    def event(self) -> Any:
        return self.m.cuda.Event(enable_timing=True)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def synchronize(self) -> None:
        self.m.cuda.synchronize()

    def l2_flusher(self, nbytes: int, clean: bool = False) -> Callable[[], None]:
        buf = self.m.empty(nbytes, dtype=self.m.int8, device="cuda")
        if not clean:
            return buf.zero_
        src = self.m.zeros(nbytes // 4, dtype=self.m.float32, device="cuda")

        def flush() -> None:
            buf.zero_()
            src.sum()  # reads nbytes: the flush's dirty lines are written back here, outside the events

        return flush


class CupyLib(ArrayLib):
    name = "cupy"

    @classmethod
    def load(cls) -> CupyLib:
        cupy = import_optional("cupy")
        if cupy is None:
            raise LibraryUnavailable("cupy is not installed", no_gpu=False)
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDARuntimeError: no driver, no device
            raise LibraryUnavailable(f"cupy sees no CUDA device ({exc})", no_gpu=True) from None
        if count == 0:
            raise LibraryUnavailable("cupy sees no CUDA device", no_gpu=True)
        return cls(cupy)

    @staticmethod
    def installed_versions() -> dict[str, Any]:
        cupy = import_optional("cupy")
        if cupy is None:
            return {}
        # CuPy uses TF32 for float32 matmuls (the reference's) only when CUPY_TF32=1.
        v = {"cupy": cupy.__version__, "cupy_tf32": os.environ.get("CUPY_TF32")}
        with contextlib.suppress(Exception):
            v["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
            v["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        return v

    def device_info(self) -> DeviceInfo:
        props = self.m.cuda.runtime.getDeviceProperties(self.m.cuda.Device().id)
        name = props["name"]
        return DeviceInfo(
            name=name.decode() if isinstance(name, bytes) else str(name),
            capability=f"{props['major']}.{props['minor']}",
            sm_count=props["multiProcessorCount"],
            l2_bytes=props.get("l2CacheSize"),
            memory_bytes=props["totalGlobalMem"],
        )

    def randn(self, shape: tuple[int, ...], dtype: str, seed: int) -> Any:
        rng = self.m.random.default_rng(seed)
        return rng.standard_normal(shape, dtype=self.m.float32).astype(self._dtype(dtype))

    def _dtype(self, dtype: str) -> Any:
        if dtype == "fp16":
            return self.m.float16
        ml_dtypes = import_optional("ml_dtypes")
        try:  # CuPy supports bfloat16 (through ml_dtypes) only in recent releases
            self.m.zeros(1, dtype=ml_dtypes.bfloat16).astype(self.m.float32)
        except Exception:
            raise Unsupported("this CuPy has no bfloat16 (it needs ml_dtypes and a CuPy that supports it)") from None
        return ml_dtypes.bfloat16

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, self.m.cuda.memory.OutOfMemoryError)

    def event(self) -> Any:
        return self.m.cuda.Event()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self.m.cuda.get_elapsed_time(start, end))

    def synchronize(self) -> None:
        self.m.cuda.Device().synchronize()

    def l2_flusher(self, nbytes: int, clean: bool = False) -> Callable[[], None]:
        buf = self.m.empty(nbytes, dtype=self.m.int8)
        if not clean:
            return lambda: buf.fill(0)
        src = self.m.zeros(nbytes // 4, dtype=self.m.float32)

        def flush() -> None:
            buf.fill(0)
            src.sum()

        return flush


LIBRARIES: dict[str, type[ArrayLib]] = {"torch": TorchLib, "cupy": CupyLib}  # --framework auto tries them in order


def select_array_lib(framework: str) -> ArrayLib:
    """The library to use: `framework` ("torch" or "cupy"), or with "auto" the first one that sees a
    GPU. Raises LibraryUnavailable with every library's reason."""
    failures = []
    for name, cls in LIBRARIES.items():
        if framework in ("auto", name):
            try:
                return cls.load()
            except LibraryUnavailable as exc:
                failures.append(exc)
    raise LibraryUnavailable("; ".join(map(str, failures)), no_gpu=any(e.no_gpu for e in failures))


def versions() -> dict[str, Any]:
    """Python, flashcute and every installed array library's versions."""
    flashcute = import_optional("flashcute")
    v: dict[str, Any] = {"python": platform.python_version(), "flashcute": getattr(flashcute, "__version__", None)}
    for cls in LIBRARIES.values():
        v.update(cls.installed_versions())
    return v
