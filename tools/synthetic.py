"""Synthetic retrieval corpora in the MS MARCO layout, for the dense-vs-generative analyses (docs/dense.md).

    python -m gr_jax.tools.synthetic pairs --out_dir data/pairs46 --num_docs 46
    python -m gr_jax.tools.synthetic topics --out_dir data/topics4k --num_docs 4000 [--num_topics 64] [--seed 0]

* `pairs` (`gr_vs_dense_limitations.txt` Sec. 3.2.1, LIMIT-style): documents `d{i}`; one query per pair of
  documents (all N(N-1)/2 pairs, or `--num_queries` of them), an opaque name (`q{j}`), relevant to exactly
  those two. Training and dev queries are the same: the question is whether a model can *represent* the relevance
  matrix, whose rank is N, not whether it generalises. The JSON summary gives the matrix's spectral tail (Eq. 14).
* `topics` (corpus-size sweeps): each document has a topic; its text is `--doc_words` words drawn from its topic's
  vocabulary (Zipf weights) mixed with `--background` common words; a query is `--query_words` distinct words of its
  document plus one word of another topic. Every document gets `--train_queries` training queries (default 1) and
  `--dev_fraction` of them a different dev query, so dev queries are in-distribution (every relevant document was
  seen in training, as the paper's NQ setting requires; several training queries per document let a data-size
  law show: `gr_jax.tools.train_fraction` then keeps a fraction of them). Nested: with one seed, the first N
  documents of a larger corpus are the corpus of size N, and the first training queries of a document do not
  depend on `--train_queries`.
Both write collection.tsv, queries.{train,dev}.tsv and qrels.{train,dev}.tsv and print a JSON summary.
"""
from __future__ import annotations

import argparse
import itertools
import pathlib
from collections.abc import Sequence
from typing import Optional

import numpy as np

from gr_jax.data.readers import write_tsv
from gr_jax.entry_point import run_tool


def _write(out_dir: pathlib.Path, *, documents, train, dev) -> None:
    """documents: (docid, text); train / dev: (qid, text, [relevant docids])."""
    if (out_dir / "collection.tsv").exists():
        raise FileExistsError(f"{out_dir / 'collection.tsv'} exists: choose a new --out_dir")
    write_tsv(out_dir / "collection.tsv", documents)
    for split, queries in (("train", train), ("dev", dev)):
        write_tsv(out_dir / f"queries.{split}.tsv", ((qid, text) for qid, text, _ in queries))
        write_tsv(out_dir / f"qrels.{split}.tsv", ((qid, 0, docid, 1) for qid, _, docids in queries
                                                   for docid in docids))


def pairs_corpus(*, out_dir: str, num_docs: int, num_queries: Optional[int] = None, seed: int = 0) -> dict:
    from gr_jax.dense.spectral import spectral_tail
    if num_docs < 3:
        raise ValueError(f"num_docs must be >= 3, got {num_docs}")
    pairs = list(itertools.combinations(range(num_docs), 2))
    if num_queries is not None:
        if not 1 <= num_queries <= len(pairs):
            raise ValueError(f"num_queries must be in [1, {len(pairs)}], got {num_queries}")
        chosen = np.random.default_rng(seed).choice(len(pairs), size=num_queries, replace=False)
        pairs = [pairs[i] for i in sorted(chosen)]
    documents = [(str(i), f"d{i}") for i in range(num_docs)]
    queries = [(f"q{j}", f"q{j}", [str(a), str(b)]) for j, (a, b) in enumerate(pairs)]
    _write(pathlib.Path(out_dir), documents=documents, train=queries, dev=queries)
    relevance = np.zeros((len(pairs), num_docs))
    for j, (a, b) in enumerate(pairs):
        relevance[j, [a, b]] = 1.0
    ranks = [r for r in (1, 2, 4, 8, 16, 32, 64) if r <= num_docs]
    return {"out_dir": out_dir, "documents": num_docs, "queries": len(pairs),
            "relevance_rank": int(np.linalg.matrix_rank(relevance)),
            "spectral_tail": spectral_tail(relevance, ranks)}


def topics_corpus(*, out_dir: str, num_docs: int, num_topics: int = 64, topic_words: int = 60,
                  background_words: int = 300, doc_words: int = 24, background: float = 0.3, query_words: int = 4,
                  dev_fraction: float = 0.2, train_queries: int = 1, seed: int = 0) -> dict:
    if num_docs < 2 or num_topics < 2 or not 0 < dev_fraction <= 1 or query_words > doc_words or train_queries < 1:
        raise ValueError("need num_docs >= 2, num_topics >= 2, 0 < dev_fraction <= 1, query_words <= doc_words, "
                         "train_queries >= 1")
    vocabulary = np.random.default_rng([seed, 0])
    syllables = ["ka", "lo", "mi", "tu", "re", "sa", "no", "vi", "de", "po", "ga", "fe", "zu", "ri", "ba", "xo"]

    def word() -> str:
        return "".join(vocabulary.choice(syllables, size=3))

    topic_vocab = [[f"{word()}{t}" for _ in range(topic_words)] for t in range(num_topics)]
    common = [word() for _ in range(background_words)]
    zipf = 1.0 / np.arange(1, topic_words + 1)
    zipf /= zipf.sum()
    documents, train, dev = [], [], []
    for i in range(num_docs):  # one generator per document: the first N documents do not depend on num_docs
        rng = np.random.default_rng([seed, 1, i])
        topic = int(rng.integers(num_topics))
        words = [str(rng.choice(common)) if rng.random() < background else str(rng.choice(topic_vocab[topic], p=zipf))
                 for _ in range(doc_words)]
        documents.append((f"doc{i}", " ".join(words)))
        distinct = list(dict.fromkeys(words))

        def query() -> str:
            picked = list(rng.choice(distinct, size=min(query_words, len(distinct)), replace=False))
            other = int((topic + 1 + rng.integers(num_topics - 1)) % num_topics)
            picked.insert(int(rng.integers(len(picked) + 1)), str(rng.choice(topic_vocab[other])))
            return " ".join(picked)

        train.append((f"t{i}", query(), [f"doc{i}"]))
        if rng.random() < dev_fraction:
            dev.append((f"v{i}", query(), [f"doc{i}"]))
        train.extend((f"t{i}_{j}", query(), [f"doc{i}"]) for j in range(1, train_queries))
    _write(pathlib.Path(out_dir), documents=documents, train=train, dev=dev)
    return {"out_dir": out_dir, "documents": num_docs, "topics": num_topics, "train_queries": len(train),
            "dev_queries": len(dev)}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.synthetic", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="corpus", required=True)
    pairs = sub.add_parser("pairs")
    pairs.add_argument("--out_dir", required=True)
    pairs.add_argument("--num_docs", type=int, required=True)
    pairs.add_argument("--num_queries", type=int, default=None, help="default: every pair")
    pairs.add_argument("--seed", type=int, default=0)
    topics = sub.add_parser("topics")
    topics.add_argument("--out_dir", required=True)
    topics.add_argument("--num_docs", type=int, required=True)
    topics.add_argument("--num_topics", type=int, default=64)
    topics.add_argument("--doc_words", type=int, default=24)
    topics.add_argument("--query_words", type=int, default=4)
    topics.add_argument("--dev_fraction", type=float, default=0.2)
    topics.add_argument("--train_queries", type=int, default=1, help="training queries per document")
    topics.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.corpus == "pairs":
        return run_tool(lambda: pairs_corpus(out_dir=args.out_dir, num_docs=args.num_docs,
                                             num_queries=args.num_queries, seed=args.seed))
    return run_tool(lambda: topics_corpus(out_dir=args.out_dir, num_docs=args.num_docs, num_topics=args.num_topics,
                                          doc_words=args.doc_words, query_words=args.query_words,
                                          dev_fraction=args.dev_fraction, train_queries=args.train_queries,
                                          seed=args.seed))


if __name__ == "__main__":
    main()
