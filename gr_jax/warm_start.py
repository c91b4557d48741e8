"""Start a run from another gr_jax run's parameters (continued pretraining on the corpus, then indexing from it) or
from a Hugging Face T5.1.1 checkpoint (`initialize_from_pretrained`, read by `gr_jax.pretrained`).

Why: the study starts every run from pretrained T5; without those weights (offline, as here) the closest stand-in
is T5's own span corruption objective on the corpus text (`tasks` row 'span_corruption'), after which the
indexing and retrieval runs start from that run's parameters, as they would from T5's (`INIT_CHECKPOINT` names
either a Hugging Face dir, see `gr_jax.pretrained`, or a gr_jax model dir, this module).

Only the parameters are read (orbax partial restore), straight into this run's shardings; the step and the
optimizer state start afresh. Parameters match by path. A larger vocabulary axis (atomic or 2D docid tokens
appended after the pieces) keeps the source's rows and takes the rows beyond from this run's initialisation; the
head's own parameters (its `fresh_param_patterns`: atomic columns, the PAWA stack) are fresh where the source lacks
them; anything else that differs is an error.
The source run's layer stacks may be scanned or not (`T5Config.scan_layers`), whatever this run's are: its
parameters are converted on the way in (`gr_jax.layer_layout`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from gr_jax import layer_layout
from gr_jax.checkpoints import Checkpointer
from gr_jax.network import T5Config
from gr_jax.partitioning import path_str
from gr_jax.pretrained import mix_vocabulary_rows
from gr_jax.run_dir import RunDir

if TYPE_CHECKING:
    from gr_jax.heads import OutputHead
    from gr_jax.trainer import Trainer, TrainState

logger = logging.getLogger(__name__)

def _vocabulary_grows(ours: tuple[int, ...], saved: tuple[int, ...], vocab_axis: int | None) -> bool:
    """Whether only the vocabulary axis differs, and ours is the larger (a smaller one would drop trained rows)."""
    return (vocab_axis is not None and len(ours) == len(saved) and ours[vocab_axis] > saved[vocab_axis]
            and all(a == b for axis, (a, b) in enumerate(zip(ours, saved)) if axis != vocab_axis))


def vocabulary_axes(params_with_logical_axes: Any) -> dict[str, int]:
    """'/'-joined path -> the axis with logical name 'vocab', of each boxed parameter that has one."""
    specs = nn.get_partition_spec(params_with_logical_axes)
    return {path_str(path): tuple(spec).index("vocab")
            for path, spec in jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
            if "vocab" in tuple(spec)}


# A source run's start record (`RunDir.read_start`) -> this network's parameters as that run started them (this
# run's layout and shardings): where the parameters its checkpoints leave out (LoRA's base) come from.
SourceStart = Callable[[Mapping[str, Any]], Any]


def _same_layout(tree: Any) -> Any:
    return tree


def params_from_run(*, model_dir: str | os.PathLike, fresh_params: Any, shardings: Any,
                    vocab_axes: Mapping[str, int], new_patterns: Sequence[str] | None = None,
                    config: Optional[T5Config] = None, head: Optional[OutputHead] = None,
                    source_start: Optional[SourceStart] = None) -> Any:
    """This run's parameter tree filled from the latest checkpoint in `model_dir`/checkpoints.

    fresh_params: this run's initialised params (unboxed), the source of new heads and of vocabulary rows beyond
      the source run's; shardings: a `Sharding` per leaf (e.g. `Trainer.state_shardings.params`); vocab_axes:
      path -> vocabulary axis (`vocabulary_axes`), the only axis along which a parameter may differ, and only by
      being larger here; new_patterns: parameters the source may lack (default: `head`'s own,
      `OutputHead.fresh_param_patterns`); config and head: this run's network and output head, given so that a source
      run whose layer stacks are in the other layout (`T5Config.scan_layers`) is read in its layout and converted
      (`gr_jax.layer_layout`); source_start: rebuilds the parameters the source's checkpoints leave out (its
      `frozen` ones, e.g. a LoRA run's base) from where the source started (`RunDir.read_start`).
    """
    directory = RunDir.of(model_dir).checkpoints
    checkpointer = Checkpointer(directory, asynchronous=False)
    conversion: tuple[T5Config, Any] | None = None  # (our network, our shardings) when the source's layout differs
    to_source_layout: Callable[[Any], Any] = _same_layout
    try:
        step = checkpointer.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {directory} to start from")
        saved = checkpointer.saved_params(step)
        source_scanned = None if config is None else layer_layout.is_scanned(saved, config=config, head=head)
        if config is not None and source_scanned is not None and source_scanned != config.scan_layers:
            # Matched and restored in the source's layout, converted to ours at the end.
            source = dataclasses.replace(config, scan_layers=source_scanned)
            conversion = (config, shardings)
            to_source_layout = functools.partial(layer_layout.convert_layers, config=source, head=head)
            fresh_params = to_source_layout(fresh_params)
            shardings = to_source_layout(shardings)
        leaves, treedef = jax.tree_util.tree_flatten_with_path(fresh_params)
        sharding_leaves = jax.tree_util.tree_leaves(shardings, is_leaf=lambda x: isinstance(x, Sharding))
        if len(sharding_leaves) != len(leaves):
            raise ValueError(f"shardings has {len(sharding_leaves)} leaves, fresh_params {len(leaves)}")
        paths = [path_str(path) for path, _ in leaves]
        if new_patterns is None:
            new_patterns = () if head is None or config is None else head.fresh_param_patterns(config)
        patterns = [re.compile(p) for p in new_patterns]
        missing = [p for p in paths if p not in saved and not any(q.fullmatch(p) for q in patterns)]
        start = RunDir.of(model_dir).read_start() if RunDir.of(model_dir).start.is_file() else {}
        left_out = re.compile(start["frozen"]) if start.get("frozen") else None
        if missing and left_out is not None and all(left_out.fullmatch(p) for p in missing):
            # The source's checkpoints leave these out (its frozen base): rebuilt from where it started.
            if source_start is None:
                raise ValueError(f"{directory} leaves out its frozen parameters ({missing[:3]}, ...) and nothing "
                                 "here rebuilds them from where that run started")
            fresh_params = to_source_layout(source_start(start))
            leaves = jax.tree_util.tree_flatten_with_path(fresh_params)[0]
            logger.info("the %d parameters %s leaves out come from where it started: %s", len(missing), directory,
                        start["init_checkpoint"] or f"seed {start['seed']}")
            missing = []
        unused = sorted(set(saved) - set(paths))
        if any(q.fullmatch(p) for p in paths for q in patterns):  # a new head replaces the output layer
            unused = [p for p in unused if p.split("/")[0] != "logits_dense"]
        mismatched = [f"{p}: ours {tuple(leaf.shape)}, saved {saved[p].shape}" for p, (_, leaf) in zip(paths, leaves)
                      if p in saved and tuple(leaf.shape) != saved[p].shape
                      and not _vocabulary_grows(tuple(leaf.shape), saved[p].shape, vocab_axes.get(p))]
        if missing or unused or mismatched:
            raise ValueError(
                f"{directory} (step {step}) does not hold this network's parameters: "
                f"{len(missing)} missing {missing[:5]}, {len(unused)} not in this network {unused[:5]}, "
                f"{len(mismatched)} with other shapes {mismatched[:5]}. Start from a run of the same network "
                f"(size gin and decoder) and vocabulary")

        targets = {}
        for path, (_, leaf), sharding in zip(paths, leaves, sharding_leaves):
            if path not in saved:
                continue
            if tuple(leaf.shape) == saved[path].shape:
                targets[path] = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
            else:  # read as saved, replicated, then mixed into this run's shape and sharding below
                replicated = NamedSharding(sharding.mesh, PartitionSpec()) if isinstance(sharding, NamedSharding) \
                    else sharding
                targets[path] = jax.ShapeDtypeStruct(saved[path].shape, leaf.dtype, sharding=replicated)
        restored = traverse_util.flatten_dict(checkpointer.restore_params(
            step, abstract_params=traverse_util.unflatten_dict(targets, sep="/")), sep="/")
    finally:
        checkpointer.close()

    out, counts = [], {"copied": 0, "mixed": 0, "fresh": 0}
    for path, (_, leaf), sharding in zip(paths, leaves, sharding_leaves):
        if path not in restored:
            out.append(jax.device_put(leaf, sharding))
            counts["fresh"] += 1
        elif tuple(leaf.shape) == restored[path].shape:
            out.append(restored[path])
            counts["copied"] += 1
        else:
            axis = vocab_axes[path]
            out.append(mix_vocabulary_rows(source=restored[path], fresh=leaf, axis=axis,
                                           rows=restored[path].shape[axis], sharding=sharding))
            counts["mixed"] += 1
    logger.info("started from %s step %d: %d parameters copied, %d with their vocabulary rows mixed, %d fresh",
                directory, step, counts["copied"], counts["mixed"], counts["fresh"])
    params = jax.tree_util.tree_unflatten(treedef, out)
    if conversion is None:
        return params
    ours, our_shardings = conversion
    logger.info("converted the layer stacks of %s to scan_layers=%s", directory, ours.scan_layers)
    return jax.jit(functools.partial(layer_layout.convert_layers, config=ours, head=head),
                   out_shardings=our_shardings)(params)


def _network(trainer: Trainer) -> tuple[Optional[T5Config], Optional[OutputHead]]:
    """The T5 network and output head of the trainer's model, which a warm start needs to convert a source run of
    the other layer layout and to know the head's new parameters; (None, None) for another family's model (the
    decoder-only network), whose source run is matched by path in its own layout."""
    config = getattr(trainer.model, "config", None)
    if not isinstance(config, T5Config):
        return None, None
    return config, getattr(trainer.model, "head")


def initialize_from_run(*, state: TrainState, trainer: Trainer, model_dir: str | os.PathLike,
                        seed: int) -> TrainState:
    """A freshly initialised train state (of `seed`) whose params come from another run (see `params_from_run`), of
    either layer layout. Where the source's checkpoints leave parameters out (a LoRA run's frozen base), they come
    from where it started (`RunDir.read_start`): a Hugging Face checkpoint read by this run's model, the run it
    was warm-started from (recursively), or its seed's initialisation, which is this state's when the seeds agree
    (the network is the source's: its saved parameters matched this one's by path and shape)."""
    boxed = jax.eval_shape(lambda: trainer.model.init(jax.random.PRNGKey(0), input_length=trainer.input_length,
                                                      target_length=trainer.target_length))["params"]
    config, head = _network(trainer)
    vocab_axes = vocabulary_axes(boxed)

    def source_start(start: Mapping[str, Any]) -> Any:
        origin = start["init_checkpoint"]
        if origin is None:
            if int(start["seed"]) != seed:
                raise ValueError(f"the frozen parameters of {model_dir} (or of a run it started from) are the "
                                 f"initialisation of seed {start['seed']}, which checkpoints do not hold; this run's "
                                 f"seed is {seed}: give it the same seed to start from that run")
            return state.params
        if RunDir.of(origin).is_run():
            return params_from_run(model_dir=origin, fresh_params=state.params,
                                   shardings=trainer.state_shardings.params, vocab_axes=vocab_axes, config=config,
                                   head=head, source_start=source_start)
        return initialize_from_pretrained(state=state, trainer=trainer, checkpoint_dir=origin).params

    params = params_from_run(model_dir=model_dir, fresh_params=state.params,
                             shardings=trainer.state_shardings.params, vocab_axes=vocab_axes,
                             config=config, head=head, source_start=source_start)
    return dataclasses.replace(state, params=jax.tree_util.tree_map(jnp.asarray, params))


@runtime_checkable
class LoadsCheckpoints(Protocol):
    """A model that reads its network's parameters from a Hugging Face checkpoint of its family (T5.1.1:
    `EncoderDecoderModel`; Llama / Mistral / Qwen: `gr_jax.decoder_only.model.DecoderOnlyModel`)."""

    def params_from_checkpoint(self, *, checkpoint_dir: str, fresh: Any, shardings: Any) -> Any: ...


def initialize_from_pretrained(*, state: TrainState, trainer: Trainer, checkpoint_dir: str | os.PathLike
                               ) -> TrainState:
    """A freshly initialised train state with its params replaced by the checkpoint's (on the trainer's shardings),
    read by the trainer's model (`LoadsCheckpoints`); what the checkpoint does not hold stays as initialised.

    Call once, before step 0, when there is no checkpoint of the run to resume from. The optimizer state is kept:
    Adafactor's and Adam's initial statistics do not depend on the parameter values.
    """
    model = trainer.model
    if not isinstance(model, LoadsCheckpoints):
        raise TypeError(f"a {type(model).__name__} reads no Hugging Face checkpoint ({checkpoint_dir})")
    params = model.params_from_checkpoint(checkpoint_dir=str(checkpoint_dir), fresh=state.params,
                                          shardings=trainer.state_shardings.params)
    return dataclasses.replace(state, params=params)
