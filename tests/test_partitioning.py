"""Mesh construction, logical-axis shardings of params/optimizer state, batch placement (8 CPU devices)."""
import os
import socket
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gr_jax import partitioning

VOCAB, EMBED, MLP, HEADS, KV, BUCKETS = 256, 128, 256, 4, 16, 32


class ToyT5Block(nn.Module):
    """Parameters named like the T5.1.1 network's, plus one left without names."""

    @nn.compact
    def __call__(self, tokens):  # tokens: int32[batch, length]
        def param(name, names, shape, init=nn.initializers.normal(0.02)):
            return self.param(name, nn.with_logical_partitioning(init, names), shape)

        embedding = param("embedding", ("vocab", "embed"), (VOCAB, EMBED))
        query = param("query", ("embed", "heads"), (EMBED, HEADS * KV))  # heads x kv fused into one axis
        out = param("out", ("heads", "embed"), (HEADS * KV, EMBED))
        wi = param("wi", ("embed", "mlp"), (EMBED, MLP))
        wo = param("wo", ("mlp", "embed"), (MLP, EMBED))
        relpos = param("rel_embedding", ("heads", "relpos_buckets"), (HEADS, BUCKETS))
        scale = param("layer_norm_scale", ("embed",), (EMBED,), nn.initializers.ones)
        unnamed = self.param("unnamed", nn.initializers.ones, (3,))
        x = embedding[tokens] * scale
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        x = x + (x @ query) @ out + jax.nn.relu(x @ wi) @ wo
        return x.sum() + relpos.sum() + unnamed.sum()


# What t5x's standard rules give on a ('data', 'model') mesh, written out by hand.
EXPECTED_PARAM_SPECS = {
    "embedding": P("model", None),
    "query": P(None, "model"),
    "out": P("model", None),
    "wi": P(None, "model"),
    "wo": P("model", None),
    "rel_embedding": P("model", None),
    "layer_norm_scale": P(None),
    "unnamed": P(),
}
TOKENS = jnp.zeros((8, 4), jnp.int32)


def _init_params(rng):
    return ToyT5Block().init(rng, TOKENS)["params"]


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh(data=2, model=4)


def _is_spec(x):
    return isinstance(x, P)


def test_param_specs_equal_hand_written_expectation(mesh):
    abstract = jax.eval_shape(_init_params, jax.random.key(0))
    specs = partitioning.param_partition_specs(abstract, mesh=mesh)
    assert specs == EXPECTED_PARAM_SPECS
    shardings = partitioning.logical_shardings(abstract, mesh=mesh)
    assert {k: s.spec for k, s in shardings.items()} == EXPECTED_PARAM_SPECS
    assert all(s.mesh == mesh for s in shardings.values())


def test_jitted_init_puts_each_param_where_expected(mesh):
    abstract = jax.eval_shape(_init_params, jax.random.key(0))
    shardings = partitioning.logical_shardings(abstract, mesh=mesh)
    params = nn.unbox(jax.jit(_init_params, out_shardings=shardings)(jax.random.key(0)))
    reference = nn.unbox(_init_params(jax.random.key(0)))
    for name, array in params.items():
        assert array.sharding.spec == EXPECTED_PARAM_SPECS[name], name
        shard_shape = array.addressable_shards[0].data.shape
        expected_shape = tuple(
            dim // (4 if axis == "model" else 1)
            for dim, axis in zip(array.shape, tuple(EXPECTED_PARAM_SPECS[name]) + (None,) * array.ndim)
        )
        assert shard_shape == expected_shape, name
        # Same random values as an unsharded init (up to float rounding of the fused normal sampler).
        np.testing.assert_allclose(np.asarray(array), np.asarray(reference[name]), rtol=1e-6, atol=0)
    # 'model'-sharded embedding: device (data=i, model=j) holds vocabulary rows [64 j, 64 (j + 1)).
    embedding = params["embedding"]
    for shard in embedding.addressable_shards:
        (i, j), = zip(*np.nonzero(mesh.devices == shard.device))
        np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(embedding)[64 * j : 64 * (j + 1)])


# optax factors a parameter's second moment when it has >= 2 dims and its second-largest is >= 128.
FACTORED = {"embedding", "wi", "wo"}


@pytest.mark.parametrize("optimizer", ["adamw", "adafactor"])
def test_optimizer_state_follows_params(mesh, optimizer):
    tx = optax.adamw(1e-3) if optimizer == "adamw" else optax.adafactor(1e-3)

    def init_state(rng):
        params = _init_params(rng)
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    abstract = jax.eval_shape(init_state, jax.random.key(0))
    shardings = partitioning.logical_shardings(abstract, mesh=mesh)
    state = nn.unbox(jax.jit(init_state, out_shardings=shardings)(jax.random.key(0)))
    assert state["step"].sharding.spec == P()
    for name, array in state["params"].items():
        assert array.sharding.spec == EXPECTED_PARAM_SPECS[name]
    if optimizer == "adamw":
        adam = state["opt_state"][0]
        assert adam.count.sharding.spec == P()
        for name, spec in EXPECTED_PARAM_SPECS.items():
            assert adam.mu[name].sharding.spec == spec, name
            assert adam.nu[name].sharding.spec == spec, name
        return
    factored = state["opt_state"][0]
    assert factored.count.sharding.spec == P()
    for name, spec in EXPECTED_PARAM_SPECS.items():
        shape = state["params"][name].shape
        if name in FACTORED:
            # Row/column statistics drop the largest / second-largest dimension: replicated.
            assert factored.v_row[name].shape == (min(shape),) and factored.v_col[name].shape == (max(shape),)
            assert factored.v[name].shape == (1,)
            for stat in (factored.v_row, factored.v_col, factored.v):
                assert all(axis is None for axis in stat[name].sharding.spec), name
        else:
            # Full second moment, sharded like the parameter; (1,) row/column placeholders replicated.
            assert factored.v[name].shape == shape
            assert factored.v[name].sharding.spec == spec, name
            for stat in (factored.v_row, factored.v_col):
                assert stat[name].shape == (1,)
                assert all(axis is None for axis in stat[name].sharding.spec), name


def test_rules_can_be_overridden_for_2d_parameter_sharding(mesh):
    rules = tuple(
        ("embed", "data") if name == "embed" else (name, axis) for name, axis in partitioning.LOGICAL_AXIS_RULES
    )
    abstract = jax.eval_shape(_init_params, jax.random.key(0))
    specs = partitioning.param_partition_specs(abstract, rules=rules, mesh=mesh)
    assert specs["wi"] == P("data", "model")
    assert specs["embedding"] == P("model", "data")
    assert specs["layer_norm_scale"] == P("data")
    assert specs["rel_embedding"] == P("model", None)


def test_unknown_logical_name_is_an_error(mesh):
    tree = {"w": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((8, 8), jnp.float32), ("embed", "mpl"))}
    with pytest.raises(ValueError, match=r"\['w'\].*'mpl'"):
        partitioning.param_partition_specs(tree, mesh=mesh)


def test_indivisible_dimension_is_an_error(mesh):
    tree = {"emb": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((250, 8), jnp.float32), ("vocab", "embed"))}
    with pytest.raises(ValueError, match=r"\['emb'\].*size 250.*'model' of size 4"):
        partitioning.logical_shardings(tree, mesh=mesh)
    # On a mesh whose model axis divides 250 the same tree is fine.
    ok = partitioning.logical_shardings(tree, mesh=partitioning.make_mesh(data=4, model=2))
    assert ok["emb"].spec == P("model", None)


def test_partitioned_boxes_use_mesh_names_directly(mesh):
    tree = {"w": nn.Partitioned(jnp.zeros((4, 8)), ("data", "model")), "plain": np.zeros((3,))}
    assert partitioning.param_partition_specs(tree, mesh=mesh) == {"w": P("data", "model"), "plain": P()}


def test_partitioning_context_makes_activation_constraints_effective(mesh):
    class Constrained(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.with_logical_constraint(x * 2, ("batch", "length", "mlp"))

    x = jnp.ones((8, 4, 16))
    with partitioning.partitioning_context(mesh=mesh):
        y = jax.jit(lambda x: Constrained().apply({}, x))(x)
    assert isinstance(y.sharding, NamedSharding)
    assert y.sharding.spec == P("data", None, "model")
    np.testing.assert_array_equal(np.asarray(y), 2 * np.ones((8, 4, 16)))


# ----------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------


def test_batch_is_split_over_data_and_replicated_over_model(mesh):
    batch = {
        "inputs": np.arange(8 * 5, dtype=np.int32).reshape(8, 5),
        "weights": np.linspace(0, 1, 8).astype(np.float32),
    }
    out = partitioning.host_batch_to_global(batch, mesh=mesh)
    assert partitioning.batch_sharding(mesh).spec == P("data")
    for key, array in out.items():
        assert array.sharding == partitioning.batch_sharding(mesh)
        np.testing.assert_array_equal(np.asarray(array), batch[key])
        assert len(array.addressable_shards) == 8
        for shard in array.addressable_shards:
            (i, _), = zip(*np.nonzero(mesh.devices == shard.device))
            np.testing.assert_array_equal(np.asarray(shard.data), batch[key][4 * i : 4 * (i + 1)])


def test_bad_batches_are_rejected(mesh):
    with pytest.raises(ValueError, match=r"batch\['x'\] has 7 examples.*2 'data' shards"):
        partitioning.host_batch_to_global({"x": np.zeros((7, 3))}, mesh=mesh)
    with pytest.raises(ValueError, match="scalar"):
        partitioning.host_batch_to_global({"x": np.float32(1)}, mesh=mesh)


# ----------------------------------------------------------------------------------------------
# Mesh
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, shape",
    [
        ({}, {"data": 8, "model": 1}),
        ({"model": 4}, {"data": 2, "model": 4}),
        ({"data": 2, "model": -1}, {"data": 2, "model": 4}),
        ({"data": 8, "model": 1}, {"data": 8, "model": 1}),
        ({"data": 1, "model": 8}, {"data": 1, "model": 8}),
    ],
)
def test_make_mesh_shapes(kwargs, shape):
    mesh = partitioning.make_mesh(**kwargs)
    assert mesh.axis_names == ("data", "model")
    assert dict(mesh.shape) == shape
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


def test_make_mesh_on_a_subset_of_devices():
    devices = jax.devices()[:4]
    mesh = partitioning.make_mesh(data=2, model=2, devices=devices)
    assert dict(mesh.shape) == {"data": 2, "model": 2}
    assert {d.id for d in mesh.devices.flat} == {d.id for d in devices}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": 3}, "not a multiple of 3"),
        ({"data": 3, "model": -1}, "not a multiple of 3"),
        ({"data": 2, "model": 2}, "= 4 devices, but 8 are available"),
        ({"data": 4, "model": 4}, "= 16 devices, but 8 are available"),
        ({"data": -1, "model": -1}, "at most one"),
        ({"data": 0}, "data=0"),
        ({"model": -2}, "model=-2"),
    ],
)
def test_make_mesh_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        partitioning.make_mesh(**kwargs)


# ----------------------------------------------------------------------------------------------
# Multi-process wiring
# ----------------------------------------------------------------------------------------------


def test_initialize_distributed_rejects_inconsistent_ids():
    with pytest.raises(ValueError, match="process_id=2 must be < num_processes=2"):
        partitioning.initialize_distributed(coordinator_address="localhost:1", num_processes=2, process_id=2)
    with pytest.raises(ValueError, match="num_processes must be >= 1"):
        partitioning.initialize_distributed(num_processes=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_initialize_distributed_in_a_fresh_process():
    """Must run before JAX touches a backend, hence a subprocess: no-op, then a real 1-process cluster."""
    script = textwrap.dedent(
        f"""
        import jax
        from gr_jax import partitioning
        assert partitioning.initialize_distributed() is False
        assert not jax.distributed.is_initialized()
        ok = partitioning.initialize_distributed(
            coordinator_address="localhost:{_free_port()}", num_processes=1, process_id=0)
        assert ok and jax.distributed.is_initialized()
        assert partitioning.initialize_distributed() is True  # idempotent
        print("processes", jax.process_count(), jax.process_index(), jax.device_count())
        jax.distributed.shutdown()
        """
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "OMPI_", "JAX_COORDINATOR", "KUBERNETES_", "TPU_", "MEGASCALE_"))
        and "_proxy" not in k.lower()
    }
    repo_root = os.path.dirname(os.path.dirname(partitioning.__file__))
    env["PYTHONPATH"] = os.pathsep.join([repo_root, env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "processes 1 0 8" in result.stdout
