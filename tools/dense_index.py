"""Encodes a dense run's corpus and builds a faiss index of it, reporting its recall against exact search.

    python -m gr_jax.tools.dense_index --model_dir RUN [--step N] [--factory IVF4096,Flat] [--nprobe 16]
        [--ef_search 64] [--recall_k 10] [--gin.KEY=VALUE ...]

The run (a `gr_jax.train` model dir of a dual encoder) is rebuilt from its config.gin; its checkpoint (latest, or
`--step`) encodes the collection into `RUN/index/{step}/` (streamed, progress bar with documents/s; reused when
already there for this corpus and encoder), and the faiss index `--factory` (a `faiss.index_factory` string over
inner products; "Flat", the default, is exact) is built beside it as `index.{factory}.faiss`. For an approximate
index, recall@k against exact search is measured on the query vectors of the run's eval split (its config's
EVAL_SPLIT; `--gin.EVAL_SPLIT=test` picks another, as for `gr_jax.eval`). Prints one JSON line:
documents, dimension, encoding documents/s, index build seconds and recall. `gr_jax.eval`, `gr_jax.infer` and
`gr-jax search` then use that index with `--gin.INDEX_FACTORY='...'` (and `--gin.index.IndexConfig.nprobe=...`).
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Optional

from gr_jax.entry_point import run_tool


def build(*, model_dir: str, step: Optional[int], factory: str, nprobe: Optional[int], ef_search: Optional[int],
          recall_k: int, gin_args: Sequence[str] = ()) -> dict:
    from gr_jax.data.readers import open_dataset
    from gr_jax.dense.experiment import DenseBuilt
    from gr_jax.dense.model import QUERY
    from gr_jax.retrievers.settings import EvalConfig
    from gr_jax.search import restore_run
    bindings = [f"--gin.INDEX_FACTORY={factory!r}", f"--gin.index.IndexConfig.nprobe={nprobe}",
                f"--gin.index.IndexConfig.ef_search={ef_search}", f"--gin.index.IndexConfig.recall_k={recall_k}"]
    built = restore_run(model_dir, gin_args=[*bindings, *gin_args])
    if not isinstance(built, DenseBuilt):
        raise ValueError(f"{model_dir} is not a dense run (its EXPERIMENT is {type(built.experiment).__name__})")
    recall_queries = None
    if not built.experiment.index.exact:  # recall against exact search, on the run's eval split
        dataset = open_dataset(built.experiment.dataset.data_dir)
        recall_queries = [text for _, text in dataset.queries(built.experiment.dataset.eval_split)]
    params, step = built.restore_params(step)
    retriever = built.retriever(params, settings=EvalConfig(), step=step, show_progress=True)
    corpus_index = retriever.index(recall_queries=None if recall_queries is None else
                                   retriever.encode(recall_queries, side=QUERY))
    return {"model_dir": model_dir, "step": step, "index_dir": str(corpus_index.directory),
            "documents": len(corpus_index), "dim": corpus_index.dim,
            "encoding": corpus_index.manifest.get("encoding"), **corpus_index.index_info}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.dense_index", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", required=True, help="a dense run's model dir")
    parser.add_argument("--step", type=int, default=None, help="checkpoint (default: the latest)")
    parser.add_argument("--factory", default="Flat", help="faiss index_factory string (default: Flat, exact)")
    parser.add_argument("--nprobe", type=int, default=None, help="IVF lists searched")
    parser.add_argument("--ef_search", type=int, default=None, help="HNSW search breadth")
    parser.add_argument("--recall_k", type=int, default=10)
    args, rest = parser.parse_known_args(argv)
    return run_tool(lambda: build(model_dir=args.model_dir, step=args.step, factory=args.factory, nprobe=args.nprobe,
                                  ef_search=args.ef_search, recall_k=args.recall_k,
                                  gin_args=rest))


if __name__ == "__main__":
    main()
