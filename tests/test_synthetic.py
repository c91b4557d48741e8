"""Synthetic corpora for the dense-vs-generative analyses, and the spectral tail of Eq. 14."""
import numpy as np
import pytest

from gr_jax.data.readers import open_dataset
from gr_jax.dense.spectral import free_embedding_recall, relevance_matrix, spectral_tail
from gr_jax.tools import synthetic


def test_spectral_tail_by_hand():
    assert spectral_tail(np.eye(4), [0, 1, 3, 4]) == pytest.approx({0: 1.0, 1: 0.75, 3: 0.25, 4: 0.0})
    rank_one = np.outer([1.0, 2.0, 3.0], [1.0, -1.0])
    assert spectral_tail(rank_one, [1])[1] == pytest.approx(0.0, abs=1e-12)
    # [[1, 1], [1, 0]]: singular values are the absolute eigenvalues (1 +- sqrt 5) / 2.
    small, large = (np.sqrt(5) - 1) / 2, (np.sqrt(5) + 1) / 2
    assert spectral_tail(np.array([[1.0, 1.0], [1.0, 0.0]]), [1])[1] == pytest.approx(small**2 / (small**2 + large**2))


def test_pairs_corpus_has_one_query_per_pair_relevant_to_exactly_it(tmp_path):
    summary = synthetic.pairs_corpus(out_dir=str(tmp_path / "p"), num_docs=6)
    data = open_dataset(tmp_path / "p")
    queries = list(data.queries("train"))
    assert len(queries) == 15 == summary["queries"] and queries == list(data.queries("dev"))
    qrels = data.qrels("train")
    assert sorted(tuple(sorted(map(int, qrels[qid]))) for qid, _ in queries) == [
        (a, b) for a in range(6) for b in range(a + 1, 6)]
    docids = [d for d, _ in data.collection()]
    matrix = relevance_matrix(qrels=qrels, qids=[q for q, _ in queries], docids=docids)
    assert matrix.sum(axis=1).tolist() == [2.0] * 15 and summary["relevance_rank"] == 6
    assert summary["spectral_tail"] == pytest.approx(spectral_tail(matrix, [1, 2, 4]))


def test_topic_corpora_are_nested_and_queries_come_from_their_document(tmp_path):
    synthetic.topics_corpus(out_dir=str(tmp_path / "small"), num_docs=30, num_topics=4, dev_fraction=0.5)
    synthetic.topics_corpus(out_dir=str(tmp_path / "large"), num_docs=60, num_topics=4, dev_fraction=0.5)
    small, large = open_dataset(tmp_path / "small"), open_dataset(tmp_path / "large")
    assert list(small.collection()) == list(large.collection())[:30]
    texts = dict(small.collection())
    qrels = {**small.qrels("train"), **small.qrels("dev")}
    train, dev = dict(small.queries("train")), dict(small.queries("dev"))
    assert len(train) == 30 and 0 < len(dev) < 30
    for qid, text in [*train.items(), *dev.items()]:
        (docid,) = qrels[qid]
        words = text.split()
        assert len(words) == 5 and sum(w in texts[docid].split() for w in words) >= 4
    for qid in dev:
        assert dev[qid] != train["t" + qid[1:]]
    with pytest.raises(FileExistsError):
        synthetic.topics_corpus(out_dir=str(tmp_path / "small"), num_docs=30, num_topics=4)
    # Several training queries per document: the first ones, the dev queries and the documents are unchanged.
    synthetic.topics_corpus(out_dir=str(tmp_path / "many"), num_docs=30, num_topics=4, dev_fraction=0.5,
                            train_queries=4)
    many = open_dataset(tmp_path / "many")
    many_train, many_qrels = dict(many.queries("train")), many.qrels("train")
    assert list(many.collection()) == list(small.collection()) and dict(many.queries("dev")) == dev
    assert len(many_train) == 120 and all(many_train[qid] == text for qid, text in train.items())
    for i in range(30):
        own = [many_train[f"t{i}"], *(many_train[f"t{i}_{j}"] for j in (1, 2, 3))]
        assert all(set(many_qrels[f"t{i}_{j}"]) == {f"doc{i}"} for j in (1, 2, 3)) and len(set(own)) > 1


def test_free_embedding_recall_reaches_what_rank_r_allows():
    import itertools
    pairs = np.zeros((10, 5))
    for i, (a, b) in enumerate(itertools.combinations(range(5), 2)):
        pairs[i, [a, b]] = 1.0
    # r = 5 = rank(S*): S = S* itself ranks every pair first. r = 1: s_ij = q_i d_j orders the documents by d_j for
    # every query, up or down, so at most 2 of the 10 pairs come out whole, the others at most half: <= 0.6.
    assert free_embedding_recall(pairs, rank=5) == 1.0
    assert 0.5 <= free_embedding_recall(pairs, rank=1) <= 0.6
    with pytest.raises(ValueError, match="relevant document"):
        free_embedding_recall(np.zeros((2, 3)), rank=1)


def test_low_rank_report_scores_each_runs_latest_trec_run_at_the_set_size(tmp_path):
    from gr_jax.evaluation import write_trec_run
    from gr_jax.tools import low_rank
    synthetic.pairs_corpus(out_dir=str(tmp_path / "p"), num_docs=5)
    data = open_dataset(tmp_path / "p")
    qrels = data.qrels("dev")
    perfect = {qid: [(d, 1.0) for d in judged] for qid, judged in qrels.items()}
    half = {qid: [(sorted(judged)[0], 1.0), (next(d for d in "01234" if d not in judged), 0.5)]
            for qid, judged in qrels.items()}
    for name, run, step in (("good", perfect, 7), ("half", half, 3), ("half", perfect, 1)):
        (tmp_path / name).mkdir(exist_ok=True)
        write_trec_run(tmp_path / name / f"run.dev.{step}.trec", run, tag="t")
    summary = low_rank.report(data_dir=str(tmp_path / "p"), dense={2: str(tmp_path / "half")},
                              generative=str(tmp_path / "good"), split="dev", out=str(tmp_path / "plot.png"))
    assert summary["k"] == 2 and summary["queries"] == 10 and summary["relevance_rank"] == 5
    assert summary["generative"] == 1.0 and summary["dense"][2]["recall"] == 0.5  # step 3's run, not step 1's
    assert (tmp_path / "plot.png").stat().st_size > 0
    both = low_rank.main(["--data_dir", str(tmp_path / "p"), "--dense", f"2={tmp_path / 'half'}",
                          "--dense", f"r4={tmp_path / 'good'}"])  # repeated flags add up
    assert {r: v["recall"] for r, v in both["dense"].items()} == {2: 0.5, 4: 1.0}
    assert both["dense"][4]["free_embedding_recall"] == 1.0  # rank 4 holds every pair of 5 documents
    assert both["dense"][2]["free_embedding_recall"] < 1.0  # in 2 dimensions 4 documents is the most (LIMIT)
    with pytest.raises(SystemExit):
        low_rank.main(["--data_dir", str(tmp_path / "p"), "--dense", f"2={tmp_path / 'half'}",
                       f"2={tmp_path / 'good'}"])


def test_msmarco_sized_corpora_are_nested_official_and_learnable(tmp_path, fixtures_dir):
    """The `msmarco` generator at 12,000 and 25,000 passages (blocks of 10,000: the smaller ends inside a block):
    the official layout, read back by the readers; the first passages and their D2Q queries of the larger corpus are
    the smaller corpus; MS MARCO's length distribution; every query judged relevant to the passage it came from,
    which BM25 (bm25s) finds."""
    import bm25s

    from gr_jax.data.d2q import read_d2q_file
    small, large = tmp_path / "small", tmp_path / "large"
    settings = dict(train_queries=300, dev_queries=100, d2q_per_passage=3, num_topics=64)
    summary = synthetic.msmarco_corpus(out_dir=str(small), num_passages=12_000, **settings)
    synthetic.msmarco_corpus(out_dir=str(large), num_passages=25_000, **settings)
    for name in ("collection.tsv", "d2q.tsv"):
        assert (large / name).read_text().splitlines()[:12_000] == (small / name).read_text().splitlines()
    data = open_dataset(small)
    docids, texts = zip(*data.collection())
    assert docids == tuple(str(i) for i in range(12_000))
    # msmarco_mini's passages: mean 56.4 words (the log-normal's clipped mean is within a word of it).
    assert summary["mean_words"] == pytest.approx(56.4, abs=1.5)
    d2q = read_d2q_file(small / "d2q.tsv", docids_in_order=docids)
    assert all(len(queries) == 3 and all(len(q.split()) == 5 for q in queries) for queries in d2q.values())
    for split, count in (("train", 300), ("dev", 100)):
        queries, qrels = list(data.queries(split)), data.qrels(split)
        assert len(queries) == count and all(qrels[qid] == {qid[1:]: 1} for qid, _ in queries)
    train = {qid[1:] for qid, _ in data.queries("train")}
    assert not train & {qid[1:] for qid, _ in data.queries("dev")}  # distinct passages
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(list(texts), show_progress=False), show_progress=False)
    dev, qrels = list(data.queries("dev")), data.qrels("dev")
    ranked, _ = retriever.retrieve(bm25s.tokenize([text for _, text in dev], show_progress=False), k=10,
                                   show_progress=False)
    mrr = np.mean([next((1 / (rank + 1) for rank, i in enumerate(row) if docids[i] in qrels[qid]), 0.0)
                   for (qid, _), row in zip(dev, ranked)])
    assert mrr > 0.6  # 0.90 when written: the queries are the passages' words
    # Word counts drawn from a given collection's passages instead.
    synthetic.msmarco_corpus(out_dir=str(tmp_path / "fixture_lengths"), num_passages=50, train_queries=5,
                             dev_queries=5, d2q_per_passage=1, num_topics=4,
                             lengths_from=str(fixtures_dir / "tasks" / "collection.tsv"))
    allowed = {len(text.split()) for _, text in open_dataset(fixtures_dir / "tasks").collection()}
    lengths = {len(text.split()) for _, text in open_dataset(tmp_path / "fixture_lengths").collection()}
    assert lengths <= allowed and len(lengths) > 1
