"""Train-step throughput as a fraction of the machine's matmul throughput, measured in one process.

python -m gr_jax.tools.bench.train_step --config gin_configs/models/t5_1_1/small.gin \
    [--batch 64 --inputs 32 --targets 8]

Prints one JSON line: steps/s, tokens/s, model FLOP/s (`model_flops`: the matrix products of the step's jaxpr,
not rematerialised, divided by the step's median time), a float32 matmul probe's FLOP/s (its 2 n^3 by hand), and
their ratio. Step and probe are timed alternately so that the machine's drifting speed affects both alike; the
ratio is the figure to compare across machines.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh

from gr_jax import gin_utils
from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.models import EncoderDecoderModel
from gr_jax.trainer import TrainableModel, Trainer


def compiled_cost(compiled) -> dict:
    """XLA's cost analysis of a compiled function (flops, bytes accessed, ...)."""
    cost = compiled.cost_analysis()
    return cost[0] if isinstance(cost, (list, tuple)) else cost


def jaxpr_matmul_flops(jaxpr: Any) -> float:
    """The FLOPs of the matrix products in a (closed) jaxpr, 2 per multiply-add, the bodies of nested calls counted
    and a scan's body once per iteration: the count behind model FLOP/s, as PaLM's MFU counts. Independent of the
    backend: XLA's cost analysis of a GPU's compiled module counts none of its cuBLAS matmuls, and its analysis of a
    scan counts the body once."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs, out = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
            total += 2.0 * math.prod(out) * math.prod(lhs[i] for i in lhs_contract)
        elif name == "while":
            raise ValueError("jaxpr_matmul_flops: a while loop's trip count is not known when traced")
        elif name == "cond":
            total += max(jaxpr_matmul_flops(branch) for branch in eqn.params["branches"])
        elif name == "scan":
            total += eqn.params["length"] * jaxpr_matmul_flops(eqn.params["jaxpr"])
        else:
            for value in eqn.params.values():
                if hasattr(value, "eqns") or hasattr(getattr(value, "jaxpr", None), "eqns"):
                    total += jaxpr_matmul_flops(value)
    return total


def matmul_flops(size: int) -> float:
    """FLOPs of the [size, size] @ [size, size] probe, by hand."""
    return 2.0 * size ** 3


def model_flops(*, model: Any, optimizer: optax.GradientTransformation, mesh: Mesh,
                batch: Mapping[str, np.ndarray]) -> float:
    """The model FLOPs of one train step of `model` (T5.1.1 or decoder-only, a `config` with `scan_layers` and
    `remat`) on `batch`: the matrix products of its jaxpr (`jaxpr_matmul_flops`), traced on abstract inputs with
    the layers not rematerialised (the recomputed forward is not model work)."""
    flat = dataclasses.replace(model, config=dataclasses.replace(model.config, remat=False))
    inputs, targets = batch["encoder_input_tokens"], batch["decoder_target_tokens"]
    twin = Trainer(model=flat, optimizer=optimizer, mesh=mesh, input_length=inputs.shape[1],
                   target_length=targets.shape[1], batch_size=inputs.shape[0])
    abstract_batch = {name: jax.ShapeDtypeStruct(np.shape(value), np.asarray(value).dtype,
                                                 sharding=twin.batch_sharding) for name, value in batch.items()}
    rng = jax.ShapeDtypeStruct((2,), np.uint32, sharding=twin.replicated)
    return jaxpr_matmul_flops(twin.trace_train_step(twin.abstract_state, abstract_batch, rng).jaxpr)


def random_batch(rng: np.random.Generator, *, batch: int, inputs: int, targets: int, vocab: int) -> dict:
    targets_tokens = rng.integers(2, vocab, size=(batch, targets), dtype=np.int32)
    return {
        "encoder_input_tokens": rng.integers(2, vocab, size=(batch, inputs), dtype=np.int32),
        "decoder_target_tokens": targets_tokens,
        "decoder_input_tokens": np.concatenate([np.zeros((batch, 1), np.int32), targets_tokens[:, :-1]], 1),
        "decoder_loss_weights": np.ones((batch, targets), np.int32),
    }


def seconds(fn) -> float:
    """Wall seconds of `fn()` until its result is ready."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def run(*, config: network.T5Config, batch: int, inputs: int, targets: int, steps: int, optimizer: str,
        probe_size: int, probe_dtype: str = "float32") -> dict:
    """The T5.1.1 train step of `config` (`run_model`)."""
    return run_model(model=EncoderDecoderModel(config=config), vocab_size=config.vocab_size, dtype=config.dtype,
                     param_dtype=config.param_dtype, batch=batch, inputs=inputs, targets=targets, steps=steps,
                     optimizer=optimizer, probe_size=probe_size, probe_dtype=probe_dtype)


def run_model(*, model: TrainableModel, vocab_size: int, dtype: str, param_dtype: str, batch: int, inputs: int,
              targets: int, steps: int, optimizer: str, probe_size: int, probe_dtype: str = "float32") -> dict:
    """Times the train step of any model that reads the generative features (T5.1.1, the decoder-only family's)
    on random tokens below `vocab_size`, alternately with the matmul probe; `dtype`, `param_dtype`: the model's,
    as reported."""
    mesh = partitioning.make_mesh(data=-1, model=1)
    lr = optimizers.warmup_constant(peak=1e-3, warmup_steps=100)
    optimizer_fn = optimizers.make_optimizer(name=optimizer, learning_rate=lr)
    trainer = Trainer(model=model, optimizer=optimizer_fn, mesh=mesh, input_length=inputs, target_length=targets,
                      batch_size=batch)
    state = trainer.init_state(jax.random.PRNGKey(0))
    data = random_batch(np.random.default_rng(0), batch=batch, inputs=inputs, targets=targets, vocab=vocab_size)
    rng = jax.random.PRNGKey(1)
    global_batch = partitioning.host_batch_to_global(data, mesh=mesh)
    step_cost = compiled_cost(trainer.lower_train_step(state, global_batch, rng).compile())
    step_flops = model_flops(model=model, optimizer=optimizer_fn, mesh=mesh, batch=data)

    a = jax.random.normal(jax.random.PRNGKey(2), (probe_size, probe_size), probe_dtype)
    b = jax.random.normal(jax.random.PRNGKey(3), (probe_size, probe_size), probe_dtype)
    probe = jax.jit(lambda x, y: x @ y)
    probe_flops = matmul_flops(probe_size)
    jax.block_until_ready(probe(a, b))

    holder = {"state": trainer.train_step(state, data, rng)[0]}  # compile + warm up

    def one_step():
        holder["state"], metrics = trainer.train_step(holder["state"], data, rng)
        return metrics["loss"].total

    step_times, probe_times = [], []
    for _ in range(steps):
        step_times.append(seconds(one_step))
        probe_times.append(min(seconds(lambda: probe(a, b)) for _ in range(3)))
    step_s = statistics.median(step_times)
    probe_s = statistics.median(probe_times)
    model_flops_per_s = step_flops / step_s
    probe_flops_per_s = probe_flops / probe_s
    return {
        "benchmark": "train_step",
        "params": trainer.param_count(),
        "batch": batch, "inputs": inputs, "targets": targets, "dtype": dtype, "param_dtype": param_dtype,
        "optimizer": optimizer,
        "devices": jax.device_count(), "platform": jax.devices()[0].platform,
        "steps_per_s": 1.0 / step_s,
        "tokens_per_s": batch * (inputs + targets) / step_s,
        "step_flops": step_flops,
        "step_bytes_accessed": float(step_cost.get("bytes accessed", float("nan"))),  # XLA's estimate
        "model_flops_per_s": model_flops_per_s,
        "probe_flops_per_s": probe_flops_per_s,
        "probe_dtype": probe_dtype, "probe_size": probe_size,
        "ratio": model_flops_per_s / probe_flops_per_s,
        "timed_steps": steps,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="a size gin, e.g. gin_configs/models/t5_1_1/small.gin")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--inputs", type=int, default=32)
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32128)
    parser.add_argument("--dtype", default="float32", help="activations")
    parser.add_argument("--param_dtype", default="float32", help="parameters (and optimizer state)")
    parser.add_argument("--dropout_broadcast_dims", default="-2",
                        help="comma-separated axes sharing a dropout mask ('-2': t5x's T5.1.1; '': per element)")
    parser.add_argument("--optimizer", default="adafactor")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--probe_size", type=int, default=2048)
    parser.add_argument("--probe_dtype", default="float32", help="bfloat16 on accelerators: their peak is bf16")
    args = parser.parse_args(argv)
    config = gin_utils.t5_config(
        [args.config], vocab_size=args.vocab, dtype=args.dtype, param_dtype=args.param_dtype, dropout_rate=0.1,
        dropout_broadcast_dims=tuple(int(axis) for axis in args.dropout_broadcast_dims.split(",") if axis.strip()))
    print(json.dumps(run(config=config, batch=args.batch, inputs=args.inputs, targets=args.targets,
                         steps=args.steps, optimizer=args.optimizer, probe_size=args.probe_size,
                         probe_dtype=args.probe_dtype)))


if __name__ == "__main__":
    main()
