"""Ring attention on two GPUs: flashcute.distributed over NCCL (one process a GPU, spawned) and
flashcute.distributed_jax over a two-device mesh, with the flashcute kernels. out, lse and
dq/dk/dv of the whole sequence (gathered from the shards) pass FlashAttention's rule against the
float32 reference, as flash_attn_func's do on one GPU. Bad calls raise on every rank; every run
has a deadline, so a hang fails. Skipped without two CUDA devices (the CPU runs of the same
schedule are test_distributed.py and test_distributed_jax.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from ranks import spawn

pytestmark = pytest.mark.gpu

# (seqlen, nheads, nheads_k, headdim, causal, softcap): chunks of 17-512 tokens (below 64 a row
# sees few enough keys of a block for the backward's exact D, which partial_keys turns off),
# GQA, MQA and odd head counts.
CASES = [
    (2048, 4, 2, 128, True, 0.0),
    (2048, 4, 2, 128, False, 0.0),
    (1000, 6, 2, 64, True, 0.0),
    (1000, 3, 3, 64, False, 0.0),
    (136, 5, 1, 64, False, 30.0),
    (68, 3, 3, 128, True, 0.0),
]


def _two_gpus(torch) -> None:
    import torch.distributed as dist

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices, this machine has {torch.cuda.device_count()}")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")


def _init(rank, world, init_file):
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120), device_id=torch.device("cuda", rank))


def _whole_inputs(torch, s, h, hk, d, seed):
    g = torch.Generator().manual_seed(seed)  # the same on every rank
    x = [torch.randn(1, s, n, d, generator=g) for n in (h, hk, hk, h)]
    return [t.to("cuda", torch.bfloat16) for t in x]


def _ring_worker(rank, world, init_file, cases, compiled):
    import torch
    import torch.distributed as dist

    import flashcute
    import flashcute.distributed as fcd
    from flashcute.bench.ring import _allgather_attn
    from flashcute.testing import check_attention, check_gradients

    _init(rank, world, init_file)
    fcd._SPLIT_HEADS_FROM_TOKENS = 1024  # the 2048-token cases' backward runs over halves of the heads
    failures = []
    try:
        for i, (s, h, hk, d, causal, softcap) in enumerate(cases):
            q, k, v, dout = _whole_inputs(torch, s, h, hk, d, seed=100 + i)
            local = [fcd.shard(x, causal).requires_grad_() for x in (q, k, v)]
            ring = fcd.ring_flash_attn_func
            if compiled:
                ring = torch.compile(ring)
            out, lse = ring(*local, causal=causal, softcap=softcap, return_lse=True)
            grads = torch.autograd.grad(out, local, fcd.shard(dout, causal))
            whole = [fcd.unshard(x.detach(), causal) for x in (out, *grads)]
            whole_lse = fcd.unshard(lse, causal, dim=2)
            kw = dict(causal=causal, softcap=softcap)
            checks = [("out", check_attention(whole[0], q, k, v, lse=whole_lse, **kw)),
                      ("grads", check_gradients(tuple(whole[1:]), dout, q, k, v, **kw))]
            if not softcap and not compiled:  # the benchmark's all-gather baseline, the same way
                local = [fcd.shard(x, causal).requires_grad_() for x in (q, k, v)]
                out = _allgather_attn(torch, dist, flashcute, *local, causal)
                grads = torch.autograd.grad(out, local, fcd.shard(dout, causal))
                whole = [fcd.unshard(x.detach(), causal) for x in (out, *grads)]
                checks += [("all-gather out", check_attention(whole[0], q, k, v, **kw)),
                           ("all-gather grads", check_gradients(tuple(whole[1:]), dout, q, k, v, **kw))]
            for name, check in checks:
                if not check.ok:
                    failures.append(f"rank {rank}, case {cases[i]}: {name}: {check.message}")
        # deterministic=True: the same bits twice
        s, h, hk, d, causal, softcap = cases[0]
        q, k, v, dout = _whole_inputs(torch, s, h, hk, d, seed=7)
        runs = []
        for _ in range(2):
            local = [fcd.shard(x, causal).requires_grad_() for x in (q, k, v)]
            out = fcd.ring_flash_attn_func(*local, causal=causal, deterministic=True)
            runs.append([out, *torch.autograd.grad(out, local, fcd.shard(dout, causal))])
        if not all(torch.equal(a, b) for a, b in zip(*runs)):
            failures.append(f"rank {rank}: deterministic=True gave different bits")
    finally:
        dist.destroy_process_group()
    assert not failures, "\n".join(failures)


def _bad_call_worker(rank, world, init_file):
    import torch
    import torch.distributed as dist

    import flashcute.distributed as fcd

    _init(rank, world, init_file)
    try:
        s = 256 if rank == 0 else 384  # rank 1 holds a longer shard
        q = torch.randn(1, s, 2, 64, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="differ"):
            fcd.ring_flash_attn_func(q, q, q, causal=True)
        q = torch.randn(1, 255, 2, 64, device="cuda", dtype=torch.bfloat16)  # odd: not two zigzag chunks
        with pytest.raises(ValueError, match="even"):
            fcd.ring_flash_attn_func(q, q, q, causal=True)
        with pytest.raises(ValueError, match="multiple of 4"):
            fcd.shard(torch.zeros(1, 250, 2, 64, device="cuda"), causal=True)
        # the group still works after the errors
        t = torch.ones(1, device="cuda")
        dist.all_reduce(t)
        assert t.item() == world
    finally:
        dist.destroy_process_group()


def _spawn(fn, args, tmp_path, deadline_s=300, world=2):
    spawn(fn, world, args, tmp_path, deadline_s, "GPUs")


def test_torch_ring_on_two_gpus(torch, require_kernel, tmp_path):
    _two_gpus(torch)
    require_kernel("bfloat16", 64)
    require_kernel("bfloat16", 128)
    _spawn(_ring_worker, (CASES, False), tmp_path)


def test_torch_ring_compiled_on_two_gpus(torch, require_kernel, tmp_path):
    """torch.compile of the ring (graph breaks at the collectives), forward and backward."""
    _two_gpus(torch)
    require_kernel("bfloat16", 128)
    _spawn(_ring_worker, (CASES[:1], True), tmp_path)


def test_torch_bad_calls_raise_on_every_rank(torch, require_kernel, tmp_path):
    _two_gpus(torch)
    require_kernel("bfloat16", 64)
    _spawn(_bad_call_worker, (), tmp_path, deadline_s=180)


_JAX_SCRIPT = textwrap.dedent(r'''
    import sys
    import numpy as np
    import torch
    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    import flashcute.distributed_jax as fdj
    from flashcute.testing import check_attention, check_gradients

    cases = eval(sys.argv[1])
    gpus = jax.devices("gpu")
    assert len(gpus) >= 2, gpus
    mesh = jax.sharding.Mesh(np.array(gpus[:2]), ("sp",))
    spec = P(None, "sp")
    failures = []
    for i, (s, h, hk, d, causal, softcap) in enumerate(cases):
        g = torch.Generator().manual_seed(100 + i)
        whole = [torch.randn(1, s, n, d, generator=g).to(torch.bfloat16) for n in (h, hk, hk, h)]
        q, k, v, dout = (jnp.asarray(x.float().numpy(), jnp.bfloat16) for x in whole)
        idx, inv = fdj.zigzag_indices(s, 2) if causal else (np.arange(s), np.arange(s))

        def local(q, k, v):
            return fdj.ring_flash_attn(q, k, v, "sp", 2, causal=causal, softcap=softcap, return_lse=True)

        ring = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=(spec, P(None, None, "sp"))))
        lay = lambda x: x[:, idx]
        out, lse = ring(lay(q), lay(k), lay(v))
        out, lse = out[:, inv], lse[:, :, inv]
        loss = lambda q, k, v: (ring(q, k, v)[0].astype(jnp.float32) * lay(dout).astype(jnp.float32)).sum()
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(lay(q), lay(k), lay(v))
        to_torch = lambda x: torch.from_numpy(np.asarray(x.astype(jnp.float32))).to(torch.bfloat16)
        tq, tk, tv, tdo = whole
        kw = dict(causal=causal, softcap=softcap)
        c1 = check_attention(to_torch(out), tq, tk, tv, lse=torch.from_numpy(np.asarray(lse)), **kw)
        c2 = check_gradients(tuple(to_torch(x[:, inv]) for x in grads), tdo, tq, tk, tv, **kw)
        for name, c in (("out", c1), ("grads", c2)):
            if not c.ok:
                failures.append(f"case {cases[i]}: {name}: {c.message}")
    assert not failures, "\n".join(failures)
    print("ok")
''')


def test_jax_ring_on_two_gpus(torch, require_kernel):
    """The JAX ring inside shard_map over a mesh of two GPUs, jit and grad (a subprocess, so that
    its JAX sees both GPUs and holds no memory of this one)."""
    _two_gpus(torch)
    pytest.importorskip("jax")
    require_kernel("bfloat16", 64)
    require_kernel("bfloat16", 128)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    res = subprocess.run([sys.executable, "-c", _JAX_SCRIPT, repr(CASES)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-3000:] + res.stderr[-5000:]
