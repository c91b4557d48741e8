"""Checkpoints by wall clock as well as by steps: SaveCheckpoint's `every_seconds` on an injected clock (no sleeping),
process 0's decision shared through a key-value store, and a run killed after a save the clock triggered resuming to
the parameters and examples of an uninterrupted run."""
import functools
import json
import pathlib
import types

import jax
import numpy as np
import pytest

from gr_jax import actions
from gr_jax import experiment as experiment_lib
from gr_jax import network
from gr_jax import optimizers
from gr_jax import training


class FakeClock:
    """Seconds that pass only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeCheckpointer:
    def __init__(self):
        self.saved = []

    def save(self, step, *, state, input_state, input_iterator=None, force=False):
        if step not in self.saved:
            self.saved.append(step)

    def wait_until_finished(self):
        pass


def _run():
    built = types.SimpleNamespace(checkpointer=FakeCheckpointer(), input_fingerprint=lambda: {},
                                  checkpoint_state=lambda state: state,
                                  experiment=types.SimpleNamespace(model_dir="/nowhere", seed=0, batch_size=4))
    return actions.TrainingRun(built=built, writer=None, start_step=0, start_batch=0)


def _train(save, *, steps, seconds_per_step, clock):
    """The loop's calls to the action for `steps` steps of `seconds_per_step` each; returns the saved steps."""
    run = _run()
    save.start(run)
    for step in range(1, steps + 1):
        clock.now += seconds_per_step  # the step ran
        if save.due(step, last=step == steps):
            save(run, actions.TrainingProgress(step=step, state=None, summary={}, last=step == steps))
    return run.built.checkpointer.saved


def test_35_second_steps_save_at_the_first_step_300_seconds_after_the_last_save():
    clock = FakeClock()
    save = actions.SaveCheckpoint(every_steps=1000, every_seconds=300, clock=clock)
    # Saves at 9 x 35 = 315 s, then 315 s later at step 18, 27; the last step (30) is saved as always.
    assert _train(save, steps=30, seconds_per_step=35, clock=clock) == [9, 18, 27, 30]
    # Steps and seconds together: a step save (10, 20, 30) restarts the clock; 19 is 315 s after 10's 350 s.
    clock = FakeClock()
    save = actions.SaveCheckpoint(every_steps=10, every_seconds=300, clock=clock)
    assert _train(save, steps=30, seconds_per_step=35, clock=clock) == [9, 10, 19, 20, 29, 30]


def test_the_work_a_kill_loses_is_bounded_in_seconds_whatever_a_step_costs():
    for seconds_per_step in (0.01, 0.3, 7.0, 35.0, 400.0):
        clock = FakeClock()
        save = actions.SaveCheckpoint(every_steps=1000, every_seconds=300, clock=clock)
        saved = _train(save, steps=3000, seconds_per_step=seconds_per_step, clock=clock)
        times = [0.0] + [step * seconds_per_step for step in saved]
        assert max(b - a for a, b in zip(times, times[1:])) <= 300 + seconds_per_step
        if seconds_per_step == 0.01:  # 30 s for 3,000 steps: the step cadence alone, no save more
            assert saved == [1000, 2000, 3000]
    # Steps only (every_seconds None): 35 s steps lose up to 1,000 of them.
    clock = FakeClock()
    save = actions.SaveCheckpoint(every_steps=1000, clock=clock)
    assert _train(save, steps=1500, seconds_per_step=35, clock=clock) == [1000, 1500]


def test_the_clock_starts_with_the_run_and_bad_intervals_are_refused():
    clock = FakeClock()
    clock.now = 1000.0  # an hour of building and compiling before the first step is no reason to save at step 1
    save = actions.SaveCheckpoint(every_steps=1000, every_seconds=300, clock=clock)
    clock.now = 5000.0
    assert _train(save, steps=12, seconds_per_step=35, clock=clock) == [9, 12]  # 315 s after the start, the last
    for bad in (0, -1.0, True):
        with pytest.raises(ValueError, match="every_seconds must be > 0 or None"):
            actions.SaveCheckpoint(every_steps=10, every_seconds=bad)
    with pytest.raises(ValueError, match="checkpoint_every_seconds must be a number > 0 or None"):
        training.train(experiment=None, num_train_steps=1, checkpoint_every_seconds=0)


class FakeKeyValueStore:
    """The coordination service's key-value client as `ProcessZeroDecides` uses it (a missing key would block)."""

    def __init__(self):
        self.values = {}

    def key_value_set(self, key, value, allow_overwrite=False):
        assert allow_overwrite or key not in self.values
        self.values[key] = value

    def blocking_key_value_get(self, key, timeout_in_ms):
        assert timeout_in_ms >= 60_000
        return self.values[key]

    def key_value_delete(self, key):
        del self.values[key]


def test_every_process_saves_where_process_zero_decides():
    store = FakeKeyValueStore()
    clocks = [FakeClock(), FakeClock()]
    processes = [actions.SaveCheckpoint(every_steps=1000, every_seconds=300, clock=clocks[i], decider=(
        actions.ProcessZeroDecides("save_checkpoint", client=store, process_index=i, process_count=2)))
        for i in range(2)]
    runs = [_run(), _run()]
    for save, run in zip(processes, runs):
        save.start(run)
    assert processes[0].decider.prefix != processes[1].decider.prefix  # two deciders of one process: two prefixes
    processes[1].decider.prefix = processes[0].decider.prefix  # what the same construction order in 2 processes gives
    for step in range(1, 41):
        clocks[0].now += 35
        clocks[1].now += 1000  # process 1's clock would save at every step: it is never read
        for save, run in zip(processes, runs):  # process 0 posts first (process 1 would wait for it)
            if save.due(step, last=False):
                save(run, actions.TrainingProgress(step=step, state=None, summary={}, last=False))
    assert runs[0].built.checkpointer.saved == runs[1].built.checkpointer.saved == [9, 18, 27, 36]
    # Process 0 posted a decision per step and keeps the last 16 (the processes are never that far apart).
    assert sorted(store.values) == [f"{processes[0].decider.prefix}/{step}" for step in range(25, 41)]
    assert [store.values[f"{processes[0].decider.prefix}/{step}"] for step in (35, 36, 37)] == ["0", "1", "0"]


# ----------------------------------------------------------------------------------- a real run, killed and resumed


MICRO = network.T5Config(vocab_size=None, emb_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         head_dim=8, mlp_dim=64, dropout_rate=0.1)


def _experiment(data_dir, model_dir):
    return experiment_lib.Experiment(
        model_dir=str(model_dir),
        dataset=experiment_lib.DatasetConfig(name="cadence", data_dir=str(data_dir), input_length=16,
                                             target_length=12),
        network_config=MICRO, learning_rate=optimizers.warmup_constant(peak=3e-3, warmup_steps=2), batch_size=8,
        mesh_data=4, mesh_model=2)


class Killed(Exception):
    pass


class SlowSteps(actions.Action):
    """Makes every step take 35 s on the fake clock (after SaveCheckpoint's decision, as a step's time passes before
    the next one's), and kills the run at `kill_at` before anything is saved there."""

    def __init__(self, clock, *, kill_at=None):
        self.clock, self.kill_at = clock, kill_at

    def due(self, step, *, last):
        if step == self.kill_at:
            raise Killed(step)
        self.clock.now += 35
        return False


def _records(model_dir) -> dict[int, list[str]]:
    lines = (pathlib.Path(model_dir) / "train_examples-0-of-1.jsonl").read_text().splitlines()
    return {record["step"]: record["examples"] for record in map(json.loads, lines)}


def test_a_run_killed_after_a_clock_triggered_save_resumes_exactly(spm_data_dir, tmp_path, monkeypatch):
    common = dict(num_train_steps=7, checkpoint_every_steps=1000, log_every_steps=50, progress=False,
                  record_examples=True, eval_config=training.EvalConfig(every_steps=-1))
    straight = _experiment(spm_data_dir, tmp_path / "straight")
    training.train(experiment=straight, checkpoint_every_seconds=None, **common)
    assert straight.build().checkpointer.all_steps() == [7]

    killed = _experiment(spm_data_dir, tmp_path / "killed")
    clock = FakeClock()
    monkeypatch.setattr(training, "SaveCheckpoint", functools.partial(actions.SaveCheckpoint, clock=clock))
    # 35 s steps, a save 100 s after the previous one: step 4 (105 s), though no report (every 50 steps) is due.
    with pytest.raises(Killed):
        training.train(experiment=killed, checkpoint_every_seconds=100, actions=[SlowSteps(clock, kill_at=6)],
                       **common)
    assert killed.build().checkpointer.all_steps() == [4]
    assert sorted(_records(tmp_path / "killed")) == [1, 2, 3, 4, 5, 6]  # steps 5 and 6 were lost

    clock.now = 0.0
    training.train(experiment=killed, checkpoint_every_seconds=100, actions=[SlowSteps(clock)], **common)
    assert killed.build().checkpointer.all_steps() == [4, 7]
    a, _ = straight.build().restore()
    b, input_state = killed.build().restore()
    assert int(a.step) == int(b.step) == 7 and input_state["batches_consumed"] == 7
    for x, y in zip(jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))):
        np.testing.assert_array_equal(x, y)
    assert _records(tmp_path / "killed") == _records(tmp_path / "straight")
