"""Semantic / 2D semantic / atomic docids: hierarchical k-means ids, their token tables, and the build tool."""
import collections
import json
import pathlib
import zlib

import faiss
import numpy as np
import pytest

from gr_jax.docids import DocidSpace, DocidTable
from gr_jax.docids.schemes.atomic import atomic_docid_table
from gr_jax.docids.schemes.semantic import digit_token_ids, semantic_docid_table
from gr_jax.docids.schemes.semantic2d import semantic_2d_docid_table
from gr_jax.docids.semantic_ids import SemanticIds, build_semantic_ids
from gr_jax.encoders.collection import embed_texts
from gr_jax.vocabulary import EOS_ID, PAD_ID, load_vocabulary, train_sentencepiece

DIGIT_TOKENS = list(range(10, 20))  # token of digit d is 10 + d


def blobs(*, sizes: tuple[int, ...], dim: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """float32[sum(sizes), dim] points around well-separated centres (distance 100, noise 1), and each blob label."""
    rng = np.random.default_rng(seed)
    centres = np.eye(len(sizes), dim) * 100.0
    labels = np.repeat(np.arange(len(sizes)), sizes)
    points = centres[labels] + rng.standard_normal((labels.size, dim))
    order = rng.permutation(labels.size)  # interleave the blobs in document order
    return points[order].astype(np.float32), labels[order]


def leaves(ids: SemanticIds) -> dict[tuple[int, ...], list[int]]:
    """Brute force: path -> documents in it, in document order."""
    groups: dict[tuple[int, ...], list[int]] = collections.defaultdict(list)
    for row in range(len(ids)):
        groups[ids.id_of(row)[:-1]].append(row)
    return groups


def check_tree(ids: SemanticIds, *, c: int) -> None:
    """Every leaf holds at most c documents numbered 0..size-1 in document order; ids are unique."""
    groups = leaves(ids)
    for path, rows in groups.items():
        assert len(rows) <= c, (path, len(rows))
        assert ids.leaf_position[rows].tolist() == list(range(len(rows)))
    all_ids = [ids.id_of(row) for row in range(len(ids))]
    assert len(set(all_ids)) == len(all_ids)
    assert all(0 <= digit < ids.k for i in all_ids for digit in i[:-1])
    stats = ids.stats
    assert stats.collisions == 0
    assert stats.num_leaves == len(groups)
    assert stats.largest_leaf == max(map(len, groups.values()))
    assert stats.num_documents == len(ids)
    assert stats.depth_histogram == dict(sorted(collections.Counter(len(p) for p in
                                                                    (i[:-1] for i in all_ids)).items()))
    internal = {path[:level] for path in groups for level in range(len(path))}
    assert stats.num_internal_nodes == len(internal)


def test_first_digit_separates_well_separated_blobs():
    points, labels = blobs(sizes=(150, 220, 130))
    ids = build_semantic_ids(embeddings=points, k=3, c=100, seed=0)
    first = ids.path[:, 0]
    # Each blob is exactly one first-level cluster, and the clusters are distinct.
    digit_of_blob = [set(first[labels == blob].tolist()) for blob in range(3)]
    assert all(len(digits) == 1 for digits in digit_of_blob)
    assert len(set.union(*digit_of_blob)) == 3
    check_tree(ids, c=100)
    assert ids.stats.depth_histogram == {2: 500}  # every blob (> 100 documents) is split once more
    assert ids.stats.position_splits == 0 and ids.stats.sampled_fits == 0


def test_blobs_are_pure_at_the_first_level_with_more_clusters_than_blobs():
    points, labels = blobs(sizes=(300, 300, 300), seed=1)
    ids = build_semantic_ids(embeddings=points, k=10, c=100, seed=0)
    for digit in np.unique(ids.path[:, 0]):
        assert len(set(labels[ids.path[:, 0] == digit].tolist())) == 1
    check_tree(ids, c=100)


@pytest.mark.parametrize("k,c", [(10, 100), (4, 7), (2, 1)])
def test_leaves_hold_at_most_c_documents_and_ids_are_unique(k, c):
    points = np.random.default_rng(3).standard_normal((1200, 16)).astype(np.float32)
    ids = build_semantic_ids(embeddings=points, k=k, c=c, seed=0)
    check_tree(ids, c=c)
    assert ids.stats.max_depth >= int(np.ceil(np.log(1200 / c) / np.log(k)))  # a k-ary tree needs that depth
    # The stats counted during the build equal those recomputed from the ids alone.
    again = SemanticIds.from_ids([ids.id_of(row) for row in range(len(ids))], k=k, c=c)
    assert again.stats == ids.stats
    np.testing.assert_array_equal(again.codes(), ids.codes())


def test_same_seed_same_ids_other_seed_other_ids():
    points = np.random.default_rng(4).standard_normal((2000, 16)).astype(np.float32)
    a = build_semantic_ids(embeddings=points, k=10, c=20, seed=7)
    b = build_semantic_ids(embeddings=points.copy(), k=10, c=20, seed=7)
    other = build_semantic_ids(embeddings=points, k=10, c=20, seed=8)
    np.testing.assert_array_equal(a.codes(), b.codes())
    assert a.stats == b.stats
    assert not np.array_equal(a.codes(), other.codes())


def test_input_dtype_and_memmap_give_the_same_ids(tmp_path):
    points = np.random.default_rng(5).standard_normal((600, 8)).astype(np.float32)
    np.save(tmp_path / "e.npy", points)
    in_memory = build_semantic_ids(embeddings=points, k=5, c=30)
    mapped = build_semantic_ids(embeddings=np.load(tmp_path / "e.npy", mmap_mode="r"), k=5, c=30)
    as_float64 = build_semantic_ids(embeddings=points.astype(np.float64), k=5, c=30)
    np.testing.assert_array_equal(in_memory.codes(), mapped.codes())
    np.testing.assert_array_equal(in_memory.codes(), as_float64.codes())


def test_identical_vectors_are_split_by_position():
    ids = build_semantic_ids(embeddings=np.ones((1050, 4), np.float32), k=10, c=11, seed=0)
    check_tree(ids, c=11)
    # Root: 10 runs of 105 in document order; each run: 10 runs of 11 (the first five) or 10 documents.
    np.testing.assert_array_equal(ids.path[:, 0], np.arange(1050) * 10 // 1050)
    assert ids.id_of(0) == (0, 0, 0) and ids.id_of(10) == (0, 0, 10) and ids.id_of(11) == (0, 1, 0)
    assert ids.id_of(104) == (0, 9, 9) and ids.id_of(105) == (1, 0, 0) and ids.id_of(1049) == (9, 9, 9)
    assert ids.stats.position_splits == 11 and ids.stats.depth_histogram == {2: 1050}


def test_two_duplicated_points_are_separated_then_split_by_position():
    points = np.repeat(np.array([[0.0, 0.0], [5.0, 5.0]], np.float32), 300, axis=0)
    ids = build_semantic_ids(embeddings=points, k=10, c=50, seed=0)
    check_tree(ids, c=50)
    first = ids.path[:, 0]
    assert len(set(first[:300].tolist())) == 1 and len(set(first[300:].tolist())) == 1 and first[0] != first[300]
    assert ids.stats.position_splits == 2


def test_fewer_documents_than_clusters_but_more_than_c():
    ids = build_semantic_ids(embeddings=np.random.default_rng(0).standard_normal((7, 3)).astype(np.float32), k=10,
                             c=5)
    assert [ids.id_of(row) for row in range(7)] == [(0, 0), (1, 0), (2, 0), (4, 0), (5, 0), (7, 0), (8, 0)]


def test_a_collection_that_fits_in_one_leaf_has_depth_zero():
    ids = build_semantic_ids(embeddings=np.zeros((5, 3), np.float32), k=10, c=100)
    assert [ids.id_of(row) for row in range(5)] == [(0,), (1,), (2,), (3,), (4,)]
    assert ids.max_depth == 0 and ids.stats.depth_histogram == {0: 5} and ids.stats.num_internal_nodes == 0
    table = semantic_docid_table(docids=list("abcde"), ids=ids, digit_tokens=DIGIT_TOKENS)
    assert table.tokens.tolist()[3] == [10, 13, EOS_ID]


def test_large_clusters_are_fit_on_a_sample(monkeypatch):
    fit_sizes = []
    train = faiss.Kmeans.train

    def recording_train(self, x, *args, **kwargs):
        fit_sizes.append(x.shape[0])
        return train(self, x, *args, **kwargs)

    monkeypatch.setattr(faiss.Kmeans, "train", recording_train)
    points, labels = blobs(sizes=(400, 350, 250), seed=2)
    ids = build_semantic_ids(embeddings=points, k=3, c=100, seed=0, sample_above=300, sample_size=120)
    # The root (1000) and the two blobs above 300 documents are fit on 120 points; the 250-blob on all of them.
    assert fit_sizes[0] == 120 and max(fit_sizes) == 250 and 250 in fit_sizes
    assert ids.stats.sampled_fits == 3
    for blob in range(3):  # every document is still assigned: the blobs stay separated
        assert len(set(ids.path[labels == blob, 0].tolist())) == 1
    check_tree(ids, c=100)


def test_bad_embeddings_and_parameters_are_refused():
    points = np.zeros((20, 4), np.float32)
    points[13, 2] = np.nan
    with pytest.raises(ValueError, match="embedding row 13 has a NaN"):
        build_semantic_ids(embeddings=points)
    with pytest.raises(ValueError, match="non-empty matrix"):
        build_semantic_ids(embeddings=np.zeros((0, 4), np.float32))
    with pytest.raises(ValueError, match="floating point"):
        build_semantic_ids(embeddings=np.zeros((3, 4), np.int32))
    with pytest.raises(ValueError, match="k .* must be >= 2"):
        build_semantic_ids(embeddings=np.zeros((3, 4), np.float32), k=1)
    with pytest.raises(ValueError, match="sample_size <= sample_above"):
        build_semantic_ids(embeddings=np.zeros((3, 4), np.float32), sample_above=10, sample_size=20)


HAND_IDS = [(3, 0, 7, 42), (3, 1, 5), (9, 0)]


def _model_vocab_size(table: DocidTable, *, vocab_size: int) -> int:
    """The token ids a model needs for `table` over `vocab_size` pieces (read back from its file, a table does not
    record how many tokens its scheme appended): its docid space's."""
    return DocidSpace.from_table(table, scheme="any", text_vocab_size=vocab_size).model_vocab_size


def test_semantic_table_through_digit_pieces_by_hand():
    ids = SemanticIds.from_ids(HAND_IDS, k=10, c=100)
    table = semantic_docid_table(docids=["d1", "d2", "d3"], ids=ids, digit_tokens=DIGIT_TOKENS)
    assert table.tokens.tolist() == [
        [13, 10, 17, 14, 12, EOS_ID],  # 3 0 7 | 42
        [13, 11, 10, 15, EOS_ID, PAD_ID],  # 3 1 | 05: the leaf position always takes two digits (c = 100)
        [19, 10, 10, EOS_ID, PAD_ID, PAD_ID],  # 9 | 00
    ]
    assert table.lookup([13, 11, 10, 15, EOS_ID]) == "d2"


def test_semantic_table_with_multi_digit_levels_by_hand():
    ids = SemanticIds.from_ids([(11, 3, 7), (2, 0)], k=12, c=8)  # levels take 2 digits, the leaf position 1
    table = semantic_docid_table(docids=["a", "b"], ids=ids, digit_tokens=DIGIT_TOKENS)
    assert table.tokens.tolist() == [[11, 11, 10, 13, 17, EOS_ID], [10, 12, 10, EOS_ID, PAD_ID, PAD_ID]]


def test_semantic_2d_table_by_hand():
    ids = SemanticIds.from_ids(HAND_IDS, k=10, c=100)
    extended = semantic_2d_docid_table(docids=["d1", "d2", "d3"], ids=ids, vocab_size=1000)
    # value v at position p -> 1000 + 100 p + v (base = max(k, c) = 100)
    assert extended.table.tokens.tolist() == [
        [1003, 1100, 1207, 1342, EOS_ID],
        [1003, 1101, 1205, EOS_ID, PAD_ID],
        [1009, 1100, EOS_ID, PAD_ID, PAD_ID],
    ]
    assert extended.num_extra_tokens == 400 and extended.model_vocab_size == 1400
    assert _model_vocab_size(extended.table, vocab_size=1000) == 1343  # from the table alone: its largest token + 1
    # The same digit at different depths is a different token (unlike the digit-piece table).
    two = semantic_2d_docid_table(docids=["x", "y"], ids=SemanticIds.from_ids([(4, 4, 4), (4, 3)], k=5, c=5),
                                  vocab_size=50)
    assert two.table.tokens.tolist() == [[54, 59, 64, EOS_ID], [54, 58, EOS_ID, PAD_ID]]
    assert two.num_extra_tokens == 15


def test_atomic_table():
    extended = atomic_docid_table(docids=iter(["p7", "p3", "p9"]), vocab_size=100)
    assert extended.table.docids == ("p7", "p3", "p9")
    assert extended.table.tokens.tolist() == [[100, EOS_ID], [101, EOS_ID], [102, EOS_ID]]
    assert extended.num_extra_tokens == 3 and extended.model_vocab_size == 103
    assert extended.table.lookup([101, EOS_ID]) == "p3"
    assert _model_vocab_size(extended.table, vocab_size=100) == 103
    with pytest.raises(ValueError, match="vocab_size must be > 1"):
        atomic_docid_table(docids=["a"], vocab_size=1)
    with pytest.raises(ValueError, match="duplicate docid 'a'"):
        atomic_docid_table(docids=["a", "b", "a"], vocab_size=10)


def test_from_ids_refuses_bad_ids():
    with pytest.raises(ValueError, match=r"semantic id 1 \(3, 10, 0\): cluster digits must be in \[0, 10\)"):
        SemanticIds.from_ids([(1, 2), (3, 10, 0)], k=10, c=100)
    with pytest.raises(ValueError, match=r"leaf position in \[0, 5\)"):
        SemanticIds.from_ids([(1, 5)], k=10, c=5)
    with pytest.raises(ValueError, match="semantic ids 0 and 2 are equal"):
        SemanticIds.from_ids([(1, 2), (1, 3), (1, 2)], k=10, c=100)
    with pytest.raises(ValueError, match="semantic id 1 is empty"):
        SemanticIds.from_ids([(1, 2), ()], k=10, c=100)


def test_table_builders_check_their_arguments():
    ids = SemanticIds.from_ids(HAND_IDS, k=10, c=100)
    with pytest.raises(ValueError, match="2 docids for 3 semantic ids"):
        semantic_docid_table(docids=["a", "b"], ids=ids, digit_tokens=DIGIT_TOKENS)
    with pytest.raises(ValueError, match="10 distinct token ids other than PAD/EOS"):
        semantic_docid_table(docids=["a", "b", "c"], ids=ids, digit_tokens=[1, *DIGIT_TOKENS[1:]])


@pytest.fixture(scope="module")
def topic_data_dir(tmp_path_factory) -> pathlib.Path:
    """An MS MARCO-layout collection of 3 topics x 40 passages with disjoint words, and its vocabulary."""
    path = tmp_path_factory.mktemp("topics")
    topics = [["pasta", "basil", "tomato", "garlic"], ["striker", "league", "referee", "stadium"],
              ["orbit", "rocket", "planet", "comet"]]
    rng = np.random.default_rng(0)
    lines = []
    for i in range(120):
        words = rng.choice(topics[i % 3], size=12)
        lines.append(f"{1000 + i}\t{' '.join(words)} number {i}")
    (path / "collection.tsv").write_text("\n".join(lines) + "\n")
    # Queries-like extra text, so that SentencePiece has enough distinct pieces for a 300-piece vocabulary.
    extra = [f"which {a} is closest to the {b} of {c}?" for a in ("team", "dish", "moon", "market", "river")
             for b in ("kitchen", "field", "sky", "village", "harbour") for c in ("tuesday", "winter", "europe")]
    train_sentencepiece(texts=[line.split("\t")[1] for line in lines] * 3 + extra, model_path=path / "spm.model",
                        vocab_size=300)
    return path


class HashedBagOfWords:
    """A stand-in encoder: unit-norm counts of crc32-hashed words (what matters here is only that it is pluggable)."""

    dim = 256

    def __init__(self):
        self.calls = 0

    def __call__(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                if not word.isdigit():
                    out[row, zlib.crc32(word.encode()) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


@pytest.mark.parametrize("scheme", ["semantic", "semantic2d"])
def test_tool_builds_and_writes_the_table(topic_data_dir, scheme, capsys):
    from gr_jax.tools import semantic_ids as tool

    encoder = HashedBagOfWords()
    cache = topic_data_dir / f"embeddings.{scheme}.npy"
    # nredo=5: a single k-means++ start merges two of three separated topics about 1 time in 10.
    report = tool.build(data_dir=topic_data_dir, scheme=scheme, options=dict(k=3, c=10, seed=0, nredo=5),
                        embeddings_path=cache, batch_size=32, encoder=encoder)
    assert encoder.calls == 4  # 120 passages, 32 at a time
    assert not report["embeddings_cached"] and report["embed_documents_per_s"] > 0
    table = DocidTable.load(topic_data_dir / f"docids.{scheme}.tsv")
    assert table.docids == tuple(str(1000 + i) for i in range(120))
    vocabulary = load_vocabulary(topic_data_dir)
    assert report["num_docids"] == 120 and report["diagnostics"]["collisions"] == 0
    assert report["diagnostics"]["largest_leaf"] <= 10
    first_tokens = table.tokens[:, 0]
    for topic in range(3):  # the first level separates the three topics
        assert len(set(first_tokens[topic::3].tolist())) == 1
    assert len(set(first_tokens.tolist())) == 3
    if scheme == "semantic":
        digits = digit_token_ids(vocabulary)
        content = table.tokens[(table.tokens != PAD_ID) & (table.tokens != EOS_ID)]
        assert set(content.tolist()) <= set(digits)
        assert report["model_vocab_size"] == vocabulary.vocab_size
    else:
        assert table.tokens[:, 0].min() >= vocabulary.vocab_size
        assert report["model_vocab_size"] == vocabulary.vocab_size + report["num_extra_tokens"]
        assert _model_vocab_size(table, vocab_size=vocabulary.vocab_size) <= report["model_vocab_size"]
    # A second run reuses the embeddings cache (the encoder is not called) and writes the same table.
    again = HashedBagOfWords()
    report = tool.build(data_dir=topic_data_dir, scheme=scheme, options=dict(k=3, c=10, seed=0, nredo=5),
                        embeddings_path=cache, batch_size=32, encoder=again)
    assert again.calls == 0 and report["embeddings_cached"] and report["embed_documents_per_s"] is None
    np.testing.assert_array_equal(DocidTable.load(topic_data_dir / f"docids.{scheme}.tsv").tokens, table.tokens)


def test_tool_clusters_a_dense_runs_index_as_it_clusters_the_encoders_vectors(topic_data_dir, tmp_path):
    """--index_dir: the same vectors, read from a dense run's corpus index, give the same table; an index of other
    documents, or of them in another order, is refused."""
    from gr_jax.dense.index import EMBEDDINGS, CorpusIndex
    from gr_jax.tools import semantic_ids as tool

    options = dict(k=3, c=10, seed=0, nredo=5)
    tool.build(data_dir=topic_data_dir, scheme="semantic", options=options, embeddings_path=None, batch_size=32,
               encoder=HashedBagOfWords())
    expected = DocidTable.load(topic_data_dir / "docids.semantic.tsv")
    texts = [line.split("\t")[1] for line in (topic_data_dir / "collection.tsv").read_text().splitlines()]
    vectors = HashedBagOfWords()(texts)

    def index_dir(name, order):
        directory = tmp_path / name
        directory.mkdir()
        np.save(directory / EMBEDDINGS, vectors[order])
        CorpusIndex(docids=np.array([d.encode() for d in expected.docids])[order], embeddings=vectors[order],
                    manifest={"corpus": {"documents": len(order)}, "encoder": {"dim": HashedBagOfWords.dim}}
                    ).save(directory)
        return directory

    (topic_data_dir / "docids.semantic.tsv").unlink()
    report = tool.build(data_dir=topic_data_dir, scheme="semantic", options=options, embeddings_path=None,
                        batch_size=32, index_dir=index_dir("dense", np.arange(120)))
    assert report["index_dir"] == str(tmp_path / "dense")
    np.testing.assert_array_equal(DocidTable.load(topic_data_dir / "docids.semantic.tsv").tokens, expected.tokens)
    with pytest.raises(ValueError, match=r"manifest.json: its 120 documents are not .*collection.tsv's 120 in order "
                                         r"\(first difference at row 0\)"):
        tool.build(data_dir=topic_data_dir, scheme="semantic", options=options, embeddings_path=None, batch_size=32,
                   index_dir=index_dir("reversed", np.arange(120)[::-1]))


def test_document_vectors_tool_writes_the_index_vectors_in_collection_order(topic_data_dir, tmp_path, capsys):
    """tools/document_vectors: a dense index stored in collection order is written as it is; one in another order
    is refused and nothing is written."""
    from gr_jax.dense.index import EMBEDDINGS, CorpusIndex
    from gr_jax.tools import document_vectors as tool

    docids = [line.split("\t")[0] for line in (topic_data_dir / "collection.tsv").read_text().splitlines()]
    vectors = np.random.default_rng(0).normal(size=(len(docids), 6)).astype(np.float32)

    def index_dir(name, order):
        directory = tmp_path / name
        directory.mkdir()
        np.save(directory / EMBEDDINGS, vectors[order])
        CorpusIndex(docids=np.array([d.encode() for d in docids])[order], embeddings=vectors[order],
                    manifest={"corpus": {"documents": len(order)}, "encoder": {"dim": 6}}).save(directory)
        return str(directory)

    out = tmp_path / "vectors.npy"
    report = tool.main(["--data_dir", str(topic_data_dir), "--index_dir", index_dir("dense", np.arange(len(docids))),
                        "--out", str(out)])
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == report
    assert (report["documents"], report["dim"]) == (len(docids), 6)
    np.testing.assert_array_equal(np.load(out), vectors)
    out.unlink()
    with pytest.raises(SystemExit, match="first difference at row 0"):
        tool.main(["--data_dir", str(topic_data_dir), "--index_dir",
                   index_dir("reversed", np.arange(len(docids))[::-1]), "--out", str(out)])
    assert not out.exists()


def test_tool_main_prints_json_and_reports_errors(topic_data_dir, tmp_path, capsys):
    from gr_jax.tools import semantic_ids as tool

    report = tool.main(["--data_dir", str(topic_data_dir), "--scheme", "atomic", "--no_progress"])
    assert json.loads(capsys.readouterr().out) == report
    assert report["num_extra_tokens"] == 120 and report["max_length"] == 2
    with pytest.raises(SystemExit, match="error: .*no SentencePiece vocabulary"):
        (tmp_path / "collection.tsv").write_text("1\ta\n")
        tool.main(["--data_dir", str(tmp_path), "--scheme", "semantic"])


def test_digit_token_ids_of_a_sentencepiece_vocabulary(topic_data_dir):
    vocabulary = load_vocabulary(topic_data_dir)
    ids = digit_token_ids(vocabulary)
    assert [vocabulary.tokenizer.id_to_piece(i) for i in ids] == list("0123456789")
    assert digit_token_ids(vocabulary.tokenizer) == ids

    class NoSeven:
        def piece_to_id(self, piece):
            return 2 if piece == "7" else 40 + int(piece)

        def is_unknown(self, i):
            return i == 2

    with pytest.raises(ValueError, match=r"no piece for digit\(s\) \['7'\]"):
        digit_token_ids(NoSeven())


def test_embed_texts_streams_into_a_preallocated_matrix():
    encoder = HashedBagOfWords()
    texts = [f"word{i} other{i % 3}" for i in range(10)]
    out = np.full((10, 256), np.nan, np.float32)
    result = embed_texts(texts=iter(texts), encode=encoder, num_texts=10, dim=256, batch_size=4, out=out)
    assert result is out and encoder.calls == 3
    np.testing.assert_array_equal(out, HashedBagOfWords()(texts))
    with pytest.raises(ValueError, match="got 10 texts, expected num_texts=11"):
        embed_texts(texts=texts, encode=encoder, num_texts=11, dim=256)
    with pytest.raises(ValueError, match="more than num_texts=9"):
        embed_texts(texts=texts, encode=encoder, num_texts=9, dim=256)
    with pytest.raises(ValueError, match=r"encode returned shape \[10, 256\] for 10 texts, expected \[10, 32\]"):
        embed_texts(texts=texts, encode=encoder, num_texts=10, dim=32)


def test_schemes_are_listed():
    """The tool has no list of schemes: it writes every registered one, and the prebuilt ones bring their options."""
    from gr_jax import docids
    from gr_jax.docids.scheme import PrebuiltScheme
    from gr_jax.tools import semantic_ids as tool

    assert {"naive", "atomic", "semantic", "semantic2d", "codebook"} <= set(docids.SCHEMES)
    prebuilt = {name for name, scheme in docids.SCHEMES.items() if isinstance(scheme, PrebuiltScheme)}
    assert {"semantic", "semantic2d", "codebook"} <= prebuilt and not {"naive", "atomic"} & prebuilt
    options = tool.scheme_options()
    assert options["k"].schemes == options["nredo"].schemes == {"semantic", "semantic2d"}
    assert options["levels"].schemes == options["shared_codes"].schemes == {"codebook"}
    assert {"semantic", "semantic2d", "codebook"} <= options["seed"].schemes
    assert (options["k"].kind, options["shared_codes"].kind) == (int, bool)
    assert options["k"].help == "semantic, semantic2d: clusters per level (default: 10)"


def test_tool_takes_each_schemes_own_options(capsys):
    """Today's command lines parse to the chosen scheme's settings; an option of another scheme is an error."""
    from gr_jax.docids import get_scheme
    from gr_jax.docids.schemes.codebook import CodebookSettings
    from gr_jax.docids.schemes.semantic import SemanticSettings
    from gr_jax.tools import semantic_ids as tool

    args, options = tool._parse_args(["--data_dir", "d", "--scheme", "codebook", "--levels", "3", "--codes", "16",
                                      "--shared_codes"])
    assert args.scheme == "codebook" and options == {"levels": 3, "codes": 16, "shared_codes": True}
    assert get_scheme("codebook").settings(options) == CodebookSettings(levels=3, codes=16, shared_codes=True, seed=0)
    args, options = tool._parse_args(["--data_dir", "d", "--k", "3", "--c", "10", "--seed", "2", "--nredo", "5"])
    assert args.scheme == "semantic" and get_scheme("semantic").settings(options) == SemanticSettings(k=3, c=10, seed=2,
                                                                                                      nredo=5)
    assert tool._parse_args(["--data_dir", "d", "--scheme", "atomic"])[1] == {}
    with pytest.raises(SystemExit):
        tool._parse_args(["--data_dir", "d", "--scheme", "codebook", "--k", "3"])
    assert "--k: not an option of --scheme codebook (its options: --codes, --levels, --seed, --shared_codes)" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        tool._parse_args(["--data_dir", "d", "--scheme", "atomic", "--seed", "1"])
    assert "--seed: not an option of --scheme atomic (its options: none)" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"docid scheme 'semantic' has no option 'levels' \(its options: k, c, seed, "
                                         r"nredo\)"):
        get_scheme("semantic").settings({"levels": 2})


def test_scheme_options_refuse_one_name_with_two_types():
    import dataclasses

    from gr_jax.docids.scheme import PrebuiltScheme, option
    from gr_jax.tools import semantic_ids as tool

    def scheme(name: str, kind: type):
        settings = dataclasses.make_dataclass("Settings", [("seed", kind, option(kind(0), "a seed"))], frozen=True)
        return type(name, (PrebuiltScheme,), {"name": name, "settings_type": settings,
                                              "from_embeddings": lambda self, **kwargs: None})()

    merged = tool.scheme_options({"a": scheme("a", int), "b": scheme("b", int)})
    assert merged["seed"].schemes == {"a", "b"} and merged["seed"].help == "a, b: a seed (default: 0)"
    with pytest.raises(TypeError, match="option --seed has several types: a: int, b: float"):
        tool.scheme_options({"a": scheme("a", int), "b": scheme("b", float)})
