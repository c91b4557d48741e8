"""Damaged checkpoints: a step whose state files were flipped, truncated or deleted after its save is refused with an
error naming the step and the file; training's resume falls back to the newest intact step (bit-exact), evaluation
of the latest step refuses."""
import json
import logging
import pathlib
import re
import types

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gr_jax import checkpoints, partitioning
from gr_jax.checkpoints import MANIFEST, STATE_ITEM, CheckpointDamagedError, Checkpointer
from gr_jax.family import BuiltRun
from gr_jax.trainer import TrainState

STEPS = (1, 2, 3)


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh(data=2, model=4)


def _state(mesh, step: int) -> TrainState:
    """A micro train state whose largest array (16 KiB of float32 noise) fills the largest data file of the step."""
    rng = np.random.default_rng(step)
    return TrainState(
        step=jax.device_put(np.int32(step), NamedSharding(mesh, P())),
        params={"kernel": jax.device_put(rng.normal(size=(64, 64)).astype(np.float32),
                                         NamedSharding(mesh, P("data", "model"))),
                "bias": jax.device_put(rng.normal(size=(16,)).astype(np.float32), NamedSharding(mesh, P("model")))},
        opt_state=(jax.device_put(np.arange(8, dtype=np.int32) + step, NamedSharding(mesh, P("data"))),))


def _abstract(mesh) -> TrainState:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), _state(mesh, 0))


def _assert_bit_exact(restored, expected):
    assert jax.tree.structure(restored) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
        assert a.dtype == e.dtype and np.array_equal(np.asarray(a), np.asarray(e))


def _saved(directory: pathlib.Path, mesh) -> pathlib.Path:
    with Checkpointer(directory) as checkpointer:  # asynchronous, as in training
        for step in STEPS:
            assert checkpointer.save(step, state=_state(mesh, step), input_state={"batches_consumed": step, "seed": 0})
    return directory


def _data_file(directory: pathlib.Path, step: int) -> pathlib.Path:
    """The largest file of the step's state: array data (the 16 KiB kernel)."""
    files = [p for p in (directory / str(step) / STATE_ITEM).rglob("*") if p.is_file() and p.name != MANIFEST]
    return max(files, key=lambda p: p.stat().st_size)


def _damage(path: pathlib.Path, how: str) -> str:
    """Damages `path` as a disk or an operator would; returns the detail `verify` must report."""
    size = path.stat().st_size
    if how == "flip":  # 64 bytes inverted in the middle of the file
        data = bytearray(path.read_bytes())
        data[size // 2:size // 2 + 64] = bytes(b ^ 0xFF for b in data[size // 2:size // 2 + 64])
        path.write_bytes(bytes(data))
        return "has other bytes than when saved"
    if how == "truncate":
        with path.open("r+b") as f:
            f.truncate(size // 2)
        return f"has {size // 2} bytes, {size} when saved"
    path.unlink()
    return "is missing"


class _Run(BuiltRun):
    """The parts of a built run that resuming and evaluating read: its checkpoints and its state's shapes."""

    def __init__(self, directory: pathlib.Path, mesh):
        self.experiment = types.SimpleNamespace(seed=0, batch_size=8, model_dir=str(directory.parent))
        self.trainer = types.SimpleNamespace(abstract_state=_abstract(mesh), frozen=None,  # nothing frozen
                                             saved_params=lambda params: params)
        self.checkpointer = Checkpointer(directory)

    def init_state(self):
        raise AssertionError("a run with an intact checkpoint must not start afresh")

    def train_batches(self, *, start_batch):
        raise AssertionError("not read by resuming and evaluating")

    tokens_per_batch = retriever = collection_rows = train_batches


def test_intact_steps_verify_and_restoring_changes_no_file(tmp_path, mesh):
    directory = _saved(tmp_path / "checkpoints", mesh)
    manifest = json.loads((directory / "3" / STATE_ITEM / MANIFEST).read_text())["files"]
    assert _data_file(directory, 3).relative_to(directory / "3" / STATE_ITEM).as_posix() in manifest
    with Checkpointer(directory) as checkpointer:
        for step in STEPS:
            state, input_state = checkpointer.restore(step, abstract_state=_abstract(mesh))
            _assert_bit_exact(state, _state(mesh, step))
            assert input_state == {"batches_consumed": step, "seed": 0}
        checkpointer.restore_params(3, abstract_params=_abstract(mesh).params)
    with Checkpointer(directory) as fresh:  # a new process: verifies the files again, after the reads above
        for step in STEPS:
            fresh.verify(step)
        assert fresh.newest_intact_step() == 3


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_damaged_step_is_refused_resume_falls_back_and_eval_refuses(tmp_path, mesh, caplog, how):
    from gr_jax import training
    directory = _saved(tmp_path / "checkpoints", mesh)
    damaged_file = _data_file(directory, 3)
    name = damaged_file.relative_to(directory / "3").as_posix()
    detail = _damage(damaged_file, how)
    error = rf"^checkpoint step 3 in {directory} is damaged: {name} {detail}"

    with Checkpointer(directory) as checkpointer:
        for restore in (lambda: checkpointer.restore(3, abstract_state=_abstract(mesh)),
                        lambda: checkpointer.restore(abstract_state=_abstract(mesh)),
                        lambda: checkpointer.restore_params(3, abstract_params=_abstract(mesh).params)):
            with pytest.raises(CheckpointDamagedError, match=error) as raised:
                restore()
            assert isinstance(raised.value, ValueError) and raised.value.step == 3

    # Evaluating the latest step refuses, saying how to read another; a named intact step is read.
    run = _Run(directory, mesh)
    with pytest.raises(CheckpointDamagedError, match=error + r".*It is the latest step; read another by naming "
                       r"it \(.*--gin.training.evaluate.step=N for gr_jax.eval; steps on disk: \[1, 2, 3\]\)$"):
        run.restore_params()
    params, step = run.restore_params(2)
    assert step == 2
    _assert_bit_exact(params, _state(mesh, 2).params)

    # Resuming takes step 2, bit-exact, with a warning naming step 3 and the damage; step 3 is moved aside.
    with caplog.at_level(logging.WARNING, logger="gr_jax.checkpoints"):
        state, start_batch, input_checkpoint = training.initial_state(run)
    _assert_bit_exact(state, _state(mesh, 2))
    assert (start_batch, input_checkpoint) == (2, 2)
    # Only ours: orbax may warn too (a slow save of the step before, under load).
    warning, = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "gr_jax.checkpoints"]
    assert re.match(error + r".*; resuming from step 2 instead", warning)
    assert run.checkpointer.all_steps() == [1, 2]
    assert (directory / checkpoints.DAMAGED_DIR / "3").is_dir() and not (directory / "3").exists()
    # The resumed run saves step 3 again (orbax saves no step at or below its latest).
    assert run.checkpointer.save(3, state=_state(mesh, 3), input_state={"batches_consumed": 3, "seed": 0})
    run.checkpointer.close()
    with Checkpointer(directory) as checkpointer:
        assert checkpointer.newest_intact_step() == 3
        _assert_bit_exact(checkpointer.restore(abstract_state=_abstract(mesh))[0], _state(mesh, 3))


def test_every_step_damaged_is_an_error_and_moves_nothing(tmp_path, mesh):
    directory = _saved(tmp_path / "checkpoints", mesh)
    for step in STEPS:
        _damage(_data_file(directory, step), "truncate")
    with Checkpointer(directory) as checkpointer:
        with pytest.raises(CheckpointDamagedError, match=r"checkpoint step 3 .* is damaged: .*; step 2 too: .*; "
                                                         r"step 1 too: .*; no intact step to resume from$"):
            checkpointer.newest_intact_step()
        assert checkpointer.all_steps() == list(STEPS)
    assert not (directory / checkpoints.DAMAGED_DIR).exists()


def test_damaged_manifest_and_checkpoints_saved_without_one(tmp_path, mesh, caplog):
    directory = _saved(tmp_path / "checkpoints", mesh)
    (directory / "3" / STATE_ITEM / MANIFEST).write_text('{"files": {"_METADATA": ')
    # Step 4 as gr_jax saved it before the manifest: orbax's own pytree handler.
    with ocp.CheckpointManager(directory, item_handlers={STATE_ITEM: ocp.PyTreeCheckpointHandler(),
                                                         checkpoints.INPUT_ITEM: ocp.JsonCheckpointHandler()}) as old:
        old.save(4, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.PyTreeSave(_state(mesh, 4)),
                                               checkpoints.INPUT_ITEM: ocp.args.JsonSave({"batches_consumed": 4})}))
    assert not (directory / "4" / STATE_ITEM / MANIFEST).exists()
    with Checkpointer(directory) as checkpointer:
        with pytest.raises(CheckpointDamagedError, match=rf"step 3 .* is damaged: {STATE_ITEM}/{MANIFEST} is "
                                                         r"unreadable \(JSONDecodeError"):
            checkpointer.verify(3)
        with caplog.at_level(logging.DEBUG, logger="gr_jax.checkpoints"):
            assert checkpointer.newest_intact_step() == 4
            state, input_state = checkpointer.restore(4, abstract_state=_abstract(mesh))
        _assert_bit_exact(state, _state(mesh, 4))
        assert input_state == {"batches_consumed": 4}
        assert any("has no gr_jax_files.json" in r.getMessage() and "not verified" in r.getMessage()
                   for r in caplog.records)
        with pytest.raises(FileNotFoundError, match="no checkpoint of step 7"):
            checkpointer.verify(7)


def test_without_the_manifest_flipped_data_reads_as_other_numbers(tmp_path, mesh):
    """Why the manifest: orbax (zstd-compressed zarr3 chunks in OCDBT files) reads the flipped bytes of the test's data
    file as other numbers, without an error."""
    directory = _saved(tmp_path / "checkpoints", mesh)
    _damage(_data_file(directory, 3), "flip")
    (directory / "3" / STATE_ITEM / MANIFEST).unlink()
    with Checkpointer(directory) as checkpointer:
        state, _ = checkpointer.restore(3, abstract_state=_abstract(mesh))
    assert not np.array_equal(np.asarray(state.params["kernel"]), np.asarray(_state(mesh, 3).params["kernel"]))
