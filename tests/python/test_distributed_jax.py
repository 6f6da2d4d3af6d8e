"""flashcute.distributed_jax on the CPU: the ring over a mesh axis of 1-3 forced host devices
(a subprocess sets XLA_FLAGS before it imports JAX), with a float32 jnp attention stand-in in
place of the kernels, against jax.grad through whole-sequence attention; the zigzag permutation.
The GPU runs (the flashcute FFI kernels) are separate.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

jax = pytest.importorskip("jax")
np = pytest.importorskip("numpy")

import flashcute.distributed_jax as fdj  # noqa: E402

_SCRIPT = textwrap.dedent(r'''
    import sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    import flashcute.distributed_jax as fdj

    world, causal, h, hk, softcap = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    assert len(jax.devices()) >= world, jax.devices()

    def scores(q, k, scale):
        g = q.shape[2] // k.shape[2]
        s = jnp.einsum("bqhd,bkhd->bhqk", q, jnp.repeat(k, g, axis=2)) * scale
        if softcap > 0:
            t = jnp.tanh(s / softcap)
            return softcap * t, t
        return s, None

    def mask(s, causal):
        if not causal:
            return s
        sq, sk = s.shape[-2:]
        return jnp.where(jnp.triu(jnp.ones((sq, sk), bool), sk - sq + 1), -jnp.inf, s)

    def opaque(*xs):
        # Through a host callback, whose results shard_map types as invariant over the mesh axis,
        # as it types the flashcute kernels' FFI results.
        shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs)
        return jax.pure_callback(lambda *a: tuple(np.asarray(x) for x in a), shapes, *xs)

    class Ref:
        def fwd(self, *args):
            return opaque(*self.fwd_(*args))

        def bwd(self, *args, **kw):
            return opaque(*self.bwd_(*args, **kw))

        def fwd_(self, q, k, v, causal, scale, cap):
            s = mask(scores(q, k, scale)[0], causal)
            lse = jax.nn.logsumexp(s, axis=-1)
            p = jnp.exp(s - lse[..., None])
            g = q.shape[2] // k.shape[2]
            return jnp.einsum("bhqk,bkhd->bqhd", p, jnp.repeat(v, g, axis=2)), lse

        def bwd_(self, dout, q, k, v, out, lse, causal, scale, cap, det, partial_keys=True):
            s, t = scores(q, k, scale)
            p = jnp.exp(mask(s, causal) - lse[..., None])
            b, sk, hk_, d = k.shape
            g = q.shape[2] // hk_
            dv = jnp.einsum("bhqk,bqhd->bkhd", p, dout)
            dp = jnp.einsum("bqhd,bkhd->bhqk", dout, jnp.repeat(v, g, axis=2))
            ds = p * (dp - (dout * out).sum(-1).transpose(0, 2, 1)[..., None])
            if t is not None:
                ds = ds * (1 - t * t)
            dq = jnp.einsum("bhqk,bkhd->bqhd", ds, jnp.repeat(k, g, axis=2)) * scale
            dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q) * scale
            fold = lambda x: x.reshape(b, sk, hk_, g, d).sum(3)
            return dq, fold(dk), fold(dv)

    b, s, d, scale = 2, 12 * world, 16, 0.3
    key = jax.random.PRNGKey(3)
    kq, kk, kv, kd = jax.random.split(key, 4)
    q = jax.random.normal(kq, (b, s, h, d), jnp.float32)
    k = jax.random.normal(kk, (b, s, hk, d), jnp.float32)
    v = jax.random.normal(kv, (b, s, hk, d), jnp.float32)
    dout = jax.random.normal(kd, (b, s, h, d), jnp.float32)

    def whole(q, k, v):
        sc = mask(scores(q, k, scale)[0], causal)
        g = q.shape[2] // k.shape[2]
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, axis=-1), jnp.repeat(v, g, axis=2))

    ref_out = whole(q, k, v)
    ref_grads = jax.grad(lambda q, k, v: (whole(q, k, v) * dout).sum(), argnums=(0, 1, 2))(q, k, v)

    idx, inv = fdj.zigzag_indices(s, world) if causal else (np.arange(s), np.arange(s))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:world]), ("sp",))
    spec = P(None, "sp")

    def local(q, k, v):
        return fdj.ring_flash_attn(q, k, v, "sp", world, softmax_scale=scale, causal=causal, softcap=softcap,
                                   _kernels=REF)

    REF = Ref()
    ring = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec))
    lay = lambda x: x[:, idx]
    out = ring(lay(q), lay(k), lay(v))[:, inv]
    grads = jax.grad(lambda q, k, v: (ring(q, k, v) * lay(dout)).sum(), argnums=(0, 1, 2))(lay(q), lay(k), lay(v))
    grads = [g[:, inv] for g in grads]
    for name, got, want in [("out", out, ref_out), *zip(("dq", "dk", "dv"), grads, ref_grads)]:
        err = float(jnp.abs(got - want).max())
        assert err < 1e-4, (name, err)
    print("ok", world, causal)
''')


def _run(world: int, causal: bool, h: int = 4, hk: int = 2, softcap: float = 0.0) -> None:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={max(world, 1)}",
               JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", _SCRIPT, str(world), "1" if causal else "0", str(h), str(hk),
                          str(softcap)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]


def test_zigzag_indices_place_each_ranks_chunks():
    idx, inv = fdj.zigzag_indices(8, 2)
    assert idx.tolist() == [0, 1, 6, 7, 2, 3, 4, 5]  # rank 0: chunks 0 and 3; rank 1: chunks 1 and 2
    assert (idx[inv] == np.arange(8)).all()
    with pytest.raises(ValueError, match="seqlen"):
        fdj.zigzag_indices(10, 2)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_over_a_mesh_axis_matches_the_whole_sequence(world, causal):
    _run(world, causal)


def test_ring_softcap_and_mqa():
    _run(2, True, h=4, hk=1, softcap=5.0)
