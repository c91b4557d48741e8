"""A multi-host job on one machine: two processes on localhost (CPU, 2 devices each) train a micro model, write a
checkpoint, resume from it and evaluate retrieval, with the results of one process holding all 4 devices."""
import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import TRAIN_WITHOUT_TENSORFLOW, micro_ranked_run_args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _train_args(data, model_dir, *, steps: int) -> list[str]:
    return micro_ranked_run_args(data=data, model_dir=model_dir, name="multiprocess", steps=steps, bindings=[
        "--gin.network.T5Config.emb_dim=64", "--gin.network.T5Config.mlp_dim=128",
        "--gin.training.train.checkpoint_every_steps=2", "--gin.training.train.log_every_steps=1",
        "--gin.INPUT_LENGTH=80"])  # the longest query is 66 tokens: the fixture's 192 fit its documents (indexing)


def _run(jobs: list[tuple[list[str], int]], *, cwd) -> None:
    """Runs the train entry point once per (arguments, CPU devices), concurrently, without TensorFlow: the ranked lists
    and preprocessed records are read on the host (test_ranking_data.py checks such a run against one with
    TensorFlow), and each process is spared TensorFlow's import (seconds of each start-up)."""
    def env(devices: int) -> dict[str, str]:
        # This process's fast-compile flags (conftest.py: compiling in five processes is most of this test), with the
        # job's own number of devices.
        flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
                 if not flag.startswith("--xla_force_host_platform_device_count=")]
        flags.append(f"--xla_force_host_platform_device_count={devices}")
        return {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}

    procs = [subprocess.Popen([sys.executable, "-c", TRAIN_WITHOUT_TENSORFLOW, *args], cwd=cwd, env=env(devices),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for args, devices in jobs]
    outputs = [proc.communicate()[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-3000:]


def test_two_processes_train_resume_and_evaluate_as_one(ranked_hypernyms, tmp_path):
    single = tmp_path / "single"
    multi = tmp_path / "multi"
    port = _free_port()

    def process(index: int, steps: int, *bindings: str) -> list[str]:
        return [*_train_args(ranked_hypernyms, multi, steps=steps),
                f"--gin.partitioning.initialize_distributed.coordinator_address='localhost:{port}'",
                "--gin.partitioning.initialize_distributed.num_processes=2",
                f"--gin.partitioning.initialize_distributed.process_id={index}", *bindings]

    _run([(_train_args(ranked_hypernyms, single, steps=4), 4)], cwd=tmp_path)  # the reference: one process, 4 devices
    # Writes the checkpoint of step 2; its evaluation is left to the resumed run's end (one compile of the search).
    never = "--gin.training.EvalConfig.every_steps=-1"
    _run([(process(0, 2, never), 2), (process(1, 2, never), 2)], cwd=tmp_path)
    assert sorted(p.name for p in (multi / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
    port = _free_port()
    _run([(process(0, 4), 2), (process(1, 4), 2)], cwd=tmp_path)  # resumes at step 2
    assert sorted(p.name for p in (multi / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]

    one = json.loads((single / "final_metrics.json").read_text())
    two = json.loads((multi / "final_metrics.json").read_text())
    for key in ("train/loss", "train/token_accuracy", "eval/MRR@10", "eval/Recall@1", "eval/nDCG@10",  # 4 beams
                "eval/num_queries"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    # One process wrote the run's files: one TREC run per evaluation, read back whole: the same queries, documents and
    # ranks; the scores as the metrics (at -O0 the partitioned programs round differently in the last digits).
    lines = [(run / "run.dev.4.trec").read_text().splitlines() for run in (multi, single)]
    assert [line.split()[:4] for line in lines[0]] == [line.split()[:4] for line in lines[1]] and lines[0]
    assert [float(line.split()[4]) for line in lines[0]] == pytest.approx([float(line.split()[4]) for line in lines[1]],
                                                                          rel=1e-5)

