"""The decoding benchmark's ratios are only meaningful if both sides of each comparison compute the same thing."""
import json

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from gr_jax.decoding import beam_search
from gr_jax.docids.trie import Trie
from gr_jax.vocabulary import EOS_ID, PAD_ID
from gr_jax.tools.bench import decode, static_decode


@pytest.fixture(scope="module")
def small_docids():
    rows = decode.random_docid_rows(np.random.default_rng(3), num_docids=400, vocab_size=40, length=3)
    trie = Trie.build(rows, vocab_size=40, sparse_fanout=4)
    host_trie = decode.GenreTrie([[PAD_ID, *row] for row in rows.tolist()])
    return rows, trie, host_trie


def test_random_docid_rows_are_distinct_eos_terminated_and_in_range():
    rows = decode.random_docid_rows(np.random.default_rng(0), num_docids=500, vocab_size=10, length=3)
    assert rows.shape == (500, 4)
    assert len({tuple(row) for row in rows.tolist()}) == 500  # 500 of the 8**3 = 512 possible: collisions topped up
    assert (rows[:, -1] == EOS_ID).all() and (rows[:, :-1] >= 2).all() and (rows < 10).all()


def test_genre_trie_allows_what_a_brute_force_prefix_scan_allows(small_docids):
    rows, _, host_trie = small_docids
    sequences = [[PAD_ID, *row] for row in rows.tolist()]
    for prefix in ([PAD_ID], [PAD_ID, sequences[7][1]], sequences[7][:3], sequences[7], [PAD_ID, 1]):
        expected = sorted({s[len(prefix)] for s in sequences if s[:len(prefix)] == prefix and len(s) > len(prefix)})
        assert sorted(host_trie.get(prefix)) == expected


@pytest.mark.parametrize("model_output", decode.MODEL_OUTPUTS)
def test_our_search_and_the_host_callback_pattern_return_the_same_docids(small_docids, model_output):
    rows, trie, host_trie = small_docids
    line = decode.run_constraint(num_docids=len(rows), vocab_size=40, docid_length=3, batch=2, beams=6,
                                 sparse_fanout=4, repeats=1, rows=rows, trie=trie, build_s=0.0,
                                 host_trie=host_trie, host_build_s=0.0, seed=1, model_output=model_output)
    json.dumps(line)  # one JSON line
    assert line["model_output"] == model_output
    assert line["ours_valid_docid_fraction"] == 1.0 and line["host_callback_valid_docid_fraction"] == 1.0
    assert line["same_docids_ours_host"] == 1.0
    assert line["max_score_difference_ours_host"] < 1e-4


def test_run_constraint_rejects_an_unknown_model_output(small_docids):
    rows, trie, host_trie = small_docids
    with pytest.raises(ValueError, match="model_output"):
        decode.run_constraint(num_docids=len(rows), vocab_size=40, docid_length=3, batch=1, beams=2,
                              sparse_fanout=4, repeats=1, rows=rows, trie=trie, build_s=0.0, host_trie=host_trie,
                              host_build_s=0.0, seed=0, model_output="probs")


def test_build_part_reports_the_trie_of_digit_pids():
    line = decode.run_build(num_docids=1000, vocab=None, sparse_fanout=4)
    # pids 0..999 as digit strings: states are the distinct prefixes plus EOS ends, DEAD and ROOT.
    prefixes = {str(pid)[:n] for pid in range(1000) for n in range(1, len(str(pid)) + 1)}
    assert line["trie_states"] == 2 + len(prefixes) + 1000
    assert line["max_length"] == 4 and line["vocab_size"] == 13 and line["trie_max_fanout"] == 11  # EOS + 10 digits


@pytest.mark.parametrize("kind", ["bigram", "per-position"])
def test_static_harness_reference_search_is_our_search(kind):
    """The STATIC comparison judges both searches against `reference_beam_search` (numpy, untruncated): on a small
    corpus it must return exactly our search's docids, for both objectives and both stand-in models."""
    batch, beams, length, vocab = 2, 6, 3, 30
    rows = decode.random_docid_rows(np.random.default_rng(4), num_docids=3000, vocab_size=vocab, length=length)
    content = rows[:, :length]
    trie = Trie.build(rows, vocab_size=vocab, sparse_fanout=4)
    stand_in = static_decode.StandIn(kind, batch=batch, beams=beams, length=length, vocab=vocab, rows=8, scale=3.0,
                                     seed=0)
    # STATIC's first call has one row per query: each gets its query's beam-0 row of the full call.
    previous = jnp.zeros(batch * beams, jnp.int32)
    np.testing.assert_array_equal(stand_in.logits(stand_in.table, previous[:batch], 0),
                                  stand_in.logits(stand_in.table, previous, 0)[::beams])
    log_probs = np.asarray(jax.nn.log_softmax(stand_in.table, axis=-1))
    ids = static_decode.prefix_ids(content)
    for score_forced_eos in (False, True):
        result = beam_search(step_fn=lambda tokens, position, cache: (stand_in.logits(stand_in.table, tokens, position),
                                                                      cache),
                             cache={}, batch_size=batch, num_beams=beams, max_decode_len=length + 1, trie=trie,
                             score_forced_eos=score_forced_eos)
        found = np.asarray(trie.leaf_indices(result.sequences.reshape(batch * beams, -1))).reshape(batch, beams)
        expected, beyond_cut = static_decode.reference_beam_search(stand_in, log_probs, content, ids,
                                                                   with_eos=score_forced_eos, cut=4)
        np.testing.assert_array_equal(found, expected)
        assert len(beyond_cut) == batch
