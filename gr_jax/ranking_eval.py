"""Entry point: `python -m gr_jax.ranking_eval --gin_file=RUN/config.gin [--gin.RANKING_SPLIT="'dev'"]
[--gin.RANKING_STEP=N]`.

SToICaL's ranking metrics of a trained generative run (`gr_jax.ranking.evaluation`): restores the latest checkpoint
(or RANKING_STEP), scores each query's graded list and its negative by mean token log-probability, prints CVR,
nDCG and R@1..R@5 as one JSON line and writes `ranking.{split}.{step}.json` into the model dir.
"""
from __future__ import annotations

from gr_jax import entry_point


def main(argv=None) -> None:
    def evaluate_ranking():
        from gr_jax.ranking import evaluation  # after setup: it loads TensorFlow
        return evaluation.evaluate_ranking

    entry_point.run_configured(argv, description=__doc__, gin_file="runs/ranking_eval.gin", function=evaluate_ranking)


if __name__ == "__main__":
    main()
