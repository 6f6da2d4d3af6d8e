"""Which forward kernel family runs a call, and that both give the same attention.

On a compute capability 9.0 GPU (H100, H200) with the sm90 kernels compiled (build option
FLASHCUTE_CUDA_ARCHS naming 90a), a forward call runs on the Hopper kernels (wgmma + TMA) when
TMA can read its arrays; everything else, and every call with FLASHCUTE_FORWARD_PATH=sm80 in the
environment, runs on the mma.sync (sm80) kernels. flashcute.last_forward_path() says which ran.

The whole forward suite (test_fwd_torch.py and the rest) runs on whichever path the environment
selects; the device script runs it once per path. This file checks the selection itself, the
fallback for arrays TMA cannot read, and the two paths against the fp32 reference side by side.
"""

from __future__ import annotations

import pytest

import flashcute
from flashcute.testing import check_attention

pytestmark = pytest.mark.gpu


def sm90_available(torch, dtype: str = "bfloat16", d: int = 128) -> str:
    """'' when this GPU and build run the sm90 kernels for (dtype, d), else why not."""
    if torch.cuda.get_device_capability() != (9, 0):
        return f"the sm90 kernels run on compute capability 9.0 only, this GPU is {torch.cuda.get_device_capability()}"
    kd = flashcute.kernel_head_dim(d)
    if ("sm90", "fwd", dtype, kd) not in flashcute.compiled_kernels():
        return f"this build has no sm90 kernel for {dtype} head dim {kd} (FLASHCUTE_CUDA_ARCHS without 90a?)"
    return ""


def run(torch, *, b=2, sq=300, sk=300, h=4, hk=4, d=128, dtype="bfloat16", causal=False, window=(-1, -1),
        softcap=0.0, q=None, k=None, v=None):
    dt = getattr(torch, dtype)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dt) if q is None else q
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dt) if k is None else k
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dt) if v is None else v
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=dt)
    _, lse = flashcute.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, out=out,
                                       return_lse=True)
    torch.cuda.synchronize()
    path = flashcute.last_forward_path()
    res = check_attention(out, q, k, v, lse=lse, causal=causal, window_size=window, softcap=softcap)
    return path, out, res


@pytest.fixture
def sm80_forced(monkeypatch):
    monkeypatch.setenv("FLASHCUTE_FORWARD_PATH", "sm80")


@pytest.fixture
def auto_path(monkeypatch):
    monkeypatch.delenv("FLASHCUTE_FORWARD_PATH", raising=False)


def test_hopper_runs_the_sm90_kernels(torch, auto_path):
    if why := sm90_available(torch):
        pytest.skip(why)
    path, _, res = run(torch)
    assert path == "sm90"
    assert res.ok, res.message


def sm80_head_dim() -> int:
    """A head dim the build has a bfloat16 sm80 forward kernel for: 128 where it has one."""
    dims = sorted(kd for arch, direction, dtype, kd in flashcute.compiled_kernels()
                  if (arch, direction, dtype) == ("sm80", "fwd", "bfloat16"))
    if not dims:
        pytest.skip("this build has no bfloat16 sm80 forward kernel")
    return 128 if 128 in dims else dims[0]


def test_environment_forces_the_sm80_kernels(torch, sm80_forced):
    d = sm80_head_dim()
    path, _, res = run(torch, d=d)
    assert path == "sm80"
    assert res.ok, res.message


def test_every_other_gpu_runs_the_sm80_kernels(torch, auto_path):
    d = sm80_head_dim()
    if not sm90_available(torch, "bfloat16", d):
        pytest.skip("this GPU and build run the sm90 kernels")
    path, _, res = run(torch, d=d)
    assert path == "sm80"
    assert res.ok, res.message


def test_bad_setting_is_an_error(torch, monkeypatch):
    monkeypatch.setenv("FLASHCUTE_FORWARD_PATH", "sm100")
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="FLASHCUTE_FORWARD_PATH"):
        flashcute.flash_attn_func(q, q, q)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_strides_tma_cannot_read_fall_back(torch, auto_path, which):
    """An array broadcast over the batch (batch stride 0, from .expand): a TMA descriptor needs a
    real stride, so the sm80 kernel runs the call, and the result is the same attention."""
    if why := sm90_available(torch):
        pytest.skip(why)
    b, s, h, d = 2, 200, 4, 128
    broadcast = torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16).expand(b, s, h, d)
    assert broadcast.stride(0) == 0
    arrays = {which: broadcast}
    path, _, res = run(torch, b=b, sq=s, sk=s, h=h, hk=h, d=d, **arrays)
    assert path == "sm80"
    assert res.ok, res.message


CASES = [
    dict(),
    dict(causal=True, sq=1000, sk=1000),
    dict(causal=True, sq=113, sk=2049),
    dict(causal=True, sq=2049, sk=113),
    dict(window=(64, 0), sq=1000, sk=1000),
    dict(window=(32, 17), sq=300, sk=500),
    dict(softcap=30.0, sq=257, sk=257),
    dict(h=16, hk=2, sq=129, sk=1000),
    dict(h=8, hk=1, sq=1, sk=1000),
    dict(sq=17, sk=17, dtype="float16"),
    dict(d=64, sq=1000, sk=1000, causal=True),
    dict(d=256, sq=333, sk=777),
    dict(d=96, sq=200, sk=300),
    dict(d=40, sq=200, sk=300),
    dict(d=192, sq=130, sk=130, causal=True),
    dict(d=32, sq=4000, sk=4000, b=1),
    dict(b=8, h=16, hk=4, sq=1000, sk=1000),  # 1024 tiles: persistent CTAs take several each
    dict(b=3, h=8, sq=1000, sk=3000, d=256),
    # d 192 and 256 (no room for an O buffer): tiles that see no key (causal, sq > sk) beside
    # tiles that do, and fp16 over several tiles per CTA.
    dict(d=256, sq=700, sk=100, causal=True),
    dict(d=192, b=3, h=8, sq=777, sk=1000, dtype="float16"),
    # Several tiles per persistent CTA, each tile's first S issued behind the previous tile's last
    # P V (two Q buffers): odd tile counts (a pair whose second tile is its first), tiles that see
    # no key at all (sq > sk, causal), and d 64.
    dict(b=4, h=16, sq=1100, sk=1100, causal=True),
    dict(b=4, h=16, sq=2049, sk=113, causal=True, d=64),
    dict(b=8, h=16, sq=1000, sk=1000, d=64),
    dict(b=4, h=16, sq=700, sk=900, softcap=20.0, dtype="float16"),
    # Causal calls of 16 query tiles or more per head and more units than one round of 132 SMs
    # takes: whole rounds of pairs, rotated over the CTAs, then the tail dealt tile by tile
    # (sm90/scheduler.hpp); 80-key blocks at d 256, and more keys than queries.
    dict(b=3, h=32, sq=2048, sk=2048, causal=True, d=64),
    dict(b=2, h=16, sq=2048, sk=2048, causal=True, d=256),
    dict(b=3, h=16, sq=2000, sk=2400, causal=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "default")
def test_both_paths_match_the_reference(torch, monkeypatch, case):
    """The same inputs on the sm90 and the sm80 kernels: each within the tolerance of the fp32
    reference (and so within twice of each other's error)."""
    dtype = case.get("dtype", "bfloat16")
    d = case.get("d", 128)
    kd = flashcute.kernel_head_dim(d)
    if kd == 0 or dtype not in flashcute.compiled_dtypes():
        pytest.skip(f"{dtype} head dim {d} is not compiled in this build")
    if why := sm90_available(torch, dtype, d):
        pytest.skip(why)
    dt = getattr(torch, dtype)
    b, sq, sk = case.get("b", 2), case.get("sq", 300), case.get("sk", 300)
    h, hk = case.get("h", 4), case.get("hk", 4)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dt)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dt)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dt)
    opts = {key: case[key] for key in ("causal", "window", "softcap") if key in case}
    monkeypatch.delenv("FLASHCUTE_FORWARD_PATH", raising=False)
    path90, out90, res90 = run(torch, q=q, k=k, v=v, d=d, dtype=dtype, **opts)
    monkeypatch.setenv("FLASHCUTE_FORWARD_PATH", "sm80")
    path80, out80, res80 = run(torch, q=q, k=k, v=v, d=d, dtype=dtype, **opts)
    assert (path90, path80) == ("sm90", "sm80")
    assert res90.ok, "sm90: " + res90.message
    assert res80.ok, "sm80: " + res80.message


# The sm90 kernels' second tile table (sm90::long_fwd_config): head dim 64 has 192 x 128 tiles,
# three consumer warpgroups, beside the first table's 256 x 64 (four). FLASHCUTE_SM90_TILES forces
# either; both must compute the same attention on every kind of call, not only the long ones
# the automatic choice gives them.
TILES = {"base": (256, 64), "long": (192, 128)}
LONG_CASES = [
    dict(),
    dict(sq=1, sk=1),
    dict(sq=17, sk=17, dtype="float16"),
    dict(sq=113, sk=1000, causal=True),
    dict(sq=1000, sk=113, causal=True),
    dict(sq=1000, sk=1000, causal=True, b=4, h=16),  # several tiles per persistent CTA, in pairs
    # Pairs of tiles under a causal offset: a warpgroup's unseen top blocks handed back on the
    # early path to the second tile (up to three at 256 x 64), and rows that see no key at all.
    dict(sq=300, sk=700, causal=True, b=8, h=16),
    dict(sq=700, sk=300, causal=True, b=8, h=16),
    dict(sq=577, sk=1500, b=8, h=16),  # several tiles per CTA, the next tile's first S early
    # Several tiles per CTA of two and three blocks: the next tile's first S early, a tile's last
    # Q K^T among the first two blocks, a ragged second block; softcap and fp16.
    dict(sq=300, sk=257, b=8, h=16),
    dict(sq=700, sk=200, b=8, h=16, softcap=20.0, dtype="float16"),
    dict(window=(100, 3), sq=700, sk=700),
    dict(softcap=30.0, sq=257, sk=257),
    dict(h=16, hk=2, sq=129, sk=1000),
    dict(h=8, hk=1, sq=1, sk=1000),
    dict(d=40, sq=200, sk=300),
]


@pytest.mark.parametrize("tiles", list(TILES))
@pytest.mark.parametrize("case", LONG_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "default")
def test_both_sm90_tiles_match_the_reference(torch, monkeypatch, case, tiles):
    dtype = case.get("dtype", "bfloat16")
    d = case.get("d", 64)
    if flashcute.kernel_head_dim(d) != 64 or dtype not in flashcute.compiled_dtypes():
        pytest.skip(f"{dtype} head dim 64 is not compiled in this build")
    if why := sm90_available(torch, dtype, 64):
        pytest.skip(why)
    monkeypatch.delenv("FLASHCUTE_FORWARD_PATH", raising=False)
    monkeypatch.setenv("FLASHCUTE_SM90_TILES", tiles)
    kw = {key: case[key] for key in ("b", "sq", "sk", "h", "hk", "causal", "window", "softcap") if key in case}
    path, _, res = run(torch, d=d, dtype=dtype, **kw)
    assert path == "sm90"
    assert flashcute.last_forward_tile() == TILES[tiles]
    assert res.ok, f"{tiles} tiles: " + res.message


@pytest.mark.parametrize("kw,tiles", [
    (dict(b=1, h=32, sq=2048, sk=2048), "long"),  # no mask from 2k keys, 352 tiles of 192 rows
    (dict(b=1, h=32, sq=1024, sk=1024), "base"),  # equal at 1k: the first table
    (dict(b=1, h=32, sq=2048, sk=2048, causal=True), "base"),  # causal: from 4k only
    (dict(b=1, h=32, sq=4096, sk=4096, causal=True), "long"),
    (dict(b=1, h=2, hk=2, sq=2048, sk=2048), "base"),  # 22 tiles: too few for 132 SMs
], ids=["full-2k", "full-1k", "causal-2k", "causal-4k", "few-tiles"])
def test_automatic_tile_choice(torch, monkeypatch, kw, tiles):
    if flashcute.kernel_head_dim(64) != 64 or "bfloat16" not in flashcute.compiled_dtypes():
        pytest.skip("bfloat16 head dim 64 is not compiled in this build")
    if why := sm90_available(torch, "bfloat16", 64):
        pytest.skip(why)
    if torch.cuda.get_device_properties(0).multi_processor_count > 132:
        pytest.skip("the few-tiles case assumes at most 132 SMs")
    monkeypatch.delenv("FLASHCUTE_FORWARD_PATH", raising=False)
    monkeypatch.delenv("FLASHCUTE_SM90_TILES", raising=False)
    path, _, res = run(torch, d=64, **kw)
    assert (path, flashcute.last_forward_tile()) == ("sm90", TILES[tiles])
    assert res.ok, res.message


def test_bad_tiles_setting_is_an_error(torch, monkeypatch):
    if flashcute.kernel_head_dim(64) == 0 or "bfloat16" not in flashcute.compiled_dtypes():
        pytest.skip("bfloat16 head dim 64 is not compiled in this build")
    if why := sm90_available(torch, "bfloat16", 64):
        pytest.skip(why)
    monkeypatch.delenv("FLASHCUTE_FORWARD_PATH", raising=False)
    monkeypatch.setenv("FLASHCUTE_SM90_TILES", "wide")
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="FLASHCUTE_SM90_TILES"):
        flashcute.flash_attn_func(q, q, q)
