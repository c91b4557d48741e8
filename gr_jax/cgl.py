"""Entry point: `python -m gr_jax.cgl --gin_file=RUN/config.gin [--gin.CGL_SPLIT="'dev'"] [--gin.CGL_STEP=N]`.

The Contrastive Generation Loss of a trained generative run (`gr_jax.scaling.cgl`): restores the latest checkpoint
(or CGL_STEP), scores each query's judged docids against CGL_NEGATIVES sampled ones, prints the result as one JSON
line and writes `cgl.{split}.{step}.json` into the model dir. Settings: `--gin.cgl.CglConfig.KEY=VALUE`.
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
    if "runs/cgl.gin" not in gin_files:
        gin_files.append("runs/cgl.gin")

    def body() -> None:
        from gr_jax.scaling import cgl  # after setup: it loads TensorFlow

        gin_utils.parse_gin(gin_files=gin_files, bindings=bindings, search_paths=args.gin_search_path)
        gin_utils.initialize_distributed()
        print(json.dumps(gin.get_configurable(cgl.evaluate_cgl)()))

    entry_point.run(body)


if __name__ == "__main__":
    main()
