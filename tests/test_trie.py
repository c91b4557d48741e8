"""Array trie against a plain Python dict of prefixes, over random docid sets, eagerly and under jit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gr_jax.docids.schemes.naive import naive_docid_table
from gr_jax.docids.trie import DEAD_STATE, ROOT_STATE, Trie

PAD, EOS = 0, 1


def random_docid_rows(rng: np.random.Generator, *, num_docids: int, vocab_size: int, max_content: int) -> np.ndarray:
    """Distinct `content EOS PAD...` rows; half of them extend a cut of an earlier docid (shared prefixes,
    docids that are prefixes of others)."""
    sequences: set[tuple[int, ...]] = set()
    ordered: list[tuple[int, ...]] = []
    while len(ordered) < num_docids:
        if ordered and rng.random() < 0.5:
            base = ordered[rng.integers(len(ordered))]
            base = base[:rng.integers(0, len(base) + 1)]
        else:
            base = ()
        extra = rng.integers(0 if base else 1, max_content - len(base) + 1)
        sequence = base + tuple(int(t) for t in rng.integers(2, vocab_size, extra))
        if sequence and sequence not in sequences:
            sequences.add(sequence)
            ordered.append(sequence)
    rows = np.zeros((num_docids, max_content + 1), np.int32)
    for i, sequence in enumerate(ordered):
        rows[i, :len(sequence) + 1] = sequence + (EOS,)
    return rows


def reference_allowed(rows: np.ndarray, *, max_prefix_length: int) -> dict[tuple[int, ...], set[int]]:
    """The plain dict trie: prefix -> set of allowed next tokens, for prefixes up to `max_prefix_length`, from
    the PAD-padded rows (a full docid is followed only by PAD). Prefixes not in the dict allow nothing."""
    padded = np.pad(rows, ((0, 0), (0, max_prefix_length + 1 - rows.shape[1])))
    allowed: dict[tuple[int, ...], set[int]] = {}
    for row in padded.tolist():
        for n in range(max_prefix_length + 1):
            allowed.setdefault(tuple(row[:n]), set()).add(row[n])
    return allowed


def walk(trie: Trie, prefixes: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
    """States after the first `lengths` tokens of each row of `prefixes` int[n, m], by stepwise `next_states`."""
    lengths = np.full(len(prefixes), prefixes.shape[1]) if lengths is None else lengths
    states = trie.root_states(prefixes.shape[0])
    for n, column in enumerate(prefixes.T):
        states = jnp.where(jnp.asarray(n < lengths), trie.next_states(states, jnp.asarray(column)), states)
    return np.asarray(states)


def queries_for(rows: np.ndarray, rng: np.random.Generator, *, vocab_size: int) -> list[tuple[int, ...]]:
    """Every prefix of every padded docid row (one PAD past the width) plus random (mostly invalid) prefixes
    and prefixes with one token changed."""
    width = rows.shape[1] + 1
    padded = np.pad(rows, ((0, 0), (0, 1))).tolist()
    queries = {tuple(row[:n]) for row in padded for n in range(width + 1)}
    for _ in range(3 * len(rows)):
        n = int(rng.integers(1, width + 1))
        queries.add(tuple(int(t) for t in rng.integers(0, vocab_size, n)))
        row = list(padded[rng.integers(len(padded))][:n])
        row[rng.integers(n)] = int(rng.integers(0, vocab_size))
        queries.add(tuple(row))
    return sorted(queries, key=lambda q: (len(q), q))


def device_results(trie: Trie, matrix: jax.Array, lengths: jax.Array) -> dict[str, jax.Array]:
    """Every query of the trie for the states reached by the rows of `matrix` (first `lengths` tokens)."""
    states = trie.root_states(matrix.shape[0])
    for n in range(matrix.shape[1]):
        states = jnp.where(n < lengths, trie.next_states(states, matrix[:, n]), states)
    child_tokens, child_states, child_valid = trie.children(states)
    all_tokens, all_states, all_valid = trie.children(states, width=trie.max_fanout)
    return dict(states=states, mask=trie.allowed_mask(states), num_children=trie.num_children(states),
                child_tokens=child_tokens, child_states=child_states, child_valid=child_valid,
                stepped=trie.next_states(jnp.broadcast_to(states[:, None], child_tokens.shape), child_tokens),
                all_tokens=all_tokens, all_states=all_states, all_valid=all_valid,
                all_stepped=trie.next_states(jnp.broadcast_to(states[:, None], all_tokens.shape), all_tokens),
                eos_states=trie.eos_states(states), eos_stepped=trie.next_states(states, jnp.full_like(states, EOS)))


def check_against_reference(trie: Trie, rows: np.ndarray, rng: np.random.Generator, *, vocab_size: int) -> None:
    """The states reached by all queries (stepwise next_states), their allowed_mask, num_children and children."""
    queries = queries_for(rows, rng, vocab_size=vocab_size)
    longest = max(map(len, queries))
    reference = reference_allowed(rows, max_prefix_length=longest)
    lengths = np.array([len(q) for q in queries])
    matrix = np.zeros((len(queries), longest), np.int32)
    for i, q in enumerate(queries):
        matrix[i, :len(q)] = q
    results = jax.jit(device_results)(trie, jnp.asarray(matrix), jnp.asarray(lengths))
    results = {name: np.asarray(value) for name, value in results.items()}
    expected = [sorted(reference.get(q, ())) for q in queries]
    expected_mask = np.zeros((len(queries), vocab_size), bool)
    for i, tokens in enumerate(expected):
        expected_mask[i, tokens] = True
    np.testing.assert_array_equal(results["states"] == DEAD_STATE, [q not in reference for q in queries])
    wrong = np.flatnonzero((results["mask"] != expected_mask).any(axis=1))
    assert not wrong.size, (queries[wrong[0]], np.flatnonzero(results["mask"][wrong[0]]), expected[wrong[0]])
    np.testing.assert_array_equal(results["num_children"], [len(e) for e in expected])
    # children: the first `width` allowed tokens in token order, each with its next_states state.
    for prefix, width in (("child", trie.sparse_fanout), ("all", trie.max_fanout)):
        expected_valid = np.arange(width) < np.minimum([len(e) for e in expected], width)[:, None]
        np.testing.assert_array_equal(results[f"{prefix}_valid"], expected_valid)
        expected_tokens = np.zeros((len(queries), width), np.int32)
        for i, tokens in enumerate(expected):
            expected_tokens[i, :min(len(tokens), width)] = tokens[:width]
        np.testing.assert_array_equal(results[f"{prefix}_tokens"], expected_tokens)
        stepped = results["stepped" if prefix == "child" else "all_stepped"]
        np.testing.assert_array_equal(results[f"{prefix}_states"], np.where(expected_valid, stepped, DEAD_STATE))
        assert (results[f"{prefix}_states"][expected_valid] != DEAD_STATE).all()
    np.testing.assert_array_equal(results["eos_states"], results["eos_stepped"])
    np.testing.assert_array_equal(results["eos_states"] != DEAD_STATE, [EOS in e for e in expected])


@pytest.mark.parametrize("num_docids, vocab_size, max_content, sparse_fanout", [
    (60, 6, 5, 2),  # low fan-out, deep, many docids prefixes of others; the root is wide
    (150, 40, 3, 4),  # high fan-out near the root (wide), K below
    (150, 40, 3, 64),  # K above every fan-out: no wide path at all
    (40, 300, 4, 1),  # K = 1: nearly every state with children is wide
])
def test_trie_matches_dict_trie(num_docids, vocab_size, max_content, sparse_fanout):
    rng = np.random.default_rng(num_docids + vocab_size)
    rows = random_docid_rows(rng, num_docids=num_docids, vocab_size=vocab_size, max_content=max_content)
    trie = Trie.build(rows, vocab_size=vocab_size, sparse_fanout=sparse_fanout)
    assert trie.max_length == int((rows != PAD).sum(axis=1).max())
    assert trie.min_length == int((rows != PAD).sum(axis=1).min())
    reference = reference_allowed(rows, max_prefix_length=rows.shape[1])
    assert trie.max_fanout == max(len(v) for v in reference.values())
    # Per level: the most children of an unfinished prefix (no EOS yet) of each length.
    assert trie.level_fanouts == tuple(
        max(len(v) for q, v in reference.items() if len(q) == depth and EOS not in q and PAD not in q)
        for depth in range(trie.max_length))
    # states: DEAD, ROOT and one per distinct prefix (the full sequences with EOS included).
    assert trie.num_states == 2 + len({tuple(r[:n]) for r in rows.tolist() for n in range(1, r.index(EOS) + 2)})
    check_against_reference(trie, rows, rng, vocab_size=vocab_size)


def test_min_length_is_the_shortest_docid_with_eos():
    """Decoding relies on it: with min_length == max_length no EOS is allowed before the last position."""
    fixed = np.array([[5, 6, 7, EOS], [5, 8, 7, EOS], [9, 6, 7, EOS]], np.int32)
    mixed = np.array([[5, 6, 7, EOS], [5, 6, EOS, PAD], [9, EOS, PAD, PAD]], np.int32)
    for rows, shortest in ((fixed, 4), (mixed, 2)):
        trie = Trie.build(rows, vocab_size=10)
        assert (trie.min_length, trie.max_length) == (shortest, 4)
        # EOS is allowed after a prefix of length p only where some docid has p tokens (p + 1 with EOS).
        for p in range(trie.max_length):
            states = trie.prefix_states(jnp.asarray(rows))[:, p]
            eos_allowed = np.asarray(trie.eos_states(states)) != DEAD_STATE
            assert not eos_allowed.any() or p >= trie.min_length - 1


def test_walks_reach_leaf_index_and_prefix_states_agree():
    rng = np.random.default_rng(3)
    rows = random_docid_rows(rng, num_docids=300, vocab_size=12, max_content=6)
    trie = Trie.build(rows, vocab_size=12, sparse_fanout=3)
    num_rows, width = rows.shape
    # prefix_states column n is the stepwise walk over the first n tokens.
    before = np.asarray(trie.prefix_states(jnp.asarray(rows)))
    assert (before[:, 0] == ROOT_STATE).all()
    np.testing.assert_array_equal(before.T, [walk(trie, rows, np.full(num_rows, n)) for n in range(width)])
    # The walk reaches the row's terminal state right after EOS and stays there on PAD.
    lengths = (rows != PAD).sum(axis=1)
    at_eos = walk(trie, rows, lengths)
    np.testing.assert_array_equal(walk(trie, rows), at_eos)
    np.testing.assert_array_equal(np.asarray(trie.leaf_index)[at_eos], np.arange(num_rows))
    assert np.asarray(trie.is_terminal(jnp.asarray(at_eos))).all()
    np.testing.assert_array_equal(trie.leaf_indices(jnp.asarray(rows)), np.arange(num_rows))
    np.testing.assert_array_equal(trie.leaf_indices(jnp.pad(jnp.asarray(rows), ((0, 0), (0, 3)))), np.arange(num_rows))
    # Before EOS no state is terminal: the rows cut before their EOS are not docids.
    cut = np.where(np.arange(width) < (lengths - 1)[:, None], rows, PAD)
    np.testing.assert_array_equal(trie.leaf_indices(jnp.asarray(cut)), -1)
    assert not np.asarray(trie.is_terminal(jnp.asarray(walk(trie, rows, lengths - 1)))).any()
    # Random sequences: -1 unless they happen to be a docid padded with PAD; prefix_states = stepwise walk.
    row_of = {tuple(r): i for i, r in enumerate(rows.tolist())}
    random_rows = rng.integers(0, 12, (500, width)).astype(np.int32)
    random_rows[:, -1] = rng.choice([PAD, EOS], 500)
    random_rows[:100] = rows[rng.integers(0, num_rows, 100)]
    np.testing.assert_array_equal(trie.leaf_indices(jnp.asarray(random_rows)),
                                  [row_of.get(tuple(r), -1) for r in random_rows.tolist()])
    np.testing.assert_array_equal(np.asarray(trie.prefix_states(jnp.asarray(random_rows))).T,
                                  [walk(trie, random_rows, np.full(500, n)) for n in range(width)])


def test_works_under_jit_with_trie_as_argument():
    rng = np.random.default_rng(4)
    rows = random_docid_rows(rng, num_docids=120, vocab_size=30, max_content=4)
    trie = Trie.build(rows, vocab_size=30, sparse_fanout=3)
    matrix = jnp.asarray(rng.integers(0, 30, (64, 6)), jnp.int32)
    lengths = jnp.asarray(rng.integers(0, 7, 64))
    eager, jitted = device_results(trie, matrix, lengths), jax.jit(device_results)(trie, matrix, lengths)
    for name in eager:
        np.testing.assert_array_equal(eager[name], jitted[name], err_msg=name)
    prefix_states = jax.jit(lambda t, x: t.prefix_states(x))(trie, jnp.asarray(rows))
    np.testing.assert_array_equal(prefix_states, trie.prefix_states(jnp.asarray(rows)))
    leaves = jax.jit(lambda t, x: t.leaf_indices(x))(trie, jnp.asarray(rows))
    np.testing.assert_array_equal(leaves, np.arange(len(rows)))
    # The trie's arrays are pytree leaves, its sizes static metadata.
    assert len(jax.tree_util.tree_leaves(trie)) == 3


# 4 examples: each compiles its own trie's program; the parametrised cases above cover the chosen shapes.
@settings(max_examples=4, deadline=None)
@given(sequences=st.lists(st.lists(st.integers(2, 7), min_size=1, max_size=4), min_size=1, max_size=25,
                          unique_by=tuple),
       sparse_fanout=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_trie_matches_dict_trie_hypothesis(sequences, sparse_fanout, seed):
    rows = np.zeros((len(sequences), 5), np.int32)
    for i, sequence in enumerate(sequences):
        rows[i, :len(sequence) + 1] = sequence + [EOS]
    trie = Trie.build(rows, vocab_size=8, sparse_fanout=sparse_fanout)
    check_against_reference(trie, rows, np.random.default_rng(seed), vocab_size=8)
    np.testing.assert_array_equal(trie.leaf_indices(jnp.asarray(rows)), np.arange(len(rows)))


def test_build_from_naive_docid_table():
    table = naive_docid_table(docids=[str(i) for i in range(0, 1000, 7)], encode=lambda s: [3 + int(c) for c in s])
    trie = Trie.build(table.tokens, vocab_size=13)
    assert trie.max_fanout == 11  # EOS and ten digits after e.g. "7"
    # Digit-by-digit walk of "994" reaches docid 994 = 7 * 142.
    state = trie.root_states(1)
    for token in [12, 12, 7, EOS]:
        state = trie.next_states(state, jnp.array([token]))
    assert table.docids[int(trie.leaf_index[state[0]])] == "994"
    assert trie.nbytes == 12 * trie.num_states + 4


def test_build_refuses_bad_matrices():
    with pytest.raises(ValueError, match="rows 0 and 2 of the docid token matrix are identical"):
        Trie.build(np.array([[5, 1], [6, 1], [5, 1]]), vocab_size=8)
    with pytest.raises(ValueError, match="row 1 .* no EOS"):
        Trie.build(np.array([[5, 1], [6, 7]]), vocab_size=8)
    with pytest.raises(ValueError, match="row 0 holds token id 9 >= vocab_size 8"):
        Trie.build(np.array([[9, 1]]), vocab_size=8)
    with pytest.raises(ValueError, match="non-empty integer matrix"):
        Trie.build(np.zeros((0, 3), np.int32), vocab_size=8)
