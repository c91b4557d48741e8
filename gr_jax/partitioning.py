"""Device mesh, logical-axis rules and shardings: t5x's partitioning design on current JAX.

Parameters and activations are annotated with *logical* axis names (`nn.with_logical_partitioning`,
`nn.with_logical_constraint`); one rules table maps those names onto the two mesh axes ('data', 'model').
The trainer turns the abstract, boxed train state (from `jax.eval_shape`) into `NamedSharding`s with
`logical_shardings` and hands them to `jax.jit(in_shardings=..., out_shardings=...)`. No pjit, no
global partitioner object: a `Mesh`, a rules table, and plain functions.

Typical use::

    mesh = make_mesh(data=-1, model=2)
    boxed = jax.eval_shape(init_train_state, rng)          # params boxed in nn.LogicallyPartitioned
    shardings = logical_shardings(boxed, mesh=mesh, rules=LOGICAL_AXIS_RULES)
    state = jax.jit(init_train_state, out_shardings=shardings)(rng)
    with partitioning_context(mesh=mesh, rules=LOGICAL_AXIS_RULES):
        state, metrics = train_step(state, host_batch_to_global(batch, mesh=mesh))
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax.core import meta
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

logger = logging.getLogger(__name__)

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)

# A rules table: ordered (logical name, mesh axis or None) pairs, as in `flax.linen.logical_axis_rules`.
LogicalAxisRules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# t5x's `standard_logical_axis_rules()` for 1-D parameter and 1-D activation partitioning on a
# ('data', 'model') mesh (Megatron-style model parallelism plus data parallelism). Parameters and
# activations share the names batch, length, embed, mlp, heads, kv, vocab, relpos_buckets (and scanned
# stacks' parameters lead with layers): exactly the names the network uses. Every logical name used by
# the model must appear here (an unknown name is an error, never a silent replication).
#
# Override by passing another table (gin binds the `rules` argument of the entry points), e.g. t5x's
# 2-D fully sharded parameters (`parameter_partitioning_dims=2`, `LOGICAL_AXIS_RULES_2D` below) replace
# ('embed', None) with ('embed', 'data'), which shards parameters and optimizer state over both mesh axes (ZeRO-3
# style).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA_AXIS),
    ("vocab", MODEL_AXIS),
    ("embed", None),
    ("mlp", MODEL_AXIS),
    ("heads", MODEL_AXIS),
    # Grouped-query attention's key/value heads (the decoder-only family): sharded as the query heads, so their
    # number must divide by the 'model' axis too (8 in Llama-2-70B, Llama-3 and Qwen3-0.6B).
    ("kv_heads", MODEL_AXIS),
    ("kv", None),
    ("relpos_buckets", None),
    ("length", None),
    # The stacked axis of scanned layers (T5Config.scan_layers): replicated, as t5x's rules; a scan step reads
    # one layer, which every device then holds its own shards of.
    ("layers", None),
    # A LoRA adapter's rank (gr_jax.lora): small, replicated; its other axis is sharded as its kernel's.
    ("lora_rank", None),
)
# t5x's 2-D fully sharded parameters: 'embed' over 'data' as well (parameters and optimizer state over both axes).
LOGICAL_AXIS_RULES_2D: tuple[tuple[str, str | None], ...] = tuple(
    (name, DATA_AXIS) if name == "embed" else (name, axis) for name, axis in LOGICAL_AXIS_RULES)


# ----------------------------------------------------------------------------------------------
# Processes and mesh
# ----------------------------------------------------------------------------------------------


def initialize_distributed(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Connects the processes of a multi-host job; must run before any other JAX call.

    With no argument, JAX's own cluster auto-detection is tried (Cloud TPU VMs and pods, SLURM,
    Open MPI, Kubernetes, or the JAX_COORDINATOR_ADDRESS variable); when none applies this is a
    no-op and the run is a single process. Arguments that are given override what is detected.
    Returns whether `jax.distributed` is initialized afterwards.
    """
    if jax.distributed.is_initialized():
        return True
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if process_id is not None and process_id < 0:
        raise ValueError(f"process_id must be >= 0, got {process_id}")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ValueError(f"process_id={process_id} must be < num_processes={num_processes}")
    explicit = any(v is not None for v in (coordinator_address, num_processes, process_id))
    if not explicit:
        # jax raises this ValueError (before contacting anything) when no cluster was detected.
        try:
            jax.distributed.initialize()
        except ValueError as e:
            if "coordinator_address should be defined" not in str(e):
                raise
            logger.info("No multi-process cluster detected; running as a single process.")
            return False
    else:
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )
    logger.info(
        "jax.distributed initialized: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def make_mesh(*, data: int = -1, model: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A ('data', 'model') mesh over `devices` (default: all devices of all processes).

    `-1` for one axis means "all remaining devices". Device order comes from
    `mesh_utils.create_device_mesh`, which lays the model axis along fast TPU interconnect links;
    on a topology it cannot tile it falls back to splitting physical axes, then to plain order.
    Axes are `Auto` (GSPMD propagation, as in t5x), not JAX's newer explicit-sharding mode.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if n == 0:
        raise ValueError("make_mesh: no devices")
    sizes = {"data": data, "model": model}
    for axis, size in sizes.items():
        if size == 0 or size < -1:
            raise ValueError(f"make_mesh: {axis}={size}; sizes must be positive or -1 (all remaining devices)")
    if data == -1 and model == -1:
        raise ValueError("make_mesh: at most one of data and model may be -1")
    if data == -1 or model == -1:
        known = model if data == -1 else data
        if n % known:
            raise ValueError(
                f"make_mesh: {n} devices cannot be split into {'model' if data == -1 else 'data'}={known} groups "
                f"({n} is not a multiple of {known})"
            )
        data, model = (n // known, model) if data == -1 else (data, n // known)
    if data * model != n:
        raise ValueError(f"make_mesh: data={data} x model={model} = {data * model} devices, but {n} are available")
    shape = (data, model)
    try:
        device_grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except (ValueError, NotImplementedError, AssertionError) as first_error:
        try:
            device_grid = mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError, AssertionError):
            logger.warning(
                "create_device_mesh cannot tile %s on this topology (%s); using device order as given",
                shape,
                first_error,
            )
            device_grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(device_grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)


@contextlib.contextmanager
def partitioning_context(*, mesh: Mesh, rules: LogicalAxisRules = LOGICAL_AXIS_RULES) -> Iterator[None]:
    """Makes `nn.with_logical_constraint` in the model effective: sets the mesh and the rules table.

    Without a mesh in context, Flax's logical constraints are no-ops; trace (call) jitted train and
    decode steps inside this context.
    """
    with jax.set_mesh(mesh), nn.logical_axis_rules(tuple(rules)):
        yield


# ----------------------------------------------------------------------------------------------
# Parameter / state shardings
# ----------------------------------------------------------------------------------------------


def path_str(path) -> str:
    """A pytree key path as 'a/b/0'."""
    return "/".join(str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))) for key in path)


def is_box(x: Any) -> bool:
    """Whether `x` is a Flax partitioning box (`nn.LogicallyPartitioned`, `nn.Partitioned`)."""
    return isinstance(x, meta.AxisMetadata)


def strip_boxes(tree: Any) -> Any:
    """Removes partitioning boxes without Flax's sharding constraint (`nn.unbox` applies one when a mesh is in
    context, which fails on Adafactor's rank-reduced statistics that inherit a parameter's box); the jit's
    out_shardings place the values instead."""
    return jax.tree.map(lambda x: x.value if is_box(x) else x, tree, is_leaf=is_box)


def _mesh_axis_size(mesh: Mesh | None, axes: str | tuple[str, ...] | None) -> int:
    if axes is None or mesh is None:
        return 1
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    for name in names:
        if name not in mesh.shape:
            raise ValueError(f"mesh axis {name!r} is not in the mesh {dict(mesh.shape)}")
    return math.prod(mesh.shape[name] for name in names)


def _box_spec(path: str, box: meta.Partitioned, *, rules: LogicalAxisRules, mesh: Mesh | None) -> PartitionSpec:
    value = box.value
    shape = tuple(getattr(value, "shape", np.shape(value)))
    names = tuple(box.names)
    if len(names) != len(shape):
        # A statistic derived from a parameter with fewer dimensions: Adafactor's factored second
        # moments (v_row, v_col) and its (1,)-shaped placeholders carry the parameter's box but
        # not its rank. They are O(rows + cols) per matrix, so we replicate them.
        return PartitionSpec()
    if isinstance(box, nn.LogicallyPartitioned):
        known = {name for name, _ in rules}
        unknown = [n for n in names if isinstance(n, str) and n not in known]
        if unknown:
            raise ValueError(
                f"{path}: logical axis name(s) {unknown} (of {names}) have no entry in the rules table "
                f"{[name for name, _ in rules]}"
            )
        mapped = nn.logical_to_mesh_axes(names, rules)  # None only for names None
        spec = PartitionSpec() if mapped is None else mapped
    else:  # nn.Partitioned: names already are mesh axes.
        spec = PartitionSpec(*names)
    resolved: list[str | tuple[str, ...] | None] = []  # the mesh axes of each dimension
    for dim, (size, axes) in enumerate(zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)))):
        if axes is None or size == 1:
            # A size-1 dimension cannot be split (Adafactor keeps (1,) placeholders for the rows and
            # columns of unfactored parameters under the parameter's names): keep it whole.
            resolved.append(None)
            continue
        n_shards = _mesh_axis_size(mesh, axes)
        if size % n_shards:
            raise ValueError(
                f"{path}: dimension {dim} (logical {names[dim]!r}, size {size}) is mapped to mesh axis "
                f"{axes!r} of size {n_shards}, which does not divide it (shape {shape})"
            )
        resolved.append(axes)
    return PartitionSpec(*resolved)


def param_partition_specs(
    tree: Any, *, rules: LogicalAxisRules = LOGICAL_AXIS_RULES, mesh: Mesh | None = None
) -> Any:
    """Mesh `PartitionSpec` for every array of a (possibly boxed) parameter or train-state tree.

    `tree` holds arrays or `jax.ShapeDtypeStruct`s, some wrapped in `nn.LogicallyPartitioned`
    (logical names, mapped through `rules`) or `nn.Partitioned` (mesh names used as they are),
    e.g. the output of `jax.eval_shape(model.init, ...)`, or of a train-state init that ran
    `optax.init` on the boxed params (optax keeps the boxes, so Adam moments inherit the parameter
    names). Unboxed leaves (step counters, RNG keys) are replicated: `PartitionSpec()`. The result
    has the structure of the *unboxed* tree. With `mesh`, every sharded dimension is checked to be
    divisible by its mesh axis size.

    Optimizer statistics whose rank differs from their parameter's (Adafactor's factored `v_row`,
    `v_col`) are replicated: they are tiny, and replication needs no per-optimizer bookkeeping.
    """
    rules = tuple(rules)

    def leaf_spec(path, leaf):
        if is_box(leaf):
            return _box_spec(jax.tree_util.keystr(path), leaf, rules=rules, mesh=mesh)
        return PartitionSpec()

    return jax.tree_util.tree_map_with_path(leaf_spec, tree, is_leaf=is_box)


def logical_shardings(tree: Any, *, mesh: Mesh, rules: LogicalAxisRules = LOGICAL_AXIS_RULES) -> Any:
    """`NamedSharding` on `mesh` for every array of a (possibly boxed) tree; see `param_partition_specs`.

    The result can be passed as `jax.jit(..., out_shardings=...)` for an init function returning
    `tree` (boxes included: a sharding at a box's place applies to its value), and, once unboxed
    with `nn.unbox`, as shardings of the train state.
    """
    specs = param_partition_specs(tree, rules=rules, mesh=mesh)
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )


# ----------------------------------------------------------------------------------------------
# Input batches
# ----------------------------------------------------------------------------------------------


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Examples split over the 'data' axis (leading dimension), replicated over 'model'."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def is_primary_process() -> bool:
    """Whether this process writes the run's files (process 0). Every process of a multi-host job computes the same
    metrics and runs; one writes them, so no two processes write one file at once."""
    return jax.process_index() == 0


def distributed_client() -> Any:
    """The jax.distributed key-value client `initialize_distributed` connected (barriers, small values shared between
    processes; orbax reads it too). An error when jax.distributed is not initialized."""
    from jax._src import distributed  # jax exposes the client only here
    if distributed.global_state.client is None:
        raise RuntimeError(f"{jax.process_count()} processes but jax.distributed is not initialized")
    return distributed.global_state.client


def host_readable_sharding(mesh: Mesh) -> NamedSharding:
    """Replicated: for outputs every process reads whole (retrieval and scoring results). A batch-sharded output
    spans other hosts' devices in a multi-host job, where `jax.device_get` cannot fetch it; these are small."""
    return NamedSharding(mesh, PartitionSpec())


def data_axis_multiple(batch_size: int, mesh: Mesh) -> int:
    """`batch_size` rounded up to a multiple of the 'data' axis, so a batch splits evenly over it."""
    data_size = mesh.shape[DATA_AXIS]
    return -(-batch_size // data_size) * data_size


def padded_batches(tokens: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    """(int32[batch_size, ...] chunk, number of real rows) over the rows of `tokens` int[n, ...]: the last chunk
    is filled with empty (all-PAD) rows, so one compiled shape serves any number of rows; callers drop the padding
    rows' outputs."""
    for lo in range(0, len(tokens), batch_size):
        chunk = np.asarray(tokens[lo:lo + batch_size], np.int32)
        real = len(chunk)
        if real < batch_size:
            chunk = np.concatenate([chunk, np.zeros((batch_size - real, *chunk.shape[1:]), np.int32)])
        yield chunk, real


def host_batch_to_global(batch: dict[str, np.ndarray], *, mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles each process's slice of a batch into global `jax.Array`s split over 'data'.

    `batch[k]: [local_batch, ...]` holds this process's examples (the whole batch in a single-process
    run); the global batch is the concatenation over processes, in process order along 'data'.
    """
    sharding = batch_sharding(mesh)
    # Number of distinct 'data' slices held by this process's devices: the local batch is split
    # evenly among them.
    data_dim = mesh.axis_names.index(DATA_AXIS)
    local_ids = {d.id for d in jax.local_devices()}
    local_data_slices = {
        index[data_dim] for index, device in np.ndenumerate(mesh.devices) if device.id in local_ids
    }
    n_local = len(local_data_slices)
    if n_local == 0:
        raise ValueError("host_batch_to_global: this process owns no device of the mesh")
    out = {}
    for key, value in batch.items():
        array = np.asarray(value)
        if array.ndim == 0:
            raise ValueError(f"host_batch_to_global: batch[{key!r}] is a scalar; every feature needs a batch dimension")
        if array.shape[0] % n_local:
            raise ValueError(
                f"host_batch_to_global: batch[{key!r}] has {array.shape[0]} examples, not divisible by the "
                f"{n_local} 'data' shards of this process (mesh {dict(mesh.shape)})"
            )
        out[key] = jax.make_array_from_process_local_data(sharding, array)
    return out
