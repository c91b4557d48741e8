"""SToICaL targets: item weights by hand, trie-marginalised token targets against the paper's Figure 2 toy and a
brute-force enumeration of random tries."""
import numpy as np
import pytest

from gr_jax.ranking.targets import Fractional, Stepwise, TopOne, trie_targets
from gr_jax.vocabulary import EOS_ID, PAD_ID

LETTERS = {ch: 3 + i for i, ch in enumerate("acdefghiorst")}


def _encode(words, length=6):
    rows = np.zeros((len(words), length), np.int32)
    for i, word in enumerate(words):
        rows[i, :len(word)] = [LETTERS[ch] for ch in word]
        rows[i, len(word)] = EOS_ID
    return rows


def test_item_weights_by_hand():
    ranks, n = np.array([1, 2, 3, 4]), np.array([4, 4, 4, 4])
    assert TopOne()(ranks, n).tolist() == [1, 0, 0, 0]
    np.testing.assert_allclose(Fractional(alpha=2)(ranks, n), [1, 1 / 4, 1 / 9, 1 / 16])
    np.testing.assert_allclose(Stepwise()(ranks, n), [1, 3 / 4, 2 / 4, 1 / 4])


def test_figure_2_toy_masses():
    """cat > dog > cats > deer > fish, beta 1 (mu = 1, 1/2, 1/3, 1/4, 1/5): at the first step of "cat" the tokens
    c, d, f carry mu(cat) + mu(cats), mu(dog) + mu(deer), mu(fish); after "cat", EOS carries mu(cat), s mu(cats)."""
    ranked = _encode(["cat", "dog", "cats", "deer", "fish"])
    tokens, mass = trie_targets(ranked, rank=1, beta=1.0, max_children=4)
    total = 1 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5
    first = dict(zip(tokens[0].tolist(), mass[0].tolist()))
    assert first.pop(PAD_ID) == 0.0
    assert first == pytest.approx({LETTERS["c"]: (1 + 1 / 3) / total, LETTERS["d"]: (1 / 2 + 1 / 4) / total,
                                   LETTERS["f"]: (1 / 5) / total})
    assert tokens[0, :3].tolist() == [LETTERS["c"], LETTERS["d"], LETTERS["f"]]  # heaviest first
    assert (tokens[1, 0], mass[1, 0]) == (LETTERS["a"], 1.0)  # "c" -> only "a"
    after_cat = dict(zip(tokens[3, :2].tolist(), mass[3, :2].tolist()))
    assert after_cat == pytest.approx({EOS_ID: 0.75, LETTERS["s"]: 0.25})
    assert (tokens[4:] == PAD_ID).all() and (mass[4:] == 0).all()  # past "cat"'s EOS
    # beta -> inf: one-hot on d_1's path; beta = 0: every docid counts the same.
    tokens, mass = trie_targets(ranked, rank=1, beta=np.inf, max_children=4)
    assert (mass.max(axis=1)[:4] == 1).all() and tokens[:4, 0].tolist() == ranked[0, :4].tolist()
    _, mass = trie_targets(ranked, rank=1, beta=0.0, max_children=4)
    np.testing.assert_allclose(mass[0, :3], [2 / 5, 2 / 5, 1 / 5])
    # The combined variant for d_3 = "cats": the trie of ranks 3..5 only, original ranks in mu.
    tokens, mass = trie_targets(ranked, rank=3, beta=1.0, max_children=4, from_rank=True)
    first = dict(zip(tokens[0, :3].tolist(), mass[0, :3].tolist()))
    total = 1 / 3 + 1 / 4 + 1 / 5
    assert first == pytest.approx({LETTERS["c"]: (1 / 3) / total, LETTERS["d"]: (1 / 4) / total,
                                   LETTERS["f"]: (1 / 5) / total})
    # "cat" (rank 1) is not in that trie: after "cat" the only child is "s".
    assert (tokens[3, 0], mass[3, 0], tokens[3, 1]) == (LETTERS["s"], 1.0, PAD_ID)


def brute_force(ranked, *, rank, beta, from_rank):
    """Per position of d_rank: {child token: normalised mass} by walking every docid."""
    n = len(ranked)
    mu = [(1.0 if r == 1 else 0.0) if np.isinf(beta) else r ** -beta for r in range(1, n + 1)]
    members = range(rank - 1 if from_rank else 0, n)  # the combined variant's trie: d_rank, ..., d_n
    target = ranked[rank - 1].tolist()
    out = []
    for t in range(len(target)):
        if target[t] == PAD_ID:
            out.append({})
            continue
        masses = {}
        for j in members:
            row = ranked[j].tolist()
            if row[:t] == target[:t] and row[t] != PAD_ID:
                masses[row[t]] = masses.get(row[t], 0.0) + mu[j]
        total = sum(masses.values())
        out.append({k: v / total for k, v in masses.items()} if total > 0 else
                   {k: float(k == target[t]) for k in masses})
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_tries_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    words = sorted({"".join(rng.choice(list("acdt"), size=rng.integers(1, 5))) for _ in range(12)})
    words = [words[i] for i in rng.permutation(len(words))]
    ranked = _encode(words)
    for rank in range(1, len(words) + 1):
        for beta in (0.0, 1.0, 2.5, np.inf):
            for from_rank in (False, True):
                tokens, mass = trie_targets(ranked, rank=rank, beta=beta, max_children=5, from_rank=from_rank)
                expected = brute_force(ranked, rank=rank, beta=beta, from_rank=from_rank)
                for t, want in enumerate(expected):
                    got = {int(k): float(m) for k, m in zip(tokens[t], mass[t]) if k != PAD_ID}
                    assert got == pytest.approx(want, abs=1e-6), (words, rank, beta, from_rank, t)
                    assert list(mass[t]) == sorted(mass[t], reverse=True)


def test_bad_inputs_are_refused():
    ranked = _encode(["cat", "dog", "deer"])
    with pytest.raises(ValueError, match="more than max_children=1"):
        trie_targets(ranked, rank=2, beta=1.0, max_children=1)
    with pytest.raises(ValueError, match="rank must be in"):
        trie_targets(ranked, rank=4, beta=1.0, max_children=3)
    with pytest.raises(ValueError, match="empty"):
        trie_targets(np.zeros((1, 3), np.int32), rank=1, beta=1.0, max_children=3)
