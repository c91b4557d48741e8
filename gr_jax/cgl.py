"""Entry point: `python -m gr_jax.cgl --gin_file=RUN/config.gin [--gin.CGL_SPLIT="'dev'"] [--gin.CGL_STEP=N]`.

The Contrastive Generation Loss of a trained generative run (`gr_jax.scaling.cgl`): restores the latest checkpoint
(or CGL_STEP), scores each query's judged docids against CGL_NEGATIVES sampled ones, prints the result as one JSON
line and writes `cgl.{split}.{step}.json` into the model dir. Settings: `--gin.cgl.CglConfig.KEY=VALUE`.
"""
from __future__ import annotations

from gr_jax import entry_point


def main(argv=None) -> None:
    def evaluate_cgl():
        from gr_jax.scaling import cgl  # after setup: it loads TensorFlow
        return cgl.evaluate_cgl

    entry_point.run_configured(argv, description=__doc__, gin_file="runs/cgl.gin", function=evaluate_cgl)


if __name__ == "__main__":
    main()
