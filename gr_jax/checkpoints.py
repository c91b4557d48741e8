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

Damage is detected, not read as numbers: the 'state' item lists its files with their sizes and crc32 (`MANIFEST`),
written after every process's shards are on disk and before the step is committed, so it is part of the step
(orbax verifies no content itself: zarr3 checksums only its shard index). Every restore checks the step's files
against it first and raises `CheckpointDamagedError` naming the step and the file; training's resume takes the newest
intact step instead (`newest_intact_step`). Steps saved before the manifest existed are read unverified.
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
import zlib
from typing import Any, Optional, Protocol, runtime_checkable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import future as ocp_future
from orbax.checkpoint._src.metadata import array_metadata_store  # pinned orbax: the default handler's store

from gr_jax import logs
from gr_jax.partitioning import path_str

logger = logging.getLogger(__name__)

STATE_ITEM = "state"
INPUT_ITEM = "input"
INPUT_ITERATOR_ITEM = "input_iterator"
MANIFEST = "gr_jax_files.json"  # in the state item's directory: {"files": {relative path: {"bytes", "crc32"}}}
DAMAGED_DIR = "damaged"  # in the checkpoint directory: steps that resume moved aside


class CheckpointDamagedError(ValueError):
    """A checkpoint step whose files are not those its save wrote (missing, truncated, changed bytes); the message
    names the step and the file. A ValueError, so an entry point ends with it as one `error:` line."""

    def __init__(self, directory: epath.Path, step: int, detail: str):
        super().__init__(f"checkpoint step {step} in {directory} is damaged: {detail}")
        self.directory, self.step, self.detail = directory, step, detail


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


def _crc32(path: epath.Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(directory: epath.Path, prefix: str = "") -> list[tuple[str, epath.Path]]:
    """(relative path, path) of every file under `directory` (iterdir: works for remote paths too)."""
    found = []
    for path in sorted(directory.iterdir(), key=lambda p: p.name):
        if path.is_dir():
            found.extend(_files(path, f"{prefix}{path.name}/"))
        else:
            found.append((f"{prefix}{path.name}", path))
    return found


class _StateHandler(ocp.PyTreeCheckpointHandler):
    """orbax's pytree handler, which also writes the item's file manifest (`MANIFEST`) in `finalize`: orbax calls
    it after every process's writes are committed (and the per-process OCDBT trees are merged), on the process that
    then commits the step, so the manifest covers every process's files and is committed with them. It reads the
    files back (the host copies are orbax's own and gone by then); that runs in the background of an asynchronous
    save."""

    def finalize(self, directory: epath.Path) -> None:
        super().finalize(directory)
        files = {name: {"bytes": path.stat().length, "crc32": _crc32(path)}
                 for name, path in _files(directory) if name != MANIFEST}
        (directory / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1, sort_keys=True))


@ocp.args.register_with_handler(_StateHandler, for_save=True)
@dataclasses.dataclass
class StateSave(ocp.args.PyTreeSave):
    pass


@ocp.args.register_with_handler(_StateHandler, for_restore=True)
@dataclasses.dataclass
class StateRestore(ocp.args.PyTreeRestore):
    pass


def _state_handler() -> ocp.PyTreeCheckpointHandler:
    """orbax's handler of a pytree of arrays (what `StandardSave` uses, same files, plus `MANIFEST`), its arrays
    written by `MIN_REPLICA_SLICE_BYTES`'s rule."""
    arrays = ocp.type_handlers.ArrayHandler(array_metadata_store=array_metadata_store.Store(),
                                            min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES)
    scalars = ocp.type_handlers.ScalarHandler()
    registry = ocp.type_handlers.create_type_handler_registry(
        (int, scalars), (float, scalars), (bytes, scalars), (np.number, scalars),
        (np.ndarray, ocp.type_handlers.NumpyHandler()), (jax.Array, arrays), (str, ocp.type_handlers.StringHandler()))
    return _StateHandler(type_handler_registry=registry)


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
        self._intact: set[int] = set()  # steps whose files matched their manifest in this process

    # -- queries -----------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        """The newest finished checkpoint's step, or None if there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of the checkpoints on disk, ascending."""
        return sorted(self._manager.all_steps())

    def verify(self, step: int) -> None:
        """Raises `CheckpointDamagedError` when a file that step `step`'s state listed at save (`MANIFEST`) is
        missing, has another size or other bytes. Steps saved without a manifest pass (not verified). Reads every
        file of the state once (each process all of them)."""
        if step in self._intact:
            return
        if not (self.directory / str(step)).is_dir():
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}")
        state_dir = self.directory / str(step) / STATE_ITEM

        def damaged(detail: str) -> CheckpointDamagedError:
            return CheckpointDamagedError(self.directory, step, detail)

        if not state_dir.is_dir():
            raise damaged(f"{STATE_ITEM}/ is missing")
        manifest = state_dir / MANIFEST
        if not manifest.exists():
            logger.debug("Checkpoint of step %d in %s has no %s (saved before gr_jax wrote one): not verified",
                         step, self.directory, MANIFEST)
            return
        try:
            files = json.loads(manifest.read_text())["files"]
            expected = {name: (int(entry["bytes"]), int(entry["crc32"])) for name, entry in files.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise damaged(f"{STATE_ITEM}/{MANIFEST} is unreadable ({type(e).__name__}: {e})") from None
        for name, (size, crc) in sorted(expected.items()):
            path = state_dir / name
            if not path.is_file():
                raise damaged(f"{STATE_ITEM}/{name} is missing")
            if (found := path.stat().length) != size:
                raise damaged(f"{STATE_ITEM}/{name} has {found} bytes, {size} when saved")
            if (found := _crc32(path)) != crc:
                raise damaged(f"{STATE_ITEM}/{name} has other bytes than when saved (crc32 {found:08x}, saved "
                              f"{crc:08x})")
        self._intact.add(step)

    def newest_intact_step(self) -> int | None:
        """The newest step that passes `verify` (None: no checkpoint), for resuming training. Newer damaged steps
        are moved to `damaged/<step>` with a warning naming the damage, so that the resumed run saves those steps
        again (orbax saves no step at or below its latest). When every step is damaged nothing is moved and
        `CheckpointDamagedError` names them all: starting afresh is for the user to decide."""
        self._manager.wait_until_finished()
        damaged: list[CheckpointDamagedError] = []
        for step in reversed(self.all_steps()):
            try:
                self.verify(step)
            except CheckpointDamagedError as e:
                damaged.append(e)
                continue
            for error in damaged:
                moved = self._move_aside(error.step)
                logger.warning("%s; resuming from step %d instead (the damaged step is moved to %s)", error, step,
                               moved)
            if damaged:
                self._manager.reload()
            return step
        if damaged:
            raise CheckpointDamagedError(self.directory, damaged[0].step, "; ".join(
                [damaged[0].detail] + [f"step {e.step} too: {e.detail}" for e in damaged[1:]])
                + "; no intact step to resume from")
        return None

    def _move_aside(self, step: int) -> epath.Path:
        """Moves step `step` to `damaged/<step>` (process 0; the others wait for it)."""
        target = self.directory / DAMAGED_DIR / str(step)
        suffix = 0
        while target.exists():
            suffix += 1
            target = self.directory / DAMAGED_DIR / f"{step}-{suffix}"
        ocp.multihost.sync_global_processes(f"gr_jax_chose_damaged_checkpoint_target_{step}")  # same target
        if jax.process_index() == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            (self.directory / str(step)).rename(target)
        ocp.multihost.sync_global_processes(f"gr_jax_move_damaged_checkpoint_{step}")
        self._intact.discard(step)
        return target

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
            logger.info("Checkpoint of step %d already exists in %s; not saving again", step, self.directory,
                        extra=logs.FILE_ONLY)
            return False
        items = {STATE_ITEM: StateSave(state), INPUT_ITEM: ocp.args.JsonSave(input_state)}
        if input_iterator is not None:
            items[INPUT_ITERATOR_ITEM] = InputIteratorSave(input_iterator)
        saved = self._manager.save(step, args=ocp.args.Composite(**items), force=force)
        if saved:
            logger.info("Checkpoint of step %d started in %s", step, self.directory, extra=logs.FILE_ONLY)
        return saved

    def restore(self, step: int | None = None, *, abstract_state: Any) -> tuple[Any, dict]:
        """Reads checkpoint `step` (default: the latest) into the shardings of `abstract_state`.

        `abstract_state` mirrors the saved state with `jax.ShapeDtypeStruct(shape, dtype,
        sharding=...)` leaves (or arrays, whose shape/dtype/sharding are used); the arrays come back
        with exactly those shardings, which may differ from the ones they were saved with.
        Returns `(state, input_state)`. Raises FileNotFoundError when there is no such checkpoint,
        `CheckpointDamagedError` when its files are not those saved (`verify`).
        """
        self._manager.wait_until_finished()
        available = self.all_steps()
        if step is None:
            if not available:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
            step = available[-1]
        elif step not in available:
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}; available: {available}")
        self.verify(step)
        target = jax.tree_util.tree_map_with_path(_abstract_leaf, abstract_state)
        state_args = StateRestore(
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
        `abstract_params` (ShapeDtypeStruct leaves with shardings, shaped as saved), after `verify`."""
        self._manager.wait_until_finished()
        self.verify(step)
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
