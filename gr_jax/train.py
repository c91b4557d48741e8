"""Entry point: `python -m gr_jax.train --gin_file=runs/train.gin --gin_file=... --gin.MODEL_DIR=...`.

Trains (resuming from MODEL_DIR's latest intact checkpoint) and prints the final metrics as one JSON line.
"""
from __future__ import annotations

import json
import sys

import gin

from gr_jax import entry_point
from gr_jax import gin_utils


def main(argv=None) -> None:
    # The arguments first: --help and a bad flag answer before TensorFlow and JAX are imported.
    args, gin_files, bindings = gin_utils.parse_args(sys.argv[1:] if argv is None else argv, description=__doc__)
    entry_point.setup()

    def body() -> None:
        from gr_jax import training  # after setup: it loads TensorFlow

        gin_utils.parse_gin(gin_files=gin_files, bindings=bindings, search_paths=args.gin_search_path)
        gin_utils.initialize_distributed()
        report = gin.get_configurable(training.train)(gin_config_str=gin.config_str())
        print(json.dumps(report), flush=True)  # the final metrics, at any GR_JAX_LOG_LEVEL

    entry_point.run(body)


if __name__ == "__main__":
    main()
