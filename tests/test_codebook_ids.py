"""Codebook docids (residual k-means): codes against brute force, collisions, the token table by hand, the tool."""
import numpy as np
import pytest

from gr_jax.docids.codebook_ids import CodebookIds, build_codebook_ids, collision_indices
from gr_jax.docids import DocidSpace, DocidTable
from gr_jax.docids.schemes.codebook import codebook_docid_table
from gr_jax.vocabulary import EOS_ID, PAD_ID, load_vocabulary

from test_semantic_ids import HashedBagOfWords, blobs, topic_data_dir  # noqa: F401  (fixture)


def test_each_level_codes_the_nearest_centroid_of_the_residual_left_by_the_levels_before():
    points, labels = blobs(sizes=(40, 40, 40, 40), dim=8, seed=1)
    ids = build_codebook_ids(embeddings=points, levels=3, num_codes=4, seed=0)
    assert ids.codes.shape == (160, 3) and ids.codes.dtype == np.int32
    # Level 0 separates the four blobs.
    assert all(len(set(ids.codes[labels == b, 0].tolist())) == 1 for b in range(4))
    assert len(set(ids.codes[:, 0].tolist())) == 4
    # Brute force: replay the levels with the centroids as the means of each code's residuals; every document's code
    # is its residual's nearest centroid, and the residual norms are those reported, falling level by level.
    residual = points.astype(np.float64)
    norms = [np.linalg.norm(residual, axis=1).mean()]
    for level in range(3):
        codes = ids.codes[:, level]
        centroids = np.stack([residual[codes == c].mean(axis=0) for c in range(4)])
        distances = ((residual[:, None, :] - centroids[None]) ** 2).sum(-1)
        assert (distances[np.arange(160), codes] <= distances.min(axis=1) + 1e-3).all()
        residual = residual - centroids[codes]
        norms.append(np.linalg.norm(residual, axis=1).mean())
    np.testing.assert_allclose(ids.residual_norms, norms, rtol=1e-4)
    assert np.all(np.diff(ids.residual_norms) < 0)
    np.testing.assert_array_equal(build_codebook_ids(embeddings=points, levels=3, num_codes=4, seed=0).codes, ids.codes)


def test_collision_indices_number_the_documents_that_share_codes_in_order():
    codes = np.array([[1, 2], [0, 0], [1, 2], [3, 3], [1, 2], [0, 0]])
    assert collision_indices(codes).tolist() == [0, 0, 1, -1, 2, 1]
    ids = CodebookIds(codes=codes, collision=collision_indices(codes), num_codes=4, residual_norms=np.zeros(3))
    assert ids.max_collisions == 3
    stats = ids.stats.to_json()
    assert (stats["unique_paths"], stats["colliding_documents"], stats["largest_collision_group"]) == (3, 5, 3)


@pytest.mark.parametrize("shared", [False, True])
def test_codebook_table_by_hand(shared):
    codes = np.array([[1, 2], [0, 3], [1, 2]])
    ids = CodebookIds(codes=codes, collision=collision_indices(codes), num_codes=4, residual_norms=np.zeros(3))
    extended = codebook_docid_table(docids=["a", "b", "c"], ids=ids, vocab_size=100, shared_codes=shared)
    if shared:  # code c -> 100 + c at every level; collision j -> 104 + j
        expected = [[101, 102, 104, EOS_ID], [100, 103, EOS_ID, PAD_ID], [101, 102, 105, EOS_ID]]
        assert extended.num_extra_tokens == 4 + 2
    else:  # level l code c -> 100 + 4 l + c; collision j -> 108 + j
        expected = [[101, 106, 108, EOS_ID], [100, 107, EOS_ID, PAD_ID], [101, 106, 109, EOS_ID]]
        assert extended.num_extra_tokens == 8 + 2
    assert extended.table.tokens.tolist() == expected
    # Unique and prefix-free: the trie decodes every docid and nothing else.
    space = DocidSpace.from_table(extended.table, scheme="codebook", text_vocab_size=100)
    assert space.model_vocab_size <= extended.model_vocab_size
    unique = CodebookIds(codes=codes[:2], collision=collision_indices(codes[:2]), num_codes=4,
                         residual_norms=np.zeros(3))
    assert codebook_docid_table(docids=["a", "b"], ids=unique, vocab_size=100).table.max_length == 3  # no collision


def test_bad_codebook_arguments_are_refused():
    points = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="10 documents cannot be split into 16 codes"):
        build_codebook_ids(embeddings=points, levels=2, num_codes=16)
    with pytest.raises(ValueError, match="levels must be >= 1"):
        build_codebook_ids(embeddings=points, levels=0, num_codes=4)
    with pytest.raises(ValueError, match="codes must lie"):
        CodebookIds(codes=np.array([[4]]), collision=np.array([-1]), num_codes=4, residual_norms=np.zeros(2))


def test_tool_builds_the_codebook_table(topic_data_dir):  # noqa: F811
    from gr_jax.tools import semantic_ids as tool
    report = tool.build(data_dir=topic_data_dir, scheme="codebook", options=dict(seed=0, levels=3, codes=3),
                        embeddings_path=None, batch_size=32, encoder=HashedBagOfWords())
    table = DocidTable.load(topic_data_dir / "docids.codebook.tsv")
    vocabulary = load_vocabulary(topic_data_dir)
    assert report["num_docids"] == 120 and report["diagnostics"]["levels"] == 3
    assert (report["levels"], report["codes"], report["shared_codes"]) == (3, 3, False)
    content = table.tokens[(table.tokens != PAD_ID) & (table.tokens != EOS_ID)]
    assert content.min() >= vocabulary.vocab_size and content.max() < report["model_vocab_size"]
    # Three topics, three codes: the first level separates them (as the semantic ids' first digit does).
    first = table.tokens[:, 0]
    assert all(len(set(first[t::3].tolist())) == 1 for t in range(3)) and len(set(first.tolist())) == 3
