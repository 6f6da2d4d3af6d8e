"""flashcute.distributed: context parallelism over a torch.distributed process group (ring attention).

One long sequence is split over the W ranks of a process group along its sequence dim; each rank
holds its shard of q, k and v. The K/V shards travel around the ring (point-to-point sends to the
next rank, receives from the one before, over the group's backend: NCCL on GPUs), while each rank
attends its queries to the block it holds; the partial results merge exactly by their logsumexp.
The backward sends the blocks around again, with their dK/dV accumulators (float32 when W > 2),
which end at their owner.

Layout. Causal attention uses the zigzag layout: the sequence is cut into 2W chunks and rank r
holds chunks r and 2W - 1 - r, so that every rank does the same work at every step
(:func:`zigzag_shard`, :func:`zigzag_unshard`). Without a mask, rank r holds chunk r of W
(:func:`shard` and :func:`unshard` choose by ``causal``). With zigzag, at step s rank r holds the
block of rank j = (r - s) mod W: at s = 0 its own (causal, on its two chunks in sequence order),
then, for j < r, all its queries against j's first chunk, and for j > r, its second chunk's
queries against both of j's chunks; never a masked block.

Every rank must call :func:`ring_flash_attn_func` with the same shapes and options (checked with
one small all-gather: a mismatch raises the same error on every rank instead of hanging).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

__all__ = ["ring_flash_attn_func", "shard", "unshard", "zigzag_shard", "zigzag_unshard"]


def _torch():
    import torch
    import torch.distributed as dist

    return torch, dist


def _group_info(group) -> Tuple[int, int]:
    _, dist = _torch()
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashcute.distributed: torch.distributed is not initialized "
                           "(torch.distributed.init_process_group first)")
    return dist.get_world_size(group), dist.get_rank(group)


def _chunks(x: Any, parts: int, dim: int, what: str) -> Sequence[Any]:
    if x.shape[dim] % parts:
        raise ValueError(f"{what}: its sequence dim ({dim}) has {x.shape[dim]} tokens, not a multiple of "
                         f"{parts} (the layout's chunks)")
    return x.chunk(parts, dim=dim)


def zigzag_shard(x: Any, world_size: int, rank: int, dim: int = 1) -> Any:
    """Rank `rank`'s shard of a whole sequence `x` in the zigzag layout: chunks rank and
    2 * world_size - 1 - rank of 2 * world_size equal chunks along `dim`, in that order. The
    sequence length must divide into 2 * world_size chunks."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size = {world_size}, got {rank}")
    c = _chunks(x, 2 * world_size, dim, "x")
    torch, _ = _torch()
    return torch.cat([c[rank], c[2 * world_size - 1 - rank]], dim=dim)


def zigzag_unshard(shards: Sequence[Any], dim: int = 1) -> Any:
    """The whole sequence from every rank's zigzag shard (`shards` in rank order)."""
    torch, _ = _torch()
    w = len(shards)
    halves = [s.chunk(2, dim=dim) for s in shards]
    return torch.cat([halves[i][0] for i in range(w)] + [halves[w - 1 - i][1] for i in range(w)], dim=dim)


def shard(x: Any, causal: bool, group=None, dim: int = 1) -> Any:
    """This rank's shard of the whole sequence `x` (the same on every rank): zigzag for causal
    attention, else the rank's one of W equal chunks."""
    w, r = _group_info(group)
    return zigzag_shard(x, w, r, dim) if causal else _chunks(x, w, dim, "x")[r].contiguous()


def unshard(x: Any, causal: bool, group=None, dim: int = 1) -> Any:
    """The whole sequence from every rank's shard `x` (an all-gather; the inverse of :func:`shard`)."""
    torch, dist = _torch()
    w, _ = _group_info(group)
    parts = [torch.empty_like(x) for _ in range(w)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return zigzag_unshard(parts, dim) if causal else torch.cat(parts, dim=dim)


class _FlashKernels:
    """The per-block attention: flashcute's forward (with its lse) and backward."""

    def fwd(self, q, k, v, causal: bool, scale: float, softcap: float):
        from .flash_attn_interface import flash_attn_func

        return flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, softcap=softcap, return_lse=True)

    def bwd(self, dout, q, k, v, out, lse, causal: bool, scale: float, softcap: float, deterministic: bool,
            partial_keys: bool = True):
        from .flash_attn_interface import flash_attn_bwd

        return flash_attn_bwd(dout, q, k, v, out, lse, softmax_scale=scale, causal=causal, softcap=softcap,
                              deterministic=deterministic, partial_keys=partial_keys)


class _Ring:
    """Point-to-point exchange with the ring's neighbours: each call sends tensors to the next rank
    and receives as many from the previous one, asynchronously (wait() before using them)."""

    def __init__(self, group) -> None:
        _, dist = _torch()
        self.group = group
        self.w, self.r = _group_info(group)
        glob = (lambda i: dist.get_global_rank(group, i)) if group is not None else (lambda i: i)
        self.next, self.prev = glob((self.r + 1) % self.w), glob((self.r - 1) % self.w)

    def exchange(self, tensors: Sequence[Any]) -> Tuple[list, list]:
        torch, dist = _torch()
        recv = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in recv]
        return recv, dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    for req in reqs:
        req.wait()


def _merge_(out, lse, o, lse_o) -> None:
    """Merges the partial attention (o, lse_o) over other keys into (out, lse) in place (views
    allowed): out float32 (b, s, h, d), lse (b, h, s). No temporary of out's size."""
    torch, _ = _torch()
    new = torch.logaddexp(lse, lse_o)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)  # rows with no key yet: weights 0
    out.mul_(torch.exp(lse - safe).transpose(1, 2).unsqueeze(-1))
    out.addcmul_(o, torch.exp(lse_o - safe).transpose(1, 2).unsqueeze(-1))
    lse.copy_(new)


def _as_flag(name: str, value: Any) -> bool:
    if value is True or value is False:
        return value
    raise TypeError(f"ring_flash_attn_func: {name}: expected a bool, got {type(value).__name__}")


def _check_call(q, k, v, ring: _Ring, options: Tuple) -> None:
    """The same shapes, dtype and options on every rank (one all-gather), so that a mismatch raises
    everywhere instead of leaving some ranks waiting in the ring."""
    import zlib

    torch, dist = _torch()
    desc = [*q.shape, *k.shape, *v.shape, zlib.crc32(repr((str(q.dtype), options)).encode())]
    mine = torch.tensor(desc, dtype=torch.int64, device=q.device)
    every = [torch.empty_like(mine) for _ in range(ring.w)]
    dist.all_gather(every, mine, group=ring.group)
    if any(not torch.equal(e, every[0]) for e in every):
        raise ValueError("ring_flash_attn_func: the ranks' q, k, v shapes, dtype or options differ: "
                         + "; ".join(f"rank {i}: {e.tolist()[:12]}" for i, e in enumerate(every)))


def _ring_fwd(kern, ring: _Ring, q, k, v, causal: bool, scale: float, softcap: float):
    c = q.shape[1] // 2
    out = lse = None  # float32, merged in place
    k_cur, v_cur = k, v
    for step in range(ring.w):
        if step + 1 < ring.w:
            nxt, reqs = ring.exchange([k_cur, v_cur])
        j = (ring.r - step) % ring.w
        if not causal or step == 0:
            o, l = kern.fwd(q, k_cur, v_cur, causal and step == 0, scale, softcap)
            if out is None:
                out, lse = o.float(), l.float()
            else:
                _merge_(out, lse, o, l)
        elif j < ring.r:  # all queries against j's first chunk (before both of ours)
            _merge_(out, lse, *kern.fwd(q, k_cur[:, :c], v_cur[:, :c], False, scale, softcap))
        else:  # our second chunk's queries against both of j's chunks (our first sees neither)
            _merge_(out[:, c:], lse[..., c:], *kern.fwd(q[:, c:], k_cur, v_cur, False, scale, softcap))
        if step + 1 < ring.w:
            _wait(reqs)
            k_cur, v_cur = nxt
    return out.to(q.dtype), lse


def _partial_keys(ring: _Ring, step: int, causal: bool, c: int) -> bool:
    """Whether a step's block is part of the keys its rows' out and lse cover (flash_attn_bwd's
    partial_keys). Not at W = 1, nor at rank 0's causal first step where its chunks are longer than
    64: the only rows there that see 64 keys or fewer (the backward's exact-D rule) are its first
    chunk's first rows, which see no other block."""
    return ring.w > 1 and not (causal and step == 0 and ring.r == 0 and c > 64)


# From this many tokens a shard, a step's backward runs in two calls over halves of the KV heads
# (with their query heads), so that one call's workspace and gradients, about three times q's size,
# are live for half the heads at a time. Shorter shards keep one call (a smaller grid costs more
# there, and the memory is small).
_SPLIT_HEADS_FROM_TOKENS = 16384


def _head_groups(seqlen: int, nheads: int, nheads_k: int) -> list:
    """(query heads, KV heads) slices of a step's backward calls: two halves where nheads_k is even
    and the shard long, else all the heads in one call."""
    parts = 2 if nheads_k % 2 == 0 and seqlen >= _SPLIT_HEADS_FROM_TOKENS else 1
    n, g = nheads_k // parts, nheads // nheads_k
    return [(slice(i * n * g, (i + 1) * n * g), slice(i * n, (i + 1) * n)) for i in range(parts)]


def _ring_bwd(kern, ring: _Ring, dout, q, k, v, out, lse, causal: bool, scale: float, softcap: float,
              deterministic: bool):
    torch, _ = _torch()
    c = q.shape[1] // 2
    # Sums of more than two terms (W > 2) accumulate in float32. With two, the one add rounded to
    # the input dtype gives the same bits, and the accumulators (dQ here, dK/dV on the ring) take
    # half the memory.
    acc = torch.float32 if ring.w > 2 else q.dtype
    groups = _head_groups(q.shape[1], q.shape[2], k.shape[2])
    everything = slice(None)
    dq = None
    k_cur, v_cur = k, v
    dkv = dkv_reqs = None
    for step in range(ring.w):
        if step + 1 < ring.w:
            nxt, reqs = ring.exchange([k_cur, v_cur])
        j = (ring.r - step) % ring.w
        if not causal or step == 0:  # all queries, all the block's keys (a causal square at step 0)
            rows, keys, mask = everything, everything, causal and step == 0
            partial = _partial_keys(ring, step, causal, c)
        elif j < ring.r:  # all queries against j's first chunk: its second gets no gradient here
            rows, keys, mask, partial = everything, slice(0, c), False, True
        else:  # our second chunk's queries against both of j's chunks
            rows, keys, mask, partial = slice(c, None), everything, False, True
        if len(groups) == 1 and rows == everything and keys == everything:  # the call's outputs accumulate
            g = kern.bwd(dout, q, k_cur, v_cur, out, lse, mask, scale, softcap, deterministic, partial_keys=partial)
            dq = g[0].to(acc) if dq is None else dq.add_(g[0])
            dk_b, dv_b = g[1].to(acc), g[2].to(acc)
            del g
        else:
            if dq is None:  # step 0, whose rows are all of them
                dq = torch.empty(q.shape, dtype=acc, device=q.device)
            new = torch.empty if keys == everything else torch.zeros
            dk_b, dv_b = (new(k.shape, dtype=acc, device=k.device) for _ in range(2))
            for qh, kh in groups:
                g = kern.bwd(dout[:, rows, qh], q[:, rows, qh], k_cur[:, keys, kh], v_cur[:, keys, kh],
                             out[:, rows, qh], lse[:, qh, rows].contiguous(), mask, scale, softcap, deterministic,
                             partial_keys=partial)
                (dq[:, rows, qh].copy_ if step == 0 else dq[:, rows, qh].add_)(g[0])
                dk_b[:, keys, kh].copy_(g[1])
                dv_b[:, keys, kh].copy_(g[2])
                del g
        if dkv is not None:  # the accumulators of this block, from the rank that held it last step
            _wait(dkv_reqs)
            dk_b.add_(dkv[0])
            dv_b.add_(dkv[1])
            dkv = None
        if ring.w == 1:
            dkv, dkv_reqs = (dk_b, dv_b), []
        else:  # on to the next rank; the last step's send reaches the block's owner
            dkv, dkv_reqs = ring.exchange([dk_b, dv_b])
        del dk_b, dv_b
        if step + 1 < ring.w:
            _wait(reqs)
            k_cur, v_cur = nxt
    _wait(dkv_reqs)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def _autograd():
    torch, _ = _torch()

    class RingFlashAttn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale, softcap, deterministic, group, kern):
            ring = _Ring(group)
            out, lse = _ring_fwd(kern, ring, q, k, v, causal, scale, softcap)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.args = (ring, kern, causal, scale, softcap, deterministic)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, lse = ctx.saved_tensors
            ring, kern, causal, scale, softcap, deterministic = ctx.args
            dq, dk, dv = _ring_bwd(kern, ring, dout.contiguous(), q, k, v, out, lse, causal, scale, softcap,
                                   deterministic)
            return dq, dk, dv, None, None, None, None, None, None

    return RingFlashAttn


_AUTOGRAD: Optional[Any] = None


def ring_flash_attn_func(q: Any, k: Any, v: Any, softmax_scale: Optional[float] = None, causal: bool = False,
                         window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, deterministic: bool = False,
                         return_lse: bool = False, group=None, check: bool = True, _kernels: Optional[Any] = None):
    """Attention over one sequence sharded along dim 1 over the ranks of `group` (the default
    group: None), as :func:`flashcute.flash_attn_func` on the whole sequence would give each
    rank's rows. Differentiable (torch autograd).

    Arguments:
        q, k, v: this rank's shards, (batch, seqlen / W, nheads or nheads_k, headdim) torch tensors,
            laid out as :func:`shard` lays them (zigzag when causal); nheads a multiple of nheads_k.
        softmax_scale, causal, softcap, deterministic: as in :func:`flashcute.flash_attn_func`
            (causal is bottom-right aligned there, here the shards make one square mask).
        window_size: (-1, -1) only; a sliding window over shards is not built (NotImplementedError).
        return_lse: also return this rank's rows' lse, float32 (batch, nheads, seqlen / W).
        group: the torch.distributed process group (None: the default one).
        check: compare every rank's shapes, dtype and options first (one small all-gather, read on
            the host: a synchronisation a call). False skips it, for calls known to agree (a
            training loop after its first step): ranks that disagree then fail or hang in the
            group's backend instead of raising.

    Return: out (and lse), this rank's rows, in its shard's layout.
    Runs eagerly and under torch.compile (graph breaks at the collectives); CUDA-graph capture
    of the ring is not tested.
    Raises ValueError on every rank when the ranks' shapes, dtypes or options differ (with check),
    or a causal shard's length is odd (two zigzag chunks).
    """
    global _AUTOGRAD
    torch, _ = _torch()
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError("ring_flash_attn_func: q, k and v must be torch tensors")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"ring_flash_attn_func: expected 4-d q, k, v (batch, seqlen, heads, headdim), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"ring_flash_attn_func: window_size: only (-1, -1) (no window) across shards, "
                                  f"got {tuple(window_size)}")
    scale = float(softmax_scale) if softmax_scale is not None else q.shape[-1] ** -0.5
    check = _as_flag("check", check)
    ring = _Ring(group)
    if check:
        _check_call(q, k, v, ring, (bool(causal), scale, float(softcap), bool(deterministic)))
    if q.shape[1] != k.shape[1] or k.shape != v.shape:
        raise ValueError(f"ring_flash_attn_func: expected q, k and v shards of the same sequence length and k, v "
                         f"alike, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if causal and q.shape[1] % 2:
        raise ValueError(f"ring_flash_attn_func: a causal shard holds two zigzag chunks, so its length must be even, "
                         f"got {q.shape[1]}")
    if _AUTOGRAD is None:
        _AUTOGRAD = _autograd()
    kern = _kernels if _kernels is not None else _FlashKernels()
    out, lse = _AUTOGRAD.apply(q, k, v, bool(causal), scale, float(softcap), bool(deterministic), group, kern)
    return (out, lse) if return_lse else out
