"""The module surface, without a GPU: build configuration, the .pyi stub, versions, imports."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flashcute
from flashcute import _C

ALL_HEAD_DIMS = [32, 64, 96, 128, 192, 256]
DTYPE_OPTION_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


def _split(value: str):
    return [x.strip() for x in value.replace(",", ";").split(";") if x.strip()]


def _build_option(name: str):
    """The list a build option was given as: what the module recorded from CMake, cross-checked
    with the test run's environment where that names the option too (CI may export it)."""
    recorded = _split(_C.BUILD_OPTIONS[name])
    assert recorded, f"_C.BUILD_OPTIONS[{name!r}] is empty: the module was not built by flashcute's CMake"
    env = os.environ.get(name)
    if env:
        assert sorted(x.lower() for x in _split(env)) == sorted(x.lower() for x in recorded), (
            f"{name}={env!r} in the environment, but the module was built with {recorded}"
        )
    return recorded


def test_build_options_are_recorded():
    assert set(_C.BUILD_OPTIONS) == {"FLASHCUTE_CUDA_ARCHS", "FLASHCUTE_HEAD_DIMS", "FLASHCUTE_DTYPES", "FLASHCUTE_BACKWARD",
                                     "FLASHCUTE_KVCACHE"}
    for name, value in _C.BUILD_OPTIONS.items():
        assert isinstance(value, str) and _split(value), name
    assert all(int(a.rstrip("af")) >= 80 for a in _split(_C.BUILD_OPTIONS["FLASHCUTE_CUDA_ARCHS"]))


def test_compiled_head_dims_match_the_build():
    # The option string and the registered kernels: CMake's option parsing, and the kernel list
    # (flashcute/build_config.hpp) that decides which kernels link in.
    expected = sorted(int(d) for d in _build_option("FLASHCUTE_HEAD_DIMS"))
    assert set(expected) <= set(ALL_HEAD_DIMS)
    assert _C.compiled_head_dims() == expected
    assert flashcute.compiled_head_dims() == expected


def test_compiled_dtypes_match_the_build():
    expected = {DTYPE_OPTION_NAMES[t.lower()] for t in _build_option("FLASHCUTE_DTYPES")}
    got = _C.compiled_dtypes()
    assert set(got) == expected
    assert len(got) == len(set(got))
    assert flashcute.compiled_dtypes() == got


def test_kernel_head_dim_dispatch():
    compiled = _C.compiled_head_dims()
    assert tuple(_C.KERNEL_HEAD_DIMS) == tuple(ALL_HEAD_DIMS)
    assert _C.MAX_HEAD_DIM == 256
    for d in range(8, 257, 8):
        expected = min((c for c in compiled if c >= d), default=0)
        assert _C.kernel_head_dim(d) == expected, d
        assert flashcute.kernel_head_dim(d) == expected
    for d in compiled:
        assert _C.kernel_head_dim(d) == d


@pytest.mark.parametrize("d", [0, -8, 12, 260, 1 << 40])
def test_kernel_head_dim_rejects_invalid(d):
    with pytest.raises(ValueError, match="headdim must be a multiple of 8 and <= 256"):
        _C.kernel_head_dim(d)


def test_cuda_queries_never_raise():
    n = _C.cuda_device_count()
    status = _C.cuda_status()
    assert isinstance(n, int) and n >= 0
    assert isinstance(status, str) and status
    if n > 0:
        assert status == f"cudaSuccess: {n} CUDA device(s)"
        assert flashcute.is_available()
    else:
        assert not status.startswith("cudaSuccess: 1"), status
        assert flashcute.is_available() is False
    assert flashcute.cuda_status() == status


def test_version():
    assert isinstance(flashcute.__version__, str) and flashcute.__version__
    assert flashcute.__version__ == _C.__version__
    assert "unknown" not in _C.__version__, "the build did not pass FLASHCUTE_VERSION to flashcute_ext.cpp"
    try:
        dist = importlib.metadata.distribution("flashcute")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("flashcute is not installed as a distribution")
    if Path(dist.locate_file("flashcute/__init__.py")).resolve() != Path(flashcute.__file__).resolve():
        pytest.skip("the imported flashcute is not the installed distribution")
    assert dist.version == _C.__version__


def test_compiled_kernels_are_the_list_the_build_made():
    # One list: the (family, direction, dtype, head dim) kernels CMake generated, which is the
    # product of the build options, and from which compiled_head_dims/dtypes are derived.
    dims = sorted(int(d) for d in _build_option("FLASHCUTE_HEAD_DIMS"))
    dtypes = {DTYPE_OPTION_NAMES[t.lower()] for t in _build_option("FLASHCUTE_DTYPES")}
    kernels = _C.compiled_kernels()
    directions = ["fwd"]
    directions += ["bwd"] if _C.BUILD_OPTIONS["FLASHCUTE_BACKWARD"] == "ON" else []
    directions += ["splitkv"] if _C.BUILD_OPTIONS["FLASHCUTE_KVCACHE"] == "ON" else []
    expected = [("sm80", di, dt, d) for di in directions for dt in dtypes for d in dims]
    if "90a" in _build_option("FLASHCUTE_CUDA_ARCHS"):  # the Hopper kernels, built for sm_90a only
        expected += [("sm90", "fwd", dt, d) for dt in dtypes for d in dims]
        if "bwd" in directions:  # the Hopper backward, for the head dims with a config (sm90/config.hpp)
            expected += [("sm90", "bwd", dt, d) for dt in dtypes for d in dims if d in (64, 128, 192, 256)]
    assert sorted(kernels) == sorted(expected)
    assert flashcute.compiled_kernels() == kernels
    assert sorted({k[3] for k in kernels}) == _C.compiled_head_dims()
    assert {k[2] for k in kernels} == set(_C.compiled_dtypes())


def test_public_api():
    for name in flashcute.__all__:
        assert hasattr(flashcute, name), name
    import inspect

    sig = inspect.signature(flashcute.flash_attn_func)
    params = list(sig.parameters.values())
    # FlashAttention-2's signature, then flashcute's keyword-only extras.
    fa2 = ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
           "deterministic", "return_attn_probs"]
    assert [p.name for p in params] == fa2 + ["return_lse", "out", "stream"]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params[:len(fa2)])
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[len(fa2):])
    defaults = {p.name: p.default for p in params[3:]}
    assert defaults == dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None, deterministic=False, return_attn_probs=False, return_lse=False,
                            out=None, stream=None)
    assert flashcute.flash_attn_func.__doc__ and "window_size" in flashcute.flash_attn_func.__doc__
    # FlashAttention-2's packed forms, in its positional order, with return_lse and stream.
    options = fa2[3:]
    packed = {
        "flash_attn_qkvpacked_func": ["qkv"],
        "flash_attn_kvpacked_func": ["q", "kv"],
        "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"],
        "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"],
    }
    for name, arrays in packed.items():
        params = list(inspect.signature(getattr(flashcute, name)).parameters.values())
        assert [p.name for p in params] == arrays + options + ["return_lse", "stream"], name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[-2:]), name


def test_import_does_not_import_frameworks_or_touch_cuda():
    code = (
        "import sys, flashcute\n"
        "heavy = [m for m in ('torch', 'cupy', 'jax', 'jaxlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # even with no visible device, import works
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_extension_exports_only_its_init_function():
    # A C++ or CUDA runtime linked into the module must stay private to it: exported,
    # its symbols can interpose on the frameworks' own copies (seen: a crash in a later
    # `import torch`).
    nm = shutil.which("nm")
    if nm is None or not sys.platform.startswith("linux"):
        pytest.skip("needs binutils' nm on Linux")
    r = subprocess.run([nm, "-D", "--defined-only", _C.__file__], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    exported = sorted(line.split()[-1] for line in r.stdout.splitlines() if line.strip())
    assert exported == ["PyInit__C"], exported[:20]


@pytest.mark.parametrize("framework", ["torch", "cupy", "jax"])
def test_framework_imports_after_flashcute(framework):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    code = f"import flashcute\nimport {framework}\nprint('ok')\n"
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])


# ------------------------------------------------------------------------------------ the stub


def _stub_path() -> Path:
    """The stub the build generated (nanobind's stubgen) and installed beside the module."""
    return Path(flashcute.__file__).with_name("_C.pyi")


def _public_names(module) -> set:
    return {n for n in dir(module) if not n.startswith("_")}


def _params(fn: ast.FunctionDef):
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def test_stub_matches_module():
    assert _stub_path().is_file(), f"no generated stub at {_stub_path()}"
    tree = ast.parse(_stub_path().read_text())
    stub_funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    stub_attrs = {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    assert set(stub_funcs) | stub_attrs == _public_names(_C)
    for name, fn in stub_funcs.items():
        assert callable(getattr(_C, name)), name
        assert ast.get_docstring(fn), f"{name}: no docstring in the stub"
        # nanobind's own signature of the compiled function, parsed as Python (it writes default
        # values as \0, \1, ... placeholders).
        nb_sig = re.sub(r"\\\d+", "...", getattr(_C, name).__nb_signature__[0][0])
        compiled = ast.parse(nb_sig + ": ...").body[0]
        assert _params(fn) == _params(compiled), f"{name}: stub {_params(fn)} vs module {_params(compiled)}"
        assert (fn.returns is None) == (compiled.returns is None)
    for name in stub_attrs:
        assert not callable(getattr(_C, name)), name
    assert ast.get_docstring(tree), "the stub has no module docstring"


def test_no_driver_is_not_reported_as_an_old_driver():
    # Without the driver library the runtime says cudaErrorInsufficientDriver ("CUDA driver version
    # is insufficient"), which would send a user without a GPU to upgrade a driver they do not have.
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has a CUDA driver library")
    except OSError:
        pass
    status = _C.cuda_status()
    assert "no CUDA driver/GPU found" in status and "insufficient" not in status, status
    assert status.split(":")[0] in ("cudaErrorInsufficientDriver", "cudaErrorNoDevice"), status


def test_namespace_is_the_public_api():
    import inspect

    public = {n for n in dir(flashcute) if not n.startswith("_") and not inspect.ismodule(getattr(flashcute, n))}
    assert public == set(flashcute.__all__) - {"__version__"}
    for name in ("List", "Tuple", "annotations", "sys"):
        assert not hasattr(flashcute, name), name
    for name in flashcute.__all__:
        obj = getattr(flashcute, name)
        if callable(obj):  # real types in help(), not strings
            sig = inspect.signature(obj)
            for p in [*sig.parameters.values(), sig]:
                ann = p.annotation if isinstance(p, inspect.Parameter) else p.return_annotation
                assert not isinstance(ann, str), (name, ann)


def test_bwd_workspace_floats_sizes_for_the_path_a_call_may_take():
    # The sm80 backward's D; with head_dim and dtype, the sm90 backward's (D, the log2 lse and the
    # fp32 dQ accumulator over rows padded to 64, then one int32 dQ add count per 64 rows and the
    # persistent main kernel's tile counter) where a compute capability 9.0 device may run it.
    assert _C.bwd_workspace_floats(2, 8, 100) == 2 * 8 * 100
    n = _C.bwd_workspace_floats(2, 8, 100, 128, "bfloat16")
    if _C.cuda_device_count() == 0 or ("sm90", "bwd", "bfloat16", 128) not in _C.compiled_kernels():
        assert n == 2 * 8 * 100
        return
    torch = pytest.importorskip("torch")
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    assert n == (2 * 8 * 128 * (128 + 2) + 2 * 8 * 2 + 1 if sm90 else 2 * 8 * 100)

