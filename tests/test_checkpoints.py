"""Orbax checkpoints of sharded state + input position on 8 simulated CPU devices."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gr_jax import partitioning
from gr_jax.checkpoints import Checkpointer


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh(data=2, model=4)


def _state(mesh, seed: int = 0):
    """A train-state-like tree: a 2-D sharded kernel, a 'model'-sharded bf16 vector, replicated scalars."""
    rng = np.random.default_rng(seed)
    kernel = rng.normal(size=(8, 16)).astype(np.float32)
    bias = rng.normal(size=(16,)).astype(jnp.bfloat16)
    return {
        "step": jax.device_put(np.int32(seed), NamedSharding(mesh, P())),
        "params": {
            "kernel": jax.device_put(kernel, NamedSharding(mesh, P("data", "model"))),
            "bias": jax.device_put(bias, NamedSharding(mesh, P("model"))),
        },
        "opt_state": (jax.device_put(np.arange(8, dtype=np.int32) + seed, NamedSharding(mesh, P("data"))),),
    }


def _abstract(state, spec_for):
    """ShapeDtypeStructs of `state` with shardings chosen by `spec_for(path_string, leaf)`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=spec_for(jax.tree_util.keystr(path), x)),
        state,
    )


def _assert_equal_trees(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def test_save_and_restore_into_same_and_different_shardings(tmp_path, mesh):
    state = _state(mesh, seed=7)
    with Checkpointer(tmp_path / "ckpt") as checkpointer:
        assert checkpointer.save(7, state=state, input_state={"batches_consumed": 123, "seed": 0})
        checkpointer.wait_until_finished()
        assert checkpointer.latest_step() == 7

        same, input_state = checkpointer.restore(abstract_state=_abstract(state, lambda _, x: x.sharding))
        assert input_state == {"batches_consumed": 123, "seed": 0}
        _assert_equal_trees(same, state)
        for restored, original in zip(jax.tree.leaves(same), jax.tree.leaves(state)):
            assert restored.sharding == original.sharding

        # A different mesh shape (4 x 2), and kernel sharded the other way round / replicated.
        other_mesh = partitioning.make_mesh(data=4, model=2)
        layouts = {
            "['params']['kernel']": NamedSharding(other_mesh, P("model", "data")),
            "['params']['bias']": NamedSharding(other_mesh, P()),
        }
        target = _abstract(state, lambda path, x: layouts.get(path, NamedSharding(other_mesh, P())))
        resharded, _ = checkpointer.restore(7, abstract_state=target)
        _assert_equal_trees(resharded, state)
        kernel = resharded["params"]["kernel"]
        assert kernel.sharding == layouts["['params']['kernel']"]
        assert kernel.addressable_shards[0].data.shape == (4, 4)
        assert resharded["params"]["bias"].sharding.spec == P()

        # Concrete arrays work as restore targets too (their shardings are used).
        from_arrays, _ = checkpointer.restore(abstract_state=_state(mesh, seed=1))
        _assert_equal_trees(from_arrays, state)


def test_max_to_keep_deletes_oldest(tmp_path, mesh):
    directory = tmp_path / "ckpt"
    with Checkpointer(directory, max_to_keep=2) as checkpointer:
        for step in range(1, 5):
            assert checkpointer.save(step, state=_state(mesh, step), input_state={"batches_consumed": step})
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [3, 4]
    assert sorted(p.name for p in directory.iterdir() if p.name.isdigit()) == ["3", "4"]
    with Checkpointer(directory, max_to_keep=2) as checkpointer:
        restored, input_state = checkpointer.restore(3, abstract_state=_state(mesh))
    _assert_equal_trees(restored, _state(mesh, 3))
    assert input_state == {"batches_consumed": 3}


def test_async_save_copies_before_returning(tmp_path, mesh):
    """The saved arrays may be deleted (as donation does) right after save returns."""
    state = _state(mesh, seed=5)
    expected = jax.tree.map(np.asarray, state)
    abstract = _abstract(state, lambda _, x: x.sharding)
    with Checkpointer(tmp_path / "ckpt", asynchronous=True) as checkpointer:
        assert checkpointer.save(5, state=state, input_state={"batches_consumed": 50})
        for leaf in jax.tree.leaves(state):
            leaf.delete()
        checkpointer.wait_until_finished()
        assert checkpointer.latest_step() == 5
        restored, input_state = checkpointer.restore(abstract_state=abstract)
    assert input_state == {"batches_consumed": 50}
    for a, e in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(a), e)


def test_new_checkpointer_on_same_directory_resumes(tmp_path, mesh):
    directory = tmp_path / "ckpt"
    first = Checkpointer(directory)
    first.save(10, state=_state(mesh, 10), input_state={"batches_consumed": 10, "seed": 3})
    first.save(20, state=_state(mesh, 20), input_state={"batches_consumed": 20, "seed": 3})
    first.close()

    second = Checkpointer(str(directory))  # as after a restart; str paths work too
    assert second.latest_step() == 20
    assert second.all_steps() == [10, 20]
    restored, input_state = second.restore(abstract_state=_abstract(_state(mesh), lambda _, x: x.sharding))
    _assert_equal_trees(restored, _state(mesh, 20))
    assert input_state == {"batches_consumed": 20, "seed": 3}
    # Training continues: the next save lands next to the old ones.
    assert second.save(30, state=restored, input_state={"batches_consumed": 30, "seed": 3})
    second.close()
    with Checkpointer(directory) as third:
        assert third.all_steps() == [10, 20, 30]


def test_save_interval_force_and_existing_steps(tmp_path, mesh):
    state = _state(mesh)
    with Checkpointer(tmp_path / "ckpt", save_interval_steps=5) as checkpointer:
        # orbax's default policy: the first save of an empty directory always happens.
        assert checkpointer.should_save(3)
        assert checkpointer.save(3, state=state, input_state={})
        assert not checkpointer.should_save(4)
        assert not checkpointer.save(4, state=state, input_state={})
        assert checkpointer.save(5, state=state, input_state={})
        assert not checkpointer.save(6, state=state, input_state={})
        assert checkpointer.save(7, state=state, input_state={}, force=True)
        # An existing step is never overwritten, forced or not.
        assert not checkpointer.save(7, state=_state(mesh, 1), input_state={}, force=True)
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [3, 5, 7]
        restored, _ = checkpointer.restore(7, abstract_state=state)
    _assert_equal_trees(restored, state)


def test_restore_without_checkpoint_is_a_clear_error(tmp_path, mesh):
    with Checkpointer(tmp_path / "empty") as checkpointer:
        assert checkpointer.latest_step() is None
        assert checkpointer.all_steps() == []
        with pytest.raises(FileNotFoundError, match="no checkpoint in .*empty"):
            checkpointer.restore(abstract_state=_state(mesh))
        checkpointer.save(1, state=_state(mesh), input_state={})
        with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 2 .*available: \[1\]"):
            checkpointer.restore(2, abstract_state=_state(mesh))


def test_bad_arguments(tmp_path, mesh):
    with Checkpointer(tmp_path / "ckpt") as checkpointer:
        with pytest.raises(ValueError, match="input_state is not plain JSON"):
            checkpointer.save(1, state=_state(mesh), input_state={"batches_consumed": np.int64(3)})
        with pytest.raises(ValueError, match="non-negative int"):
            checkpointer.save(-1, state=_state(mesh), input_state={})
        checkpointer.save(1, state=_state(mesh), input_state={})
        no_sharding = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(mesh))
        with pytest.raises(ValueError, match=r"abstract_state\['opt_state'\]\[0\].*no sharding"):
            checkpointer.restore(abstract_state=no_sharding)
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer(tmp_path / "other", max_to_keep=0)


class CountingInput:
    """A `CheckpointableInput` whose state is the number of batches it yielded, one file per process (as the seqio
    pipeline's), so a test can see which state each step kept."""

    def __init__(self, *, process: int = 0, count: int = 1):
        self.consumed = 0
        self.name = f"train_ds-{process}-of-{count}"

    def __next__(self):
        self.consumed += 1
        return self.consumed

    def save_input_state(self, directory):
        (pathlib.Path(directory) / self.name).write_text(str(self.consumed))

    def restore_input_state(self, directory):
        self.consumed = int((pathlib.Path(directory) / self.name).read_text())
        return True


@pytest.mark.parametrize("asynchronous", [True, False])
def test_input_iterator_state_is_taken_at_save_kept_with_its_step_and_pruned_with_it(tmp_path, mesh, asynchronous):
    from gr_jax.checkpoints import INPUT_ITERATOR_ITEM, CheckpointableInput
    directory = tmp_path / "ckpt"
    batches = CountingInput()
    assert isinstance(batches, CheckpointableInput)
    saved_at = {}
    with Checkpointer(directory, max_to_keep=2, asynchronous=asynchronous) as checkpointer:
        for step in range(1, 5):
            next(batches)
            saved_at[step] = batches.consumed
            assert checkpointer.save(step, state=_state(mesh, step), input_state={"batches_consumed": step},
                                     input_iterator=batches)
            next(batches)  # the loop moves on while the save is still being written: the saved state must not
        assert checkpointer.save(5, state=_state(mesh, 5), input_state={})  # no iterator (e.g. model selection)
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [4, 5]
        assert not checkpointer.has_input_iterator(5) and checkpointer.has_input_iterator(4)
        with pytest.raises(FileNotFoundError, match="no input iterator state"):
            checkpointer.restore_input_iterator(5, input_iterator=CountingInput())
    # Pruned steps took their iterator state with them; each kept step holds exactly its own.
    assert sorted(p.name for p in directory.iterdir() if p.name.isdigit()) == ["4", "5"]
    assert (directory / "4" / INPUT_ITERATOR_ITEM / "train_ds-0-of-1").read_text() == str(saved_at[4]) == "7"
    with Checkpointer(directory) as checkpointer:
        resumed = CountingInput()
        assert checkpointer.restore_input_iterator(4, input_iterator=resumed)
        assert resumed.consumed == 7
        with pytest.raises(TypeError, match="CheckpointableInput"):
            checkpointer.save(6, state=_state(mesh), input_state={}, input_iterator=iter([1]))
