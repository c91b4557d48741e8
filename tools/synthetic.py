"""Synthetic retrieval corpora in the MS MARCO layout, for the dense-vs-generative analyses (docs/dense.md).

    python -m gr_jax.tools.synthetic pairs --out_dir data/pairs46 --num_docs 46
    python -m gr_jax.tools.synthetic topics --out_dir data/topics4k --num_docs 4000 [--num_topics 64] [--seed 0]
    python -m gr_jax.tools.synthetic msmarco --out_dir data/msmarco_synth [--num_passages 8841823] \\
        [--train_queries 502939] [--dev_queries 6980] [--d2q_per_passage 20] [--lengths_from collection.tsv]

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
* `msmarco` (the study's data at the study's size, issue 34; docs/scale.md): `--num_passages` (MS MARCO's
  8,841,823 by default) passages of MS MARCO's length distribution (log-normal words per passage with msmarco_mini's
  parameters, or the empirical distribution of `--lengths_from` a collection.tsv), each of a topic (`--num_topics`)
  whose words (Zipf weights) it mixes with common ones; `--train_queries` and `--dev_queries` queries on distinct
  seeded passages (a few of the passage's words and one of another topic, so retrieval is learnable), and
  `--d2q_per_passage` synthetic queries per passage made the same way, in d2q.tsv's per-passage layout. Written as it
  is generated, in blocks of 10,000 passages, each block from its own seeded generators: memory does not grow with
  the corpus, and the first N passages of a larger corpus are the corpus of size N.
All write collection.tsv, queries.{train,dev}.tsv and qrels.{train,dev}.tsv (msmarco also d2q.tsv) and print a JSON
summary.
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


# MS MARCO passages' words per passage, as a log-normal: msmarco_mini's 11,809 passages (mean 56.4 words, median
# 51, 1st-99th percentile 18-127) have log word counts of mean 3.954 and standard deviation 0.400.
MSMARCO_LOG_WORDS = (3.954, 0.400)
MSMARCO_PASSAGES = 8_841_823
_BLOCK = 10_000  # passages per block of generation: fixed, so that a block's draws do not depend on the corpus size


def _length_sampler(lengths_from: Optional[str]):
    """rng, n -> int[n] words per passage: the log-normal of MSMARCO_LOG_WORDS (3 to 250 words), or the empirical
    distribution of `lengths_from`'s passages."""
    if lengths_from is None:
        mu, sigma = MSMARCO_LOG_WORDS
        return lambda rng, n: np.clip(np.rint(np.exp(rng.normal(mu, sigma, size=n))), 3, 250).astype(np.int64)
    from gr_jax.data.readers import read_collection
    observed = np.fromiter((len(text.split()) for _, text in read_collection(lengths_from)), dtype=np.int64)
    observed = observed[observed > 0]
    if not observed.size:
        raise ValueError(f"{lengths_from} has no passage with a word")
    return lambda rng, n: rng.choice(observed, size=n)


def _syllable_words(count: int) -> np.ndarray:
    """`count` distinct pronounceable words, word w being w's digits in base 100 spelled as consonant-vowel
    syllables (as few as hold `count`, at least 2): about English's 5-6 letters a word at 1M words, so passages take
    about the bytes of MS MARCO's."""
    syllables = np.array([c + v for c in "bdfghjklmnprstvwxyzc" for v in "aeiou"])
    places = max(2, int(np.ceil(np.log(count) / np.log(100))))
    ids = np.arange(count)
    words = syllables[ids % 100]
    for place in range(1, places):
        words = np.char.add(syllables[(ids // 100 ** place) % 100], words)
    return words


def msmarco_corpus(*, out_dir: str, num_passages: int = MSMARCO_PASSAGES, train_queries: int = 502_939,
                   dev_queries: int = 6_980, d2q_per_passage: int = 20, num_topics: int = 4_096,
                   topic_words: int = 200, background_words: int = 2_000, background: float = 0.3,
                   query_words: int = 4, lengths_from: Optional[str] = None, seed: int = 0) -> dict:
    """See the module docstring. Query ids are 'q{passage}' (training) and 'v{passage}' (dev), passage ids the
    passage's index, so a file's rows name where they come from."""
    if num_passages < 2 or train_queries + dev_queries > num_passages or min(train_queries, dev_queries) < 0:
        raise ValueError(f"need 2 <= num_passages and train_queries + dev_queries <= num_passages, got "
                         f"{num_passages}, {train_queries} and {dev_queries}")
    if num_topics < 2 or query_words < 1 or d2q_per_passage < 0 or not 0 <= background < 1:
        raise ValueError("need num_topics >= 2, query_words >= 1, d2q_per_passage >= 0 and 0 <= background < 1")
    out = pathlib.Path(out_dir)
    if (out / "collection.tsv").exists():
        raise FileExistsError(f"{out / 'collection.tsv'} exists: choose a new --out_dir")
    out.mkdir(parents=True, exist_ok=True)
    words = _syllable_words(num_topics * topic_words + background_words)
    zipf = 1.0 / np.arange(1, topic_words + 1)
    zipf /= zipf.sum()
    lengths_of = _length_sampler(lengths_from)
    # Which passages have a training or a dev query: distinct, seeded, in passage order.
    chosen = np.random.default_rng([seed, 1]).choice(num_passages, size=train_queries + dev_queries, replace=False)
    query_kind = dict(zip(chosen.tolist(), ["q"] * train_queries + ["v"] * dev_queries))
    files = {name: open(out / f".{name}.tmp", "w", encoding="utf-8", newline="\n")
             for name in ("collection.tsv", "queries.train.tsv", "queries.dev.tsv", "qrels.train.tsv",
                          "qrels.dev.tsv", "d2q.tsv")}
    total_words = 0
    try:
        for start in range(0, num_passages, _BLOCK):
            block = np.arange(start, min(start + _BLOCK, num_passages))
            block_index = start // _BLOCK
            n = len(block)

            def rngs(stream: int) -> np.random.Generator:
                """One generator per block and per quantity: the first m draws of a block do not depend on n."""
                return np.random.default_rng([seed, stream, block_index])

            topics = rngs(2).integers(num_topics, size=n)
            lengths = lengths_of(rngs(3), n)
            # Each passage's words: from its topic's (Zipf) or, with probability `background`, a common word.
            owner = np.repeat(np.arange(n), lengths)
            topical = topics[owner] * topic_words + rngs(4).choice(topic_words, size=owner.size, p=zipf)
            common = num_topics * topic_words + rngs(5).integers(background_words, size=owner.size)
            ids = np.where(rngs(6).random(owner.size) < background, common, topical)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            total_words += int(lengths.sum())
            # Queries (training, dev, D2Q alike): query_words of the passage's words and one of another topic.
            per_passage = 1 + d2q_per_passage
            picks = offsets[:-1, None, None] + (rngs(7).random((n, per_passage, query_words))
                                                * lengths[:, None, None]).astype(np.int64)
            other = (topics[:, None] + 1 + rngs(8).integers(num_topics - 1, size=(n, per_passage))) % num_topics
            noise = other * topic_words + rngs(9).choice(topic_words, size=(n, per_passage), p=zipf)
            slot = rngs(10).integers(query_words + 1, size=(n, per_passage))
            # [n, per_passage, query_words + 1] word ids: the picked words with the other topic's at `slot`.
            position = np.arange(query_words + 1)
            from_pick = np.clip(position - (position > slot[..., None]), 0, query_words - 1)
            query_ids = np.where(position == slot[..., None], noise[..., None],
                                 np.take_along_axis(ids[picks], from_pick, axis=-1))
            tokens = words[ids].tolist()
            query_tokens = words[query_ids].tolist()
            for i, pid in enumerate(block.tolist()):
                text = " ".join(tokens[offsets[i]:offsets[i + 1]])
                files["collection.tsv"].write(f"{pid}\t{text}\n")
                queries = [" ".join(query) for query in query_tokens[i]]
                files["d2q.tsv"].write("\t".join(queries[1:]) + "\n")
                kind = query_kind.get(pid)
                if kind is not None:
                    split = "train" if kind == "q" else "dev"
                    files[f"queries.{split}.tsv"].write(f"{kind}{pid}\t{queries[0]}\n")
                    files[f"qrels.{split}.tsv"].write(f"{kind}{pid}\t0\t{pid}\t1\n")
    finally:
        for f in files.values():
            f.close()
    for name in files:
        (out / f".{name}.tmp").replace(out / name)
    return {"out_dir": out_dir, "passages": num_passages, "train_queries": train_queries,
            "dev_queries": dev_queries, "d2q_per_passage": d2q_per_passage, "topics": num_topics,
            "mean_words": total_words / num_passages,
            "bytes": {name: (out / name).stat().st_size for name in files}}


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
    msmarco = sub.add_parser("msmarco")
    msmarco.add_argument("--out_dir", required=True)
    msmarco.add_argument("--num_passages", type=int, default=MSMARCO_PASSAGES)
    msmarco.add_argument("--train_queries", type=int, default=502_939)
    msmarco.add_argument("--dev_queries", type=int, default=6_980)
    msmarco.add_argument("--d2q_per_passage", type=int, default=20)
    msmarco.add_argument("--num_topics", type=int, default=4_096)
    msmarco.add_argument("--lengths_from", default=None,
                         help="a collection.tsv whose passages' word counts to draw from (default: the log-normal "
                              "of msmarco_mini's)")
    msmarco.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.corpus == "msmarco":
        return run_tool(lambda: msmarco_corpus(
            out_dir=args.out_dir, num_passages=args.num_passages, train_queries=args.train_queries,
            dev_queries=args.dev_queries, d2q_per_passage=args.d2q_per_passage, num_topics=args.num_topics,
            lengths_from=args.lengths_from, seed=args.seed))
    if args.corpus == "pairs":
        return run_tool(lambda: pairs_corpus(out_dir=args.out_dir, num_docs=args.num_docs,
                                             num_queries=args.num_queries, seed=args.seed))
    return run_tool(lambda: topics_corpus(out_dir=args.out_dir, num_docs=args.num_docs, num_topics=args.num_topics,
                                          doc_words=args.doc_words, query_words=args.query_words,
                                          dev_fraction=args.dev_fraction, train_queries=args.train_queries,
                                          seed=args.seed))


if __name__ == "__main__":
    main()
