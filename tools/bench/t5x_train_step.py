"""Our train step against t5x's on the same T5.1.1, alternated in one process (the method of issue 18).

python -m gr_jax.tools.bench.t5x_train_step --t5x_dir /path/to/t5x/checkout [--blocks 5 --steps 50]

t5x is not installable from the package index, so it is imported from a checkout of its repository (the
directory holding the `t5x` package). A few modules it imports at the top of files this benchmark does not run
(airio, jestimator) are replaced by empty stand-ins, and `cached_property` by functools'. t5x runs its own model
(`t5x.examples.t5.network.Transformer` in `t5x.models.EncoderDecoderModel`), its own Adafactor with its standard
logical factor rules (as its T5.1.1 gin files), and its own step (`t5x.trainer.train_with_lr`, jitted with the
state donated, as its trainer does); ours runs `gr_jax.trainer.Trainer` with `optimizers.make_optimizer`. Both get
the same random batch, dropout 0.1 and a constant learning rate.

The two steps take turns in `--blocks` blocks of `--steps` steps (the first one alternates), and each block times a
float32 matmul probe, so the machine's drifting speed affects both alike. Prints one JSON line per block and a
summary: ours/t5x steps/s per block, each step's model FLOP/s over the probe, and XLA's FLOPs and bytes accessed
of both compiled steps.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.models import EncoderDecoderModel
from gr_jax.tools.bench.train_step import compiled_cost, random_batch, seconds
from gr_jax.trainer import Trainer

# The configuration: 9.64M parameters.
DIMENSIONS = dict(vocab_size=384, emb_dim=256, num_heads=4, num_encoder_layers=4, num_decoder_layers=4, head_dim=64,
                  mlp_dim=1024, dropout_rate=0.1)
LEARNING_RATE = 1e-3


class _StandInType(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandInType(name, (), {})


class _StandInModule(types.ModuleType):
    """A module whose every attribute is a placeholder class: for imports t5x makes but this step never uses."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandInType(name, (), {})


def import_t5x(t5x_dir: str) -> types.SimpleNamespace:
    """t5x's network, models, adafactor, trainer and train_state from a checkout, with stand-ins for the
    dependencies that are not installed (each named on stderr)."""
    import gin
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)  # t5x's Adafactor warns once per rank-2 parameter
    sys.path.insert(0, t5x_dir)
    gin.enter_interactive_mode()  # t5x registers configurables again when an import is retried
    shim = types.ModuleType("cached_property")
    shim.cached_property = functools.cached_property
    sys.modules.setdefault("cached_property", shim)
    for _ in range(20):
        try:
            from t5x import adafactor, models, train_state, trainer
            from t5x.examples.t5 import network as t5x_network
            return types.SimpleNamespace(adafactor=adafactor, models=models, train_state=train_state,
                                         trainer=trainer, network=t5x_network)
        except ModuleNotFoundError as error:
            if error.name is None or error.name.startswith("t5x"):
                raise
            print(f"t5x import: stand-in for the missing module {error.name!r}", file=sys.stderr)
            parts = error.name.split(".")
            for i in range(1, len(parts) + 1):
                sys.modules.setdefault(".".join(parts[:i]), _StandInModule(".".join(parts[:i])))
            for name in [n for n in sys.modules if n == "t5x" or n.startswith("t5x.")]:
                del sys.modules[name]
    raise RuntimeError(f"could not import t5x from {t5x_dir}")


def t5x_step(t5x, *, batch: dict, seed: int):
    """(step function state -> state, initial state, compiled cost) of t5x's own training step."""
    import seqio
    cfg = t5x.network.T5Config(dtype="float32", mlp_activations=("gelu", "linear"), logits_via_embedding=False,
                               **DIMENSIONS)
    vocabulary = seqio.PassThroughVocabulary(size=DIMENSIONS["vocab_size"])
    optimizer = t5x.adafactor.Adafactor(decay_rate=0.8, step_offset=0,
                                        logical_factor_rules=t5x.adafactor.standard_logical_factor_rules())
    model = t5x.models.EncoderDecoderModel(t5x.network.Transformer(cfg), vocabulary, vocabulary, optimizer)
    shapes = {name: value.shape for name, value in batch.items()}
    types_ = {name: jnp.int32 for name in batch}
    variables = model.get_initial_variables(jax.random.PRNGKey(seed), shapes, types_)
    state = t5x.train_state.FlaxOptimTrainState.create(optimizer, variables)
    step = jax.jit(functools.partial(t5x.trainer.train_with_lr, model=model, num_microbatches=None),
                   donate_argnums=(0,))
    lr = jnp.asarray(LEARNING_RATE, jnp.float32)
    rng = jax.random.PRNGKey(seed + 1)
    cost = compiled_cost(step.lower(state, batch, learning_rate=lr, dropout_rng=rng).compile())
    return (lambda s: step(s, batch, learning_rate=lr, dropout_rng=rng)[0]), state, cost


def our_step(*, batch: dict, seed: int):
    """(step function, initial state, compiled cost) of gr_jax's Trainer on the same configuration."""
    config = network.T5Config(dtype="float32", **DIMENSIONS)
    mesh = partitioning.make_mesh(data=-1, model=1)
    some = next(iter(batch.values()))
    trainer = Trainer(model=EncoderDecoderModel(config=config), mesh=mesh,
                      optimizer=optimizers.make_optimizer(learning_rate=LEARNING_RATE),
                      input_length=batch["encoder_input_tokens"].shape[1],
                      target_length=batch["decoder_target_tokens"].shape[1], batch_size=some.shape[0])
    state = trainer.init_state(jax.random.PRNGKey(seed))
    global_batch = partitioning.host_batch_to_global(batch, mesh=mesh)
    rng = jax.random.PRNGKey(seed + 1)
    cost = compiled_cost(trainer.lower_train_step(state, global_batch, rng).compile())
    return (lambda s: trainer.train_step(s, global_batch, rng)[0]), state, cost


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--t5x_dir", required=True, help="a checkout of github.com/google-research/t5x")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--probe_size", type=int, default=1024)
    args = parser.parse_args(argv)

    t5x = import_t5x(args.t5x_dir)
    batch = random_batch(np.random.default_rng(0), batch=args.batch, inputs=args.inputs, targets=args.targets,
                         vocab=DIMENSIONS["vocab_size"])
    runs = {"gr_jax": our_step(batch=batch, seed=0), "t5x": t5x_step(t5x, batch=batch, seed=0)}
    states = {name: run[1] for name, run in runs.items()}
    a = jax.random.normal(jax.random.PRNGKey(2), (args.probe_size, args.probe_size))
    probe = jax.jit(lambda x, y: x @ y)
    probe_flops = float(compiled_cost(probe.lower(a, a).compile())["flops"])
    for name, (step, _, _) in runs.items():  # compile and warm up
        states[name] = jax.block_until_ready(step(states[name]))

    blocks = []
    for block in range(args.blocks):
        order = list(runs) if block % 2 == 0 else list(runs)[::-1]
        record = {"block": block}
        for name in order:
            step = runs[name][0]

            def run_steps(name=name, step=step):
                for _ in range(args.steps):
                    states[name] = step(states[name])
                return states[name]
            block_s = seconds(run_steps)
            probe_s = min(seconds(lambda: probe(a, a)) for _ in range(5))
            record[name] = {"steps_per_s": args.steps / block_s,
                            "flops_over_probe": ((runs[name][2]["flops"] * args.steps / block_s)
                                                 / (probe_flops / probe_s))}
        record["ratio"] = record["gr_jax"]["steps_per_s"] / record["t5x"]["steps_per_s"]
        blocks.append(record)
        print(json.dumps(record), flush=True)
    summary = {
        "benchmark": "t5x_train_step", "config": DIMENSIONS, "batch": args.batch, "inputs": args.inputs,
        "targets": args.targets, "blocks": args.blocks, "steps_per_block": args.steps,
        "ratio_per_block": [round(b["ratio"], 3) for b in blocks],
        "ratio_median": statistics.median(b["ratio"] for b in blocks),
        "flops_over_probe": {name: statistics.median(b[name]["flops_over_probe"] for b in blocks) for name in runs},
        "step_gflops": {name: runs[name][2]["flops"] / 1e9 for name in runs},
        "step_bytes_accessed_gb": {name: runs[name][2].get("bytes accessed", float("nan")) / 1e9 for name in runs},
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
