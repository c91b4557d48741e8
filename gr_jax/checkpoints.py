"""Train-state checkpoints with orbax: sharded arrays plus the input pipeline's position, saved together.

Each step directory holds up to three items: 'state' (any pytree of `jax.Array`s, possibly sharded; written
by every process, each its own shards, with orbax's pytree handler: `_state_handler`), 'input' (a small JSON dict
such as `{"batches_consumed": 123, "seed": 0}`, written by process 0 with `JsonSave`), so a resumed run
continues at the exact example where the saved one stopped, and, for an input that can save its own state
(`CheckpointableInput`: the seqio pipeline's tf.data iterator), 'input_iterator': one file set per process, so
the resume takes time independent of the step. Being an item of the step, the iterator state is committed
atomically with the model state and deleted with it by `max_to_keep`. Saves are asynchronous by default: the
device-to-host copy and the iterator's state are taken inside `save`, writing to disk in the background, so
the caller may donate or overwrite the saved arrays and advance the iterator as soon as `save` returns.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import pathlib
import shutil
import tempfile
from typing import Any, Optional, Protocol, runtime_checkable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import future as ocp_future
from orbax.checkpoint._src.metadata import array_metadata_store  # pinned orbax: the default handler's store

from gr_jax.partitioning import path_str

logger = logging.getLogger(__name__)

STATE_ITEM = "state"
INPUT_ITEM = "input"
INPUT_ITERATOR_ITEM = "input_iterator"


@runtime_checkable
class CheckpointableInput(Protocol):
    """A training input that saves its own position (`gr_jax.data.pipeline.TrainBatches`), each process its own
    files in a directory shared by all of them."""

    def save_input_state(self, directory: str) -> None:
        """Writes the state after the batches yielded so far into `directory`, before returning."""

    def restore_input_state(self, directory: str) -> bool:
        """Continues from the state in `directory`; False when that checkpoint could not keep one."""


class _InputIteratorHandler(ocp.AsyncCheckpointHandler):
    """The 'input_iterator' item: the state is taken synchronously inside `async_save` (while the caller's
    `Checkpointer.save` blocks, so it is the state of exactly the batches consumed up to the step), into a local
    temporary directory; a commit future copies those files into the step's item directory in the background,
    once orbax has created it, before the step is finalized."""

    async def async_save(self, directory: epath.Path, args: InputIteratorSave) -> list[ocp_future.Future]:
        local = pathlib.Path(tempfile.mkdtemp(prefix="gr_jax_input_state_"))
        try:
            args.input.save_input_state(str(local))
        except BaseException:
            shutil.rmtree(local, ignore_errors=True)
            raise
        return [ocp_future.CommitFutureAwaitingContractedSignals(self._copy(local, directory),
                                                                  name="gr_jax_input_iterator_save")]

    @staticmethod
    async def _copy(local: pathlib.Path, directory: epath.Path) -> None:
        try:
            for path in sorted(local.iterdir()):
                (directory / path.name).write_bytes(path.read_bytes())
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def save(self, directory: epath.Path, args: InputIteratorSave) -> None:
        async def run():
            for commit in await self.async_save(directory, args):
                commit.result()
        asyncio.run(run())

    def restore(self, directory: epath.Path, args: InputIteratorRestore) -> bool:
        return args.input.restore_input_state(str(directory))


@ocp.args.register_with_handler(_InputIteratorHandler, for_save=True)
@dataclasses.dataclass
class InputIteratorSave(ocp.args.CheckpointArgs):
    input: CheckpointableInput


@ocp.args.register_with_handler(_InputIteratorHandler, for_restore=True)
@dataclasses.dataclass
class InputIteratorRestore(ocp.args.CheckpointArgs):
    input: CheckpointableInput


# An array replicated over R devices is written in R slices by default ("replica-parallel"), each cut out of its
# device buffer by an eagerly dispatched (and, per shape, compiled) slice: the write is spread over the hosts holding
# the replicas. Below this many bytes per slice the slicing costs more than it spreads (on one host it spreads
# nothing): such arrays are written whole by one replica, as orbax does for any array that no dimension divides.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _state_handler() -> ocp.PyTreeCheckpointHandler:
    """orbax's handler of a pytree of arrays (what `StandardSave` uses, same files), its arrays written by
    `MIN_REPLICA_SLICE_BYTES`'s rule."""
    arrays = ocp.type_handlers.ArrayHandler(array_metadata_store=array_metadata_store.Store(),
                                            min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES)
    scalars = ocp.type_handlers.ScalarHandler()
    registry = ocp.type_handlers.create_type_handler_registry(
        (int, scalars), (float, scalars), (bytes, scalars), (np.number, scalars),
        (np.ndarray, ocp.type_handlers.NumpyHandler()), (jax.Array, arrays), (str, ocp.type_handlers.StringHandler()))
    return ocp.PyTreeCheckpointHandler(type_handler_registry=registry)


def _as_path(directory: str | os.PathLike) -> epath.Path:
    text = os.fspath(directory)
    if "://" in text:  # gs://, s3:// ...: leave remote paths alone
        return epath.Path(text)
    return epath.Path(os.path.abspath(text))


def _abstract_leaf(path, leaf) -> jax.ShapeDtypeStruct:
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    if isinstance(leaf, jax.ShapeDtypeStruct):
        if leaf.sharding is None:
            raise ValueError(
                f"abstract_state{jax.tree_util.keystr(path)}: ShapeDtypeStruct{leaf.shape} has no sharding; "
                "restore needs one for every array (e.g. from partitioning.logical_shardings)"
            )
        return leaf
    raise TypeError(
        f"abstract_state{jax.tree_util.keystr(path)}: expected jax.ShapeDtypeStruct or jax.Array, "
        f"got {type(leaf).__name__}"
    )


class Checkpointer:
    """Saves and restores (train state, input position) pairs under `directory/<step>/`.

    Call `save`/`restore` from every process of a multi-host job (the directory must be shared);
    orbax coordinates the writes. `max_to_keep` most recent steps are kept (None: all).
    `save` writes (orbax's default policy) when the step is a multiple of `save_interval_steps`,
    when the directory has no checkpoint yet, when a preemption notice was received (Cloud TPU),
    or when `force` is given.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int | None = 3,
        save_interval_steps: int = 1,
        asynchronous: bool = True,
    ):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        if save_interval_steps < 1:
            raise ValueError(f"save_interval_steps must be >= 1, got {save_interval_steps}")
        self.directory = _as_path(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                save_interval_steps=save_interval_steps,
                enable_async_checkpointing=asynchronous,
                create=True,
            ),
            item_handlers={STATE_ITEM: _state_handler(), INPUT_ITEM: ocp.JsonCheckpointHandler(),
                           INPUT_ITERATOR_ITEM: _InputIteratorHandler()},
        )

    # -- queries -----------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        """The newest finished checkpoint's step, or None if there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of the checkpoints on disk, ascending."""
        return sorted(self._manager.all_steps())

    def should_save(self, step: int) -> bool:
        """Whether `save(step)` (without force) would write, e.g. to skip preparing the input state."""
        return self._manager.should_save(step)

    # -- save / restore ----------------------------------------------------------------------

    def save(self, step: int, *, state: Any, input_state: dict, input_iterator: Optional[CheckpointableInput] = None,
             force: bool = False) -> bool:
        """Starts saving `state` and `input_state` (and `input_iterator`'s state, taken before this returns) as
        `step`; returns whether a save was started.

        Nothing is written when `step` is not due (see `save_interval_steps`; `force` overrides) or
        already has a checkpoint (which is never overwritten).

        `input_state` must be a JSON-serializable dict of plain Python values (no numpy scalars).
        """
        if input_iterator is not None and not isinstance(input_iterator, CheckpointableInput):
            raise TypeError(f"input_iterator must be a CheckpointableInput, got {type(input_iterator).__name__}")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if not isinstance(input_state, dict):
            raise TypeError(f"input_state must be a dict, got {type(input_state).__name__}")
        try:
            json.dumps(input_state, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"input_state is not plain JSON ({e}): {input_state!r}") from e
        if step in self._manager.all_steps():
            # Never overwrite: e.g. a forced final save of a step the periodic save already wrote.
            logger.info("Checkpoint of step %d already exists in %s; not saving again", step, self.directory)
            return False
        items = {STATE_ITEM: ocp.args.PyTreeSave(state), INPUT_ITEM: ocp.args.JsonSave(input_state)}
        if input_iterator is not None:
            items[INPUT_ITERATOR_ITEM] = InputIteratorSave(input_iterator)
        saved = self._manager.save(step, args=ocp.args.Composite(**items), force=force)
        if saved:
            logger.info("Checkpoint of step %d started in %s", step, self.directory)
        return saved

    def restore(self, step: int | None = None, *, abstract_state: Any) -> tuple[Any, dict]:
        """Reads checkpoint `step` (default: the latest) into the shardings of `abstract_state`.

        `abstract_state` mirrors the saved state with `jax.ShapeDtypeStruct(shape, dtype,
        sharding=...)` leaves (or arrays, whose shape/dtype/sharding are used); the arrays come back
        with exactly those shardings, which may differ from the ones they were saved with.
        Returns `(state, input_state)`. Raises FileNotFoundError when there is no such checkpoint.
        """
        self._manager.wait_until_finished()
        available = self.all_steps()
        if step is None:
            if not available:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
            step = available[-1]
        elif step not in available:
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}; available: {available}")
        target = jax.tree_util.tree_map_with_path(_abstract_leaf, abstract_state)
        state_args = ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target))
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{STATE_ITEM: state_args, INPUT_ITEM: ocp.args.JsonRestore()}))
        logger.info("Restored checkpoint of step %d from %s", step, self.directory)
        return restored[STATE_ITEM], dict(restored[INPUT_ITEM])

    def has_input_iterator(self, step: int) -> bool:
        """Whether checkpoint `step` (finished) holds an input iterator state (older checkpoints do not)."""
        self._manager.wait_until_finished()
        return step in self.all_steps() and (self.directory / str(step) / INPUT_ITERATOR_ITEM).is_dir()

    def restore_input_iterator(self, step: int, *, input_iterator: CheckpointableInput) -> bool:
        """Puts `input_iterator` where checkpoint `step` left it (`CheckpointableInput.restore_input_state`): True
        if restored, False where that save could not keep a state. FileNotFoundError when the step has no input
        iterator item (see `has_input_iterator`)."""
        if not self.has_input_iterator(step):
            raise FileNotFoundError(f"no input iterator state in {self.directory / str(step)}")
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{INPUT_ITERATOR_ITEM: InputIteratorRestore(input_iterator)}))
        ok = bool(restored[INPUT_ITERATOR_ITEM])
        if ok:
            logger.info("Restored the input iterator of step %d from %s", step, self.directory)
        return ok

    def input_state(self, step: int) -> dict:
        """The input state saved with checkpoint `step` (a small JSON item), without reading the train state."""
        self._manager.wait_until_finished()
        if step not in self.all_steps():
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}")
        restored = self._manager.restore(step, args=ocp.args.Composite(**{INPUT_ITEM: ocp.args.JsonRestore()}))
        return dict(restored[INPUT_ITEM])

    def saved_params(self, step: int) -> dict[str, jax.ShapeDtypeStruct]:
        """'/'-joined path -> shape and dtype of each leaf of `state.params` saved at `step` (read from metadata)."""
        metadata = ocp.PyTreeCheckpointer().metadata(self.directory / str(step) / STATE_ITEM).item_metadata.tree
        if "params" not in metadata:
            raise ValueError(f"the state saved in {self.directory / str(step)} has no 'params' (it has "
                             f"{sorted(metadata)}): not a gr_jax train state")
        return {path_str(path): jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype)
                for path, leaf in jax.tree_util.tree_leaves_with_path(metadata["params"])}

    def restore_params(self, step: int, *, abstract_params: Any) -> Any:
        """Only `state.params` of checkpoint `step` (not the optimizer state), into the shardings of
        `abstract_params` (ShapeDtypeStruct leaves with shardings, shaped as saved)."""
        self._manager.wait_until_finished()
        target = {"params": jax.tree_util.tree_map_with_path(_abstract_leaf, abstract_params)}
        restore_args = jax.tree_util.tree_map(
            lambda leaf: ocp.ArrayRestoreArgs(sharding=leaf.sharding, global_shape=leaf.shape, dtype=leaf.dtype),
            target)
        restored = ocp.PyTreeCheckpointer().restore(
            self.directory / str(step) / STATE_ITEM,
            args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True))
        logger.info("Restored the params of step %d from %s", step, self.directory)
        return restored["params"]

    # -- lifecycle ---------------------------------------------------------------------------

    def wait_until_finished(self) -> None:
        """Blocks until the pending asynchronous save (and old-checkpoint deletion) is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finishes pending saves and releases orbax's background resources."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
