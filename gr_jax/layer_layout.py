"""Parameter trees of unscanned and scanned layer stacks (`T5Config.scan_layers`), and conversion between them.

Unscanned, layer i of a stack is its own subtree, `encoder_layers_{i}/attention/query` [embed, heads, kv]; scanned,
the stack is one subtree whose leaves stack the layers on a leading axis (logical name 'layers'),
`encoder_layers/attention/query` [layers, embed, heads, kv]. Everything outside the stacks (embeddings, relative
position tables, final norms, heads) is the same in both. The stacks are the encoder's, the decoder's and the
head's own (`OutputHead.layer_stacks`: PAWA's `pawa/layers`).

Why: a checkpoint, a pretrained Hugging Face T5 (one block per layer) or another run's parameters can start a run of
either layout. `stack_layers` / `unstack_layers` are pure functions of nested dicts whose leaves are arrays (numpy
stays numpy), `jax.ShapeDtypeStruct`s, logically partitioned boxes (`nn.LogicallyPartitioned`, as `init` returns
them: the 'layers' name is added or removed) or `NamedSharding`s (scanned layers replicated, as the default rules
say); a stack already in the asked layout, or absent (an encoder-only tree), passes through unchanged. An orbax
checkpoint of the other layout needs no offline conversion: `gr_jax.warm_start` (INIT_CHECKPOINT = a run dir)
converts its parameters on the way in. To convert one by hand, restore its params
(`Checkpointer.restore_params`) and apply `convert_layers`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from flax.core import meta
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from gr_jax.network import LAYERS, Head, T5Config


def layer_stacks(config: T5Config, *, head: Optional[Head]) -> dict[str, int]:
    """'/'-joined path of each layer stack of `config`'s network with the output head `head` (None: a network
    without one, e.g. an encoder alone) -> its depth."""
    return {"encoder_layers": config.num_encoder_layers, "decoder_layers": config.num_decoder_layers,
            **(head.layer_stacks(config) if head is not None else {})}


def stack_layers(params: Any, *, config: T5Config, head: Optional[Head]) -> Any:
    """The scanned tree of an unscanned one: `{stack}_{i}/rest` for i < depth -> `{stack}/rest` [depth, ...]."""
    flat = _flatten(params)
    out = {key: leaf for key, leaf in flat.items()
           if not any(_layer_index(key, stack) is not None for stack in layer_stacks(config, head=head))}
    for stack, depth in layer_stacks(config, head=head).items():
        by_rest: dict[str, dict[int, Any]] = {}
        for key, leaf in flat.items():
            found = _layer_index(key, stack)
            if found is not None:
                index, rest = found
                by_rest.setdefault(rest, {})[index] = leaf
        for rest, layers in by_rest.items():
            if sorted(layers) != list(range(depth)):
                raise ValueError(f"params of {stack}_*/{rest} exist for layers {sorted(layers)}, but the config's "
                                 f"stack has {depth} layers: a tree of another network")
            out[f"{stack}/{rest}"] = _stack_leaves([layers[i] for i in range(depth)])
    return traverse_util.unflatten_dict(out, sep="/")


def unstack_layers(params: Any, *, config: T5Config, head: Optional[Head]) -> Any:
    """The unscanned tree of a scanned one: `{stack}/rest` [depth, ...] -> `{stack}_{i}/rest` for i < depth."""
    stacks = layer_stacks(config, head=head)
    out = {}
    for key, leaf in _flatten(params).items():
        stack = next((s for s in stacks if key.startswith(s + "/")), None)
        if stack is None:
            out[key] = leaf
            continue
        rest = key[len(stack) + 1:]
        for i, layer_leaf in enumerate(_unstack_leaf(leaf, depth=stacks[stack], key=key)):
            out[f"{stack}_{i}/{rest}"] = layer_leaf
    return traverse_util.unflatten_dict(out, sep="/")


def convert_layers(params: Any, *, config: T5Config, head: Optional[Head]) -> Any:
    """`params` (either layout) in the layout of `config.scan_layers`."""
    convert = stack_layers if config.scan_layers else unstack_layers
    return convert(params, config=config, head=head)


def is_scanned(paths: Iterable[str], *, config: T5Config, head: Optional[Head]) -> Optional[bool]:
    """Whether '/'-joined parameter paths (e.g. a checkpoint's) hold `config`'s stacks scanned; None when they hold
    none of its stacks."""
    paths = list(paths)
    for stack, depth in layer_stacks(config, head=head).items():
        if not depth:
            continue
        if any(path.startswith(stack + "/") for path in paths):
            return True
        if any(path.startswith(f"{stack}_0/") for path in paths):
            return False
    return None


# --- Leaves -----------------------------------------------------------------------------------------------------------


def _flatten(params: Any) -> dict[str, Any]:
    return traverse_util.flatten_dict(_as_dict(params), sep="/")


def _as_dict(tree: Any) -> Any:
    """Nested mappings (FrozenDict included) as plain dicts; leaves untouched."""
    if hasattr(tree, "items") and not isinstance(tree, meta.AxisMetadata):
        return {key: _as_dict(value) for key, value in tree.items()}
    return tree


def _layer_index(key: str, stack: str) -> Optional[tuple[int, str]]:
    match = re.fullmatch(re.escape(stack) + r"_(\d+)/(.+)", key)
    return (int(match.group(1)), match.group(2)) if match else None


def _stack_leaves(leaves: list[Any]) -> Any:
    first = leaves[0]
    if isinstance(first, meta.Partitioned):  # nn.LogicallyPartitioned too: the stacked axis is named 'layers'
        return first.replace(value=_stack_leaves([leaf.value for leaf in leaves]),
                             names=(LAYERS,) + tuple(first.names))
    if isinstance(first, jax.ShapeDtypeStruct):
        sharding = first.sharding
        return jax.ShapeDtypeStruct((len(leaves),) + tuple(first.shape), first.dtype,
                                    sharding=None if sharding is None else _stack_sharding(sharding))
    if isinstance(first, Sharding):
        return _stack_sharding(first)
    if all(isinstance(leaf, np.ndarray) for leaf in leaves):
        return np.stack(leaves)
    return jnp.stack(leaves)


def _stack_sharding(sharding: Sharding) -> Sharding:
    """A layer's sharding with the stacked axis replicated in front (the default rules' 'layers')."""
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))
    return sharding  # e.g. one device: any shape


def _unstack_sharding(sharding: Sharding) -> Sharding:
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[1:]))
    return sharding


def _unstack_leaf(leaf: Any, *, depth: int, key: str) -> list[Any]:
    if isinstance(leaf, meta.Partitioned):
        if not leaf.names or leaf.names[0] != LAYERS:
            raise ValueError(f"params[{key!r}] has logical axes {leaf.names}; a scanned stack's start with {LAYERS!r}")
        return [leaf.replace(value=value, names=tuple(leaf.names[1:]))
                for value in _unstack_leaf(leaf.value, depth=depth, key=key)]
    if isinstance(leaf, Sharding):
        return [_unstack_sharding(leaf)] * depth
    shape = tuple(leaf.shape)
    if not shape or shape[0] != depth:
        raise ValueError(f"params[{key!r}] has shape {shape}; a scanned stack of {depth} layers has them first")
    if isinstance(leaf, jax.ShapeDtypeStruct):
        sharding = None if leaf.sharding is None else _unstack_sharding(leaf.sharding)
        return [jax.ShapeDtypeStruct(shape[1:], leaf.dtype, sharding=sharding)] * depth
    return [leaf[i] for i in range(depth)]
