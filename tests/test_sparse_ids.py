"""Sparse-coded docids (SToICaL's ESCI setting): scikit-learn's OMP codes as our ids read them, against a plain OMP
loop, brute force over all supports and `sparse_encode` over the learnt dictionary; the order by |coefficient|;
collisions against a brute-force count; the table by hand; the tool's generic path, and a run's docid space reading
the table back."""
import collections
import itertools
import json
from collections.abc import Sequence

import numpy as np
import pytest
from sklearn.decomposition import MiniBatchDictionaryLearning, SparseCoder, sparse_encode

from gr_jax.docids import DocidTable, get_scheme
from gr_jax.docids.scheme import PrebuiltScheme
from gr_jax.docids.schemes.sparse import (SparseIds, build_sparse_ids, order_by_magnitude,
                                          sparse_codes, sparse_docid_table)
from gr_jax.vocabulary import EOS_ID, PAD_ID, load_vocabulary

from test_semantic_ids import HashedBagOfWords, topic_data_dir  # noqa: F401  (fixture)


def read_sparse_docid(tokens: Sequence[int] | np.ndarray, *, vocab_size: int,
                      num_atoms: int) -> tuple[tuple[int, ...], int | None]:
    """(atoms, collision index or None) of a sparse docid's tokens (EOS included; anything after it ignored):
    the inverse of `sparse_docid_table`'s layout, to check it."""
    tokens = [int(t) for t in tokens]
    if EOS_ID not in tokens:
        raise ValueError(f"{tokens} is no docid: it has no EOS ({EOS_ID})")
    content = tokens[:tokens.index(EOS_ID)]
    bad = [t for t in content if t < vocab_size]
    if bad or not content:
        raise ValueError(f"{tokens} is no sparse docid over a vocabulary of {vocab_size} pieces")
    collision = content[-1] - vocab_size - num_atoms if content[-1] >= vocab_size + num_atoms else None
    atoms = tuple(t - vocab_size for t in (content[:-1] if collision is not None else content))
    if any(a >= num_atoms for a in atoms):
        raise ValueError(f"{tokens}: a collision position before the last token")
    return atoms, collision


def unit_rows(vectors):
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def reference_omp(dictionary, signal, nonzeros):
    """OMP written plainly, one signal: the atom of largest |correlation| with the residual, then least squares."""
    chosen, coefficients = [], np.zeros(0)
    residual = signal.astype(np.float64)
    for _ in range(nonzeros):
        correlation = np.abs(dictionary @ residual)
        best = int(np.argmax(correlation))
        if best in chosen or correlation[best] ** 2 < np.finfo(np.float64).tiny:
            break
        chosen.append(best)
        coefficients = np.linalg.lstsq(dictionary[chosen].T, signal, rcond=None)[0]
        residual = signal - dictionary[chosen].T @ coefficients
    return chosen, coefficients


def omp_coder(dictionary, nonzeros):
    return SparseCoder(dictionary=dictionary, transform_algorithm="omp", transform_n_nonzero_coefs=nonzeros)


def prototypes(*, n: int, groups: int, dim: int, noise: float, seed: int) -> np.ndarray:
    """float32[n, dim]: n documents near `groups` random directions, so many share their sparse id."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((groups, dim))
    return (centres[rng.integers(0, groups, n)] + noise * rng.standard_normal((n, dim))).astype(np.float32)


def test_codes_by_hand_on_an_orthonormal_dictionary():
    atoms, coefficients, relative = sparse_codes(coder=omp_coder(np.eye(4), 3),
                                                 embeddings=np.array([[0.5, -3.0, 0.0, 2.0]]), nonzeros=3)
    assert atoms.tolist() == [[1, 3, 0]] and coefficients.tolist() == [[-3.0, 2.0, 0.5]]
    assert relative.tolist() == [0.0]
    # Two atoms explain [1, -1, 0, 0] exactly: OMP stops after them (-1, coefficient 0); the tie goes to atom 0.
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning, match="prematurely"):
        atoms, coefficients, _ = sparse_codes(coder=omp_coder(np.eye(4), 3),
                                              embeddings=np.array([[1.0, -1.0, 0.0, 0.0]]), nonzeros=3)
    assert atoms.tolist() == [[0, 1, -1]] and coefficients.tolist() == [[1.0, -1.0, 0.0]]


def test_codes_match_a_plain_omp_loop_on_an_overcomplete_dictionary():
    rng = np.random.default_rng(0)
    dictionary = unit_rows(rng.standard_normal((12, 8)))
    signals = rng.standard_normal((60, 8))
    atoms, coefficients, _ = sparse_codes(coder=omp_coder(dictionary, 3), embeddings=signals, nonzeros=3)
    for row in range(60):
        chosen, expected = reference_omp(dictionary, signals[row], 3)
        order = sorted(range(3), key=lambda j: (-abs(expected[j]), chosen[j]))
        assert atoms[row].tolist() == [chosen[j] for j in order]
        np.testing.assert_allclose(coefficients[row], [expected[j] for j in order], rtol=1e-10, atol=1e-12)


def test_codes_recover_the_best_support_of_brute_force():
    """3-sparse signals over a nearly orthogonal dictionary: of all 220 three-atom supports the one with the least
    squares residual is the true support, with residual 0, and the scheme's OMP codes find it with its
    coefficients."""
    rng = np.random.default_rng(1)
    basis = np.linalg.qr(rng.standard_normal((32, 32)))[0][:12]
    dictionary = unit_rows(basis + 0.05 * rng.standard_normal((12, 32)))
    for _ in range(20):
        support = rng.choice(12, size=3, replace=False)
        weights = rng.uniform(1, 2, 3) * rng.choice([-1, 1], 3)
        signal = weights @ dictionary[support]
        fits = {}
        for candidate in itertools.combinations(range(12), 3):
            solution = np.linalg.lstsq(dictionary[list(candidate)].T, signal, rcond=None)
            fits[candidate] = (np.linalg.norm(signal - dictionary[list(candidate)].T @ solution[0]), solution[0])
        best = min(fits, key=lambda c: fits[c][0])
        assert best == tuple(sorted(support)) and fits[best][0] < 1e-9
        atoms, coefficients, _ = sparse_codes(coder=omp_coder(dictionary, 3), embeddings=signal[None], nonzeros=3)
        assert sorted(atoms[0].tolist()) == list(best)
        by_atom = dict(zip(atoms[0].tolist(), coefficients[0]))
        np.testing.assert_allclose([by_atom[a] for a in best], fits[best][1], atol=1e-9)
        assert np.all(np.diff(np.abs(coefficients[0])) <= 0)


def test_ids_are_scikit_learns_omp_codes_of_its_learnt_dictionary_by_absolute_coefficient():
    points = np.random.default_rng(3).standard_normal((200, 16)).astype(np.float32)
    ids = build_sparse_ids(embeddings=points, atoms=24, nonzeros=3, iterations=1, seed=0)
    assert ids.atoms.shape == (200, 3) and ids.atoms.dtype == np.int32
    # The dictionary is scikit-learn's, learnt with the paper's parameters and ours.
    learner = MiniBatchDictionaryLearning(n_components=24, transform_algorithm="omp", transform_n_nonzero_coefs=3,
                                          max_iter=1, random_state=0).fit(points)
    np.testing.assert_array_equal(ids.dictionary, learner.components_)
    assert (ids.fit_passes, ids.fit_steps) == (learner.n_iter_, learner.n_steps_)
    # The ids are the non-zero entries of sparse_encode's OMP codes over it, by |coefficient| (ties: the lower atom).
    codes = sparse_encode(points, learner.components_, algorithm="omp", n_nonzero_coefs=3)
    assert (np.count_nonzero(codes, axis=1) == 3).all()
    for row in range(200):
        expected = sorted(np.flatnonzero(codes[row]), key=lambda a: (-abs(codes[row, a]), a))
        assert ids.id_of(row) == tuple(expected)
        np.testing.assert_allclose(ids.coefficients[row], codes[row, expected], rtol=1e-6)
    magnitudes = np.abs(ids.coefficients)
    assert (magnitudes[:, :-1] >= magnitudes[:, 1:]).all() and (magnitudes > 0).all()
    # ... and OMP's: a plain loop over the learnt dictionary chooses the same atoms.
    for row in range(0, 200, 5):
        chosen, _ = reference_omp(ids.dictionary, points[row].astype(np.float64), 3)
        assert set(ids.id_of(row)) == set(chosen)
    # Learning fits the dictionary: on the other documents its codes leave less than those of as many documents
    # drawn as atoms.
    drawn = np.random.default_rng(0).choice(200, size=24, replace=False)
    others = points[np.setdiff1d(np.arange(200), drawn)]
    _, _, drawn_relative = sparse_codes(coder=omp_coder(unit_rows(points[drawn].astype(np.float64)), 3),
                                        embeddings=others, nonzeros=3)
    _, _, learnt_relative = sparse_codes(coder=omp_coder(ids.dictionary, 3), embeddings=others, nonzeros=3)
    assert 0 < learnt_relative.mean() < drawn_relative.mean()
    relative = np.linalg.norm(points - codes @ ids.dictionary, axis=1) / np.linalg.norm(points, axis=1)
    np.testing.assert_allclose(ids.relative_residual, relative.mean(), rtol=1e-5)
    again = build_sparse_ids(embeddings=points.copy(), atoms=24, nonzeros=3, iterations=1, seed=0)
    np.testing.assert_array_equal(again.atoms, ids.atoms)
    np.testing.assert_array_equal(again.dictionary, ids.dictionary)
    assert not np.array_equal(build_sparse_ids(embeddings=points, atoms=24, nonzeros=3, iterations=1,
                                               seed=1).atoms, ids.atoms)


def test_alpha_one_on_unit_norm_embeddings_gives_zero_fit_codes():
    """What the module docstring says of scikit-learn's default alpha: no atom of norm <= 1 correlates with a unit-norm
    document by more than 1, so every lasso code of the fit is zero over the dictionary (the fit learns from no
    mini-batch after the first); at alpha 0.1 the fit's codes are not."""
    points = unit_rows(prototypes(n=200, groups=20, dim=16, noise=0.3, seed=6).astype(np.float64)).astype(np.float32)
    ids = build_sparse_ids(embeddings=points, atoms=12, nonzeros=3, alpha=1.0, iterations=1, seed=0)
    assert (np.linalg.norm(ids.dictionary, axis=1) <= 1 + 1e-6).all()
    assert not sparse_encode(points, ids.dictionary, algorithm="lasso_lars", alpha=1.0).any()
    learnt = build_sparse_ids(embeddings=points, atoms=12, nonzeros=3, alpha=0.1, iterations=1, seed=0)
    assert (np.count_nonzero(sparse_encode(points, learnt.dictionary, algorithm="lasso_lars", alpha=0.1),
                             axis=1) > 0).all()


def test_ties_go_to_the_lower_atom_and_zero_coefficients_are_no_entry():
    codes = np.array([[0.0, -0.5, 2.0, 0.0, 0.5], [0.0, 0.0, 0.0, 1.0, 0.0]])
    ordered, magnitudes = order_by_magnitude(codes, nonzeros=3)
    assert ordered.tolist() == [[2, 1, 4], [3, -1, -1]]
    assert magnitudes.tolist() == [[2.0, -0.5, 0.5], [1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="code of row 1 has 3 non-zeros, more than 2"):
        order_by_magnitude(np.array([[1.0, 0, 0], [1.0, 2.0, 3.0]]), nonzeros=2)


def test_collisions_are_counted_as_brute_force_and_every_docid_is_unique():
    points = prototypes(n=300, groups=5, dim=16, noise=0.01, seed=4)
    ids = build_sparse_ids(embeddings=points, atoms=8, nonzeros=2, iterations=1, seed=0)
    groups = collections.defaultdict(list)
    for row in range(300):
        groups[ids.id_of(row)].append(row)
    shared = {key: rows for key, rows in groups.items() if len(rows) > 1}
    assert shared  # the test needs collisions
    stats = ids.stats
    assert stats.unique_ids == len(groups) and stats.collision_groups == len(shared)
    assert stats.colliding_documents == sum(map(len, shared.values()))
    assert stats.largest_collision_group == max(map(len, shared.values()))
    assert stats.distinct_atom_sets == len({frozenset(key) for key in groups})
    expected = np.full(300, -1)
    for rows in shared.values():
        expected[rows] = np.arange(len(rows))
    np.testing.assert_array_equal(ids.collision, expected)
    extended = sparse_docid_table(docids=[f"d{i}" for i in range(300)], ids=ids, vocab_size=50)
    assert len({tuple(row) for row in extended.table.tokens.tolist()}) == 300
    assert extended.num_extra_tokens == 8 + stats.largest_collision_group
    for row in range(300):
        collision = None if ids.collision[row] < 0 else int(ids.collision[row])
        assert read_sparse_docid(extended.table.tokens[row], vocab_size=50, num_atoms=8) == (ids.id_of(row), collision)


def test_table_by_hand():
    ids = SparseIds(atoms=np.array([[3, 1, 4], [2, 0, 1], [2, 0, 1], [3, 1, -1]], np.int32),
                    coefficients=np.array([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0], [-3.0, 2.0, 1.0], [2.0, 1.0, 0.0]]),
                    collision=np.array([-1, 0, 1, -1], np.int32), num_atoms=5, dictionary=np.eye(5))
    extended = sparse_docid_table(docids=["a", "b", "c", "d"], ids=ids, vocab_size=100)
    assert extended.table.tokens.tolist() == [
        [103, 101, 104, EOS_ID, PAD_ID],
        [102, 100, 101, 105, EOS_ID],  # atoms, then collision position 0: 100 + 5 + 0
        [102, 100, 101, 106, EOS_ID],
        [103, 101, EOS_ID, PAD_ID, PAD_ID],  # OMP stopped after two atoms
    ]
    assert extended.num_extra_tokens == 7 and extended.model_vocab_size == 107
    assert read_sparse_docid([102, 100, 101, 106, EOS_ID, PAD_ID], vocab_size=100, num_atoms=5) == ((2, 0, 1), 1)
    assert read_sparse_docid([103, 101, EOS_ID], vocab_size=100, num_atoms=5) == ((3, 1), None)
    unique = SparseIds(atoms=ids.atoms[:2], coefficients=ids.coefficients[:2], collision=np.array([-1, -1], np.int32),
                       num_atoms=5, dictionary=np.eye(5))
    assert sparse_docid_table(docids=["a", "b"], ids=unique, vocab_size=100).table.max_length == 4
    with pytest.raises(ValueError, match="2 docids for 4"):
        sparse_docid_table(docids=["a", "b"], ids=ids, vocab_size=100)


def test_bad_settings_and_embeddings_are_refused():
    points = np.random.default_rng(5).standard_normal((10, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="need 1 <= nonzeros <= atoms, got nonzeros=4, atoms=3"):
        build_sparse_ids(embeddings=points, atoms=3, nonzeros=4)
    with pytest.raises(ValueError, match="10 documents cannot start a dictionary of 11 atoms"):
        build_sparse_ids(embeddings=points, atoms=11, nonzeros=3)
    points[7] = 0
    with pytest.raises(ValueError, match="embedding row 7 is zero"):
        build_sparse_ids(embeddings=points, atoms=4, nonzeros=2)


def test_the_tool_writes_the_table_and_a_runs_docid_space_reads_it(topic_data_dir, capsys):  # noqa: F811
    """Through the tool's generic path (no scheme named in it) with a fake encoder; then the docid space a run builds
    from `docids.sparse.tsv`, whose trie decodes every docid back to its document."""
    from gr_jax.tasks.docid_space import load_docid_space
    from gr_jax.tools import semantic_ids as tool

    assert isinstance(get_scheme("sparse"), PrebuiltScheme)
    options = tool.scheme_options()
    assert options["atoms"].schemes == options["nonzeros"].schemes == options["alpha"].schemes == {"sparse"}
    assert "sparse" in options["seed"].schemes
    args, given = tool._parse_args(["--data_dir", str(topic_data_dir), "--scheme", "sparse", "--atoms", "8",
                                    "--nonzeros", "2", "--alpha", "0.5"])
    assert args.scheme == "sparse" and given == {"atoms": 8, "nonzeros": 2, "alpha": 0.5}

    report = tool.build(data_dir=topic_data_dir, scheme="sparse", options=dict(atoms=8, nonzeros=2, iterations=2),
                        embeddings_path=None, batch_size=32, encoder=HashedBagOfWords())
    assert json.loads(json.dumps(report)) == report
    assert (report["atoms"], report["nonzeros"], report["iterations"], report["seed"]) == (8, 2, 2, 0)
    table = DocidTable.load(topic_data_dir / "docids.sparse.tsv")
    assert table.docids == tuple(str(1000 + i) for i in range(120)) and report["num_docids"] == 120
    vocabulary = load_vocabulary(topic_data_dir)
    # The table is that of the scheme's ids of the same embeddings.
    texts = [line.split("\t")[1] for line in (topic_data_dir / "collection.tsv").read_text().splitlines()]
    ids = build_sparse_ids(embeddings=HashedBagOfWords()(texts), atoms=8, nonzeros=2, iterations=2, seed=0)
    np.testing.assert_array_equal(table.tokens, sparse_docid_table(docids=table.docids, ids=ids,
                                                                   vocab_size=vocabulary.vocab_size).table.tokens)
    # Collisions in the report, counted from the written table: documents whose atoms another document has.
    atoms = [read_sparse_docid(row, vocab_size=vocabulary.vocab_size, num_atoms=8)[0] for row in table.tokens]
    counts = collections.Counter(atoms)
    diagnostics = report["diagnostics"]
    assert diagnostics["colliding_documents"] == sum(n for n in counts.values() if n > 1) > 0
    assert diagnostics["collision_groups"] == sum(1 for n in counts.values() if n > 1)
    assert diagnostics["largest_collision_group"] == max(counts.values())
    assert report["num_extra_tokens"] == 8 + max(counts.values())
    assert report["model_vocab_size"] == vocabulary.vocab_size + report["num_extra_tokens"]

    space = load_docid_space(data_dir=topic_data_dir, docid_scheme="sparse")
    assert space.scheme == "sparse" and space.table.docids == table.docids
    np.testing.assert_array_equal(space.table.tokens, table.tokens)
    assert space.docid_token_range[0] >= vocabulary.vocab_size
    assert space.docid_token_range[1] <= space.model_vocab_size
    np.testing.assert_array_equal(np.asarray(space.trie.leaf_indices(table.tokens)), np.arange(120))
    assert [space.table.lookup(row) for row in table.tokens] == list(table.docids)
