"""flash_attn_with_kvcache on the GPU: contiguous and paged caches (pages shuffled), with and
without an in-place append, decode and multi-token queries, causal, window and softcap, GQA 1:1
to 32:1, num_splits 1, chosen and forced; each batch entry checked against the float32 reference
with FlashAttention's rule (flashcute.testing); outputs poisoned with NaN inside guards; the cache
checked row by row after the append; cache_seqlens and block_table never read on the host (a
decode step captured in a CUDA graph, replayed with new lengths) and never able to move a kernel
outside the cache: a page number out of range gives NaN to the rows that see it, table slots no
query sees may hold anything. The argument errors at the end need no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import pytest

import flashcute
from flashcute.testing import check_attention


@dataclass(frozen=True)
class Case:
    b: int
    sq: int            # query rows (== seqlen_new when appending)
    h: int
    hk: int
    d: int
    capacity: int      # keys per sequence the cache holds
    page: int = 0      # 0: contiguous; else the page size
    new: int = 0       # keys appended
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    num_splits: int = 0
    seqlens: bool = True  # False: no cache_seqlens (the whole cache)

    @property
    def id(self) -> str:
        s = f"b{self.b}-q{self.sq}-h{self.h}:{self.hk}-d{self.d}-cap{self.capacity}"
        s += f"-page{self.page}" if self.page else "-contig"
        s += f"-new{self.new}" if self.new else ""
        s += "-causal" if self.causal else ""
        s += f"-win{self.window[0]}_{self.window[1]}" if self.window != (-1, -1) else ""
        s += f"-cap{self.softcap:g}" if self.softcap else ""
        return s + f"-splits{self.num_splits}"

    def options(self) -> dict:
        return dict(causal=self.causal, window_size=self.window, softcap=self.softcap)


CASES = [
    Case(3, 1, 32, 8, 128, 1000, new=1, causal=True),                    # a decode step, GQA 4:1
    Case(2, 1, 32, 1, 64, 4096, page=16, new=1),                         # 32:1, small pages, split
    Case(3, 5, 8, 2, 128, 768, page=256, new=5, causal=True),            # several new tokens
    Case(2, 1, 4, 4, 256, 640, page=64, window=(100, 0)),                # 1:1, a window, no append
    Case(2, 17, 6, 2, 96, 300, num_splits=7, seqlens=False),             # forced splits, the whole cache
    Case(3, 3, 2, 1, 40, 160, page=32, new=3, softcap=15.0, num_splits=1),  # padded head dim
    Case(1, 1, 16, 2, 128, 20000, page=128, new=1, causal=True),         # long: many splits
    Case(4, 1, 8, 8, 64, 113, new=1),                                    # 1:1, odd capacity
    Case(2, 1, 32, 2, 128, 700, page=16, new=1),                         # 16:1: 16 rows, the decode kernel's most
]


def _require_kvcache(dtype: str, d: int) -> None:
    hd = flashcute.kernel_head_dim(d)
    if dtype not in flashcute.compiled_dtypes() or hd == 0 or \
            ("sm80", "splitkv", dtype, hd) not in flashcute.compiled_kernels():
        pytest.skip(f"no KV-cache kernel for {dtype} / head dim {d} in this build (FLASHCUTE_KVCACHE, "
                    "FLASHCUTE_DTYPES, FLASHCUTE_HEAD_DIMS)")


class Cache:
    """A KV cache, contiguous or paged with shuffled pages, inside a buffer whose guard pages
    (before and after) hold a sentinel, and the logical (batch, capacity, hk, d) view of it."""

    def __init__(self, torch, c: Case, dtype, g, guard: int = 2):
        self.torch, self.c = torch, c
        if c.page:
            per_seq = -(-c.capacity // c.page)
            self.num_pages = c.b * per_seq + 3  # spare pages nobody points at
            shape = (self.num_pages + 2 * guard, c.page, c.hk, c.d)
            perm = torch.randperm(self.num_pages, generator=g, device="cuda")[: c.b * per_seq]
            self.block_table = perm.view(c.b, per_seq).to(torch.int32)
        else:
            shape = (c.b + 2 * guard, c.capacity, c.hk, c.d)
            self.block_table = None
        self.guard = guard
        self.k_buf = torch.randn(shape, device="cuda", generator=g).to(dtype)
        self.v_buf = torch.randn(shape, device="cuda", generator=g).to(dtype)
        for buf in (self.k_buf, self.v_buf):
            buf[:guard] = 7.0
            buf[-guard:] = 7.0
        self.k_cache = self.k_buf[guard:-guard]
        self.v_cache = self.v_buf[guard:-guard]

    def logical(self, cache):
        """(batch, capacity, hk, d): each entry's keys in order."""
        c = self.c
        if self.block_table is None:
            return cache.clone()
        pages = cache[self.block_table.long()]  # (b, per_seq, page, hk, d)
        return pages.reshape(c.b, -1, c.hk, c.d)[:, : c.capacity].clone()

    def guards_intact(self) -> bool:
        g = self.guard
        return all(bool((buf[:g] == 7).all()) and bool((buf[-g:] == 7).all()) for buf in (self.k_buf, self.v_buf))


def _run_case(torch, c: Case, dtype: str, seed: int, *, split_count: bool = False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    cache = Cache(torch, c, dt, g)
    q = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=g).to(dt)
    k_new = v_new = None
    if c.new:
        k_new = torch.randn(c.b, c.new, c.hk, c.d, device="cuda", generator=g).to(dt)
        v_new = torch.randn(c.b, c.new, c.hk, c.d, device="cuda", generator=g).to(dt)
    if not c.seqlens:
        seqlens = None
        lens = [c.capacity] * c.b
    else:
        lens = torch.randint(0, c.capacity - c.new + 1, (c.b,), generator=g, device="cuda").tolist()
        lens[0] = c.capacity - c.new  # one full cache
        seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    k_before, v_before = cache.logical(cache.k_cache), cache.logical(cache.v_cache)
    guard = 3
    buf = torch.full((c.b + 2 * guard, c.sq, c.h, c.d), float("nan"), dtype=dt, device="cuda")
    out = buf[guard:guard + c.b]
    res, lse = flashcute.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k_new, v_new,
                                                 cache_seqlens=seqlens, block_table=cache.block_table,
                                                 num_splits=c.num_splits, return_lse=True, out=out, **c.options())
    torch.cuda.synchronize()
    assert res is out and lse.shape == (c.b, c.h, c.sq) and lse.dtype == torch.float32
    assert torch.isnan(buf[:guard]).all() and torch.isnan(buf[guard + c.b:]).all(), "a guard row of out was written"
    assert cache.guards_intact(), "a guard page of the cache was written"
    k_after, v_after = cache.logical(cache.k_cache), cache.logical(cache.v_cache)
    for b in range(c.b):
        n = lens[b]
        # The append: rows [n, n + new) hold the new keys and values; every other row is unchanged.
        exp_k, exp_v = k_before[b].clone(), v_before[b].clone()
        if c.new:
            exp_k[n:n + c.new] = k_new[b]
            exp_v[n:n + c.new] = v_new[b]
        assert torch.equal(k_after[b], exp_k) and torch.equal(v_after[b], exp_v), f"cache of entry {b}"
        keys = n + c.new
        ks, vs = k_after[b:b + 1, :keys], v_after[b:b + 1, :keys]
        if keys == 0:
            assert not out[b].any() and bool((lse[b] == float("-inf")).all())
            continue
        check = check_attention(out[b:b + 1], q[b:b + 1], ks, vs, lse=lse[b:b + 1], **c.options())
        assert check.ok, (b, n, check.message)
    if c.page:  # the pages nobody points at are untouched
        used = set(cache.block_table.flatten().tolist())
        spare = [p for p in range(cache.num_pages) if p not in used]
        ref_k = Cache(torch, c, dt, torch.Generator(device="cuda").manual_seed(seed))
        for p in spare:
            assert torch.equal(cache.k_cache[p], ref_k.k_cache[p]), f"spare page {p} was written"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kvcache_against_reference(torch, case, dtype):
    _require_kvcache(dtype, case.d)
    _run_case(torch, case, dtype, seed=sum(map(ord, case.id)) % 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 0, 3, 128])
@pytest.mark.parametrize("d", [64, 128])
def test_num_splits_agree(torch, num_splits, d):
    """Every split count passes the rule; automatic splits a long single-sequence decode. At d 64
    the combine's lanes 16-31 hold no columns but the lse of splits 16-31 (more than 16 splits)."""
    _require_kvcache("bfloat16", d)
    c = Case(1, 1, 8, 2, d, 8192, page=64, new=1, num_splits=num_splits)
    _run_case(torch, c, "bfloat16", seed=11)
    from flashcute._torch import _kvcache_launch

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(1, 1, 8, d, device="cuda", generator=g).bfloat16()
    kc = torch.randn(1, 8192, 2, d, device="cuda", generator=g).bfloat16()
    out = torch.empty_like(q)
    ran = _kvcache_launch(q, kc, kc, None, None, None, None, out, None, (0.1, False, -1, -1, 0.0), num_splits, 0,
                          torch.cuda.current_stream().cuda_stream, False)
    assert ran == num_splits if num_splits else ran > 1, ran


# Prefill: 64 query rows and more, which run on the sm90 kernels on an H100 / H200 (and on the
# split-KV kernels with FLASHCUTE_FORWARD_PATH=sm80). Key counts are rarely multiples of 16 here,
# so the box that holds an entry's last key reads cache rows past it.
PREFILL_CASES = [
    Case(2, 128, 8, 2, 128, 1000, new=128, causal=True),                 # contiguous, odd capacity
    Case(3, 113, 4, 4, 64, 777, page=16, new=113, causal=True),          # the smallest pages, odd rows
    Case(2, 200, 8, 1, 256, 640, page=64, window=(100, 0)),              # MQA, a window, no append
    Case(2, 64, 4, 2, 96, 300, seqlens=False),                           # the whole cache, 64 rows
    Case(2, 96, 6, 2, 40, 400, page=32, new=96, softcap=15.0),           # padded head dim, softcap
    Case(1, 1024, 32, 8, 128, 5000, page=64, new=1024, causal=True),     # chunked prefill, GQA 4:1
    Case(2, 300, 4, 2, 192, 1200, page=128, new=300, causal=True),       # pages of a block or more
]


@pytest.mark.gpu
@pytest.mark.parametrize("fwd_path", ["sm80", "sm90"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", PREFILL_CASES, ids=[c.id for c in PREFILL_CASES])
def test_prefill_against_reference(torch, sm90_fwd_why_not, monkeypatch, case, dtype, fwd_path):
    _require_kvcache(dtype, case.d)
    if fwd_path == "sm90" and (why := sm90_fwd_why_not(case.d, dtype)):
        pytest.skip(why)
    monkeypatch.setenv("FLASHCUTE_FORWARD_PATH", fwd_path)
    _run_case(torch, case, dtype, seed=sum(map(ord, case.id)) % 1000)
    assert flashcute.last_forward_path() == fwd_path


@pytest.mark.gpu
@pytest.mark.parametrize("fwd_path", ["sm80", "sm90"])
@pytest.mark.parametrize("page", [0, 16, 64])
def test_cache_rows_past_the_keys_are_never_read(torch, sm90_fwd_why_not, monkeypatch, page, fwd_path):
    """NaN in every cache row past an entry's keys (and, paged, -1 in the table slots past its
    pages) leaves the output finite and equal to that of a clean cache: as FlashAttention-2, no
    row past cache_seqlens + the new keys reaches the result (0 * NaN would)."""
    _require_kvcache("bfloat16", 128)
    if fwd_path == "sm90" and (why := sm90_fwd_why_not(128, "bfloat16")):
        pytest.skip(why)
    monkeypatch.setenv("FLASHCUTE_FORWARD_PATH", fwd_path)
    c = Case(3, 96, 8, 2, 128, 1024, page=page, new=96, causal=True)
    g = torch.Generator(device="cuda").manual_seed(21)
    cache = Cache(torch, c, torch.bfloat16, g)
    q = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=g).bfloat16()
    kn = torch.randn(c.b, c.new, c.hk, c.d, device="cuda", generator=g).bfloat16()
    vn = torch.randn(c.b, c.new, c.hk, c.d, device="cuda", generator=g).bfloat16()
    lens = [5, 401, 1024 - 96]  # keys after the append: 101, 497, 1024
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    table = None if cache.block_table is None else cache.block_table.clone()
    k_clean, v_clean = cache.k_cache.clone(), cache.v_cache.clone()
    for b, n in enumerate(lens):
        keys = n + c.new
        if table is None:
            cache.k_cache[b, keys:] = float("nan")
            cache.v_cache[b, keys:] = float("nan")
            continue
        first_unused = -(-keys // page)
        for slot in range(table.shape[1]):
            p = int(table[b, slot])
            rows = slice(keys - slot * page if slot * page < keys else 0, page)
            if slot * page + page > keys:
                cache.k_cache[p, rows] = float("nan")
                cache.v_cache[p, rows] = float("nan")
        table[b, first_unused:] = -1
    out = flashcute.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, kn, vn, cache_seqlens=seqlens,
                                           block_table=table, causal=True)
    ref = flashcute.flash_attn_with_kvcache(q, k_clean, v_clean, kn, vn, cache_seqlens=seqlens,
                                           block_table=cache.block_table, causal=True)
    torch.cuda.synchronize()
    assert flashcute.last_forward_path() == fwd_path
    assert torch.isfinite(out).all()
    assert torch.equal(out, ref)


def _step_inputs(torch, c: Case, seed: int):
    """A bf16 cache for c, one decode step's q and new keys, and the generator that made them."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    cache = Cache(torch, c, torch.bfloat16, g)
    q = torch.randn(c.b, 1, c.h, c.d, device="cuda", generator=g).bfloat16()
    kn = torch.randn(c.b, 1, c.hk, c.d, device="cuda", generator=g).bfloat16()
    return cache, q, kn, g


@pytest.mark.gpu
def test_cuda_graph_decode_step(torch):
    """One decode step (append + paged attention) captured in a CUDA graph and replayed with new
    cache_seqlens and new tokens matches the same step run eagerly on a copy of the cache."""
    _require_kvcache("bfloat16", 128)
    c = Case(4, 1, 16, 4, 128, 2048, page=64, new=1)
    cache, q, kn, g = _step_inputs(torch, c, seed=5)
    vn = torch.randn_like(kn)
    seqlens = torch.tensor([5, 100, 0, 2000], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    step = dict(cache_seqlens=seqlens, block_table=cache.block_table, causal=True, out=out)
    flashcute.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, kn, vn, **step)  # warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashcute.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, kn, vn, **step)
    for lens in ([6, 101, 1, 2001], [2047, 0, 1000, 17], [300, 300, 300, 300]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.normal_(generator=g)
        kn.normal_(generator=g)
        vn.normal_(generator=g)
        k_copy, v_copy = cache.k_cache.clone(), cache.v_cache.clone()
        eager = flashcute.flash_attn_with_kvcache(q, k_copy, v_copy, kn, vn, cache_seqlens=seqlens,
                                                 block_table=cache.block_table, causal=True)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), lens
        assert torch.equal(cache.k_cache, k_copy) and torch.equal(cache.v_cache, v_copy), lens


@pytest.mark.gpu
def test_garbage_cache_seqlens_stay_inside_the_cache(torch):
    """Negative or huge cache_seqlens are clamped on the device: no fault, no write outside the
    cache (guard pages) or out, finite results; compute-sanitizer checks the reads."""
    _require_kvcache("bfloat16", 64)
    c = Case(3, 1, 4, 2, 64, 256, page=16, new=1)
    cache, q, kn, g = _step_inputs(torch, c, seed=9)
    for lens in ([-5, 1 << 30, 255], [0, 256, (1 << 31) - 1]):
        seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        out = flashcute.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, kn, kn, cache_seqlens=seqlens,
                                               block_table=cache.block_table, num_splits=0)
        torch.cuda.synchronize()
        assert cache.guards_intact()
        assert torch.isfinite(out).all(), lens


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("bad", [-1, "num_pages", 1 << 30], ids=["negative", "num_pages", "huge"])
def test_bad_page_gives_nan_rows(torch, bad, num_splits):
    """A block_table entry outside [0, num_pages) is never read or written: the query rows that see
    a key on it are NaN (out and lse), every other row is finite and right, the append drops the
    keys that land on it, and nothing outside the cache is touched. Causal, 4 queries, 128-key
    blocks: entry 0's bad page is in its first block (of five: with one split, a main-loop load
    through the page slots), entry 2's holds its last two keys (seen by queries 2 and 3 only),
    entry 3 has one key block (with 3 splits, the only split that has keys is NaN), entry 1 is
    untouched."""
    _require_kvcache("bfloat16", 64)
    c = Case(4, 4, 4, 2, 64, 640, page=16, new=4, causal=True, num_splits=num_splits)
    g = torch.Generator(device="cuda").manual_seed(21)
    cache = Cache(torch, c, torch.bfloat16, g)
    q = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=g).bfloat16()
    kn = torch.randn(c.b, c.new, c.hk, c.d, device="cuda", generator=g).bfloat16()
    vn = torch.randn(c.b, c.new, c.hk, c.d, device="cuda", generator=g).bfloat16()
    bad = cache.num_pages if bad == "num_pages" else bad
    lens = [596, 300, 78, 16]  # keys 600, 304, 82 and 20 after the append
    table = cache.block_table.clone()
    table[0, 2], table[2, 5], table[3, 0] = bad, bad, bad  # keys 32-47, 80-95 and 0-15
    nan_rows = {0: range(4), 2: range(2, 4), 3: range(4)}  # causal: query i sees keys < keys - 3 + i
    exp_k, exp_v = cache.k_cache.clone(), cache.v_cache.clone()
    for b, n in enumerate(lens):  # the append, where the table is valid
        for i in range(c.new):
            page = int(table[b, (n + i) // c.page])
            if 0 <= page < cache.num_pages:
                exp_k[page, (n + i) % c.page], exp_v[page, (n + i) % c.page] = kn[b, i], vn[b, i]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = flashcute.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, kn, vn, cache_seqlens=seqlens,
                                                 block_table=table, num_splits=num_splits, return_lse=True,
                                                 **c.options())
    torch.cuda.synchronize()
    assert cache.guards_intact(), "a guard page of the cache was written"
    assert torch.equal(cache.k_cache, exp_k) and torch.equal(cache.v_cache, exp_v), "the append left its pages"
    ks, vs = cache.logical(cache.k_cache), cache.logical(cache.v_cache)  # through the valid table
    for b, n in enumerate(lens):
        keys, bad_rows = n + c.new, list(nan_rows.get(b, ()))
        good_rows = [i for i in range(c.sq) if i not in bad_rows]
        assert torch.isnan(out[b, bad_rows]).all() and torch.isnan(lse[b, :, bad_rows]).all(), (b, bad_rows)
        assert torch.isfinite(out[b, good_rows]).all() and torch.isfinite(lse[b, :, good_rows]).all(), b
        if good_rows:  # the first rows, with the keys they see: the same causal alignment
            rows, seen = len(good_rows), keys - (c.sq - len(good_rows))
            check = check_attention(out[b:b + 1, :rows], q[b:b + 1, :rows], ks[b:b + 1, :seen], vs[b:b + 1, :seen],
                                    lse=lse[b:b + 1, :, :rows], **c.options())
            assert check.ok, (b, check.message)


@pytest.mark.gpu
@pytest.mark.parametrize("fwd_path", ["sm80", "sm90"])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("bad", [-1, "num_pages"])
def test_prefill_bad_page_gives_nan_rows(torch, sm90_fwd_why_not, monkeypatch, bad, page, fwd_path):
    """The same rule for 100 causal queries, on both forward paths: entry 0's bad page holds early
    keys (every row sees them), entry 2's its last keys (seen by the last rows only), entry 1 is
    clean; rows that see a key on the bad page are NaN (out and lse), the others right."""
    _require_kvcache("bfloat16", 128)
    if fwd_path == "sm90" and (why := sm90_fwd_why_not(128, "bfloat16")):
        pytest.skip(why)
    monkeypatch.setenv("FLASHCUTE_FORWARD_PATH", fwd_path)
    c = Case(3, 100, 4, 2, 128, 1024, page=page, causal=True)
    g = torch.Generator(device="cuda").manual_seed(23)
    cache = Cache(torch, c, torch.bfloat16, g)
    q = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=g).bfloat16()
    bad = cache.num_pages if bad == "num_pages" else bad
    lens = [700, 513, 901]
    table = cache.block_table.clone()
    table[0, 1] = bad                                  # keys [page, 2 page): every row sees them
    last = (lens[2] - 1) // page                       # the page of entry 2's last key
    table[2, last] = bad
    first_seeing = last * page - (lens[2] - c.sq)      # causal: row i sees keys < lens - sq + 1 + i
    nan_rows = {0: range(c.sq), 2: range(max(first_seeing, 0), c.sq)}
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = flashcute.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens,
                                                 block_table=table, return_lse=True, **c.options())
    torch.cuda.synchronize()
    assert flashcute.last_forward_path() == fwd_path
    assert cache.guards_intact()
    ks, vs = cache.logical(cache.k_cache), cache.logical(cache.v_cache)
    for b, keys in enumerate(lens):
        bad_rows = list(nan_rows.get(b, ()))
        good_rows = [i for i in range(c.sq) if i not in bad_rows]
        assert torch.isnan(out[b, bad_rows]).all() and torch.isnan(lse[b, :, bad_rows]).all(), (b, bad_rows)
        assert torch.isfinite(out[b, good_rows]).all() and torch.isfinite(lse[b, :, good_rows]).all(), b
        if good_rows:
            rows, seen = len(good_rows), keys - (c.sq - len(good_rows))
            check = check_attention(out[b:b + 1, :rows], q[b:b + 1, :rows], ks[b:b + 1, :seen], vs[b:b + 1, :seen],
                                    lse=lse[b:b + 1, :, :rows], **c.options())
            assert check.ok, (b, check.message)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [(-1, -1), (100, 0)], ids=["past-the-length", "and-before-the-window"])
def test_table_slots_no_query_sees_may_hold_anything(torch, window):
    """-1 padding (FlashInfer's and vLLM's) in the table slots past each sequence's keys, and, with a
    window, in the slots wholly before it, changes nothing: the same out, bit for bit, as the
    valid table, finite and right."""
    _require_kvcache("bfloat16", 64)
    c = Case(3, 1, 8, 2, 64, 1024, page=16, new=1, window=window)
    cache, q, kn, g = _step_inputs(torch, c, seed=13)
    vn = torch.randn_like(kn)
    lens = [1000, 37, 600]
    padded = cache.block_table.clone()
    for b, n in enumerate(lens):
        keys = n + c.new
        padded[b, -(-keys // c.page):] = -1
        if window[0] >= 0:  # the slots whose last key is before the first one the query sees
            padded[b, :max(0, keys - 1 - window[0]) // c.page] = -1
    k_copy, v_copy = cache.k_cache.clone(), cache.v_cache.clone()
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    want = flashcute.flash_attn_with_kvcache(q, k_copy, v_copy, kn, vn, cache_seqlens=seqlens,
                                             block_table=cache.block_table, **c.options())
    out, lse = flashcute.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, kn, vn, cache_seqlens=seqlens,
                                                 block_table=padded, return_lse=True, **c.options())
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert torch.equal(out, want)
    assert torch.equal(cache.k_cache, k_copy) and torch.equal(cache.v_cache, v_copy) and cache.guards_intact()
    ks, vs = cache.logical(cache.k_cache), cache.logical(cache.v_cache)
    for b, n in enumerate(lens):
        keys = n + c.new
        check = check_attention(out[b:b + 1], q[b:b + 1], ks[b:b + 1, :keys], vs[b:b + 1, :keys],
                                lse=lse[b:b + 1], **c.options())
        assert check.ok, (b, check.message)


@pytest.mark.gpu
def test_torch_compile_and_opcheck(torch):
    _require_kvcache("bfloat16", 64)
    torch._dynamo.reset()
    c = Case(2, 1, 8, 2, 64, 512, page=32, new=1)
    cache, q, kn, g = _step_inputs(torch, c, seed=13)
    seqlens = torch.tensor([10, 300], dtype=torch.int32, device="cuda")

    def step(q, kc, vc, kn, seqlens):
        return flashcute.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=seqlens,
                                                 block_table=cache.block_table, causal=True)

    kc1, vc1 = cache.k_cache.clone(), cache.v_cache.clone()
    eager = step(q, kc1, vc1, kn, seqlens)
    kc2, vc2 = cache.k_cache.clone(), cache.v_cache.clone()
    compiled = torch.compile(step, fullgraph=True)(q, kc2, vc2, kn, seqlens)
    assert torch.equal(eager, compiled)
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)  # the compiled step appended in place too
    torch.library.opcheck(torch.ops.flashcute.fwd_kvcache.default,
                          (q, cache.k_cache.clone(), cache.v_cache.clone(), kn, kn, seqlens, cache.block_table, 0.125,
                           True, -1, -1, 0.0, 0),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
def test_cupy_matches_torch(torch, cupy):
    _require_kvcache("bfloat16", 128)
    c = Case(2, 1, 8, 2, 128, 1024, page=64, new=1)
    cache, q, kn, g = _step_inputs(torch, c, seed=17)
    seqlens = torch.tensor([100, 700], dtype=torch.int32, device="cuda")
    kc, vc = cache.k_cache.clone(), cache.v_cache.clone()
    ref = flashcute.flash_attn_with_kvcache(q, kc, vc, kn, kn, cache_seqlens=seqlens, block_table=cache.block_table)
    kc2, vc2 = cache.k_cache.clone(), cache.v_cache.clone()
    torch.cuda.synchronize()
    cp = [cupy.from_dlpack(t) for t in (q, kc2, vc2, kn, seqlens, cache.block_table)]
    out = flashcute.flash_attn_with_kvcache(cp[0], cp[1], cp[2], cp[3], cp[3], cache_seqlens=cp[4], block_table=cp[5])
    cupy.cuda.get_current_stream().synchronize()
    assert torch.equal(torch.from_dlpack(out), ref)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


# ------------------------------------------------------------------------------- errors, no GPU needed


def test_fa2_keywords_not_built_raise_by_name():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 1, 2, 64, dtype=torch.bfloat16)
    for kw in ("rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad", "alibi_slopes"):
        with pytest.raises(NotImplementedError, match=kw):
            flashcute.flash_attn_with_kvcache(q, q, q, **{kw: q})
    with pytest.raises(ValueError, match="num_splits"):
        flashcute.flash_attn_with_kvcache(q, q, q, num_splits=129)


def test_cpu_arrays_are_refused_by_name():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 1, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="q: expected a CUDA array"):
        flashcute.flash_attn_with_kvcache(q, q, q)


def test_kvcache_host_errors_on_gpu_arrays(torch):
    """The validation's messages, end to end (needs CUDA arrays to get past the device checks)."""
    _require_kvcache("bfloat16", 64)
    q = torch.randn(2, 1, 4, 64, device="cuda").bfloat16()
    kc = torch.randn(10, 48, 2, 64, device="cuda").bfloat16()
    bt = torch.zeros(2, 3, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="k_cache: page size 48 is not supported"):
        flashcute.flash_attn_with_kvcache(q, kc, kc, block_table=bt)
    kc = torch.randn(10, 64, 2, 64, device="cuda").bfloat16()
    with pytest.raises(TypeError, match="block_table"):
        flashcute.flash_attn_with_kvcache(q, kc, kc, block_table=bt.float())
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashcute.flash_attn_with_kvcache(q, kc, kc, block_table=bt,
                                          cache_seqlens=torch.zeros(3, dtype=torch.int32, device="cuda"))
    kn = torch.randn(2, 1, 2, 64, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="cache_seqlens: required"):
        flashcute.flash_attn_with_kvcache(q, kc, kc, kn, kn, block_table=bt)
    big = torch.randn(2, 193, 2, 64, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="overflow a cache of 192"):
        flashcute.flash_attn_with_kvcache(q, kc, kc, big, big, cache_seqlens=0, block_table=bt)
    with pytest.raises(ValueError, match="given together"):
        flashcute.flash_attn_with_kvcache(q, kc, kc, kn, None, cache_seqlens=0, block_table=bt)


@pytest.mark.gpu
def test_readme_paged_decode_step(torch):
    """The README's paged decode step runs as written and appends where it says."""
    _require_kvcache("bfloat16", 128)
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(# A paged decode step.*?)```", readme, re.S).group(1)
    scope = {"torch": torch, "flashcute": flashcute}
    exec(code, scope)  # noqa: S102 - the README's own example
    out, cache_seqlens = scope["out"], scope["cache_seqlens"]
    assert out.shape == (4, 1, 32, 128) and torch.isfinite(out).all()
    assert cache_seqlens.tolist() == [6, 901, 18, 2001]
    table, k_cache = scope["block_table"], scope["k_cache"]
    page, row = table[1, 900 // 64].item(), 900 % 64  # sequence 1's new token went to key 900
    assert torch.equal(k_cache[page, row], scope["k_new"][1, 0])
