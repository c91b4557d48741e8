"""A multi-host job on one machine on the preprocessed input path (gr_jax.data.records): two processes on localhost
(CPU, 2 devices each) train a micro model on the fixture's row 2a preprocessed into ArrayRecord files, without
TensorFlow, write a checkpoint and resume from it, each on its half of every global batch of one process holding all 4
devices. Its own file, so that it runs beside test_multiprocess.py's job rather than after it."""
import json

import pytest

from conftest import preprocess_examples
from test_multiprocess import _free_port, _run


def _records_args(data, model_dir, *, preprocessed, steps: int) -> list[str]:
    """A micro T5.1.1 on the fixture's row 2a preprocessed into ArrayRecord files, recording its examples."""
    return ["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin", "--gin_file=data/preprocessed.gin",
            f"--gin.PREPROCESSED_DIR='{preprocessed}'", f"--gin.TRAIN_STEPS={steps}", f"--gin.DATA_DIR='{data}'",
            f"--gin.MODEL_DIR='{model_dir}'", "--gin.DATASET_NAME='multiprocess_records'", "--gin.INPUT_LENGTH=16",
            "--gin.TARGET_LENGTH=12", "--gin.BATCH_SIZE=8", "--gin.network.T5Config.num_encoder_layers=1",
            "--gin.network.T5Config.num_decoder_layers=1", "--gin.training.EvalConfig.every_steps=-1",
            "--gin.training.train.checkpoint_every_steps=2", "--gin.training.train.progress=False",
            "--gin.training.train.record_examples=True"]


def _examples(model_dir, name: str) -> dict[int, list[str]]:
    lines = (model_dir / name).read_text().splitlines()
    return {record["step"]: record["examples"] for record in map(json.loads, lines)}


def test_two_processes_train_and_resume_on_preprocessed_examples_as_one(spm_data_dir, tmp_path):
    preprocessed, single, multi = tmp_path / "records", tmp_path / "single", tmp_path / "multi"
    preprocess_examples(_records_args(spm_data_dir, single, preprocessed=preprocessed, steps=4))

    port = _free_port()

    def process(index: int, steps: int) -> list[str]:
        return [*_records_args(spm_data_dir, multi, preprocessed=preprocessed, steps=steps),
                f"--gin.partitioning.initialize_distributed.coordinator_address='localhost:{port}'",
                "--gin.partitioning.initialize_distributed.num_processes=2",
                f"--gin.partitioning.initialize_distributed.process_id={index}"]

    _run([(_records_args(spm_data_dir, single, preprocessed=preprocessed, steps=4), 4)], cwd=tmp_path)
    _run([(process(0, 2), 2), (process(1, 2), 2)], cwd=tmp_path)
    port = _free_port()
    _run([(process(0, 4), 2), (process(1, 4), 2)], cwd=tmp_path)  # resumes at step 2

    # Each process trained on its half of every global batch of the one-process run, across the restart.
    one = _examples(single, "train_examples-0-of-1.jsonl")
    halves = [_examples(multi, f"train_examples-{p}-of-2.jsonl") for p in (0, 1)]
    assert sorted(one) == [1, 2, 3, 4]
    for step, rows in one.items():
        assert halves[0][step] + halves[1][step] == rows, step
    one, two = (json.loads((run / "final_metrics.json").read_text()) for run in (single, multi))
    for key in ("train/loss", "train/grad_norm", "train/token_accuracy"):  # step 4's: after 3 steps on those batches
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
