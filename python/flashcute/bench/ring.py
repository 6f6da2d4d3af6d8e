"""``python -m flashcute.bench ring``: context parallelism (:mod:`flashcute.distributed`) on the
GPUs of one host: forward + backward of one long sequence over W GPUs against one GPU.

It spawns one process a GPU (NCCL). At every point (total seqlen x causal; batch 1, bf16,
``--heads`` query:KV heads, ``--headdim``) it times, each as the median over ``--reps`` of the
slowest rank's CUDA-event time after ``--warmup`` runs, every rank starting together (a barrier):

- ``1gpu``: :func:`flashcute.flash_attn_func` on the whole sequence, forward + backward, on rank 0
  (n/a where it runs out of memory);
- ``ring``: :func:`flashcute.distributed.ring_flash_attn_func` on the shards (zigzag when causal);
- ``compute``: the same ring with the exchanges left out (each rank attends to its own block W
  times): the ring's compute alone;
- ``comm``: the exchanges alone (the K/V blocks twice around the ring, dK/dV once in float32, as
  the ring sends them when W > 2; at W = 2 it sends them in the input dtype, half the bytes);
- ``allgather``: the baseline from the same kernels: all-gather the whole K/V, attend the local
  queries to it (two causal calls for the two zigzag chunks), and reduce-scatter dK/dV back.

Scaling efficiency = 1gpu / (W x ring). The ring's cost over its compute, ring - compute, against
comm: what of the communication shows (it can exceed comm: NCCL's kernels take SMs from the
attention kernels while they run). ``--framework jax`` (or ``both``, the default) also times
:func:`flashcute.distributed_jax.ring_flash_attn` inside ``jax.shard_map`` over a mesh of the same
GPUs against ``flash_attn_func`` on one, both jitted forward + backward (``jax.vjp``), by wall clock
around ``block_until_ready`` (median of ``--reps``).
FLOPs as FlashAttention counts them (3.5x the forward's 4 x heads x S^2 x headdim, halved when
causal), TFLOP/s per GPU. Memory: the peak allocated bytes a rank, and from the two longest points
the bytes a token, whence the longest sequence that would fit (``capacity``: a linear fit, not a
run). Writes ``ring-<date>.json`` to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

PROG = "flashcute.bench ring"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    p.add_argument("--seqlens", type=_ints, default=[65536, 131072, 262144],
                   help="total tokens (default 64k,128k,256k)")
    p.add_argument("--heads", default="32:8", help="nheads:nheads_k (default 32:8)")
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--causal", default="1,0", help="1, 0 or both (default 1,0)")
    p.add_argument("--world", type=int, default=0, help="GPUs (default: every visible one)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--skip-1gpu", action="store_true", help="leave out the one-GPU runs")
    p.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    p.add_argument("--out-dir", type=Path, default=Path("."))
    return p


def _flops(s: int, h: int, d: int, causal: bool) -> float:
    return 3.5 * 4.0 * h * s * s * d / (2.0 if causal else 1.0)


class _NoExchange:
    """A ring that sends nothing: each rank keeps its own block (the compute of the ring alone)."""

    def __init__(self, ring: Any) -> None:
        self.group, self.w, self.r = ring.group, ring.w, ring.r

    def exchange(self, tensors):
        return list(tensors), []


def _allgather_attn(torch, dist, fc, q, k, v, causal: bool, group=None):
    """The baseline: every rank gathers the whole K/V (autograd: dK/dV reduce-scattered back)."""
    w, r = dist.get_world_size(group), dist.get_rank(group)

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            parts = torch.empty((w, *x.shape), dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(parts, x.contiguous(), group=group)
            if not causal:
                return torch.cat(list(parts), dim=1)
            halves = [p.chunk(2, dim=1) for p in parts]  # rank i: chunks i and 2w - 1 - i
            return torch.cat([halves[i][0] for i in range(w)] + [halves[w - 1 - i][1] for i in range(w)], dim=1)

        @staticmethod
        def backward(ctx, g):
            if causal:
                c = g.chunk(2 * w, dim=1)
                g = torch.stack([torch.cat([c[i], c[2 * w - 1 - i]], dim=1) for i in range(w)])
            else:
                g = torch.stack(g.chunk(w, dim=1))
            out = torch.empty(g.shape[1:], dtype=g.dtype, device=g.device)
            dist.reduce_scatter_tensor(out, g.contiguous(), group=group)
            return out

    kk, vv = Gather.apply(k), Gather.apply(v)
    if not causal:
        return fc.flash_attn_func(q, kk, vv)
    c = q.shape[1] // 2
    first = fc.flash_attn_func(q[:, :c], kk[:, : (r + 1) * c], vv[:, : (r + 1) * c], causal=True)
    second = fc.flash_attn_func(q[:, c:], kk[:, : (2 * w - r) * c], vv[:, : (2 * w - r) * c], causal=True)
    return torch.cat([first, second], dim=1)


def _time(torch, dist, fn: Callable[[], Any], warmup: int, reps: int, active: bool = True) -> Optional[float]:
    """Median over reps of the slowest rank's time (ms); every rank joins the barriers. A rank with
    active False only waits. None where fn ran out of memory on any rank."""
    oom = torch.zeros(1, device="cuda")
    times = []
    for i in range(warmup + reps):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if active and not oom.item():
            try:
                fn()
            except torch.cuda.OutOfMemoryError:
                oom.fill_(1)
        end.record()
        torch.cuda.synchronize()
        t = torch.tensor([start.elapsed_time(end) if active else 0.0], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.all_reduce(oom, op=dist.ReduceOp.MAX)
        if oom.item():
            return None
        if i >= warmup:
            times.append(t.item())
    return statistics.median(times)


def _worker(rank: int, world: int, init_file: str, args: argparse.Namespace, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    import flashcute as fc
    import flashcute.distributed as fcd

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=600), device_id=torch.device("cuda", rank))
    h, hk = (int(x) for x in args.heads.split(":"))
    d = args.headdim
    rows = []
    for causal in [c == "1" for c in args.causal.split(",") if c]:
        for s in args.seqlens:
            row: dict[str, Any] = {"seqlen": s, "causal": causal, "heads": f"{h}:{hk}", "headdim": d, "world": world}
            g = torch.Generator(device="cuda").manual_seed(s)

            def mk(n, length):
                return torch.randn(1, length, n, d, device="cuda", generator=g, dtype=torch.bfloat16)

            if not args.skip_1gpu:  # the whole sequence on rank 0
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                state: dict[str, Any] = {}
                if rank == 0:
                    try:
                        state["x"] = [mk(n, s).requires_grad_() for n in (h, hk, hk)] + [mk(h, s)]
                    except torch.cuda.OutOfMemoryError:
                        pass

                def one_gpu():
                    q, k, v, dout = state["x"]
                    fc.flash_attn_func(q, k, v, causal=causal).backward(dout)
                    q.grad = k.grad = v.grad = None

                row["1gpu_ms"] = _time(torch, dist, one_gpu, args.warmup, args.reps, active=rank == 0 and "x" in state)
                row["1gpu_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9 if rank == 0 else None
                state.clear()

            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            whole_len = s // world
            q, k, v = (mk(n, whole_len).requires_grad_() for n in (h, hk, hk))
            dout = mk(h, whole_len)
            ring = fcd._Ring(None)

            def run_ring(kern_ring=None):
                if kern_ring is None:
                    out = fcd.ring_flash_attn_func(q, k, v, causal=causal)
                    out.backward(dout)
                else:  # the same schedule and kernels, no exchange
                    kern = fcd._FlashKernels()
                    o, lse = fcd._ring_fwd(kern, kern_ring, q.detach(), k.detach(), v.detach(), causal, d ** -0.5, 0.0)
                    fcd._ring_bwd(kern, kern_ring, dout, q.detach(), k.detach(), v.detach(), o, lse, causal,
                                  d ** -0.5, 0.0, False)
                q.grad = k.grad = v.grad = None

            row["ring_ms"] = _time(torch, dist, run_ring, args.warmup, args.reps)
            row["ring_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
            row["compute_ms"] = _time(torch, dist, lambda: run_ring(_NoExchange(ring)), args.warmup, args.reps)

            def comm():
                blocks = [k.detach(), v.detach()]
                f32 = [torch.zeros(k.shape, dtype=torch.float32, device="cuda") for _ in range(2)]
                for _ in range(2):  # forward, then backward: K/V around the ring
                    for _ in range(world - 1):
                        blocks, reqs = ring.exchange(blocks)
                        fcd._wait(reqs)
                for _ in range(world):  # the float32 dK/dV accumulators
                    f32, reqs = ring.exchange(f32)
                    fcd._wait(reqs)

            row["comm_ms"] = _time(torch, dist, comm, args.warmup, args.reps) if world > 1 else 0.0

            def gathered():
                fcd_out = _allgather_attn(torch, dist, fc, q, k, v, causal)
                fcd_out.backward(dout)
                q.grad = k.grad = v.grad = None

            torch.cuda.reset_peak_memory_stats()
            row["allgather_ms"] = _time(torch, dist, gathered, args.warmup, args.reps)
            row["allgather_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
            del q, k, v, dout
            flops = _flops(s, h, d, causal)
            for key in ("1gpu", "ring", "allgather"):
                ms = row.get(f"{key}_ms")
                gpus = 1 if key == "1gpu" else world
                row[f"{key}_tflops_per_gpu"] = flops / gpus / (ms * 1e-3) / 1e12 if ms else None
            if row.get("1gpu_ms") and row["ring_ms"]:
                row["scaling"] = row["1gpu_ms"] / (world * row["ring_ms"])
            if row["ring_ms"] and row["compute_ms"]:
                row["overhead"] = row["ring_ms"] / row["compute_ms"] - 1.0
            rows.append(row)
            if rank == 0:
                print(_line(row), flush=True)
    if rank == 0:
        meta = {"gpu": torch.cuda.get_device_name(0), "world": world, "torch": torch.__version__,
                "flashcute": fc.__version__, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "gpu_memory_gb": torch.cuda.get_device_properties(0).total_memory / 1e9}
        Path(out_file).write_text(json.dumps({"meta": meta, "rows": rows, "capacity": _capacity(rows, meta)}, indent=1))
    dist.destroy_process_group()


def _capacity(rows: list, meta: dict) -> dict:
    """The longest total sequence whose peak memory a rank fits in the GPU's, by a line through the
    two longest points (peak bytes are linear in the tokens), causal and not."""
    out = {}
    for causal in (True, False):
        for key in ("1gpu", "ring"):
            pts = sorted((r["seqlen"], r[f"{key}_peak_gb"]) for r in rows
                         if r["causal"] == causal and r.get(f"{key}_peak_gb") and r.get(f"{key}_ms"))
            if len(pts) < 2:
                continue
            (s0, m0), (s1, m1) = pts[-2], pts[-1]
            slope = (m1 - m0) / (s1 - s0)
            if slope > 0:
                out[f"{key}{'_causal' if causal else ''}"] = {
                    "gb_per_1k_tokens": slope * 1024, "tokens": int(s1 + (meta["gpu_memory_gb"] - m1) / slope)}
    return out


def _fmt(x: Any, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _line(r: dict) -> str:
    return (f"S={r['seqlen']:>7} causal={int(r['causal'])} 1gpu {_fmt(r.get('1gpu_ms'), '.1f')} ms | ring "
            f"{_fmt(r['ring_ms'], '.1f')} ms (compute {_fmt(r['compute_ms'], '.1f')}, comm {_fmt(r['comm_ms'], '.1f')}, "
            f"ring/compute - 1 {_fmt(r.get('overhead'), '.1%')}) | allgather {_fmt(r['allgather_ms'], '.1f')} ms | "
            f"scaling {_fmt(r.get('scaling'), '.0%')} | TFLOP/s a GPU 1gpu {_fmt(r.get('1gpu_tflops_per_gpu'), '.0f')} "
            f"ring {_fmt(r.get('ring_tflops_per_gpu'), '.0f')} allgather {_fmt(r.get('allgather_tflops_per_gpu'), '.0f')} "
            f"| peak GB 1gpu {_fmt(r.get('1gpu_peak_gb'), '.1f')} ring {_fmt(r.get('ring_peak_gb'), '.1f')} "
            f"allgather {_fmt(r.get('allgather_peak_gb'), '.1f')}")


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as exc:
        print(f"{PROG}: needs torch ({exc})", file=sys.stderr)
        return 2
    world = args.world or torch.cuda.device_count()
    if world < 1 or world > torch.cuda.device_count():
        print(f"{PROG}: --world: expected 1..{torch.cuda.device_count()} (the visible GPUs), got {world}",
              file=sys.stderr)
        return 2
    h, hk = (int(x) for x in args.heads.split(":"))
    for s in args.seqlens:
        if s % (2 * world):
            print(f"{PROG}: --seqlens: {s} is not a multiple of 2 x world = {2 * world}", file=sys.stderr)
            return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_file = args.out_dir / f"ring-{_dt.date.today().isoformat()}.json"
    res: dict[str, Any] = {}
    start = time.monotonic()
    if args.framework in ("torch", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(_worker, args=(world, os.path.join(tmp, "init"), args, str(out_file)), nprocs=world,
                               start_method="spawn")
        res = json.loads(out_file.read_text())
        print(f"{PROG}: torch, {res['meta']['gpu']} x {world}, {time.monotonic() - start:.0f} s; capacity (linear "
              f"fit of the peak memory): {json.dumps(res['capacity'])}")
    if args.framework in ("jax", "both"):
        res["jax"] = _jax_rows(args, world)
    out_file.write_text(json.dumps(res, indent=1))
    print(f"{PROG}: wrote {out_file}")
    return 0


def _jax_rows(args: argparse.Namespace, world: int) -> list:
    """The JAX ring against flash_attn_func on one GPU, forward + backward, wall-clock medians."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import flashcute as fc
    import flashcute.distributed_jax as fdj

    gpus = jax.devices("gpu")[:world]
    mesh = jax.sharding.Mesh(np.array(gpus), ("sp",))
    spec = P(None, "sp")
    h, hk = (int(x) for x in args.heads.split(":"))
    d = args.headdim

    def timed(f, *xs) -> Optional[float]:
        times = []
        try:
            for i in range(args.warmup + args.reps):
                t0 = time.perf_counter()
                jax.block_until_ready(f(*xs))
                if i >= args.warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
        except Exception as exc:  # XlaRuntimeError: out of memory
            if "RESOURCE_EXHAUSTED" not in str(exc) and "out of memory" not in str(exc).lower():
                raise
            return None
        return statistics.median(times)

    rows = []
    for causal in [c == "1" for c in args.causal.split(",") if c]:
        def one(q, k, v, do):
            return jax.vjp(lambda q, k, v: fc.flash_attn_func(q, k, v, causal=causal), q, k, v)[1](do)

        def local(q, k, v, do):
            return jax.vjp(lambda q, k, v: fdj.ring_flash_attn(q, k, v, "sp", world, causal=causal), q, k, v)[1](do)

        ring = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 3))
        for s in args.seqlens:
            keys = jax.random.split(jax.random.PRNGKey(s), 4)
            shapes = [(1, s, n, d) for n in (h, hk, hk, h)]
            row: dict[str, Any] = {"seqlen": s, "causal": causal, "heads": f"{h}:{hk}", "headdim": d, "world": world}
            if not args.skip_1gpu:
                xs = [jax.device_put(jax.random.normal(kk, sh, jnp.bfloat16), gpus[0]) for kk, sh in zip(keys, shapes)]
                row["1gpu_ms"] = timed(jax.jit(one), *xs)
                del xs
            xs = [jax.device_put(jax.random.normal(kk, sh, jnp.bfloat16), NamedSharding(mesh, spec))
                  for kk, sh in zip(keys, shapes)]
            row["ring_ms"] = timed(ring, *xs)
            del xs
            flops = _flops(s, h, d, causal)
            if row.get("1gpu_ms"):
                row["1gpu_tflops_per_gpu"] = flops / (row["1gpu_ms"] * 1e-3) / 1e12
            if row["ring_ms"]:
                row["ring_tflops_per_gpu"] = flops / world / (row["ring_ms"] * 1e-3) / 1e12
            if row.get("1gpu_ms") and row["ring_ms"]:
                row["scaling"] = row["1gpu_ms"] / (world * row["ring_ms"])
            rows.append(row)
            print(f"jax S={s:>7} causal={int(causal)} 1gpu {_fmt(row.get('1gpu_ms'), '.1f')} ms | ring "
                  f"{_fmt(row['ring_ms'], '.1f')} ms | scaling {_fmt(row.get('scaling'), '.0%')} | TFLOP/s a GPU "
                  f"1gpu {_fmt(row.get('1gpu_tflops_per_gpu'), '.0f')} ring {_fmt(row.get('ring_tflops_per_gpu'), '.0f')}",
                  flush=True)
    return rows
