"""Entry point: `python -m gr_jax.eval --gin_file=<experiment gin> --gin_file=runs/eval.gin --gin.MODEL_DIR=...`.

Restores the latest checkpoint (or `--gin.training.evaluate.step=N`), ranks the split's queries with the model's
retriever, prints the metrics as one JSON line and writes a TREC run into the model dir.
"""
from __future__ import annotations

import json
import sys

import gin

from gr_jax import entry_point
from gr_jax import gin_utils


def main(argv=None) -> None:
    entry_point.setup()
    args, gin_files, bindings = gin_utils.parse_args(sys.argv[1:] if argv is None else argv, description=__doc__)
    if "runs/eval.gin" not in gin_files:
        gin_files.append("runs/eval.gin")

    def body() -> None:
        from gr_jax import training  # after setup: it loads TensorFlow

        gin_utils.parse_gin(gin_files=gin_files, bindings=bindings, search_paths=args.gin_search_path)
        gin_utils.initialize_distributed()
        print(json.dumps(gin.get_configurable(training.evaluate)()))

    entry_point.run(body)


if __name__ == "__main__":
    main()
