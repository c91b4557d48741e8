"""Which library modules `gr_jax/training.py` hands control to in one training run: the architecture's measure of
how many places a reader follows to understand a run (docs/architecture.md, "One training run").

    python -m gr_jax.tools.call_path --data_dir DIR   (a data dir with spm.model, e.g. tests/fixtures/tasks + one)

trains a micro generative run (one layer each side, 3 steps, a final retrieval evaluation) in a temporary folder
under `sys.setprofile` and prints the modules `training.py` calls into directly, in order of first call, and the
sequence of those calls with repeats of one module collapsed (each change of module is a return to `training.py`).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import gr_jax
from gr_jax import experiment as experiment_lib
from gr_jax import network, optimizers, training
from gr_jax.entry_point import run_tool
from gr_jax.retrievers.settings import EvalConfig

LIBRARY = pathlib.Path(gr_jax.__file__).parent


def library_calls(*, caller: str | pathlib.Path, run: Callable[[], Any]) -> list[str]:
    """The modules of the library (dotted names) that functions defined in the file `caller` call directly while
    `run()` runs, one entry per call, in call order."""
    caller = str(caller)
    calls: list[str] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None or frame.f_back.f_code.co_filename != caller:
            return
        callee = pathlib.Path(frame.f_code.co_filename)
        if callee.is_relative_to(LIBRARY) and str(callee) != caller:
            calls.append(".".join(("gr_jax", *callee.relative_to(LIBRARY).with_suffix("").parts)))

    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def collapsed(calls: Sequence[str]) -> list[str]:
    """`calls` with each run of one module kept once: the hand-offs between modules."""
    return [module for i, module in enumerate(calls) if i == 0 or calls[i - 1] != module]


def measure(data_dir: str) -> dict:
    config = network.T5Config(vocab_size=None, emb_dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                              mlp_dim=32, head_dim=8, dropout_rate=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        experiment = experiment_lib.Experiment(
            model_dir=str(pathlib.Path(tmp) / "run"), network_config=config, batch_size=8,
            dataset=experiment_lib.DatasetConfig(name="call_path", data_dir=data_dir, input_length=16,
                                                 target_length=12),
            learning_rate=optimizers.warmup_constant(peak=1e-3, warmup_steps=2))
        calls = library_calls(caller=training.__file__, run=lambda: training.train(
            experiment=experiment, num_train_steps=3, checkpoint_every_steps=3, progress=False,
            eval_config=EvalConfig(every_steps=0, num_beams=4, batch_size=8)))
    modules = list(dict.fromkeys(calls))
    return {"modules": modules, "num_modules": len(modules), "hand_offs": collapsed(calls)}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="a retrieval data dir with its spm.model")
    args = parser.parse_args(argv)
    return run_tool(lambda: measure(args.data_dir))


if __name__ == "__main__":
    main()
