"""Crash safety: `python -m gr_jax.train` killed with SIGKILL at seeded random moments (once while it starts, before
its first checkpoint; once after it trained a step, during its steps or checkpoint writes), restarted each time, ends
with the parameters and the sequence of training examples of a run that was never interrupted. On both input paths: the
seqio tasks' tf.data stream (its iterator state saved with every checkpoint) and the same tasks preprocessed into
ArrayRecord files (`gr_jax.data.records`: read without TensorFlow, the position alone in the checkpoint).

The runs record every step's example fingerprints (`training.train.record_examples`); steps re-run after a restart
are recorded again, so the last record of each step is the batch the final state was trained on.
"""
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import gin
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import TRAIN_WITHOUT_TENSORFLOW, preprocess_examples
from gr_jax import checkpoints

STEPS = 8
RECORD = "train_examples-0-of-1.jsonl"


def _args(data_dir, model_dir, *, preprocessed=None) -> list[str]:
    """A micro T5.1.1 on the seqio tasks of the fixture corpus (or their examples preprocessed into `preprocessed`),
    a checkpoint every 2 steps, no evaluation."""
    records = ["--gin_file=data/preprocessed.gin", f"--gin.PREPROCESSED_DIR='{preprocessed}'"] if preprocessed else []
    return ["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin", *records, f"--gin.TRAIN_STEPS={STEPS}",
            f"--gin.DATA_DIR='{data_dir}'", f"--gin.MODEL_DIR='{model_dir}'", "--gin.DATASET_NAME='kill_resume'",
            "--gin.INPUT_LENGTH=16", "--gin.TARGET_LENGTH=12", "--gin.BATCH_SIZE=8",
            "--gin.network.T5Config.num_encoder_layers=1", "--gin.network.T5Config.num_decoder_layers=1",
            "--gin.network.T5Config.emb_dim=32", "--gin.network.T5Config.mlp_dim=64",
            "--gin.network.T5Config.num_heads=2", "--gin.network.T5Config.head_dim=8",
            "--gin.training.EvalConfig.every_steps=-1", "--gin.training.train.checkpoint_every_steps=2",
            "--gin.training.train.log_every_steps=1", "--gin.training.train.progress=False",
            "--gin.training.train.record_examples=True"]


def _records(model_dir) -> list[dict]:
    """The complete records: a line still being written (read while the run appends) or cut by a kill is not one."""
    path = pathlib.Path(model_dir) / RECORD
    records = []
    for line in path.read_text().split("\n")[:-1] if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _max_step(model_dir) -> int:
    return max((record["step"] for record in _records(model_dir)), default=0)


def _last_record_per_step(model_dir) -> dict[int, list[str]]:
    return {record["step"]: record["examples"] for record in _records(model_dir)}


def _final_params(model_dir) -> dict:
    """The params of the latest checkpoint, as numpy arrays."""
    directory = pathlib.Path(model_dir) / "checkpoints"
    step = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    assert step == STEPS
    state = ocp.StandardCheckpointer().restore(directory / str(step) / checkpoints.STATE_ITEM)
    return jax.tree.map(np.asarray, state["params"])


@pytest.mark.parametrize("path", ["seqio", "preprocessed"])
def test_killed_and_resumed_training_equals_the_uninterrupted_run(spm_data_dir, tmp_path, path):
    from gr_jax import train as train_main
    straight = tmp_path / "straight"
    preprocessed = tmp_path / "records" if path == "preprocessed" else None
    if preprocessed:
        preprocess_examples(_args(spm_data_dir, straight, preprocessed=preprocessed))
    gin.clear_config()
    try:  # in this process: the subprocesses then find its compiled programs in the session's compilation cache
        train_main.main(_args(spm_data_dir, straight, preprocessed=preprocessed))
    finally:
        gin.clear_config()

    killed = tmp_path / "killed"
    rng = random.Random(18)
    repo = pathlib.Path(__file__).parent.parent
    env = os.environ | {"PYTHONPATH": str(repo), "GR_JAX_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-c", TRAIN_WITHOUT_TENSORFLOW] if preprocessed else [sys.executable, "-m",
                                                                                       "gr_jax.train"]
    outcomes = []
    for kill in range(2):
        before = _max_step(killed)
        proc = subprocess.Popen([*command, *_args(spm_data_dir, killed, preprocessed=preprocessed)], cwd=tmp_path,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if kill == 0:
            time.sleep(rng.uniform(0.5, 3.0))  # most likely still starting up: nothing saved yet
        else:  # once this process trained a step, anywhere in its steps and checkpoint writes
            while proc.poll() is None and _max_step(killed) <= before:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        stderr = proc.stderr.read().decode()
        assert proc.returncode in (0, -signal.SIGKILL), stderr[-3000:]
        outcomes.append((proc.returncode, _max_step(killed)))
    final = subprocess.run([*command, *_args(spm_data_dir, killed, preprocessed=preprocessed)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, check=False)
    assert final.returncode == 0, final.stderr[-3000:]

    expected = _last_record_per_step(straight)
    assert sorted(expected) == list(range(1, STEPS + 1))
    got = _last_record_per_step(killed)
    assert sorted(got) == list(range(1, STEPS + 1)), outcomes
    for step in expected:
        assert got[step] == expected[step], (step, outcomes)
    a, b = _final_params(straight), _final_params(killed)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    for step_dir in (p for p in (killed / "checkpoints").iterdir() if p.name.isdigit()):
        position = step_dir / checkpoints.INPUT_ITEM / "metadata"  # orbax's JSON item
        assert json.loads(position.read_text())["batches_consumed"] == int(step_dir.name)
        if preprocessed:  # the position is the whole input state: a few hundred bytes, whatever the corpus
            assert not (step_dir / checkpoints.INPUT_ITERATOR_ITEM).exists() and position.stat().st_size < 1024
        else:  # every checkpoint the restarted runs kept holds its process's tf.data iterator state
            record = json.loads((step_dir / checkpoints.INPUT_ITERATOR_ITEM / "train_ds-0-of-1.json").read_text())
            assert record["batches_consumed"] == int(step_dir.name) and record["state"] is True
