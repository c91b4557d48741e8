"""Per-device memory of a train step on a mesh of simulated devices, before renting the pod.

    python -m gr_jax.tools.plan_memory --config gin_configs/models/t5_1_1/base.gin --mesh 8x8 \
        [--batch 512] [--input_length 64] [--target_length 8] [--vocab 32128] [--dtype bfloat16] \
        [--param_dtype bfloat16] [--rules 2d] [--gin_file=decoders/atomic.gin] [--gin.KEY=VALUE ...]

`--mesh DxM` makes D x M CPU devices (XLA's `--xla_force_host_platform_device_count`, set before JAX starts) and the
('data', 'model') mesh over them; the train step (the project's `Trainer`, model and Adafactor, as a run builds
them from the same gin; a size file of the decoder-only family, gin_configs/decoder_only/*.gin, plans that family's
step) is lowered on abstract inputs and compiled, nothing is allocated. Prints one JSON line:
XLA's `memory_analysis()` of the compiled step per device (arguments, outputs, temporaries, aliased donations,
generated code) and their peak estimate (arguments + outputs + temporaries - aliased), the parameter count, and
the compile time. `--rules 2d` shards parameters over both mesh axes (t5x's `parameter_partitioning_dims=2`:
'embed' over 'data'). CPU compilation stands in for the accelerator's: layouts and fusion differ, so treat the
figures as estimates to compare settings, not as the accelerator's exact bytes.
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Optional

from gr_jax.entry_point import run_tool

def parse_mesh(text: str) -> tuple[int, int]:
    try:
        data, model = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--mesh must be DATAxMODEL, e.g. 8x8; got {text!r}") from None
    if data < 1 or model < 1:
        raise ValueError(f"--mesh sizes must be >= 1; got {text!r}")
    return data, model


def plan(*, config, mesh_shape: tuple[int, int], batch: int, input_length: int, target_length: int,
         rules_2d: bool, head=None) -> dict:
    """The memory analysis of one compiled train step of `config` (a T5Config, with `head`, None: the standard head;
    or a decoder-only family's DecoderOnlyConfig; see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from gr_jax import optimizers, partitioning
    from gr_jax.decoder_only.model import DecoderOnlyModel
    from gr_jax.decoder_only.network import DecoderOnlyConfig
    from gr_jax.heads import StandardHead
    from gr_jax.models import EncoderDecoderModel
    from gr_jax.trainer import Trainer

    rules = partitioning.LOGICAL_AXIS_RULES_2D if rules_2d else partitioning.LOGICAL_AXIS_RULES
    mesh = partitioning.make_mesh(data=mesh_shape[0], model=mesh_shape[1])
    model = (DecoderOnlyModel(config=config) if isinstance(config, DecoderOnlyConfig)
             else EncoderDecoderModel(config=config, head=head or StandardHead()))
    # LoRA's base, a frozen tower: no gradient, no update, no optimizer state for those.
    trainer = Trainer(model=model, optimizer=optimizers.make_optimizer(name="adafactor", learning_rate=1e-3),
                      mesh=mesh, frozen=model.frozen_parameters,
                      input_length=input_length, target_length=target_length, batch_size=batch, rules=rules)
    shapes = {"encoder_input_tokens": (batch, input_length), "decoder_target_tokens": (batch, target_length),
              "decoder_input_tokens": (batch, target_length), "decoder_loss_weights": (batch, target_length)}
    abstract_batch = {name: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=trainer.batch_sharding)
                      for name, shape in shapes.items()}
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=trainer.replicated)
    start = time.perf_counter()
    compiled = trainer.lower_train_step(trainer.abstract_state, abstract_batch, rng).compile()
    compile_seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    fields = {name: int(getattr(memory, f"{name}_size_in_bytes")) for name in
              ("argument", "output", "temp", "alias", "generated_code")}
    return {
        "mesh": f"{mesh_shape[0]}x{mesh_shape[1]}", "devices": jax.device_count(), "rules": "2d" if rules_2d else "1d",
        "params": trainer.param_count(), "trained_params": trainer.param_count(trained_only=True),
        "batch": batch, "input_length": input_length, "target_length": target_length,
        "dtype": config.dtype, "param_dtype": config.param_dtype,
        **{f"{name}_bytes": value for name, value in fields.items()},
        "peak_bytes": fields["argument"] + fields["output"] + fields["temp"] - fields["alias"],
        "compile_seconds": round(compile_seconds, 2),
    }


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a size gin, e.g. gin_configs/models/t5_1_1/base.gin")
    parser.add_argument("--mesh", required=True, help="DATAxMODEL simulated devices, e.g. 8x8")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--input_length", type=int, default=64)
    parser.add_argument("--target_length", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32128)
    parser.add_argument("--dtype", default="bfloat16", help="activations")
    parser.add_argument("--param_dtype", default="float32")
    parser.add_argument("--rules", choices=("1d", "2d"), default="1d")
    args, gin_args = parser.parse_known_args(argv)

    def build() -> dict:
        mesh_shape = parse_mesh(args.mesh)
        # Before JAX starts: the simulated devices.
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={mesh_shape[0] * mesh_shape[1]}"
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax

        from gr_jax import gin_utils
        if jax.device_count() != mesh_shape[0] * mesh_shape[1]:
            raise ValueError(f"JAX started with {jax.device_count()} devices before --mesh {args.mesh} could be "
                             "set: run the tool in a fresh process")
        _, gin_files, bindings = gin_utils.parse_args(gin_args, description="gin overrides")
        numerics = dict(vocab_size=args.vocab, dtype=args.dtype, param_dtype=args.param_dtype)
        if gin_utils.binds_decoder_only([args.config, *gin_files], bindings=bindings):
            config, head = gin_utils.decoder_only_config([args.config, *gin_files], bindings=bindings,
                                                         **numerics), None
        else:
            config, head = gin_utils.t5_config_and_head([args.config, *gin_files], bindings=bindings, **numerics)
        return plan(config=config, head=head, mesh_shape=mesh_shape, batch=args.batch,
                    input_length=args.input_length, target_length=args.target_length, rules_2d=args.rules == "2d")

    return run_tool(build)


if __name__ == "__main__":
    main()
