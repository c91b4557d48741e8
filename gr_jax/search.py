"""Interactive retrieval with a trained model: `gr-jax search --model_dir runs/demo "query" ["query" ...]`.

Rebuilds the experiment from `model_dir/config.gin`, restores the latest checkpoint and prints the top-k docids
with their text and log-likelihoods.
"""
from __future__ import annotations

import argparse
import pathlib
from typing import Iterable, Optional, Sequence

import gin

from gr_jax import gin_utils
from gr_jax import training
from gr_jax.data.readers import open_dataset
from gr_jax.evaluator import RetrievalEvaluator


class Searcher:
    """A restored model plus its docid trie, ranking arbitrary query texts."""

    def __init__(self, *, built: training.Built, params, num_beams: int, constrained: bool, batch_size: int = 8):
        self.built = built
        self.params = params
        self.num_beams = num_beams
        self.constrained = constrained
        self.batch_size = batch_size
        self._table = built.docid_table()

    @classmethod
    def from_model_dir(cls, model_dir: str, *, gin_args: Sequence[str] = (), num_beams: int = 40,
                       constrained: bool = True, step: Optional[int] = None) -> "Searcher":
        config = pathlib.Path(model_dir) / "config.gin"
        if not config.exists():
            raise FileNotFoundError(f"{config} is missing: is {model_dir} a gr_jax training directory?")
        _, gin_files, bindings = gin_utils.parse_args(list(gin_args), description=__doc__)
        gin.clear_config()
        gin_utils.parse_gin(gin_files=[str(config), *gin_files], bindings=bindings)
        built = gin.get_configurable(training.Experiment)().build()
        state, _ = built.restore(step)
        return cls(built=built, params=state.params, num_beams=num_beams, constrained=constrained)

    def rank(self, queries: Iterable[tuple[str, str]]) -> dict[str, list[tuple[str, float]]]:
        queries = list(queries)
        evaluator = RetrievalEvaluator(
            model=self.built.model, queries=queries, qrels={}, docid_table=self._table,
            vocabulary=self.built.vocabulary, input_length=self.built.experiment.dataset.input_length,
            mesh=self.built.mesh, param_shardings=self.built.trainer.state_shardings.params,
            batch_size=self.batch_size, num_beams=self.num_beams, constrained=self.constrained)
        return evaluator.rank(self.params, progress=len(queries) > 100)

    def document_texts(self, docids: set[str]) -> dict[str, str]:
        """Streams the collection once and keeps only the wanted texts."""
        return {d: t for d, t in open_dataset(self.built.experiment.dataset.data_dir).collection() if d in docids}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="gr-jax search", description=__doc__)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--top_k", type=int, default=10)
    parser.add_argument("--num_beams", type=int, default=40)
    parser.add_argument("--unconstrained", action="store_true")
    parser.add_argument("queries", nargs="+")
    args, rest = parser.parse_known_args(argv)
    gin_utils.setup_logging()
    searcher = Searcher.from_model_dir(args.model_dir, gin_args=rest, num_beams=args.num_beams,
                                       constrained=not args.unconstrained)
    run = searcher.rank([(str(i), q) for i, q in enumerate(args.queries)])
    texts = searcher.document_texts({d for ranking in run.values() for d, _ in ranking[:args.top_k]})
    for i, query in enumerate(args.queries):
        print(f"\nquery: {query}")
        for rank, (docid, score) in enumerate(run[str(i)][:args.top_k], start=1):
            print(f"{rank:3d}. {docid}  {score:8.3f}  {texts.get(docid, '(not a docid of the corpus)')[:100]}")
