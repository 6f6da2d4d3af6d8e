"""The implementations the benchmark times: flashcute, the one under test, and its peers.

Each is an :class:`Impl` with a name and ``prepare(point, input_sets, softmax_scale) -> Runner``,
which raises :class:`Unsupported` when it cannot run the point. The runner holds one
ready-to-time call per input set (everything else, such as layout changes, is done in prepare,
outside the timed region) and converts a call's output to (b, s, h, d) for the correctness check.
Adding a peer (another FlashAttention package) or a pass (backward) is one new subclass and one
entry in :data:`IMPLS`. An optional peer (FlashAttention-4, ``fa4``) says through
:meth:`Impl.missing` why it cannot run here; the run then leaves it out.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import KW_ONLY, dataclass
from typing import Any, Callable

from .arrays import Inputs, Unsupported
from .grid import Point

SUBJECT = "flashcute"  # the implementation under test: its errors and wrong results fail the run


def is_own(name: str) -> bool:
    """Whether an implementation is flashcute's (the subject or a variant of it, "flashcute-sm80"):
    its errors and wrong results fail the run too."""
    return name == SUBJECT or name.startswith(SUBJECT + "-")


def _same(out: Any) -> Any:
    return out


@dataclass
class Runner:
    """Calls of one implementation at one point, and how to read their output."""

    calls: list[Callable[[], Any]]  # one per input set; each returns the output (bwd passes: (dq, dk, dv))
    _: KW_ONLY  # the rest by name: a positional mix-up once sent SDPA's forward context into douts
    to_bshd: Callable[[Any], Any] = _same  # a call's output -> (b, s, h, d)
    douts: list[Any] | None = None  # bwd passes: the output gradient of each input set
    context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext  # entered around the calls
    layout: str = ""  # how the inputs were passed, when that is a choice (SDPA: "view" or "contiguous")


class Impl(ABC):
    """An attention implementation the benchmark can time."""

    name: str

    def supports(self, framework: str, pass_: str = "fwd") -> bool:
        """Whether it can run `pass_` on arrays of `framework` ("torch" or "cupy"): the backward
        passes go through torch autograd."""
        return pass_ == "fwd" or framework == "torch"

    def missing(self) -> str | None:
        """Why this implementation cannot run at all on this machine (an optional package that does
        not import), or None. A run leaves such an implementation out, saying why in one line."""
        return None

    @abstractmethod
    def prepare(self, point: Point, input_sets: Sequence[Inputs], softmax_scale: float) -> Runner:
        """A runner with one call per input set; raises Unsupported when the point cannot run."""

    def is_unsupported_error(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by a call, means "cannot run this point" (n/a) rather than a bug."""
        return False


def grad_runner(point: Point, input_sets: Sequence[Inputs], attn: Callable[[Any, Any, Any], Any], **kw: Any) -> Runner:
    """The backward passes of a torch implementation: attn(q, k, v) -> out, all (b, s, h, d).

    "bwd" runs the forward once here and times ``torch.autograd.grad(out, (q, k, v), dout,
    retain_graph=True)``; "fwd+bwd" times the forward and that backward together. The calls return
    (dq, dk, dv) in (b, s, h, d)."""
    import torch

    gen = torch.Generator(device=input_sets[0].q.device).manual_seed(point.seqlen * 7 + point.headdim)
    calls, douts = [], []
    for x in input_sets:
        leaves = [t.detach().requires_grad_() for t in (x.q, x.k, x.v)]
        dout = torch.randn(x.q.shape, generator=gen, device=x.q.device, dtype=torch.float32).to(x.q.dtype)
        douts.append(dout)
        if point.pass_ == "bwd":
            out = attn(*leaves)
            calls.append(lambda out=out, leaves=leaves, dout=dout: torch.autograd.grad(out, leaves, dout, retain_graph=True))
        else:
            calls.append(lambda leaves=leaves, dout=dout: torch.autograd.grad(attn(*leaves), leaves, dout))
    return Runner(calls, douts=douts, **kw)


@contextlib.contextmanager
def env_var(name: str, value: str | None):
    """Environment variable ``name`` set to ``value`` while the block runs, then restored (None:
    leave it as it is). flashcute reads its settings (FLASHCUTE_FORWARD_PATH, FLASHCUTE_SM90_TILES)
    at every call, so this switches them between calls."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def forward_path_env(path: str | None):
    """FLASHCUTE_FORWARD_PATH=path while the block runs (None: leave it as it is)."""
    return env_var("FLASHCUTE_FORWARD_PATH", path)


class Flashcute(Impl):
    """flashcute.flash_attn_func, called as users call it. Points whose dtype or head dim was left
    out of the build (FLASHCUTE_DTYPES / FLASHCUTE_HEAD_DIMS) are unsupported. The forward's runner
    records the kernel family and tile that ran (``layout`` "path sm90 128x128"); ``path`` forces a
    family through FLASHCUTE_FORWARD_PATH ("flashcute-sm80": the mma.sync kernels on any GPU), and
    ``tiles`` an sm90 tile table through FLASHCUTE_SM90_TILES ("flashcute-base": the first table's
    tiles only, to measure what the second table's choice gains); ``deterministic`` is
    flash_attn_func's, for the backward passes ("flashcute-det")."""

    def __init__(self, name: str = SUBJECT, path: str | None = None, tiles: str | None = None,
                 bwd_path: str | None = None, deterministic: bool = False) -> None:
        self.name = name
        self.path = path
        self.tiles = tiles
        self.bwd_path = bwd_path  # FLASHCUTE_BACKWARD_PATH for the backward passes (None: as it is)
        self.deterministic = deterministic

    def prepare(self, point: Point, input_sets: Sequence[Inputs], softmax_scale: float) -> Runner:
        import flashcute

        dtype_name = {"bf16": "bfloat16", "fp16": "float16"}[point.dtype]
        if dtype_name not in flashcute.compiled_dtypes():
            raise Unsupported(f"{dtype_name} is not compiled into this build")
        if flashcute.kernel_head_dim(point.headdim) == 0:
            raise Unsupported(
                f"no kernel for head dim {point.headdim} in this build (compiled: {flashcute.compiled_head_dims()})"
            )

        def call(x: Inputs) -> Callable[[], Any]:
            return lambda: flashcute.flash_attn_func(
                x.q, x.k, x.v, softmax_scale=softmax_scale, causal=point.causal
            )

        @contextlib.contextmanager
        def context() -> Iterator[None]:
            with forward_path_env(self.path), env_var("FLASHCUTE_SM90_TILES", self.tiles), \
                    env_var("FLASHCUTE_BACKWARD_PATH", self.bwd_path):
                yield

        if point.pass_ != "fwd":
            with context():
                return grad_runner(point, input_sets,
                                   lambda q, k, v: flashcute.flash_attn_func(q, k, v, softmax_scale=softmax_scale,
                                                                             causal=point.causal,
                                                                             deterministic=self.deterministic),
                                   context=context)

        calls = [call(x) for x in input_sets]
        with context():
            calls[0]()
            path = flashcute.last_forward_path()
            block_m, block_n = flashcute.last_forward_tile()
        return Runner(calls, context=context, layout=f"path {path} {block_m}x{block_n}")

    def is_unsupported_error(self, exc: BaseException) -> bool:
        return isinstance(exc, NotImplementedError)  # flashcute._C's type for "not compiled"


class Sdpa(Impl):
    """torch's scaled_dot_product_attention pinned to one backend with sdpa_kernel().

    SDPA takes (b, h, s, d), so the inputs are passed as ``.transpose(1, 2)`` views, as
    FlashAttention users pass them; a backend that refuses the views gets contiguous copies.
    GQA uses ``enable_gqa=True``.
    """

    def __init__(self, name: str, backend: str) -> None:
        self.name = name
        self.backend = backend  # a torch.nn.attention.SDPBackend member's name

    def supports(self, framework: str, pass_: str = "fwd") -> bool:
        return framework == "torch"

    def prepare(self, point: Point, input_sets: Sequence[Inputs], softmax_scale: float) -> Runner:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, self.backend)
        kwargs: dict[str, Any] = {"is_causal": point.causal, "scale": softmax_scale}
        if point.nheads != point.nheads_k:
            kwargs["enable_gqa"] = True

        def bind(q: Any, k: Any, v: Any) -> Callable[[], Any]:
            return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)

        def runner(layout: str) -> Runner:
            if point.pass_ != "fwd":  # q, k, v as (b, s, h, d) leaves; SDPA sees them transposed
                def attn(q: Any, k: Any, v: Any) -> Any:
                    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
                    if layout == "contiguous":
                        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs).transpose(1, 2)

                return grad_runner(point, input_sets, attn, context=lambda: sdpa_kernel(backend), layout=layout)
            calls = []
            for x in input_sets:
                q, k, v = (t.transpose(1, 2) for t in (x.q, x.k, x.v))
                if layout == "contiguous":
                    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
                calls.append(bind(q, k, v))
            return Runner(calls, to_bshd=lambda out: out.transpose(1, 2), context=lambda: sdpa_kernel(backend),
                          layout=layout)

        reasons: dict[str, str] = {}
        for layout in ("view", "contiguous"):
            # Under the backend: a backward pass runs its forward while the runner is made.
            with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
                warnings.simplefilter("always")
                try:
                    candidate = runner(layout)
                    candidate.calls[0]()
                    torch.cuda.synchronize()
                    return candidate
                except Exception as exc:  # RuntimeError "No available kernel", NotImplementedError, ...
                    why = [str(w.message).splitlines()[0] for w in caught] + [str(exc).splitlines()[0]]
                    reasons[layout] = " | ".join(why)
        if len(set(reasons.values())) == 1:
            raise Unsupported(reasons["view"])
        raise Unsupported("; ".join(f"{layout}: {why}" for layout, why in reasons.items()))


FA4_IMPORT = "flash_attn.cute"  # FlashAttention-4 (the flash-attn-4 wheel): CuTe DSL kernels, JIT-compiled


class FlashAttn4(Impl):
    """FlashAttention-4's ``flash_attn.cute.flash_attn_func``, an optional peer: present when it
    imports (its wheels are not a dependency of flashcute). It takes q, k, v as (b, s, h, d), like
    flashcute, and returns (out, lse). Its kernels are JIT-compiled on the first call of each
    configuration, which prepare makes (seconds), so no timed call compiles. It is differentiable,
    so it runs the backward passes too."""

    name = "fa4"

    def __init__(self) -> None:
        self._func: Callable[..., Any] | None = None
        self._why: str | None = None

    def supports(self, framework: str, pass_: str = "fwd") -> bool:
        return framework == "torch"

    def _load(self) -> Callable[..., Any] | None:
        if self._func is None and self._why is None:
            try:
                from flash_attn.cute import flash_attn_func
            except Exception as exc:  # ModuleNotFoundError, or a broken install (missing CUDA libs)
                self._why = f"{FA4_IMPORT} is not importable ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
            else:
                self._func = flash_attn_func
        return self._func

    def missing(self) -> str | None:
        self._load()
        return self._why

    def prepare(self, point: Point, input_sets: Sequence[Inputs], softmax_scale: float) -> Runner:
        func = self._load()
        if func is None:
            raise Unsupported(self._why or f"{FA4_IMPORT} is not importable")

        def attn(q: Any, k: Any, v: Any) -> Any:
            out = func(q, k, v, softmax_scale=softmax_scale, causal=point.causal)
            return out[0] if isinstance(out, tuple) else out  # (out, lse)

        if point.pass_ != "fwd":
            return grad_runner(point, input_sets, attn)
        calls = [lambda x=x: attn(x.q, x.k, x.v) for x in input_sets]
        calls[0]()  # the JIT compile of this configuration (the backward passes: the check's call compiles)
        return Runner(calls)


IMPLS: dict[str, Impl] = {
    impl.name: impl
    for impl in (
        Flashcute(),
        Flashcute("flashcute-sm80", path="sm80", bwd_path="sm80"),
        # The Hopper backward forced (FLASHCUTE_BACKWARD_PATH=sm90; the default takes it where it can).
        Flashcute("flashcute-sm90bwd", bwd_path="sm90"),
        Flashcute("flashcute-det", deterministic=True),  # the backward with deterministic=True
        Flashcute("flashcute-base", tiles="base"),
        Sdpa("sdpa-flash", "FLASH_ATTENTION"),
        Sdpa("sdpa-cudnn", "CUDNN_ATTENTION"),
        Sdpa("sdpa-efficient", "EFFICIENT_ATTENTION"),
        FlashAttn4(),
    )
}
# What a run times unless --impls says otherwise: every implementation but the forced tile table,
# which only A/B comparisons of the two tables ask for (fa4 is left out of a run, with a line saying
# so, where it does not import).
DEFAULT_IMPLS: tuple[str, ...] = tuple(name for name in IMPLS
                                       if name not in ("flashcute-base", "flashcute-sm90bwd", "flashcute-det"))
