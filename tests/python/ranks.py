"""One process a rank for the distributed tests (test_distributed.py on gloo, test_distributed_gpu.py
on NCCL), with a deadline: a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import time

import pytest


def spawn(fn, world: int, args: tuple, tmp_path, deadline_s: float, ranks: str = "processes") -> None:
    """fn(rank, world, init_file, *args) in `world` spawned processes; a worker's exception fails the
    test (torch.multiprocessing re-raises it), and so does running past `deadline_s`."""
    import torch.multiprocessing as mp

    init_file = str(tmp_path / f"init-{time.monotonic_ns()}")
    ctx = mp.start_processes(fn, args=(world, init_file, *args), nprocs=world, join=False, start_method="spawn")
    end = time.monotonic() + deadline_s
    while not ctx.join(timeout=max(1.0, end - time.monotonic())):
        if time.monotonic() > end:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{fn.__name__} on {world} {ranks} did not finish in {deadline_s} s (a hang)")
