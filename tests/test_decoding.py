"""Beam search and sampling against brute force under toy models whose logits depend on the cache.

The toy model is a small random-weight RNN: its hidden state is the cache (so a wrong beam reordering
changes every later logit) and a per-query vector is closed over (as encoder outputs would be).
Brute force scores every candidate sequence by teacher forcing the same step function.
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import decoding
from gr_jax.decoding import beam_search, brevity_penalty, sample, score_sequences
from gr_jax.docids.trie import Trie

PAD, EOS = 0, 1


class ToyRNN:
    """h' = tanh(E[token] + h W + P[position] + q[query]); logits = 3 * h' O. The cache is {"h": [rows, H]}."""

    def __init__(self, *, vocab_size: int, num_queries: int, max_length: int, hidden: int = 16, seed: int = 0):
        keys = jax.random.split(jax.random.PRNGKey(seed), 5)
        self.embed = jax.random.normal(keys[0], (vocab_size, hidden))
        self.recurrent = jax.random.normal(keys[1], (hidden, hidden)) / np.sqrt(hidden)
        self.positions = jax.random.normal(keys[2], (max_length, hidden))
        self.queries = jax.random.normal(keys[3], (num_queries, hidden))
        self.output = jax.random.normal(keys[4], (hidden, vocab_size)) * 3 / np.sqrt(hidden)
        self.hidden = hidden

    def step_fn(self, query_of_row: jax.Array):
        """step_fn for rows belonging to queries `query_of_row` int32[rows] (the per-query constant)."""
        query_vectors = self.queries[query_of_row]

        def step(tokens, position, cache):
            h = jnp.tanh(self.embed[tokens] + cache["h"] @ self.recurrent + self.positions[position] + query_vectors)
            return h @ self.output, {"h": h}

        return step

    def initial_cache(self, rows: int):
        return {"h": jnp.zeros((rows, self.hidden))}

    def score(self, sequences: np.ndarray, query: int) -> np.ndarray:
        """float64[n]: log-likelihood of each EOS-terminated sequence int[n, L] by teacher forcing."""
        log_probs = self.token_log_probs(sequences, query)
        is_eos = sequences == EOS
        counted = np.cumsum(is_eos, axis=1) - is_eos == 0  # positions after the first EOS do not count
        return np.sum(np.where(counted, log_probs, 0.0), axis=1)

    def token_log_probs(self, sequences: np.ndarray, query: int) -> np.ndarray:
        """float64[n, L]: the teacher-forced log-prob of each token of sequences int[n, L] (PAD after EOS too)."""
        sequences = jnp.asarray(sequences, jnp.int32)
        return np.asarray(self._teacher_forced(sequences, jnp.full(sequences.shape[0], query)), np.float64)

    @functools.partial(jax.jit, static_argnums=0)
    def _teacher_forced(self, sequences: jax.Array, queries: jax.Array) -> jax.Array:
        step = self.step_fn(queries)
        previous = jnp.concatenate([jnp.full((sequences.shape[0], 1), PAD), sequences[:, :-1]], axis=1)

        def one_position(cache, inputs):
            position, previous_tokens, tokens = inputs
            logits, cache = step(previous_tokens, position, cache)
            log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, None], axis=1)[:, 0]
            return cache, log_probs

        _, log_probs = jax.lax.scan(one_position, self.initial_cache(sequences.shape[0]),
                                    (jnp.arange(sequences.shape[1]), previous.T, sequences.T))
        return log_probs.T


def beams_step(model: ToyRNN, *, batch: int, beams: int):
    return model.step_fn(jnp.repeat(jnp.arange(batch), beams)), model.initial_cache(batch * beams)


def docid_rows(rng: np.random.Generator, *, num_docids: int, vocab_size: int, max_content: int) -> np.ndarray:
    """Distinct random `content EOS PAD...` rows of varied lengths, with shared prefixes."""
    seen, rows = set(), []
    while len(rows) < num_docids:
        length = int(rng.integers(1, max_content + 1))
        prefix = rows[rng.integers(len(rows))][:int(rng.integers(0, length))] if rows and rng.random() < 0.6 else []
        content = list(prefix) + [int(t) for t in rng.integers(2, vocab_size, length - len(prefix))]
        if tuple(content) not in seen:
            seen.add(tuple(content))
            rows.append(content)
    matrix = np.zeros((num_docids, max_content + 1), np.int32)
    for i, content in enumerate(rows):
        matrix[i, :len(content) + 1] = content + [EOS]
    return matrix


def run_beam_search(model, *, batch, beams, max_decode_len, trie=None, length_penalty=0.0, **kwargs):
    step_fn, cache = beams_step(model, batch=batch, beams=beams)
    search = jax.jit(functools.partial(beam_search, step_fn=step_fn, batch_size=batch, num_beams=beams,
                                       max_decode_len=max_decode_len, length_penalty=length_penalty, **kwargs))
    result = search(cache=cache, trie=trie)
    return np.asarray(result.sequences), np.asarray(result.scores)


def fixed_length_rows(rng: np.random.Generator, *, num_docids: int, vocab_size: int, length: int) -> np.ndarray:
    """Distinct random rows of `length` content tokens, then EOS (every docid ends at the same position)."""
    content = np.unique(rng.integers(2, vocab_size, (4 * num_docids, length)), axis=0)
    content = content[rng.permutation(len(content))[:num_docids]]
    assert len(content) == num_docids
    return np.concatenate([content, np.full((num_docids, 1), EOS)], axis=1).astype(np.int32)


def pad_to(rows: np.ndarray, length: int) -> np.ndarray:
    return np.pad(rows, ((0, 0), (0, length - rows.shape[1])))


@pytest.mark.parametrize("sparse_fanout", [2, 64])  # 2: the wide path at the root; 64: never
def test_constrained_beam_search_is_exhaustive_top_k(sparse_fanout):
    rng = np.random.default_rng(0)
    vocab, batch, max_decode_len = 9, 3, 6
    rows = docid_rows(rng, num_docids=14, vocab_size=vocab, max_content=4)
    trie = Trie.build(rows, vocab_size=vocab, sparse_fanout=sparse_fanout)
    model = ToyRNN(vocab_size=vocab, num_queries=batch, max_length=max_decode_len, seed=1)
    beams = 16  # >= 14 valid docids: the search must return all of them, ranked
    sequences, scores = run_beam_search(model, batch=batch, beams=beams, max_decode_len=max_decode_len, trie=trie)
    assert sequences.shape == (batch, beams, max_decode_len) and scores.shape == (batch, beams)
    for query in range(batch):
        brute = model.score(rows, query)
        order = np.argsort(-brute)
        np.testing.assert_array_equal(sequences[query, :len(rows)], pad_to(rows[order], max_decode_len))
        np.testing.assert_allclose(scores[query, :len(rows)], brute[order], rtol=1e-5, atol=1e-5)
        assert np.all(scores[query, len(rows):] == -np.inf)
        assert not sequences[query, len(rows):].any()


@pytest.mark.parametrize("beams, sparse_fanout", [(1, 3), (3, 2), (5, 64)])
def test_constrained_beam_search_with_few_beams_emits_only_valid_docids(beams, sparse_fanout):
    rng = np.random.default_rng(1)
    vocab, batch, max_decode_len = 12, 4, 7
    rows = docid_rows(rng, num_docids=200, vocab_size=vocab, max_content=5)
    trie = Trie.build(rows, vocab_size=vocab, sparse_fanout=sparse_fanout)
    model = ToyRNN(vocab_size=vocab, num_queries=batch, max_length=max_decode_len, seed=2)
    sequences, scores = run_beam_search(model, batch=batch, beams=beams, max_decode_len=max_decode_len, trie=trie)
    row_of = {tuple(r): i for i, r in enumerate(pad_to(rows, max_decode_len).tolist())}
    for query in range(batch):
        found = [row_of.get(tuple(s)) for s in sequences[query].tolist()]
        assert None not in found, sequences[query]  # every beam is a valid docid
        assert len(set(found)) == beams  # and no docid twice
        np.testing.assert_allclose(scores[query], model.score(rows[found], query), rtol=1e-5, atol=1e-5)
        assert np.all(np.diff(scores[query]) <= 0)  # best first
    np.testing.assert_array_equal(trie.leaf_indices(jnp.asarray(sequences.reshape(-1, max_decode_len))) >= 0, True)


def all_sequences(*, vocab: int, max_length: int) -> np.ndarray:
    """Every EOS-terminated sequence of at most max_length tokens (any non-EOS token before EOS), PAD-padded."""
    content_tokens = [t for t in range(vocab) if t != EOS]
    rows = [list(c) + [EOS] for n in range(max_length) for c in itertools.product(content_tokens, repeat=n)]
    return np.array([r + [PAD] * (max_length - len(r)) for r in rows], np.int32)


@pytest.mark.parametrize("length_penalty", [0.0, 0.8])
def test_unconstrained_beam_search_equals_brute_force(length_penalty):
    vocab, batch, max_decode_len = 4, 2, 3
    candidates = all_sequences(vocab=vocab, max_length=max_decode_len)  # 1 + 3 + 9 = 13 sequences
    model = ToyRNN(vocab_size=vocab, num_queries=batch, max_length=max_decode_len, seed=3)
    beams = 16  # keeps every alive prefix (at most 9): exact
    sequences, scores = run_beam_search(model, batch=batch, beams=beams, max_decode_len=max_decode_len,
                                        length_penalty=length_penalty)
    lengths = (np.cumsum(candidates == EOS, axis=1) == 0).sum(axis=1) + 1
    for query in range(batch):
        brute = model.score(candidates, query) / np.asarray(brevity_penalty(alpha=length_penalty, length=lengths))
        order = np.argsort(-brute)
        np.testing.assert_array_equal(sequences[query, :len(candidates)], candidates[order])
        np.testing.assert_allclose(scores[query, :len(candidates)], brute[order], rtol=1e-5, atol=1e-5)
        assert np.all(scores[query, len(candidates):] == -np.inf)


class HistoryModel:
    """Logits are a hash of the whole decoded prefix, which only the cache holds: any mistake in reordering
    the cache with the beams changes the scores."""

    def __init__(self, *, vocab_size: int, max_length: int, seed: int = 0):
        self.table = jax.random.normal(jax.random.PRNGKey(seed), (97, vocab_size)) * 2
        self.max_length = max_length

    def step_fn(self, tokens, position, cache):
        history = cache["history"].at[:, jnp.maximum(position - 1, 0)].set(
            jnp.where(position > 0, tokens, cache["history"][:, 0]))
        weights = jnp.array([7, 13, 29, 31, 37, 41][:self.max_length])
        key = (jnp.sum(history * weights, axis=1) + 5 * position) % 97
        return self.table[key], {"history": history}

    def initial_cache(self, rows: int):
        return {"history": jnp.zeros((rows, self.max_length), jnp.int32)}


def test_cache_is_reordered_with_beams():
    vocab, max_decode_len, beams = 5, 4, 85  # 1 + 4 + 16 + 64 = 85 sequences: exhaustive
    model = HistoryModel(vocab_size=vocab, max_length=max_decode_len)
    candidates = all_sequences(vocab=vocab, max_length=max_decode_len)
    # Brute force: teacher-force every candidate through the same step_fn.
    cache, previous = model.initial_cache(len(candidates)), jnp.full(len(candidates), PAD)
    brute = np.zeros(len(candidates))
    done = np.zeros(len(candidates), bool)
    for position in range(max_decode_len):
        logits, cache = model.step_fn(previous, position, cache)
        log_probs = np.asarray(jax.nn.log_softmax(logits))[np.arange(len(candidates)), candidates[:, position]]
        brute += np.where(done, 0, log_probs)
        done |= candidates[:, position] == EOS
        previous = jnp.asarray(candidates[:, position])
    search = jax.jit(functools.partial(beam_search, step_fn=model.step_fn, batch_size=1, num_beams=beams,
                                       max_decode_len=max_decode_len))
    result = search(cache=model.initial_cache(beams))
    sequences, scores = np.asarray(result.sequences[0]), np.asarray(result.scores[0])
    # Every sequence comes back once, with its teacher-forced score, best first (ties in any order).
    index = {tuple(c): i for i, c in enumerate(candidates.tolist())}
    returned = [index[tuple(s)] for s in sequences.tolist()]
    assert sorted(returned) == list(range(len(candidates)))
    np.testing.assert_allclose(scores, brute[returned], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scores, np.sort(brute)[::-1], rtol=1e-5, atol=1e-5)


def greedy_reference(model: ToyRNN, *, queries: np.ndarray, max_decode_len: int, rows: np.ndarray | None):
    """Greedy decoding with a Python loop (and, with `rows`, a Python set of valid prefixes)."""
    prefixes = None if rows is None else {tuple(r[:n]) for r in rows.tolist() for n in range(r.index(EOS) + 2)}
    sequences = np.zeros((len(queries), max_decode_len), np.int32)
    for i, query in enumerate(queries):
        step = model.step_fn(jnp.array([query]))
        cache, previous = model.initial_cache(1), PAD
        for position in range(max_decode_len):
            logits, cache = step(jnp.array([previous]), position, cache)
            log_probs = np.asarray(jax.nn.log_softmax(logits[0]))
            if prefixes is not None:
                allowed = [t for t in range(len(log_probs)) if tuple(sequences[i, :position]) + (t,) in prefixes]
                log_probs = np.where(np.isin(np.arange(len(log_probs)), allowed), log_probs, -np.inf)
            previous = int(np.argmax(log_probs))
            sequences[i, position] = previous
            if previous == EOS:
                break
    return sequences


def run_sample(model, *, queries, max_decode_len, seed=0, **kwargs):
    queries = jnp.asarray(queries)
    trie = kwargs.pop("trie", None)
    run = jax.jit(functools.partial(sample, step_fn=model.step_fn(queries), batch_size=len(queries),
                                    max_decode_len=max_decode_len, **kwargs))
    result = run(cache=model.initial_cache(len(queries)), rng=jax.random.PRNGKey(seed), trie=trie)
    return np.asarray(result.sequences), np.asarray(result.log_probs)


@pytest.mark.parametrize("constrained", [False, True])
def test_sampling_with_top_k_1_or_temperature_0_is_greedy(constrained):
    rng = np.random.default_rng(5)
    vocab, max_decode_len = 10, 6
    rows = docid_rows(rng, num_docids=60, vocab_size=vocab, max_content=5) if constrained else None
    trie = Trie.build(rows, vocab_size=vocab, sparse_fanout=3) if constrained else None
    model = ToyRNN(vocab_size=vocab, num_queries=6, max_length=max_decode_len, seed=5)
    queries = np.arange(6)
    expected = greedy_reference(model, queries=queries, max_decode_len=max_decode_len, rows=rows)
    for kwargs in ({"top_k": 1}, {"top_k": 4, "temperature": 0.0}):
        sequences, log_probs = run_sample(model, queries=queries, max_decode_len=max_decode_len, trie=trie, **kwargs)
        np.testing.assert_array_equal(sequences, expected)
        np.testing.assert_allclose(log_probs, [model.score(s[None], q)[0] for s, q in zip(sequences, queries)],
                                   rtol=1e-5, atol=1e-5)


def test_sampled_tokens_lie_in_the_top_k():
    vocab, max_decode_len, top_k = 12, 5, 3
    model = ToyRNN(vocab_size=vocab, num_queries=2, max_length=max_decode_len, seed=6)
    queries = np.repeat([0, 1], 200)
    sequences, log_probs = run_sample(model, queries=queries, max_decode_len=max_decode_len, top_k=top_k,
                                      temperature=1.5)
    step = model.step_fn(jnp.asarray(queries))
    cache, previous = model.initial_cache(len(queries)), jnp.full(len(queries), PAD)
    finished = np.zeros(len(queries), bool)
    for position in range(max_decode_len):
        logits, cache = step(previous, position, cache)
        top = np.argsort(-np.asarray(logits), axis=1)[:, :top_k]
        token = sequences[:, position]
        in_top = (top == token[:, None]).any(axis=1)
        assert np.all(in_top | finished), position
        assert np.all(token[finished] == PAD)
        if position == 0:
            for query in (0, 1):  # actually random: each query's top 3 all occur
                assert len(np.unique(token[queries == query])) == top_k
        finished |= token == EOS
        previous = jnp.asarray(token)
    scored = np.concatenate([model.score(sequences[queries == q], q) for q in (0, 1)])
    np.testing.assert_allclose(log_probs, scored, rtol=1e-5, atol=1e-5)


def test_first_token_frequencies_follow_the_tempered_top_k_distribution():
    vocab, top_k, temperature, samples = 8, 3, 0.7, 4000
    model = ToyRNN(vocab_size=vocab, num_queries=1, max_length=2, seed=7)
    sequences, _ = run_sample(model, queries=np.zeros(samples, np.int32), max_decode_len=2, top_k=top_k,
                              temperature=temperature, seed=3)
    logits, _ = model.step_fn(jnp.zeros(1, jnp.int32))(jnp.array([PAD]), 0, model.initial_cache(1))
    logits = np.asarray(logits[0], np.float64)
    top = np.argsort(-logits)[:top_k]
    expected = np.exp(logits[top] / temperature) / np.exp(logits[top] / temperature).sum()
    observed = np.array([(sequences[:, 0] == t).mean() for t in top])
    np.testing.assert_allclose(observed, expected, atol=4 * np.sqrt(0.25 / samples))  # 4 standard errors
    assert observed.sum() == 1.0


def test_constrained_sampling_yields_valid_docids():
    rng = np.random.default_rng(8)
    vocab, max_decode_len = 15, 6
    rows = docid_rows(rng, num_docids=300, vocab_size=vocab, max_content=5)
    trie = Trie.build(rows, vocab_size=vocab, sparse_fanout=4)
    model = ToyRNN(vocab_size=vocab, num_queries=3, max_length=max_decode_len, seed=8)
    queries = np.repeat(np.arange(3), 100)
    sequences, log_probs = run_sample(model, queries=queries, max_decode_len=max_decode_len, top_k=5,
                                      temperature=2.0, trie=trie)
    leaves = np.asarray(trie.leaf_indices(jnp.asarray(sequences)))
    assert (leaves >= 0).all()
    np.testing.assert_array_equal(pad_to(rows[leaves], max_decode_len), sequences)
    assert len(np.unique(leaves)) > 20  # sampling explores many docids
    scored = np.concatenate([model.score(sequences[queries == q], q) for q in range(3)])
    np.testing.assert_allclose(log_probs, scored, rtol=1e-5, atol=1e-5)


def test_argument_errors():
    rows = np.array([[5, 6, 7, 1], [5, 1, 0, 0]], np.int32)
    trie = Trie.build(rows, vocab_size=8)
    model = ToyRNN(vocab_size=8, num_queries=1, max_length=4)
    step_fn, cache = beams_step(model, batch=1, beams=2)
    with pytest.raises(ValueError, match="max_decode_len=3 is shorter than the longest docid .4 tokens"):
        beam_search(step_fn=step_fn, cache=cache, batch_size=1, num_beams=2, max_decode_len=3, trie=trie)
    with pytest.raises(ValueError, match=r"leading dimension 4 .* cache\['h'\] has shape \[2, 16\]"):
        beam_search(step_fn=step_fn, cache=cache, batch_size=2, num_beams=2, max_decode_len=4)
    with pytest.raises(ValueError, match="eos_id=3 cannot be used"):
        sample(step_fn=step_fn, cache=cache, rng=jax.random.PRNGKey(0), batch_size=2, max_decode_len=4, trie=trie,
               eos_id=3)
    with pytest.raises(ValueError, match="num_beams must be a positive int"):
        beam_search(step_fn=step_fn, cache=cache, batch_size=1, num_beams=0, max_decode_len=4)


def test_scored_sequences_are_teacher_forced_and_trie_probabilities_sum_to_one():
    """`score_sequences`: the full-vocabulary log-likelihood is the teacher-forced one; renormalised over the trie's
    children at every step, the probabilities of all docids of a query sum to 1 (a distribution over docids), and
    a sequence that is no docid gets NaN."""
    rng = np.random.default_rng(5)
    vocab, queries, max_decode_len = 9, 3, 6
    rows = docid_rows(rng, num_docids=14, vocab_size=vocab, max_content=4)
    trie = Trie.build(rows, vocab_size=vocab, sparse_fanout=2)
    model = ToyRNN(vocab_size=vocab, num_queries=queries, max_length=max_decode_len, seed=2)
    padded = pad_to(rows, max_decode_len)
    for query in range(queries):
        scored = jax.jit(functools.partial(score_sequences, step_fn=model.step_fn(jnp.full(len(rows), query))))(
            cache=model.initial_cache(len(rows)), sequences=jnp.asarray(padded), trie=trie)
        np.testing.assert_allclose(np.asarray(scored.log_probs), model.score(padded, query), rtol=1e-5, atol=1e-5)
        trie_probs = np.exp(np.asarray(scored.trie_log_probs, np.float64))
        assert trie_probs.sum() == pytest.approx(1.0, abs=1e-5)
        assert np.all(trie_probs >= np.exp(model.score(padded, query)) - 1e-6)  # renormalising only raises them
    invalid = np.array([[vocab - 1] * (max_decode_len - 1) + [EOS]], np.int32)  # 5 content tokens: no docid has
    scored = score_sequences(step_fn=model.step_fn(jnp.zeros(1, jnp.int32)), cache=model.initial_cache(1),
                             sequences=jnp.asarray(invalid), trie=trie)
    assert np.isnan(float(scored.trie_log_probs[0])) and np.isfinite(float(scored.log_probs[0]))


def forced_eos(rows: np.ndarray) -> np.ndarray:
    """bool[n]: the row's EOS is the only token the trie allows after its content (no docid extends it)."""
    contents = [tuple(r[:r.index(EOS)]) for r in rows.tolist()]
    return np.array([not any(len(o) > len(c) and o[:len(c)] == c for o in contents) for c in contents])


@pytest.mark.parametrize("fixed_length", [True, False])
def test_forced_eos_costs_nothing_and_takes_no_model_step(fixed_length):
    """score_forced_eos=False: exhaustive search (beams >= docids) ranks every docid by its teacher-forced score
    without the log-prob of an EOS no other docid competes with; docids that are prefixes of others keep their
    EOS log-prob. The model runs at positions 0 .. max_length - 2 only (the last position's beams are all forced),
    where the default search runs it at max_length - 1 too and scores every EOS."""
    rng = np.random.default_rng(11)
    vocab, batch, beams = 7, 2, 32
    if fixed_length:
        rows = fixed_length_rows(rng, num_docids=30, vocab_size=vocab, length=3)
    else:
        rows = docid_rows(rng, num_docids=30, vocab_size=vocab, max_content=3)
        assert not forced_eos(rows).all()  # some docid is a prefix of another: its EOS competes
    max_decode_len = rows.shape[1]
    trie = Trie.build(rows, vocab_size=vocab, sparse_fanout=2)
    assert (trie.min_length == trie.max_length) == fixed_length
    model = ToyRNN(vocab_size=vocab, num_queries=batch, max_length=max_decode_len, seed=11)
    eos_at = (rows == EOS).argmax(axis=1)
    for score_forced_eos in (True, False):
        positions = []
        step_fn, cache = beams_step(model, batch=batch, beams=beams)

        def counted_step(tokens, position, cache, step_fn=step_fn):
            jax.debug.callback(lambda p: positions.append(int(p)), position)
            return step_fn(tokens, position, cache)

        result = jax.jit(functools.partial(beam_search, step_fn=counted_step, batch_size=batch, num_beams=beams,
                                           max_decode_len=max_decode_len, score_forced_eos=score_forced_eos))(
            cache=cache, trie=trie)
        jax.block_until_ready(result)
        sequences, scores = np.asarray(result.sequences), np.asarray(result.scores)
        assert sorted(set(positions)) == list(range(trie.max_length - (0 if score_forced_eos else 1)))
        for query in range(batch):
            brute = model.score(rows, query)
            if not score_forced_eos:
                eos_log_probs = model.token_log_probs(rows, query)[np.arange(len(rows)), eos_at]
                brute = brute - np.where(forced_eos(rows), eos_log_probs, 0.0)
            order = np.argsort(-brute)
            np.testing.assert_array_equal(sequences[query, :len(rows)], rows[order])
            np.testing.assert_allclose(scores[query, :len(rows)], brute[order], rtol=1e-5, atol=1e-5)
            assert np.all(scores[query, len(rows):] == -np.inf)


def reference_fixed_length_beam_search(model: ToyRNN, rows: np.ndarray, *, query: int, beams: int,
                                       score_forced_eos: bool) -> tuple[np.ndarray, np.ndarray]:
    """Untruncated beam search over docids of one length, in Python: each level keeps the `beams` best prefixes
    among all children of the kept ones; the kept docids then finish with EOS (scored or not)."""
    log_probs = model.token_log_probs(rows, query)
    length = rows.shape[1] - 1
    kept: dict[tuple[int, ...], float] = {(): 0.0}
    for depth in range(length):
        children = {}
        for row, log_prob in zip(rows.tolist(), log_probs):
            if tuple(row[:depth]) in kept:
                children[tuple(row[:depth + 1])] = kept[tuple(row[:depth])] + log_prob[depth]
        kept = dict(sorted(children.items(), key=lambda item: -item[1])[:beams])
    row_of = {tuple(row[:length]): i for i, row in enumerate(rows.tolist())}
    final = {content: score + (log_probs[row_of[content], length] if score_forced_eos else 0.0)
             for content, score in kept.items()}
    ranked = sorted(final.items(), key=lambda item: -item[1])
    return rows[[row_of[content] for content, _ in ranked]], np.array([score for _, score in ranked])


@pytest.mark.parametrize("sparse_fanout, widths", [(3, (2, 4)), (4, (4,)), (1, (1, 4))])
def test_beams_below_the_root_are_read_at_two_widths_at_most(sparse_fanout, widths):
    """Level fan-outs 3, 4, 2, 1 (the root, then below it): below the root the search reads the largest fan-out up
    to K, and the largest, so a deep level never pays for a wide one and the search compiles two selections."""
    rows = np.array([[2, 2, 2, EOS, PAD], [2, 2, 3, EOS, PAD], [2, 3, EOS, PAD, PAD], [2, 4, EOS, PAD, PAD],
                     [2, 5, EOS, PAD, PAD], [3, EOS, PAD, PAD, PAD], [4, 2, 2, 2, EOS]], np.int32)
    trie = Trie.build(rows, vocab_size=8, sparse_fanout=sparse_fanout)
    assert trie.level_fanouts == (3, 4, 2, 1, 1)
    assert decoding._inner_widths(trie) == widths
    model = ToyRNN(vocab_size=8, num_queries=2, max_length=5, seed=3)
    sequences, scores = run_beam_search(model, batch=2, beams=len(rows), max_decode_len=5, trie=trie)
    for query in range(2):  # every docid, ranked: both widths are exact
        order = np.argsort(-model.score(rows, query))
        np.testing.assert_array_equal(sequences[query], rows[order])


@pytest.mark.parametrize("beams, sparse_fanout", [(3, 2), (5, 64), (12, 3)])
def test_fixed_length_search_equals_the_untruncated_reference(beams, sparse_fanout):
    """Docids of one length (STATIC's setting): no step before the last looks at EOS and the last one only
    finishes beams; with or without the forced EOS's log-prob the search is the untruncated beam search."""
    rng = np.random.default_rng(12)
    vocab, batch = 12, 3
    rows = fixed_length_rows(rng, num_docids=300, vocab_size=vocab, length=4)
    trie = Trie.build(rows, vocab_size=vocab, sparse_fanout=sparse_fanout)
    model = ToyRNN(vocab_size=vocab, num_queries=batch, max_length=rows.shape[1], seed=12)
    for score_forced_eos in (True, False):
        sequences, scores = run_beam_search(model, batch=batch, beams=beams, max_decode_len=rows.shape[1],
                                            trie=trie, score_forced_eos=score_forced_eos)
        for query in range(batch):
            expected, expected_scores = reference_fixed_length_beam_search(
                model, rows, query=query, beams=beams, score_forced_eos=score_forced_eos)
            np.testing.assert_array_equal(sequences[query], expected)
            np.testing.assert_allclose(scores[query], expected_scores, rtol=1e-5, atol=1e-5)


def test_forced_eos_needs_a_trie():
    model = ToyRNN(vocab_size=5, num_queries=1, max_length=3)
    step_fn, cache = beams_step(model, batch=1, beams=2)
    with pytest.raises(ValueError, match="score_forced_eos=False needs a trie"):
        beam_search(step_fn=step_fn, cache=cache, batch_size=1, num_beams=2, max_decode_len=3, score_forced_eos=False)
