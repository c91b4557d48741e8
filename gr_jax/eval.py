"""Entry point: `python -m gr_jax.eval --gin_file=<experiment gin> --gin_file=runs/eval.gin --gin.MODEL_DIR=...`.

Restores the latest checkpoint (or `--gin.training.evaluate.step=N`), ranks the split's queries with the model's
retriever, prints the metrics as one JSON line and writes a TREC run into the model dir.
"""
from __future__ import annotations

from gr_jax import entry_point


def main(argv=None) -> None:
    def evaluate():
        from gr_jax import training  # after setup: it loads TensorFlow
        return training.evaluate

    entry_point.run_configured(argv, description=__doc__, gin_file="runs/eval.gin", function=evaluate)


if __name__ == "__main__":
    main()
