"""CGL (Cai et al. 2025, Eq. 5): the formula by hand, negatives against brute force, candidate scoring against
per-pair scoring, the chance level of a model that cannot tell identifiers apart, and the entry points."""
import json
import math
import statistics
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gr_jax import network
from gr_jax import partitioning
from gr_jax.data.readers import open_dataset
from gr_jax.docids.identifiers import DocumentIdentifiers
from gr_jax.docids.table import DocidTable
from gr_jax.models import EncoderDecoderModel
from gr_jax.scaling.cgl import (CglConfig, CglScorer, chance_level, contrastive_generation_loss,
                                sample_negatives)
from gr_jax.trainer import Trainer
from gr_jax.vocabulary import EOS_ID

MICRO = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         head_dim=8, mlp_dim=32, dropout_rate=0.0)


def test_cgl_by_hand():
    positives = np.array([[2.0, 1.0, 0.5], [3.0, 9.0, 9.0]])
    valid = np.array([[True, True, False], [True, False, False]])  # 0.5 is padding: not a positive
    negatives = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
    np.testing.assert_allclose(contrastive_generation_loss(positives, valid, negatives),
                               [-math.log(6 / (1 + 6)), -math.log(6 / (3 + 6))])
    np.testing.assert_allclose(contrastive_generation_loss(positives, valid, negatives, positive_reduction="mean"),
                               [-math.log(6 / (1.5 + 6)), -math.log(6 / (3 + 6))])
    assert chance_level(256) == pytest.approx(math.log(257 / 256)) == pytest.approx(0.0039, abs=1e-4)
    with pytest.raises(ValueError, match="valid positive"):
        contrastive_generation_loss(positives, np.zeros_like(valid), negatives)


def test_negatives_are_distinct_uniform_and_never_a_positive():
    positives = [np.array([0, 7, 19, 7])] * 4000
    drawn = sample_negatives(num_documents=20, positives=positives, num_negatives=5, seed=3)
    assert drawn.shape == (4000, 5)
    assert all(len(set(row)) == 5 for row in drawn.tolist())
    counts = np.bincount(drawn.ravel(), minlength=20)
    assert counts[[0, 7, 19]].sum() == 0
    allowed = np.delete(np.arange(20), [0, 7, 19])
    expected = 4000 * 5 / 17  # 1,176 per allowed row; binomial sd 31
    assert np.abs(counts[allowed] - expected).max() < 5 * 31
    np.testing.assert_array_equal(drawn, sample_negatives(num_documents=20, positives=positives, num_negatives=5,
                                                          seed=3))
    with pytest.raises(ValueError, match="only 17 documents"):
        sample_negatives(num_documents=20, positives=positives[:1], num_negatives=18, seed=0)


def _table(num_docids: int, rng) -> DocidTable:
    """Distinct random docids of 1-4 tokens (ids 3..63), EOS, PAD."""
    rows = set()
    while len(rows) < num_docids:
        rows.add(tuple(rng.integers(3, MICRO.vocab_size, size=rng.integers(1, 5)).tolist()))
    tokens = np.zeros((num_docids, 5), np.int32)
    for i, row in enumerate(sorted(rows)):
        tokens[i, :len(row)] = row
        tokens[i, len(row)] = EOS_ID
    return DocidTable(docids=tuple(f"d{i}" for i in range(num_docids)), tokens=tokens)


def _stand_in_run(table: DocidTable):
    """What `CglScorer` reads of a built run: its model, trainer (mesh, shardings) and docid table."""
    model = EncoderDecoderModel(config=MICRO)
    trainer = Trainer(model=model, optimizer=optax.sgd(0.1), mesh=partitioning.make_mesh(data=-1, model=1),
                      input_length=6, target_length=5, batch_size=8)
    return types.SimpleNamespace(model=model, trainer=trainer, docid_space=types.SimpleNamespace(table=table))


def test_candidate_scores_equal_scoring_each_pair_on_its_own():
    rng = np.random.default_rng(0)
    table = _table(12, rng)
    model = EncoderDecoderModel(config=MICRO)
    # Both sides compiled whole (op by op, each of the network's ops compiles on its own).
    params = jax.jit(lambda: model.init(jax.random.PRNGKey(1), input_length=6, target_length=5))()["params"]
    tokens = rng.integers(2, MICRO.vocab_size, size=(3, 6)).astype(np.int32)
    rows = rng.integers(0, 12, size=(3, 4))
    log_likelihood, positions = jax.jit(model.score_candidates)(params, jnp.asarray(tokens),
                                                                jnp.asarray(table.tokens[rows]))
    score_batch = jax.jit(model.score_batch)
    for q in range(3):
        targets = table.tokens[rows[q]]
        batch = {"encoder_input_tokens": np.repeat(tokens[q:q + 1], 4, axis=0), "decoder_target_tokens": targets,
                 "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0)))}
        np.testing.assert_allclose(log_likelihood[q], score_batch(params, batch), rtol=1e-5)
        np.testing.assert_array_equal(positions[q], (targets > 0).sum(axis=1))  # tokens + EOS


def test_a_model_that_cannot_tell_identifiers_apart_scores_the_chance_level():
    """All-zero parameters give uniform next-token distributions: every identifier's mean token loss is log V, so
    CGL = log(257 / 256) with 256 negatives, whatever the identifiers' lengths; a trained-looking model does not."""
    table = _table(300, np.random.default_rng(1))
    run = _stand_in_run(table)
    scorer = CglScorer(run, config=CglConfig(batch_size=4))
    rng = np.random.default_rng(2)
    positives = [rng.choice(300, size=k, replace=False) for k in (1, 2, 3, 1, 2)]
    negatives = sample_negatives(num_documents=300, positives=positives, num_negatives=256, seed=0)
    rows = np.full((5, 3 + 256), -1)
    for i, p in enumerate(positives):
        rows[i, :len(p)] = p
    rows[:, 3:] = negatives
    tokens = rng.integers(2, MICRO.vocab_size, size=(5, 6)).astype(np.int32)
    zeros = jax.tree.map(jnp.zeros_like, run.trainer.init_state(jax.random.PRNGKey(0)).params)
    losses = scorer.candidate_losses(zeros, tokens, rows)
    np.testing.assert_allclose(losses[rows >= 0], math.log(MICRO.vocab_size), rtol=1e-6)
    cgl = contrastive_generation_loss(losses[:, :3], rows[:, :3] >= 0, losses[:, 3:])
    np.testing.assert_allclose(cgl, chance_level(256), rtol=1e-6)
    trained = run.trainer.init_state(jax.random.PRNGKey(0)).params
    random_losses = scorer.candidate_losses(trained, tokens, rows)
    assert not np.allclose(contrastive_generation_loss(random_losses[:, :3], rows[:, :3] >= 0, random_losses[:, 3:]),
                           chance_level(256), rtol=1e-3)


@pytest.mark.parametrize("reduction", ["mean", "min"])
def test_a_document_named_by_several_strings_scores_their_mean_or_least_loss(reduction):
    """n-gram ids: a document's L(q, d) is the mean of L(q, I) over its identifier strings (Cai et al.'s code), or
    their minimum, checked against scoring every (query, string) pair on its own; with one string each it is that
    string's."""
    table = _table(20, np.random.default_rng(3))
    run = _stand_in_run(table)
    scorer = CglScorer(run, config=CglConfig(batch_size=2, candidates_per_call=3,  # 8 strings a query: 3 calls
                                             identifier_reduction=reduction))
    identifiers = DocumentIdentifiers.from_lists(["a", "b", "c", "d"], [np.array([0, 5, 7]), np.array([1]),
                                                                        np.array([2, 3]), np.array([4, 8, 9, 10])])
    rng = np.random.default_rng(4)
    tokens = rng.integers(2, MICRO.vocab_size, size=(3, 6)).astype(np.int32)
    documents = np.array([[0, 2, -1], [3, 1, 0], [2, -1, -1]])
    params = run.trainer.init_state(jax.random.PRNGKey(0)).params
    got = scorer.document_losses(params, tokens, documents, identifiers)
    every_row = scorer.candidate_losses(params, tokens, np.tile(np.arange(20), (3, 1)))
    for q in range(3):
        for j, document in enumerate(documents[q]):
            if document < 0:
                assert np.isnan(got[q, j])
            else:
                expected = getattr(np, reduction)(every_row[q, identifiers.rows_of(document)])
                np.testing.assert_allclose(got[q, j], expected, rtol=1e-6)
    one_each = DocumentIdentifiers.one_each(table)
    np.testing.assert_allclose(scorer.document_losses(params, tokens, np.tile(np.arange(20), (3, 1)), one_each),
                               every_row, rtol=1e-6)
    with pytest.raises(ValueError, match="needs an identifier string"):
        DocumentIdentifiers.from_lists(["a", "b"], [np.array([0]), np.array([], np.int64)])


def test_cgl_during_training_and_from_the_entry_point(spm_data_dir, tmp_path, capsys):
    import gin
    from gr_jax import cgl as cgl_main
    from gr_jax import train as train_main
    model_dir = tmp_path / "run"
    gin.clear_config()
    train_main.main(["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin",
                     "--gin_file=scaling/cgl_every.gin", "--gin.TRAIN_STEPS=3", "--gin.CGL_EVERY=2",
                     "--gin.CGL_NEGATIVES=4", f"--gin.DATA_DIR='{spm_data_dir}'", f"--gin.MODEL_DIR={model_dir}",
                     "--gin.DATASET_NAME='cgl_fixture'", "--gin.INPUT_LENGTH=16", "--gin.TARGET_LENGTH=12",
                     "--gin.BATCH_SIZE=8", "--gin.network.T5Config.num_encoder_layers=1",
                     "--gin.network.T5Config.num_decoder_layers=1", "--gin.training.EvalConfig.num_beams=4",
                     "--gin.training.EvalConfig.batch_size=8"])
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["cgl/dev/cgl"] > 0 and final["cgl/dev/positive_loss"] > 0
    gin.clear_config()
    cgl_main.main(["--gin_file", str(model_dir / "config.gin"), "--gin.CGL_SPLIT='dev'", "--gin.CGL_NEGATIVES=4"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result == json.loads((model_dir / "cgl.dev.3.json").read_text())
    assert result["cgl"] == pytest.approx(final["cgl/dev/cgl"], rel=1e-6)  # the training action's, last step
    # The fixture's dev split judges one document that is not in the collection: that query is counted, not scored.
    assert result["num_queries"] == 3 and result["queries_without_positive"] == 1
    dev = open_dataset(spm_data_dir)
    collection = {pid for pid, _ in dev.collection()}
    scored = [qid for qid, _ in dev.queries("dev") if set(dev.qrels("dev").get(qid, {})) & collection]
    assert list(result["per_query"]) == scored
    values = list(result["per_query"].values())
    assert result["cgl"] == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert result["cgl_standard_error"] == pytest.approx(statistics.stdev(values) / math.sqrt(3), rel=1e-9)
    assert result["settings"] == {"num_negatives": 4, "positive_reduction": "min", "token_reduction": "mean",
                                  "identifier_reduction": "mean", "seed": 0, "batch_size": 8,
                                  "candidates_per_call": 1024, "max_queries": None}
    assert result["chance"] == pytest.approx(math.log(5 / 4))
    # One query has two judged documents: averaging them instead of taking the better one raises its CGL.
    gin.clear_config()
    cgl_main.main(["--gin_file", str(model_dir / "config.gin"), "--gin.CGL_NEGATIVES=4",
                   "--gin.cgl.CglConfig.positive_reduction='mean'"])
    averaged = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert averaged["cgl"] > result["cgl"] and averaged["split"] == "dev"
