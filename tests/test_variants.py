"""Model variants: atomic-ID head (full-corpus ranking, shard-wise), PAWA decoder, NCI's consistency loss, gins."""
import dataclasses
import functools
import math

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from gr_jax import decoding
from gr_jax import experiment as experiment_lib
from gr_jax import gin_utils
from gr_jax import losses
from gr_jax import metrics as metrics_lib
from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.docids.schemes.atomic import atomic_docid_table
from gr_jax.docids.trie import Trie
from gr_jax.heads import StandardHead
from gr_jax.heads.atomic import AtomicHead, top_k_columns
from gr_jax.heads.pawa import PawaHead
from gr_jax.heads.standard import StandardLayer
from gr_jax.models import EncoderDecoderModel
from gr_jax.trainer import Trainer

from test_scan_layers import started

# heads=4 so the 'model' axis of a 2x4 mesh divides every sharded dimension.
MICRO = network.T5Config(vocab_size=128, emb_dim=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                         head_dim=8, mlp_dim=64, dropout_rate=0.0)
# Atomic ids as gr_jax.docids.schemes.atomic.atomic_docid_table makes them: docid i is token ATOMIC_START + i
# (appended after a SentencePiece vocabulary of ATOMIC_START pieces), the head's column i.
STANDARD = StandardHead()
NUM_DOCIDS, ATOMIC_START = 300, 120
ATOMIC, ATOMIC_HEAD = MICRO, AtomicHead(docid_vocab_start=ATOMIC_START, docid_vocab_size=NUM_DOCIDS)
# 2D semantic ids: 3 positions x 4 values, tokens appended after a 128-token text vocabulary.
POSITIONS, VALUES, TEXT_VOCAB = 3, 4, 128
PAWA = dataclasses.replace(MICRO, vocab_size=256)
PAWA_HEAD = PawaHead(docid_vocab_start=TEXT_VOCAB, docid_vocab_size=POSITIONS * VALUES)


def _params(config, head=STANDARD, *, input_length=7, target_length=4, loss=losses.TokenCrossEntropy()):
    model = EncoderDecoderModel(config=config, head=head, loss=loss)
    # The init depends on the network alone (not the loss): computed once per config and head, in fresh containers.
    return model, jax.tree.map(lambda x: x, _initial_params(config, head, input_length, target_length))


@functools.cache
def _initial_params(config, head, input_length, target_length):
    return nn.unbox(_boxed_params(config, head, input_length, target_length))


@functools.cache
def _boxed_params(config, head=STANDARD, input_length=7, target_length=4):
    """Initialised op by op: the initialiser's ops compile once per shape, for every config (one compiled
    initialiser per config compiles a threefry program for each parameter). The initialiser draws no dropout:
    configs that differ in `dropout_rate` alone share one init (the same values)."""
    if config.dropout_rate:
        return _boxed_params(dataclasses.replace(config, dropout_rate=0.0), head, input_length, target_length)
    variables = EncoderDecoderModel(config=config, head=head).init(jax.random.PRNGKey(0), input_length=input_length,
                                                        target_length=target_length)
    return variables["params"]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _logits(config, head, params, queries, decoder_inputs):
    """The teacher-forced logits, compiled whole (op by op, each of the network's ops compiles on its own)."""
    return EncoderDecoderModel(config=config, head=head).module.apply({"params": params}, queries, decoder_inputs)


def _queries(n, length=7, seed=1):
    return jax.random.randint(jax.random.PRNGKey(seed), (n, length), 3, TEXT_VOCAB).at[0, 5:].set(0)


def _count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def _trunk_params(cfg) -> int:
    """Hand count of T5.1.1 without an output layer (as tests/test_network.py counts it)."""
    d, h, k, m = cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim
    attention, mlp = 4 * d * h * k, 3 * d * m
    encoder = cfg.num_encoder_layers * (attention + mlp + 2 * d) + d
    decoder = cfg.num_decoder_layers * (2 * attention + mlp + 3 * d) + d
    return cfg.vocab_size * d + encoder + decoder + 2 * h * cfg.relative_attention_num_buckets


def _semantic2d_table(n, seed=0) -> np.ndarray:
    """n distinct 2D semantic ids: token of value v at position p is TEXT_VOCAB + p * VALUES + v, then EOS."""
    rng = np.random.default_rng(seed)
    codes = rng.choice(VALUES ** POSITIONS, size=n, replace=False)
    digits = np.stack([(codes // VALUES ** p) % VALUES for p in reversed(range(POSITIONS))], axis=1)
    tokens = TEXT_VOCAB + np.arange(POSITIONS) * VALUES + digits
    return np.concatenate([tokens, np.ones((n, 1), np.int64)], axis=1).astype(np.int32)


def _batch(encoder_tokens, targets):
    targets = np.asarray(targets, np.int32)
    return {"encoder_input_tokens": np.asarray(encoder_tokens, np.int32), "decoder_target_tokens": targets,
            "decoder_input_tokens": np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1),
            "decoder_loss_weights": (targets > 0).astype(np.int32)}


# --- Configuration ------------------------------------------------------------------------------------------------


def test_bad_head_configurations_are_refused():
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        PawaHead(num_layers=0)
    for head in (AtomicHead, PawaHead):
        with pytest.raises(ValueError, match="set both docid_vocab_start and docid_vocab_size, or neither"):
            head(docid_vocab_start=300)
        unset = head()  # the entry points fill the range in later
        with pytest.raises(ValueError, match="needs docid_vocab_start and docid_vocab_size"):
            _params(MICRO, unset)
    with pytest.raises(ValueError, match="does not cover the docid tokens"):
        EncoderDecoderModel(config=dataclasses.replace(ATOMIC, output_vocab_size=ATOMIC_START + 10), head=ATOMIC_HEAD)
    with pytest.raises(ValueError, match="above EOS"):
        PawaHead(docid_vocab_start=1, docid_vocab_size=3)
    with pytest.raises(ValueError, match="consistency measure must be one of"):
        losses.ConsistencyRegularised(weight=0.15, measure="l2")
    with pytest.raises(ValueError, match="do not fit the vocabulary"):
        _params(MICRO, PawaHead(docid_vocab_start=120, docid_vocab_size=20))


# --- Atomic ids ---------------------------------------------------------------------------------------------------


def test_atomic_head_shapes_and_count():
    model = EncoderDecoderModel(config=ATOMIC, head=ATOMIC_HEAD)
    params = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=7, target_length=4)))
    params = params["params"]
    assert "logits_dense" not in params
    assert params["atomic_logits_dense"].shape == (32, 384)  # 300 columns padded to a multiple of 128
    assert model.logits_vocab_size == ATOMIC_START + NUM_DOCIDS  # the token space of decoded docids
    assert _count(params) == _trunk_params(ATOMIC) + 32 * 384


def _brute_force_ranking(model, params, queries, k):
    """Sort the log-softmax over all docid columns of the teacher-forced logits at the start position."""
    logits = _logits(model.config, model.head, params, queries, jnp.zeros((queries.shape[0], 3), jnp.int32))
    assert logits.shape == (queries.shape[0], 1, 384)  # the atomic decoder runs the start position only
    docid_logits = np.asarray(logits[:, 0, :NUM_DOCIDS], np.float64)  # column i: docid i
    log_p = docid_logits - np.log(np.exp(docid_logits - docid_logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - docid_logits.max(1, keepdims=True)
    order = np.argsort(-log_p, axis=1, kind="stable")[:, :k]
    return order + ATOMIC_START, np.take_along_axis(log_p, order, axis=1)


def _check_ranking(result, tokens, log_p, max_decode_len):
    np.testing.assert_array_equal(result.sequences[:, :, 0], tokens)
    np.testing.assert_array_equal(result.sequences[:, :, 1], 1)  # EOS
    np.testing.assert_array_equal(result.sequences[:, :, 2:max_decode_len], 0)
    np.testing.assert_allclose(result.scores, log_p, atol=2e-5)


def test_atomic_ranking_equals_sorting_all_docid_logits():
    model, params = _params(ATOMIC, ATOMIC_HEAD)
    queries = _queries(4)
    tokens, log_p = _brute_force_ranking(model, params, queries, k=10)
    result = jax.jit(lambda p, q: model.predict_batch(p, q, num_beams=10, max_decode_len=3))(params, queries)
    _check_ranking(result, tokens, log_p, 3)
    # The evaluator maps sequences back through the DocidTable: row i is [ATOMIC_START + i, EOS].
    table = atomic_docid_table(docids=[f"doc{i}" for i in range(NUM_DOCIDS)], vocab_size=ATOMIC_START).table
    assert [table.lookup(s) for s in np.asarray(result.sequences[1])] == [f"doc{t - ATOMIC_START}" for t in tokens[1]]


def test_atomic_ranking_is_shard_wise_on_a_2x4_mesh():
    model, params = _params(ATOMIC, ATOMIC_HEAD)
    queries = _queries(4)
    tokens, log_p = _brute_force_ranking(model, params, queries, k=40)  # more than one shard's 96 columns hold
    mesh = partitioning.make_mesh(data=2, model=4)
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=7, target_length=4))
    shardings = partitioning.logical_shardings(boxed, mesh=mesh)["params"]
    assert tuple(shardings["atomic_logits_dense"].spec) == (None, "model")  # docid columns split over 'model'
    predict = jax.jit(lambda p, q: model.predict_batch(p, q, num_beams=40, max_decode_len=2),
                      in_shardings=(shardings, partitioning.batch_sharding(mesh)))
    with partitioning.partitioning_context(mesh=mesh):
        result = predict(jax.device_put(params, shardings), queries)
        hlo = predict.lower(params, queries).compile().as_text()
    _check_ranking(result, tokens, log_p, 2)
    # Each device computes the logits of its own 384 / 4 = 96 columns for its 4 / 2 = 2 queries, never all 384.
    assert "f32[2,96]" in hlo and ",384]" not in hlo


def test_top_k_columns_beyond_the_number_of_docids_gives_empty_slots():
    model, params = _params(ATOMIC, dataclasses.replace(ATOMIC_HEAD, docid_vocab_size=5))
    result = jax.jit(lambda p, q: model.head.rank(model, p, q, num_results=8, max_decode_len=2))(  # not op by op
        params, _queries(2))
    assert np.isfinite(result.scores[:, :5]).all() and np.isneginf(result.scores[:, 5:]).all()
    np.testing.assert_array_equal(result.sequences[:, 5:], 0)
    assert sorted(np.asarray(result.sequences[0, :5, 0]).tolist()) == list(range(ATOMIC_START, ATOMIC_START + 5))
    np.testing.assert_allclose(np.exp(result.scores[:, :5]).sum(1), 1.0, rtol=1e-5)  # the whole corpus
    states = jax.random.normal(jax.random.PRNGKey(0), (3, 4))
    kernel = jax.random.normal(jax.random.PRNGKey(1), (4, 16))
    log_p, columns = top_k_columns(states, kernel, k=20, first_column=0, end_column=16)
    assert log_p.shape == columns.shape == (3, 16)  # k is capped by the number of columns


def test_atomic_generic_beam_search_and_sampling_agree_with_the_ranking():
    """decode_step (docid logits at position 0, only EOS after) drives the generic search to the same result."""
    model, params = _params(ATOMIC, ATOMIC_HEAD)
    queries = _queries(3)
    # Each compiled whole (op by op, each of the network's ops compiles on its own).
    ranked = jax.jit(lambda p, q: model.head.rank(model, p, q, num_results=6, max_decode_len=2))(params, queries)

    def generic_search(p, q):
        context = model._prefill(p, q, 2)
        cache = network.init_cache(ATOMIC, head=ATOMIC_HEAD, rows=3 * 6, max_decode_len=2)
        return decoding.beam_search(step_fn=model._step_fn(p, context), cache=cache, batch_size=3, num_beams=6,
                                    max_decode_len=2)

    searched = jax.jit(generic_search)(params, queries)
    np.testing.assert_array_equal(searched.sequences, ranked.sequences)
    np.testing.assert_allclose(searched.scores, ranked.scores, atol=1e-5)
    sampled = jax.jit(lambda p, q: model.sample_batch(p, q, rng=jax.random.PRNGKey(0), max_decode_len=2, top_k=5))(
        params, queries)
    assert ((sampled.sequences[:, 0] >= ATOMIC_START) & (sampled.sequences[:, 0] < ATOMIC_START + NUM_DOCIDS)).all()
    np.testing.assert_array_equal(sampled.sequences[:, 1], 1)


def test_atomic_loss_and_score_are_per_docid():
    model, params = _params(ATOMIC, ATOMIC_HEAD)
    queries = _queries(4)
    docids = np.array([5, 0, 299, 100])
    targets = np.stack([ATOMIC_START + docids, np.ones(4), np.zeros(4)], axis=1)
    batch = _batch(queries, targets)
    # Each compiled whole, once for all four batches (op by op, each of the network's ops compiles on its own).
    loss_fn, score_batch = jax.jit(model.loss_fn), jax.jit(model.score_batch)
    loss, metrics = loss_fn(params, batch, None)
    logits = _logits(ATOMIC, ATOMIC_HEAD, params, queries, batch["decoder_input_tokens"])
    log_p = jax.nn.log_softmax(logits[:, 0])
    expected = -np.asarray(log_p)[np.arange(4), docids]
    z = model.loss.z_loss * np.square(np.asarray(jax.nn.logsumexp(logits[:, 0], axis=-1)))
    np.testing.assert_allclose(loss, (expected + z).sum(), rtol=1e-5)
    assert float(metrics["loss"].count) == 4.0  # one target (the docid) per query, EOS is certain
    np.testing.assert_allclose(score_batch(params, batch), -expected, rtol=1e-5)
    # A padding row (no target) weighs nothing; a weighted target that is no docid token makes the loss NaN.
    padded = _batch(queries, np.concatenate([targets[:3], np.zeros((1, 3))]))
    assert math.isfinite(float(loss_fn(params, padded, None)[0]))
    for not_a_docid in (ATOMIC_START - 1, ATOMIC_START + NUM_DOCIDS):
        bad = _batch(queries, np.concatenate([targets[:3], [[not_a_docid, 1, 0]]]))
        assert math.isnan(float(loss_fn(params, bad, None)[0]))
        assert math.isnan(float(score_batch(params, bad)[3]))


# --- PAWA ---------------------------------------------------------------------------------------------------------


def test_pawa_param_shapes_and_count():
    _, params = _params(PAWA, PAWA_HEAD)
    pawa = params["pawa"]
    assert PAWA_HEAD.depth(PAWA) == 1  # half the decoder's 2 layers
    assert pawa["weight_generator"].shape == (32, 32 * 32)
    assert params["logits_dense"].shape == (32, 256)  # the shared projection keeps its name and shape
    d, h, k, m = 32, 4, 8, 64
    stack = (2 * 4 * d * h * k + 3 * d * m + 3 * d) + d + h * 32  # one decoder layer, norm, relpos table
    assert _count(pawa) == stack + d * d * d
    assert _count(params) == _trunk_params(PAWA) + 32 * 256 + _count(pawa)
    sizes = dataclasses.replace(PAWA_HEAD, num_layers=3)
    assert sizes.depth(PAWA) == 3 and STANDARD.num_cached_layers(MICRO) == 0


def _pawa_projections(transformer, queries, decoder_inputs):
    """The PAWA head's W_t for teacher-forced decoder inputs (`PawaLayer.projections`)."""
    return transformer.output_layer.projections(transformer.embed(decoder_inputs), transformer.encode(queries),
                                                cross_mask=(queries > 0)[:, None, None, :])


def test_pawa_projections_depend_on_position_and_prefix_and_give_the_logits():
    model, params = _params(PAWA, PAWA_HEAD)
    queries = _queries(2)
    table = _semantic2d_table(8)
    decoder_inputs = np.concatenate([np.zeros((2, 1), np.int32), table[:2, :-1]], axis=1)  # two different prefixes
    # Compiled whole (op by op, each of the network's ops compiles on its own).
    logits, states = jax.jit(lambda p, q, d: model.module.apply({"params": p}, q, d, return_states=True))(
        params, queries, decoder_inputs)
    projections_of = jax.jit(lambda p, q, d: model.module.apply({"params": p}, q, d, method=_pawa_projections))
    projections = projections_of(params, queries, decoder_inputs)
    assert projections.shape == (2, 4, 32, 1 + POSITIONS * VALUES)
    columns = np.concatenate([[1], TEXT_VOCAB + np.arange(POSITIONS * VALUES)])
    # logits = h_t W_t over EOS and the docid tokens; every other column is masked.
    np.testing.assert_allclose(logits[..., columns], np.einsum("btd,btdv->btv", states, projections), atol=1e-4)
    others = np.setdiff1d(np.arange(256), columns)
    assert (np.asarray(logits[..., others]) == network.NEG_INF).all()
    # Position-dependent: W_t differs along the sequence; prefix-dependent: and between the two prefixes.
    for t in range(1, 4):
        assert np.abs(projections[0, t] - projections[0, 0]).max() > 0.1
        assert np.abs(projections[0, t] - projections[1, t]).max() > 0.1
    # Same query, same prefix -> same projection (only the prefix and the query matter).
    same = projections_of(params, queries[:1].repeat(2, 0), decoder_inputs[:1].repeat(2, 0))
    np.testing.assert_allclose(same[0], same[1], atol=1e-6)


def test_pawa_incremental_decoding_equals_teacher_forcing():
    model, params = _params(PAWA, PAWA_HEAD)
    queries = _queries(3)
    table = _semantic2d_table(3, seed=1)
    decoder_inputs = np.concatenate([np.zeros((3, 1), np.int32), table[:, :-1]], axis=1)
    # Compiled whole, one decode step program for all t (op by op, each of the network's ops compiles on its own).
    full = _logits(PAWA, PAWA_HEAD, params, queries, decoder_inputs)
    context = jax.jit(lambda p, q: model._prefill(p, q, 4))(params, queries)
    cache = network.init_cache(PAWA, head=PAWA_HEAD, rows=3, max_decode_len=4)
    assert len(cache) == PAWA.num_decoder_layers + PAWA_HEAD.depth(PAWA)
    step = jax.jit(lambda p, c, tokens, t, cache: model._step_fn(p, c)(tokens, t, cache))
    steps = []
    for t in range(4):
        logits, cache = step(params, context, jnp.asarray(decoder_inputs[:, t]), jnp.int32(t), cache)
        steps.append(logits)
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-4, rtol=1e-4)


def test_pawa_constrained_beam_search_returns_valid_docids_with_exact_scores():
    model, params = _params(PAWA, PAWA_HEAD)
    table = _semantic2d_table(20)
    trie = Trie.build(table, vocab_size=PAWA_HEAD.logits_vocab_size(PAWA))
    queries = _queries(2)
    result = jax.jit(lambda p, q, t: model.predict_batch(p, q, num_beams=5, max_decode_len=4, trie=t))(
        params, queries, trie)
    rows = {tuple(r) for r in table.tolist()}
    assert all(tuple(s) in rows for s in np.asarray(result.sequences).reshape(-1, 4).tolist())
    sequences = np.asarray(result.sequences).reshape(-1, 4)
    scores = jax.jit(model.score_batch)(params, _batch(np.repeat(np.asarray(queries), 5, axis=0), sequences))
    np.testing.assert_allclose(np.asarray(result.scores).reshape(-1), scores, atol=1e-4)


def test_pawa_trains_on_a_2x4_mesh():
    """Queries -> 2D semantic ids: a few steps with sharded PAWA parameters lower the loss."""
    config = dataclasses.replace(PAWA, dropout_rate=0.1, num_encoder_layers=1, num_decoder_layers=1)
    table = _semantic2d_table(16)
    rng = np.random.default_rng(0)
    batch = _batch(rng.integers(3, TEXT_VOCAB, (16, 8)), table)
    mesh = partitioning.make_mesh(data=2, model=4)
    trainer = Trainer(model=EncoderDecoderModel(config=config, head=PAWA_HEAD), mesh=mesh, input_length=8,
                      target_length=4, batch_size=16, optimizer=optimizers.make_optimizer(
                          name="adafactor", learning_rate=optimizers.warmup_constant(peak=1e-2, warmup_steps=1)))
    assert tuple(trainer.state_shardings.params["pawa"]["weight_generator"].spec) == (None, "model")
    state = started(trainer, _boxed_params(config, PAWA_HEAD))
    losses_seen = []
    for _ in range(15):
        state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(1))
        losses_seen.append(float(metrics["loss"].total / metrics["loss"].count))
    assert all(math.isfinite(x) for x in losses_seen)
    assert losses_seen[-1] < 0.5 * losses_seen[0], losses_seen


# --- Consistency loss ---------------------------------------------------------------------------------------------


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_symmetric_kl_matches_its_definition():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 3, 11)) * 3, rng.normal(size=(2, 3, 11)) * 3
    p, q = _softmax(a), _softmax(b)
    expected = 0.5 * ((p * np.log(p / q)).sum(-1) + (q * np.log(q / p)).sum(-1))
    np.testing.assert_allclose(losses.symmetric_kl(jnp.asarray(a), jnp.asarray(b)), expected, rtol=1e-4)
    masked = np.where(np.arange(11) < 4, network.NEG_INF, a)  # masked columns add nothing, and no NaN
    same_mask = np.where(np.arange(11) < 4, network.NEG_INF, b)
    value = losses.symmetric_kl(jnp.asarray(masked), jnp.asarray(same_mask))
    p, q = _softmax(a[..., 4:]), _softmax(b[..., 4:])
    np.testing.assert_allclose(value, 0.5 * ((p - q) * np.log(p / q)).sum(-1), rtol=1e-4)


def test_contrastive_consistency_matches_a_loop():
    rng = np.random.default_rng(1)
    batch, length, embed = 4, 3, 5
    za, zb = rng.normal(size=(2, batch, length, embed))
    valid = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]], bool)
    temperature = 0.5
    value = losses.contrastive_consistency(jnp.asarray(za), jnp.asarray(zb), jnp.asarray(valid),
                                           temperature=temperature)
    expected = np.zeros((batch, length))
    for t in range(length):
        states = np.concatenate([za[:, t], zb[:, t]])
        ok = np.concatenate([valid[:, t], valid[:, t]])
        for i in range(batch):
            if not valid[i, t]:
                continue
            directions = []
            for row, positive in ((i, i + batch), (i + batch, i)):
                sims = {j: states[row] @ states[j] / (embed * temperature) for j in range(2 * batch)
                        if j != row and ok[j]}
                log_z = np.log(sum(np.exp(s) for s in sims.values()))
                directions.append(log_z - sims[positive])
            expected[i, t] = np.mean(directions)
    np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-6)
    assert value[2, 1] == 0  # an invalid position
    assert abs(float(value[0, 2])) < 1e-6  # the one valid example at t=2 has no negative: nothing to contrast


@pytest.mark.parametrize("kind", ["symmetric_kl", "contrastive"])
def test_consistency_loss_is_zero_without_dropout_and_positive_with_it(kind):
    queries = np.asarray(_queries(4))
    batch = _batch(queries, np.array([[5, 6, 1, 0], [7, 1, 0, 0], [8, 9, 10, 1], [11, 12, 1, 0]]))
    rng = jax.random.PRNGKey(3)
    measure = {"symmetric_kl": losses.SymmetricKL(), "contrastive": losses.ContrastiveStates()}[kind]
    for dropout_rate in (0.0, 0.3):
        config = dataclasses.replace(MICRO, dropout_rate=dropout_rate)
        model, params = _params(config, loss=losses.ConsistencyRegularised(weight=0.5, measure=measure))
        loss, metrics = model.loss_fn(params, batch, rng)
        plain_loss, plain = EncoderDecoderModel(config=config).loss_fn(params, batch, rng)
        assert "consistency_loss" not in plain
        consistency = float(metrics["consistency_loss"].total)
        if dropout_rate == 0.0:
            if kind == "symmetric_kl":
                assert consistency == pytest.approx(0.0, abs=1e-6)  # identical passes
            # Without dropout both passes are the plain pass: the loss is its loss plus the weighted regulariser.
            np.testing.assert_allclose(loss, plain_loss + 0.5 * consistency, rtol=1e-5)
        else:
            assert consistency > 1e-3
            assert float(metrics["loss"].count) == 12.0
        assert math.isfinite(float(loss))
    assert "consistency_loss" in metrics_lib.summarize(jax.device_get(metrics))


def test_consistency_training_keeps_the_loss_finite_for_hundreds_of_steps():
    config = dataclasses.replace(MICRO, dropout_rate=0.1, num_encoder_layers=1, num_decoder_layers=1)
    mesh = partitioning.make_mesh(data=1, model=1, devices=jax.devices()[:1])
    model = EncoderDecoderModel(config=config, loss=losses.ConsistencyRegularised(weight=0.15))
    trainer = Trainer(model=model, mesh=mesh, input_length=8, target_length=4,
                      batch_size=8, optimizer=optimizers.make_optimizer(
                          name="adafactor", learning_rate=optimizers.warmup_constant(peak=1e-2, warmup_steps=10)))
    rng = np.random.default_rng(0)
    batch = _batch(rng.integers(3, TEXT_VOCAB, (8, 8)), np.concatenate(
        [rng.integers(3, TEXT_VOCAB, (8, 3)), np.ones((8, 1), np.int64)], axis=1))
    state = started(trainer, _boxed_params(config))
    history = []
    # 200 steps: the loss falls from 5.8 to 0.03 (0.08 by step 100), far below half of it.
    for step in range(200):
        state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(step))
        if step % 50 == 0 or step == 199:
            history.append(metrics_lib.summarize(jax.device_get(metrics)))
    assert all(math.isfinite(v) for summary in history for v in summary.values()), history
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    assert history[-1]["consistency_loss"] > 0


# --- gin ----------------------------------------------------------------------------------------------------------


CONSISTENCY = "losses/consistency.gin"


@pytest.mark.parametrize("name,gin_files,bindings,expected,expected_loss", [
    ("standard", [CONSISTENCY], ["CONSISTENCY_WEIGHT = 0.15"], dict(head=StandardHead()),
     losses.ConsistencyRegularised(weight=0.15, measure=losses.SymmetricKL())),
    ("atomic", [], ["DOCID_VOCAB_START = 320", "DOCID_VOCAB_SIZE = 1000"],
     dict(head=AtomicHead(docid_vocab_start=320, docid_vocab_size=1000), logits_vocab_size=1320),
     losses.TokenCrossEntropy()),
    ("pawa", ["losses/consistency_contrastive.gin"], ["DOCID_VOCAB_START = 320", "DOCID_VOCAB_SIZE = 70"],
     dict(head=PawaHead(docid_vocab_start=320, docid_vocab_size=70)),
     losses.ConsistencyRegularised(weight=0.15, measure=losses.ContrastiveStates())),
    # Unbound, the range comes from the docid space (here its tokens are [320, 1320) and [320, 390)).
    ("atomic", [], [], dict(head=AtomicHead(docid_vocab_start=320, docid_vocab_size=1000), logits_vocab_size=1320),
     losses.TokenCrossEntropy()),
    ("pawa", [], [], dict(head=PawaHead(docid_vocab_start=320, docid_vocab_size=70)), losses.TokenCrossEntropy()),
    # The head's own settings, bound in gin.
    ("pawa", [], ["PAWA_NUM_LAYERS = 3"], dict(head=PawaHead(num_layers=3, docid_vocab_start=320, docid_vocab_size=70)),
     losses.TokenCrossEntropy()),
])
def test_decoder_gins_configure_the_model_the_entry_points_build(name, gin_files, bindings, expected, expected_loss):
    gin.clear_config()
    try:
        gin_utils.parse_gin(gin_files=["runs/train.gin", "models/t5_1_1/tiny.gin", f"decoders/{name}.gin", *gin_files],
                            bindings=["MODEL_DIR = '/tmp/unused'", "DATASET_NAME = 'x'", "DATA_DIR = '/tmp/unused'",
                                      "TRAIN_STEPS = 1", *bindings])
        experiment = gin.get_configurable(experiment_lib.Experiment)()
    finally:
        gin.clear_config()
    table_range = {"standard": None, "atomic": (320, 1320), "pawa": (320, 390)}[name]
    model = experiment_lib.build_model(config=experiment.network_config, loss=experiment.loss, head=experiment.head,
                                       model_vocab_size=max(390, table_range[1] if table_range else 0),
                                       docid_token_range=table_range)
    for key, value in expected.items():
        assert getattr(model, key) == value, key
    assert model.loss == expected_loss  # the loss, configured in one place
    assert model.config.emb_dim == 256  # the size gin still sets the dimensions
    assert experiment.dataset.docid_scheme == {"standard": "naive", "atomic": "atomic", "pawa": "semantic2d"}[name]
    abstract = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=4, target_length=4))
    assert _count(nn.unbox(abstract)) > 0


class _DoubledLayer(StandardLayer):
    def project(self, states):
        return 2.0 * super().project(states)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Doubled(StandardHead):
    layer_class = _DoubledLayer


def test_a_new_head_is_one_class_given_to_the_model():
    """A head defined anywhere plugs in where the model is built (gin: HEAD) with no other module edited
    (tests/test_custom_head.py does it through gin and the entry points' build)."""
    standard, params = _params(MICRO)
    model = EncoderDecoderModel(config=MICRO, head=_Doubled())
    # The same parameter tree (its shapes: op by op, a second init would compile each of its ops on its own), so the
    # standard head's parameters are the doubled head's.
    doubled_tree = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=7, target_length=4))
    assert jax.tree.map(np.shape, nn.unbox(doubled_tree)["params"]) == jax.tree.map(np.shape, params)
    queries, targets = _queries(2), np.array([[5, 6, 1, 0], [7, 1, 0, 0]])
    batch = _batch(queries, targets)
    np.testing.assert_allclose(  # each compiled whole (op by op, each of the network's ops compiles on its own)
        _logits(model.config, model.head, params, queries, batch["decoder_input_tokens"]),
        2.0 * _logits(standard.config, standard.head, params, queries, batch["decoder_input_tokens"]), rtol=1e-6)
    result = jax.jit(lambda p, q: model.predict_batch(p, q, num_beams=3, max_decode_len=4))(  # generic search
        params, queries)
    assert result.sequences.shape == (2, 3, 4)
