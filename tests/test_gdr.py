"""GDR: cluster ids, the clustered index against brute force, the loss by hand, training batches, and a run through
the entry points that adds documents without training."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import network
from gr_jax.data.readers import DataFormatError, open_dataset
from gr_jax.dense.index import CorpusIndex, docids_digest
from gr_jax.gdr.clusters import ClusterIds, build_cluster_ids, cluster_id_table, leaf_centroids
from gr_jax.gdr.index import ClusteredIndex
from gr_jax.gdr.losses import GdrLoss
from gr_jax.gdr.model import GdrModel
from gr_jax.losses import Outputs
from gr_jax.vocabulary import EOS_ID

MICRO = network.T5Config(vocab_size=128, emb_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         head_dim=8, mlp_dim=64, dropout_rate=0.0)


def blobs(rng, *, centers, per_center, dim=8, spread=0.05):
    means = rng.normal(size=(centers, dim)) * 3
    points = np.concatenate([m + spread * rng.normal(size=(per_center, dim)) for m in means])
    return points.astype(np.float32), np.repeat(np.arange(centers), per_center)


# --- Cluster ids -------------------------------------------------------------------------------------------------


def test_cluster_ids_have_a_fixed_number_of_clusters_that_recover_the_blobs():
    rng = np.random.default_rng(0)
    points, blob = blobs(rng, centers=6, per_center=40)
    clusters = build_cluster_ids(embeddings=points, branching=(3, 2), seed=0, nredo=3)
    # 6 well-separated blobs, 3 x 2 clusters: each cluster is exactly one blob.
    assert clusters.num_clusters == 6 and clusters.sizes().tolist() == [40] * 6
    for c in range(6):
        assert np.unique(blob[clusters.assignment == c]).size == 1
    # The same corpus ten times larger has no more clusters: their number is set by branching, not by N.
    big, _ = blobs(rng, centers=6, per_center=400)
    assert build_cluster_ids(embeddings=big, branching=(3, 2), seed=0).num_clusters <= 6
    again = build_cluster_ids(embeddings=points, branching=(3, 2), seed=0, nredo=3)
    assert np.array_equal(again.assignment, clusters.assignment) and np.array_equal(again.paths, clusters.paths)
    assert (np.diff(np.ravel_multi_index(clusters.paths.T, (3, 2))) > 0).all()  # lexicographic order


def test_given_groups_are_the_first_level_and_k_means_splits_each_of_them():
    rng = np.random.default_rng(0)
    points, blob = blobs(rng, centers=6, per_center=40)
    groups = np.array([0, 1, 1, 0, 1, 0])[blob]  # three blobs a group, not the two k-means would draw
    clusters = build_cluster_ids(embeddings=points, branching=(2, 3), seed=0, nredo=3, groups=groups)
    assert clusters.num_clusters == 6 and clusters.sizes().tolist() == [40] * 6
    assert np.array_equal(clusters.paths[clusters.assignment, 0], groups)
    for c in range(6):  # below a group, k-means finds its three blobs
        assert np.unique(blob[clusters.assignment == c]).size == 1
    with pytest.raises(ValueError, match="each of 0..2"):
        build_cluster_ids(embeddings=points, branching=(3, 2), groups=groups)  # group 2 holds nothing
    with pytest.raises(ValueError, match="one per document"):
        build_cluster_ids(embeddings=points, branching=(2, 3), groups=groups[:-1])


def test_a_node_with_at_most_k_documents_is_not_split():
    points = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    clusters = build_cluster_ids(embeddings=points, branching=(8, 5))
    assert clusters.num_clusters == 1 and clusters.paths.tolist() == [[0, 0]]
    with pytest.raises(ValueError, match="each >= 2"):
        build_cluster_ids(embeddings=points, branching=(8, 1))


def test_cluster_id_tokens_are_fixed_width_digits_then_eos():
    digits = list(range(10, 20))  # "0".."9" -> 10..19
    clusters = ClusterIds(branching=(12, 3), paths=np.array([[0, 2], [7, 0], [11, 1]]), assignment=[0, 1, 2, 2])
    table = cluster_id_table(clusters, digit_tokens=digits)
    assert table.docids == ("c0-2", "c7-0", "c11-1")
    assert table.tokens.tolist() == [[10, 10, 12, EOS_ID], [10, 17, 10, EOS_ID], [11, 11, 11, EOS_ID]]


def test_bad_cluster_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unique and in lexicographic order"):
        ClusterIds(branching=(4,), paths=[[2], [1]], assignment=[0, 1])
    with pytest.raises(ValueError, match=r"values in \[0, 2\)"):
        ClusterIds(branching=(4,), paths=[[1], [2]], assignment=[0, 2])
    (tmp_path / "c.npz").write_bytes(b"not an npz")
    with pytest.raises(DataFormatError, match="c.npz: not a cluster-id file"):
        ClusterIds.load(tmp_path / "c.npz")


def test_leaf_centroids_are_the_cluster_means():
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(50, 3)).astype(np.float32)
    assignment = rng.integers(0, 4, size=50)
    expected = np.stack([vectors[assignment == c].mean(axis=0) for c in range(4)])
    np.testing.assert_allclose(leaf_centroids(vectors, assignment, num_clusters=4), expected, rtol=1e-6, atol=1e-6)


# --- The clustered index -----------------------------------------------------------------------------------------


def dense_index_dir(tmp_path, vectors, *, name="dense", encoder=None):
    """A saved dense corpus index of `vectors` (as `gr_jax.retrievers.dense` writes one)."""
    directory = tmp_path / name
    directory.mkdir(parents=True)
    np.save(directory / "embeddings.npy", vectors)
    docids = np.asarray([f"d{i}".encode() for i in range(len(vectors))])
    manifest = {"corpus": {"documents": len(vectors), "docids_sha1": docids_digest(docids)},
                "encoder": encoder or {"model_dir": "/nowhere", "step": 1, "config_sha1": "abc",
                                       "dim": vectors.shape[1]}}
    return CorpusIndex(docids=docids, embeddings=vectors, manifest=manifest).save(directory)


def clustered(tmp_path, *, n=60, dim=6, k=(3, 2), seed=3):
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    corpus = CorpusIndex.load(dense_index_dir(tmp_path, vectors).directory, expect=lambda m, p: None)
    clusters = build_cluster_ids(embeddings=vectors, branching=k, seed=0)
    return ClusteredIndex.from_corpus_index(corpus, clusters=clusters, clusters_source={}).save(tmp_path / "gdr")


@pytest.mark.parametrize("cluster_weight", [0.0, 0.7])
def test_search_is_the_exact_top_k_of_the_combined_score_over_the_recalled_clusters(tmp_path, cluster_weight):
    index = clustered(tmp_path)
    rng = np.random.default_rng(4)
    queries = rng.normal(size=(5, 6)).astype(np.float32)
    clusters = np.stack([rng.permutation(index.clusters.num_clusters)[:3] for _ in range(5)])
    clusters[1, 2] = -1  # an empty beam recalls nothing
    log_probs = -rng.exponential(size=clusters.shape).astype(np.float32)
    scores, rows = index.search(queries, clusters=clusters, cluster_log_probs=log_probs, k=7, temperature=0.5,
                                cluster_weight=cluster_weight)
    vectors = np.load(tmp_path / "dense" / "embeddings.npy")
    for q in range(5):
        brute = {}
        for c, lp in zip(clusters[q], log_probs[q]):
            for row in np.flatnonzero(index.clusters.assignment == c) if c >= 0 else []:
                brute[row] = vectors[row] @ queries[q] / 0.5 + cluster_weight * lp
        best = sorted(brute, key=lambda r: -brute[r])[:7]
        assert rows[q, :len(best)].tolist() == best
        np.testing.assert_allclose(scores[q, :len(best)], [brute[r] for r in best], rtol=1e-5)
        assert (rows[q, len(best):] == -1).all() and np.isneginf(scores[q, len(best):]).all()


def test_added_documents_go_to_the_nearest_centroid_and_survive_a_reload(tmp_path):
    index = clustered(tmp_path)
    rng = np.random.default_rng(5)
    new = rng.normal(size=(4, 6)).astype(np.float32)
    grown = index.with_documents(docids=["n0", "n1", "n2", "n3"], vectors=new).save(tmp_path / "grown")
    nearest = np.argmin(((new[:, None] - index.centroids[None]) ** 2).sum(-1), axis=1)
    assert grown.clusters.assignment[60:].tolist() == nearest.tolist()
    assert len(index) == 60 and len(grown) == 64  # the original is unchanged
    reloaded = ClusteredIndex.load(tmp_path / "grown")
    assert reloaded.rows_of(["n2", "d5", "zz"]).tolist() == [62, 5, -1]
    np.testing.assert_array_equal(reloaded.vectors(np.array([62, 5])),
                                  np.stack([new[2], np.load(tmp_path / "dense" / "embeddings.npy")[5]]))
    # An added document is found in its cluster like any other.
    cluster = reloaded.clusters.assignment[62]
    _, rows = reloaded.search(new[2:3], clusters=[[cluster]], cluster_log_probs=[[0.0]], k=100, temperature=1.0,
                              cluster_weight=0.0)
    assert 62 in rows[0].tolist()


def test_bad_additions_and_mismatched_files_are_refused(tmp_path):
    index = clustered(tmp_path)
    vector = np.zeros((1, 6), np.float32)
    with pytest.raises(ValueError, match="'d3' is already in the index"):
        index.with_documents(docids=["d3"], vectors=vector)
    with pytest.raises(ValueError, match="'x' is given 2 times"):
        index.with_documents(docids=["x", "x"], vectors=np.zeros((2, 6), np.float32))
    with pytest.raises(ValueError, match="another encoder"):
        index.with_documents(docids=["x"], vectors=np.zeros((1, 5), np.float32))
    # A cluster file of another corpus (other length) and a base index that changed are named.
    ClusterIds(branching=(2,), paths=[[0]], assignment=np.zeros(59)).save(tmp_path / "gdr" / "clusters.npz")
    with pytest.raises(DataFormatError, match="cover 59 documents, the index holds 60"):
        ClusteredIndex.load(tmp_path / "gdr")
    clustered_again = clustered(tmp_path / "other")
    np.save(tmp_path / "other" / "dense" / "docids.npy", np.asarray([f"e{i}".encode() for i in range(60)]))
    with pytest.raises(DataFormatError, match="now holds other documents"):
        ClusteredIndex.load(clustered_again.directory)


# --- The loss ----------------------------------------------------------------------------------------------------


def test_gdr_loss_is_the_sequence_nll_plus_the_weighted_contrastive_loss_by_hand():
    rng = np.random.default_rng(6)
    b, length, vocab, m, d = 3, 2, 5, 2, 4
    logits = rng.normal(size=(b, length, vocab)).astype(np.float32)
    columns = rng.integers(2, vocab, size=(b, length)).astype(np.int32)
    weights = np.ones((b, length), np.float32)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q, p = unit(rng.normal(size=(b, d))), unit(rng.normal(size=(b, d)))
    neg = unit(rng.normal(size=(b, m, d)))
    positive_rows = np.array([10, 11, 10])  # query 2's positive is query 0's document again
    negative_rows = np.array([[20, -1], [21, 11], [22, 23]])  # an empty slot; query 1's positive among its negatives
    loss = GdrLoss(inter_weight=0.5, intra_weight=2.0, cluster_negative_weight=3.0, z_loss=0.0)
    total, metrics = jax.jit(  # one program (op by op, each of the loss's ops compiles on its own)
        lambda logits, columns, weights, q, p, positive_rows, neg, negative_rows: loss(
            outputs=Outputs(logits=logits, states=jnp.zeros((b, length, 1)), columns=columns, weights=weights,
                            invalid=jnp.zeros((b, length), bool)),
            query_vectors=q, positive_vectors=p, positive_rows=positive_rows, negative_vectors=neg,
            negative_rows=negative_rows, temperature=0.1))(
        jnp.asarray(logits), jnp.asarray(columns), jnp.asarray(weights), jnp.asarray(q, jnp.float32),
        jnp.asarray(p, jnp.float32), jnp.asarray(positive_rows, jnp.int32), jnp.asarray(neg, jnp.float32),
        jnp.asarray(negative_rows, jnp.int32))
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    inter = -np.take_along_axis(log_softmax, columns[..., None], -1)[..., 0].sum(-1)
    intra = []
    for i in range(b):
        terms = [np.exp(q[i] @ p[j] / 0.1) for j in range(b) if j == i or positive_rows[j] != positive_rows[i]]
        terms += [3.0 * np.exp(q[i] @ neg[i, s] / 0.1) for s in range(m)
                  if negative_rows[i, s] >= 0 and negative_rows[i, s] != positive_rows[i]]
        intra.append(np.log(sum(terms)) - q[i] @ p[i] / 0.1)
    assert float(metrics["inter_loss"].total) == pytest.approx(inter.sum(), rel=1e-5)
    assert float(metrics["intra_loss"].total) == pytest.approx(sum(intra), rel=1e-5)
    assert float(total) == pytest.approx(0.5 * inter.sum() + 2.0 * sum(intra), rel=1e-5)
    assert all(float(metric.count) == 3 for metric in metrics.values())  # every metric is per query
    assert float(metrics["candidates"].total) == (2 + 1) + (3 + 1) + (2 + 2)


def micro_batch(rng, *, b=8, m=3, dim=16, length=3, num_clusters=4):
    targets = np.stack([[5 + c, 9, EOS_ID] for c in rng.integers(0, num_clusters, size=b)]).astype(np.int32)
    return {"encoder_input_tokens": rng.integers(3, 128, size=(b, 6)).astype(np.int32),
            "decoder_input_tokens": np.concatenate([np.zeros((b, 1), np.int32), targets[:, :-1]], axis=1),
            "decoder_target_tokens": targets, "decoder_loss_weights": np.ones((b, length), np.int32),
            "positive_row": np.arange(b, dtype=np.int32),
            "positive_vector": rng.normal(size=(b, dim)).astype(np.float32),
            "negative_rows": np.arange(b, b + b * m, dtype=np.int32).reshape(b, m),
            "negative_vectors": rng.normal(size=(b, m, dim)).astype(np.float32)}


def test_gdr_training_has_a_pulse():
    """The micro model fits one batch: both stages' losses fall, the cluster ids come out exactly. On one device:
    learning is checked here, not sharding (each of the 60 steps would run 8 partitions of tiny ops)."""
    import optax
    from gr_jax import partitioning
    from gr_jax.trainer import Trainer
    model = GdrModel(config=MICRO, document_dim=16)
    mesh = partitioning.make_mesh(data=1, model=1, devices=jax.devices()[:1])
    trainer = Trainer(model=model, optimizer=optax.adam(3e-3), mesh=mesh,
                      input_length=6, target_length=3, batch_size=8)
    state = trainer.init_state(jax.random.PRNGKey(0))
    batch = micro_batch(np.random.default_rng(7))
    first = None
    for step in range(60):
        state, metrics = trainer.train_step(state, batch, jax.random.PRNGKey(step))
        metrics = jax.device_get(metrics)
        first = first or metrics
    assert metrics["inter_loss"].total < 0.1 * first["inter_loss"].total
    assert metrics["intra_loss"].total < 0.5 * first["intra_loss"].total
    assert metrics["sequence_accuracy"].total == 8


def test_recall_from_one_encoding_equals_separate_beam_search_and_query_vectors():
    """`recall_batch` shares one encoding between the stages and returns what `predict_batch` and `query_vectors`
    return separately (cluster ids through the trie, their log-probabilities, r_q)."""
    from gr_jax.docids.trie import Trie
    model = GdrModel(config=MICRO, document_dim=16)
    # Each side one compiled program (op by op, every op of the network compiles on its own).
    params = jax.jit(lambda: model.init(jax.random.PRNGKey(3), input_length=6, target_length=3))()["params"]
    ids = cluster_id_table(ClusterIds(branching=(2, 3), paths=np.array([[0, 0], [0, 1], [1, 0], [1, 2]]),
                                      assignment=[0, 1, 2, 3]), digit_tokens=range(10, 20))
    trie = Trie.build(ids.tokens, vocab_size=MICRO.vocab_size)
    tokens = jnp.asarray(np.random.default_rng(0).integers(2, MICRO.vocab_size, size=(3, 6)), jnp.int32)
    result, vectors = jax.jit(lambda p, q, t: model.recall_batch(p, q, num_beams=3, max_decode_len=ids.max_length,
                                                                 trie=t))(params, tokens, trie)
    expected = jax.jit(lambda p, q, t: model.predict_batch(p, q, num_beams=3, max_decode_len=ids.max_length,
                                                           trie=t))(params, tokens, trie)
    np.testing.assert_array_equal(result.sequences, expected.sequences)
    np.testing.assert_allclose(result.scores, expected.scores, atol=1e-6)
    np.testing.assert_allclose(vectors, jax.jit(model.query_vectors)(params, tokens), atol=1e-6)


def test_a_head_that_ranks_in_one_pass_is_refused():
    from gr_jax.heads import AtomicHead
    with pytest.raises(ValueError, match="atomic"):
        GdrModel(config=MICRO, head=AtomicHead(), document_dim=16)


def test_minilm_query_tower_of_the_document_width_is_the_dense_query_encoder():
    """No projection when the tower has the documents' width: r_q is MiniLM's sentence embedding."""
    import flax.linen as nn
    from gr_jax.dense.towers import MiniLMTower
    from gr_jax.encoders.minilm import load_minilm
    tower = MiniLMTower()
    model = GdrModel(config=MICRO, encoder_tower=tower, document_dim=384)
    params = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=16,
                                                        target_length=3))["params"])
    assert "query_projection" not in params and params["bridge"]["kernel"].shape == (384, 32)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), params)
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), params)
    params["tower"] = tower.load_params(abstract=abstract["tower"])
    texts = ["a sweet baked food made of dough", "fermented cabbage"]
    tokens = tower.tokenizer(data_dir="")(texts, length=16).ids
    np.testing.assert_allclose(np.asarray(jax.jit(model.query_vectors)(params, jnp.asarray(tokens))),  # not op by op
                               load_minilm()(texts), atol=2e-5)


# --- Training batches and a run through the entry points ------------------------------------------------------


@pytest.fixture(scope="module")
def dense_run(spm_data_dir, tmp_path_factory):
    """A micro T5 dual encoder of the fixture (TRAIN_STEPS=0: its saved step 0; what the GDR tests read of it is
    its document vectors and its run dir, not their quality, so no train step is compiled) and its saved corpus
    index."""
    import gin
    from gr_jax import train as train_main
    from gr_jax.tools import dense_index
    model_dir = tmp_path_factory.mktemp("gdr_dense") / "dr"
    gin.clear_config()
    train_main.main(["--gin_file=dense/t5.gin", "--gin_file=models/t5_1_1/tiny.gin", f"--gin.DATA_DIR={spm_data_dir}",
                     f"--gin.MODEL_DIR={model_dir}", "--gin.TRAIN_STEPS=0", "--gin.BATCH_SIZE=8",
                     "--gin.QUERY_LENGTH=8", "--gin.DOCUMENT_LENGTH=32", "--gin.PROJECTION_DIM=8",
                     "--gin.network.T5Config.num_encoder_layers=1", "--gin.training.EvalConfig.every_steps=-1"])
    gin.clear_config()
    dense_index.main(["--model_dir", str(model_dir)])
    return model_dir


def test_gdr_index_build_takes_the_first_level_from_a_labels_file(dense_run, tmp_path):
    from gr_jax.tools import gdr_index
    docids = [d.decode() for d in CorpusIndex.load(dense_run / "index" / "0", expect=lambda m, p: None).docids]
    labels = {d: ("odd", "even")[i % 2 == 0] for i, d in enumerate(docids)}
    groups = tmp_path / "groups.tsv"
    groups.write_text("".join(f"{d}\t{labels[d]}\n" for d in reversed(docids)))  # any order
    report = gdr_index.main(["build", "--index_dir", str(dense_run / "index" / "0"), "--branching", "2",
                             "--cluster_groups", str(groups), "--out_dir", str(tmp_path / "gidx")])
    index = ClusteredIndex.load(tmp_path / "gidx")
    assert report["branching"] == [2, 2] and index.manifest["clusters"]["source"]["groups"]["labels"] == ["even",
                                                                                                        "odd"]
    first = index.clusters.paths[index.clusters.assignment, 0]
    assert first.tolist() == [["even", "odd"].index(labels[d]) for d in docids]

    def refused(text, match):
        groups.write_text(text)
        with pytest.raises(DataFormatError, match=match):
            gdr_index.build(index_dir=str(dense_run / "index" / "0"), out_dir=str(tmp_path / "no"), branching=(2,),
                            cluster_groups=str(groups))
        assert not (tmp_path / "no").exists()

    lines = [f"{d}\t{labels[d]}\n" for d in docids]
    refused("".join(lines[1:]), rf"groups\.tsv: no label for document '{docids[0]}'")
    refused("".join(lines) + "stranger\todd\n", rf"groups\.tsv:{len(lines) + 1}: document 'stranger' is not in")
    refused("".join(f"{d}\tall\n" for d in docids), r"one label \('all'\)")
    refused(lines[0] + f"{docids[1]}\t \n", rf"groups\.tsv:2: document '{docids[1]}' has an empty label")


def test_batches_are_seeded_their_targets_the_positives_clusters_and_negatives_their_cluster_mates(
        spm_data_dir, dense_run, tmp_path):
    from gr_jax.dense.towers import SentencePieceTokenizer
    from gr_jax.gdr.data import GdrBatchSource, GdrData, training_examples
    from gr_jax.tools import gdr_index
    from gr_jax.vocabulary import load_vocabulary
    gdr_index.main(["build", "--index_dir", str(dense_run / "index" / "0"), "--branching", "2,2",
                    "--out_dir", str(tmp_path / "gidx")])
    index = ClusteredIndex.load(tmp_path / "gidx")
    data = GdrData(name="f", data_dir=str(spm_data_dir), index_dir=str(tmp_path / "gidx"), input_length=8,
                   num_cluster_negatives=3)
    assert data.target_length == 3  # two one-digit levels, then EOS
    examples = training_examples(data=data, index=index)
    assert examples.counts == {"labeled": 9, "indexing": 10}
    tokens = np.arange(index.clusters.num_clusters * 3).reshape(-1, 3) + 100

    def source(seed):
        return GdrBatchSource(data=data, index=index, examples=examples, cluster_tokens=tokens,
                              tokenizer=SentencePieceTokenizer(load_vocabulary(spm_data_dir / "spm.model")),
                              batch_size=6, seed=seed)

    batch = source(0).batch(4)
    for key, value in source(0).batch(4).items():
        np.testing.assert_array_equal(value, batch[key])
    assert not np.array_equal(source(1).batch(4)["positive_row"], batch["positive_row"])
    clusters = index.clusters.assignment
    np.testing.assert_array_equal(batch["decoder_target_tokens"], tokens[clusters[batch["positive_row"]]])
    np.testing.assert_array_equal(batch["decoder_input_tokens"][:, 1:], batch["decoder_target_tokens"][:, :-1])
    np.testing.assert_array_equal(batch["positive_vector"], index.vectors(batch["positive_row"]))
    # Each example's input is its query's text, or for an indexing example its document's own text.
    tokenizer = SentencePieceTokenizer(load_vocabulary(spm_data_dir / "spm.model"))
    documents = dict(open_dataset(spm_data_dir).collection())
    chosen = source(0).example_indices(4)
    texts = [examples.query_texts[t] if t >= 0 else documents[index.docid_strings([r])[0]]
             for t, r in zip(examples.example_text[chosen], examples.example_row[chosen])]
    assert (examples.example_text[chosen] < 0).any() and (examples.example_text[chosen] >= 0).any()
    np.testing.assert_array_equal(batch["encoder_input_tokens"], tokenizer(texts, length=8).ids)
    for row, negatives in zip(batch["positive_row"], batch["negative_rows"]):
        real = negatives[negatives >= 0]
        assert row not in real and (clusters[real] == clusters[row]).all()
        assert len(real) == min(3, int((clusters == clusters[row]).sum()) - 1)


def test_a_teachers_ranking_gives_soft_cluster_targets_by_hand(spm_data_dir, dense_run, tmp_path):
    """With token_targets, a labeled query's target is the trie targets over its ranked list's clusters: positive
    first (mass 1), then the run's other documents (1/2, 1/3 at beta 1); a cluster holds its documents' mass.
    Indexing examples stay one-hot; a run naming documents the index lacks is refused naming the run."""
    from gr_jax.data.features import SOFT_TARGET_MASS, SOFT_TARGET_TOKENS
    from gr_jax.data.pairs import labeled_queries
    from gr_jax.dense.towers import SentencePieceTokenizer
    from gr_jax.gdr.data import GdrBatchSource, GdrData, training_examples
    from gr_jax.ranking.data import TrieTargets
    from gr_jax.tools import gdr_index
    from gr_jax.vocabulary import load_vocabulary
    gdr_index.main(["build", "--index_dir", str(dense_run / "index" / "0"), "--branching", "2,2",
                    "--out_dir", str(tmp_path / "gidx")])
    index = ClusteredIndex.load(tmp_path / "gidx")
    clusters = index.clusters.assignment
    dataset = open_dataset(spm_data_dir)
    qrels = dataset.qrels("train")
    # Each query's run: a cluster mate of its first positive (when it has one), a document of another cluster, then
    # that positive again. Example (q, d)'s list: d, q's other judged documents, then the run's, 3 in all.
    run = []
    for qid, judged in qrels.items():
        positive = index.rows_of([next(iter(judged))])[0]
        mates = [r for r in np.flatnonzero(clusters == clusters[positive]) if r != positive]
        other = int(np.flatnonzero(clusters != clusters[positive])[0])
        ranked = index.docid_strings([*mates[:1], other, positive])
        run += [f"{qid} Q0 {docid} {rank} {10 - rank} t" for rank, docid in enumerate(ranked, 1)]
    by_query: dict = {}
    for line in run:
        qid, _, docid, *_ = line.split()
        by_query.setdefault(qid, []).append(docid)
    labeled = labeled_queries(dataset=dataset, split="train", known_docids=index, first_relevant_only=False)
    expected = []
    for qid, docid in zip(labeled.qids, labeled.docids):
        judged = [d for d, grade in qrels[qid].items() if grade > 0 and d in index]
        ranked = list(dict.fromkeys([docid, *judged, *by_query[qid]]))[:3]
        mass: dict = {}
        for rank, row in enumerate(index.rows_of(ranked).tolist(), 1):
            mass[int(clusters[row])] = mass.get(int(clusters[row]), 0.0) + 1 / rank
        expected.append({c: m / sum(mass.values()) for c, m in mass.items()})
    (tmp_path / "run.trec").write_text("\n".join(run) + "\n")
    data = GdrData(name="f", data_dir=str(spm_data_dir), index_dir=str(tmp_path / "gidx"), input_length=8,
                   token_targets=TrieTargets(beta=1.0, max_children=4), run_file=str(tmp_path / "run.trec"), depth=3)
    examples = training_examples(data=data, index=index)
    tokens = np.arange(index.clusters.num_clusters * 3).reshape(-1, 3) + 100  # each cluster's own first token
    source = GdrBatchSource(data=data, index=index, examples=examples, cluster_tokens=tokens,
                            tokenizer=SentencePieceTokenizer(load_vocabulary(spm_data_dir / "spm.model")),
                            batch_size=19, seed=0)
    batch = source.batch(0)
    checked = 0
    for i, example in enumerate(source.example_indices(0).tolist()):
        soft_tokens, soft_mass = batch[SOFT_TARGET_TOKENS][i], batch[SOFT_TARGET_MASS][i]
        target = batch["decoder_target_tokens"][i]
        np.testing.assert_array_equal(soft_tokens[1:, 0], target[1:])  # below the first step: the positive's path
        np.testing.assert_allclose(soft_mass[1:].sum(-1), 1.0)
        np.testing.assert_allclose(soft_mass[1:, 0], 1.0)
        if example >= len(expected):  # an indexing example: one-hot
            assert soft_tokens[0, 0] == target[0] and soft_mass[0, 0] == 1.0
            continue
        got = {int((t - 100) // 3): float(m) for t, m in zip(soft_tokens[0], soft_mass[0]) if m > 0}
        want = expected[example]
        assert got.keys() == want.keys() and all(got[c] == pytest.approx(want[c], rel=1e-6) for c in want)
        checked += 1
    assert checked == 9

    (tmp_path / "bad.trec").write_text("1 Q0 nowhere 1 1.0 t\n")
    with pytest.raises(DataFormatError, match="bad.trec: query '1' ranks 1 documents that are not in"):
        training_examples(data=dataclasses.replace(data, run_file=str(tmp_path / "bad.trec")), index=index)
    with pytest.raises(ValueError, match="set token_targets"):
        GdrData(name="f", data_dir=str(spm_data_dir), index_dir=str(tmp_path / "gidx"), run_file="run.trec")


def test_soft_cluster_targets_reach_the_gdr_loss():
    """GdrModel's L_inter is the cross entropy against the batch's soft targets where it has them: by hand from
    the model's own logits, and one-hot soft targets give the one-hot loss."""
    from gr_jax.data.features import SOFT_TARGET_MASS, SOFT_TARGET_TOKENS
    from gr_jax.gdr.model import GdrNetwork
    model = GdrModel(config=MICRO, document_dim=16, gdr_loss=GdrLoss(z_loss=0.0))
    params = jax.jit(lambda: model.init(jax.random.PRNGKey(1), input_length=6, target_length=3))()["params"]
    batch = micro_batch(np.random.default_rng(2))
    b, length = batch["decoder_target_tokens"].shape
    one_hot_tokens = np.zeros((b, length, 2), np.int32)
    one_hot_tokens[..., 0] = batch["decoder_target_tokens"]
    one_hot_mass = np.zeros((b, length, 2), np.float32)
    one_hot_mass[..., 0] = 1.0
    soft_tokens, soft_mass = one_hot_tokens.copy(), one_hot_mass.copy()
    soft_tokens[:, 0, 1] = 5 + (batch["decoder_target_tokens"][:, 0] - 5 + 1) % 4  # another cluster's first digit
    soft_mass[:, 0] = [0.75, 0.25]

    def inter(tokens, mass):
        with_targets = {**batch, SOFT_TARGET_TOKENS: tokens, SOFT_TARGET_MASS: mass}
        return float(jax.jit(model.loss_fn)(params, with_targets, None)[1]["inter_loss"].total)

    logits = np.asarray(jax.jit(lambda p: model.module.apply(
        {"params": p}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        method=GdrNetwork.train_outputs)[0])(params))
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    by_hand = -sum(float(m) * log_p[i, t, tok] for i in range(b) for t in range(length)
                   for tok, m in zip(soft_tokens[i, t], soft_mass[i, t]) if m > 0)
    assert inter(soft_tokens, soft_mass) == pytest.approx(by_hand, rel=1e-5)
    one_hot = float(jax.jit(model.loss_fn)(params, batch, None)[1]["inter_loss"].total)
    assert inter(one_hot_tokens, one_hot_mass) == pytest.approx(one_hot, rel=1e-6)
    assert abs(inter(soft_tokens, soft_mass) - one_hot) > 1e-3


def test_gdr_trains_evaluates_and_takes_new_documents_without_training(spm_data_dir, dense_run, tmp_path, capsys):
    import gin
    from gr_jax import eval as eval_main
    from gr_jax import train as train_main
    from gr_jax.search import restore_retriever
    from gr_jax.tools import gdr_index
    from gr_jax.training import EvalConfig
    gin.clear_config()
    gdr_index.main(["build", "--index_dir", str(dense_run / "index" / "0"), "--branching", "3,2",
                    "--out_dir", str(tmp_path / "gidx")])
    model_dir = tmp_path / "gdr"
    gin.clear_config()
    train_main.main(["--gin_file=gdr/train.gin", "--gin_file=models/t5_1_1/tiny.gin", f"--gin.DATA_DIR={spm_data_dir}",
                     f"--gin.GDR_INDEX={tmp_path / 'gidx'}", f"--gin.MODEL_DIR={model_dir}", "--gin.TRAIN_STEPS=3",
                     "--gin.BATCH_SIZE=8", "--gin.QUERY_LENGTH=8", "--gin.CLUSTERS_RECALLED=2",
                     "--gin.network.T5Config.num_encoder_layers=1", "--gin.network.T5Config.num_decoder_layers=1"])
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["eval/num_queries"] == 4 and final["train/inter_loss"] > 0 and final["train/intra_loss"] > 0
    assert json.loads((model_dir / "document_encoder.json").read_text())["model_dir"] == str(dense_run.resolve())
    gin.clear_config()
    eval_main.main(["--gin_file", str(model_dir / "config.gin")])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["MRR@10"] == pytest.approx(
        final["eval/MRR@10"])

    # Two new documents, encoded by the index's dense run and put in clusters; no training step.
    new = tmp_path / "new.tsv"
    new.write_text("n1\tsourdough bread with a thick crust\nn2\tkimchi fermented with chili\n")
    gin.clear_config()
    report = gdr_index.main(["add", "--gdr_index", str(tmp_path / "gidx"), "--documents", str(new),
                             "--out_dir", str(tmp_path / "grown")])
    assert report["added"] == 2 and report["documents"] == 12
    before = (tmp_path / "grown" / "manifest.json").read_text()
    with pytest.raises(SystemExit, match="error: .*'n1' is already in the index"):  # added twice: nothing written
        gdr_index.main(["add", "--gdr_index", str(tmp_path / "grown"), "--documents", str(new)])
    assert (tmp_path / "grown" / "manifest.json").read_text() == before

    # The run ranks the grown index: with every cluster recalled and no cluster term, the ranking is the exact
    # dense ranking of all 12 documents, the new ones included.
    gin.clear_config()
    built, retriever = restore_retriever(str(model_dir), gin_args=[f"--gin.GDR_INDEX={tmp_path / 'grown'}",
                                                                   "--gin.CLUSTER_WEIGHT=0.0"],
                                         settings=EvalConfig(num_beams=6, ranking_depth=12))
    ranking = retriever.rank(["kimchi"], k=12)
    assert sorted(ranking.ids[0]) == sorted([f"{i}" for i in built.index.docid_strings(np.arange(12))])
    query = np.asarray(jax.jit(built.model.query_vectors)(jax.device_get(retriever.params), jnp.asarray(
        built.tokenizer(["kimchi"], length=8).ids)))[0]  # one program on one device, not op by op on the mesh
    exact = built.index.vectors(np.arange(12)) @ query / built.model.temperature
    assert ranking.ids[0] == built.index.docid_strings(np.argsort(-exact, kind="stable"))


