"""Scanned against unscanned layer stacks (`T5Config.scan_layers`): train-step compile time and speed, one process.

python -m gr_jax.tools.bench.scan_layers --config gin_configs/models/t5_1_1/tiny.gin \
    [--batch 32 --inputs 64 --targets 8 --vocab 384] [--steps 8] [--remat]

Builds the project's Trainer (Adafactor, dropout 0.1) for both layouts of the same network on one device, compiles
each train step (timed), then times steps alternately, one of each layout in turn, so that the machine's drifting
speed affects both alike. Prints one JSON line: both compile times and median steps/s, and their ratios
(scanned / unscanned), the figures to compare across machines.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import jax
import numpy as np

from gr_jax import gin_utils
from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.models import EncoderDecoderModel
from gr_jax.tools.bench.train_step import random_batch
from gr_jax.trainer import Trainer


def run(*, config: network.T5Config, batch: int, inputs: int, targets: int, steps: int) -> dict:
    """Compile seconds and median steps/s of both layouts of `config` (its `scan_layers` is ignored)."""
    mesh = partitioning.make_mesh(data=1, model=1, devices=jax.devices()[:1])
    data = random_batch(np.random.default_rng(0), batch=batch, inputs=inputs, targets=targets, vocab=config.vocab_size)
    global_batch = partitioning.host_batch_to_global(data, mesh=mesh)
    rng = jax.random.PRNGKey(1)
    layouts = {}
    for scan in (False, True):
        trainer = Trainer(model=EncoderDecoderModel(config=dataclasses.replace(config, scan_layers=scan)), mesh=mesh,
                          optimizer=optimizers.make_optimizer(name="adafactor", learning_rate=1e-3),
                          input_length=inputs, target_length=targets, batch_size=batch)
        state = trainer.init_state(jax.random.PRNGKey(0))
        start = time.perf_counter()
        step = trainer.lower_train_step(state, global_batch, rng).compile()
        compile_s = time.perf_counter() - start
        state, _ = step(state, global_batch, rng)  # warm up
        jax.block_until_ready(state)
        layouts["scanned" if scan else "unscanned"] = {"step": step, "state": state, "compile_s": compile_s,
                                                       "times": [], "params": trainer.param_count()}
    for _ in range(steps):
        for layout in layouts.values():
            start = time.perf_counter()
            layout["state"], metrics = layout["step"](layout["state"], global_batch, rng)
            jax.block_until_ready(metrics)
            layout["times"].append(time.perf_counter() - start)
    result = {"benchmark": "scan_layers", "params": layouts["scanned"]["params"], "batch": batch, "inputs": inputs,
              "targets": targets, "layers": [config.num_encoder_layers, config.num_decoder_layers],
              "remat": config.remat, "dtype": config.dtype, "platform": jax.devices()[0].platform,
              "timed_steps": steps}
    for name, layout in layouts.items():
        result[f"{name}_compile_s"] = round(layout["compile_s"], 2)
        result[f"{name}_steps_per_s"] = 1.0 / statistics.median(layout["times"])
    result["compile_ratio"] = result["scanned_compile_s"] / result["unscanned_compile_s"]
    result["steps_per_s_ratio"] = result["scanned_steps_per_s"] / result["unscanned_steps_per_s"]
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a size gin, e.g. gin_configs/models/t5_1_1/tiny.gin")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=384)
    parser.add_argument("--dtype", default="float32", help="activations")
    parser.add_argument("--remat", action="store_true", help="rematerialise each layer (T5Config.remat)")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    config = gin_utils.t5_config([args.config], vocab_size=args.vocab, dtype=args.dtype, dropout_rate=0.1,
                                 remat=args.remat)
    print(json.dumps(run(config=config, batch=args.batch, inputs=args.inputs, targets=args.targets,
                         steps=args.steps)))


if __name__ == "__main__":
    main()
