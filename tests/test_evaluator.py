"""RetrievalEvaluator with a GenerativeRetriever on a random-init micro model: rankings against brute-force scoring
of every docid (the padded last batch included), invalid outputs in unconstrained mode against the DocidTable's own
lookup."""
import math

import jax
import numpy as np
import pytest

from gr_jax import network
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.docids import DocidSpace, DocidTable
from gr_jax.evaluator import RetrievalEvaluator
from gr_jax.models import EncoderDecoderModel
from gr_jax.retrievers.generative import INVALID_PREFIX, GenerativeRetriever, invalid_output_name
from gr_jax.trainer import Trainer
from gr_jax.vocabulary import EOS_ID, PAD_ID, encode_inputs

VOCAB = 64
INPUT_LENGTH = 8
MICRO = network.T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=2, num_encoder_layers=2, num_decoder_layers=2,
                         head_dim=8, mlp_dim=64, dropout_rate=0.0)
QUERIES = [("q0", "apple pie"), ("q1", "rye bread"), ("q2", "green tea"), ("q3", "salted butter"),
           ("q4", "plum jam"), ("q5", "")]  # 6 queries in batches of 4: the last batch holds 2 padding rows


class CharVocabulary:
    """Stand-in for a SentencePiece vocabulary: one token per character, ids 3..VOCAB-1."""
    eos_id = 1  # T5's, as `gr_jax.vocabulary.encode_inputs` appends it

    def encode(self, text: str) -> list[int]:
        return [3 + ord(c) % (VOCAB - 3) for c in text]


@pytest.fixture(scope="module")
def setup():
    mesh = partitioning.make_mesh(data=4, model=2)
    model = EncoderDecoderModel(config=MICRO)
    trainer = Trainer(model=model, optimizer=optimizers.make_optimizer(
        name="adafactor", learning_rate=optimizers.warmup_constant(peak=1e-3, warmup_steps=1)), mesh=mesh,
        input_length=INPUT_LENGTH, target_length=4, batch_size=4)
    params = trainer.init_state(jax.random.PRNGKey(0)).params
    return model, mesh, params, trainer.state_shardings.params


def random_table(rng: np.random.Generator, *, num_docids: int, max_content: int) -> DocidTable:
    """Distinct docids with 1..max_content content tokens (the longest length occurs), EOS, PAD."""
    sequences: set[tuple[int, ...]] = {tuple(rng.integers(3, VOCAB, max_content).tolist())}
    while len(sequences) < num_docids:
        sequences.add(tuple(rng.integers(3, VOCAB, rng.integers(1, max_content + 1)).tolist()))
    return table_of(sorted(sequences), names=[f"d{i}" for i in range(num_docids)])


def table_of(sequences, *, names) -> DocidTable:
    width = max(map(len, sequences)) + 1
    tokens = np.full((len(sequences), width), PAD_ID, np.int32)
    for row, sequence in enumerate(sequences):
        tokens[row, :len(sequence)] = sequence
        tokens[row, len(sequence)] = EOS_ID
    return DocidTable(docids=tuple(names), tokens=tokens)


def make_retriever(setup, table, *, params=None, constrained: bool, num_beams: int) -> GenerativeRetriever:
    model, mesh, _, shardings = setup
    space = DocidSpace.from_table(table, scheme="test", text_vocab_size=VOCAB)
    return GenerativeRetriever(model=model, params=params, docid_space=space, vocabulary=CharVocabulary(),
                               input_length=INPUT_LENGTH, mesh=mesh, param_shardings=shardings, batch_size=4,
                               num_beams=num_beams, constrained=constrained)


def evaluate(setup, table, params, *, constrained: bool, num_beams: int, qrels=None):
    """(metrics, run) of the micro model with `params` over `table`'s docids, ranking all `num_beams` beams."""
    retriever = make_retriever(setup, table, params=params, constrained=constrained, num_beams=num_beams)
    evaluator = RetrievalEvaluator(queries=QUERIES, qrels=qrels or {qid: {} for qid, _ in QUERIES}, k=num_beams)
    return evaluator.evaluate(retriever)


def brute_force_scores(model, params, table: DocidTable) -> np.ndarray:
    """float32[queries, docids]: teacher-forced log-likelihood of every docid for every query."""
    queries = encode_inputs([text for _, text in QUERIES], vocabulary=CharVocabulary(), input_length=INPUT_LENGTH)
    targets = np.asarray(table.tokens)
    score = jax.jit(model.score_batch)
    rows = []
    for query in queries:
        batch = {"encoder_input_tokens": np.repeat(query[None], len(table), axis=0),
                 "decoder_target_tokens": targets,
                 "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
                 "decoder_loss_weights": (targets > 0).astype(np.int32)}
        rows.append(np.asarray(score(params, batch)))
    return np.stack(rows)


def test_constrained_run_ranks_every_docid_as_brute_force_scoring(setup):
    """With beams >= docids the search is exhaustive: each query's run is every docid, ranked by score_batch.
    q4 and q5 share the last batch with 2 padding rows, so their results also show that padding does not leak."""
    model, _, params, _ = setup
    table = random_table(np.random.default_rng(0), num_docids=12, max_content=3)
    expected = brute_force_scores(model, params, table)
    order = np.argsort(-expected, axis=1)
    # Relevant docid of query i: its brute-force rank i % 3 + 1, so MRR@10 = mean(1 / (i % 3 + 1)).
    qrels = {qid: {table.docids[order[i, i % 3]]: 1} for i, (qid, _) in enumerate(QUERIES)}
    # beams >= docids: exact
    metrics, run = evaluate(setup, table, params, constrained=True, num_beams=16, qrels=qrels)

    assert list(run) == [qid for qid, _ in QUERIES]  # the 2 padding rows of the last batch add nothing
    index = {docid: i for i, docid in enumerate(table.docids)}
    for q, (qid, _) in enumerate(QUERIES):
        names = [docid for docid, _ in run[qid]]
        scores = np.array([score for _, score in run[qid]])
        assert sorted(names) == sorted(table.docids)  # every docid once, the 4 empty beams left out
        np.testing.assert_allclose(scores, expected[q, [index[d] for d in names]], atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(scores, np.sort(expected[q])[::-1], atol=2e-5, rtol=1e-5)  # best first
    assert metrics["MRR@10"] == pytest.approx(np.mean([1 / (i % 3 + 1) for i in range(len(QUERIES))]))
    assert metrics["Recall@1"] == pytest.approx(np.mean([i % 3 == 0 for i in range(len(QUERIES))]))
    assert metrics["invalid_docid_rate"] == 0.0
    assert metrics["num_queries"] == len(QUERIES)
    assert all(math.isfinite(metrics[k]) for k in ("queries_per_second", "compile_seconds"))  # reported, not limited


def test_unconstrained_invalid_outputs_are_named_and_counted(setup):
    model, _, params, shardings = setup
    # At random init the lone EOS is every query's best output. With EOS's logit fixed at 0 and the others
    # sharpened, top outputs are 1-3 content tokens and EOS, i.e. possible docid rows, differing between queries.
    params = dict(params, logits_dense=(params["logits_dense"] * 8).at[:, EOS_ID].set(0.0))
    params = jax.device_put(params, shardings)
    beams, length = 4, 4
    queries = encode_inputs([text for _, text in QUERIES], vocabulary=CharVocabulary(), input_length=INPUT_LENGTH)
    reference = jax.jit(lambda p, x: model.predict_batch(p, x, num_beams=beams, max_decode_len=length))(params, queries)
    sequences, scores = np.asarray(reference.sequences), np.asarray(reference.scores)

    def well_formed(sequence) -> tuple[int, ...] | None:
        eos = np.flatnonzero(sequence == EOS_ID)
        content = sequence[:eos[0]] if eos.size else sequence[:0]
        return tuple(content.tolist()) if eos.size and content.size and (content != PAD_ID).all() else None

    # Docids: every well-formed output of the first queries whose top output is well-formed, plus random fillers.
    chosen = [q for q in range(len(QUERIES)) if well_formed(sequences[q, 0])][:2]
    assert chosen, "no query decodes a well-formed top output: the setup cannot test valid outputs"
    valid = {well_formed(s) for q in chosen for s in sequences[q]} - {None}
    rng = np.random.default_rng(2)
    while len(valid) < 10:
        valid.add(tuple(rng.integers(3, VOCAB, length - 1).tolist()))
    valid = sorted(valid)
    table = table_of(valid, names=[f"doc-{i}" for i in range(len(valid))])
    assert table.max_length == length

    qrels = {qid: {"doc-0": 1} for qid, _ in QUERIES}
    metrics, run = evaluate(setup, table, params, constrained=False, num_beams=beams, qrels=qrels)

    expected_top1_invalid = []
    for q, (qid, _) in enumerate(QUERIES):
        expected = [(table.lookup(s) or invalid_output_name(s), float(score))
                    for s, score in zip(sequences[q], scores[q]) if score > -np.inf]
        assert [d for d, _ in run[qid]] == [d for d, _ in expected]
        np.testing.assert_allclose([s for _, s in run[qid]], [s for _, s in expected], atol=1e-4)
        expected_top1_invalid.append(table.lookup(sequences[q, 0]) is None)
    names = [d for ranking in run.values() for d, _ in ranking]
    assert any(d.startswith(INVALID_PREFIX) for d in names) and any(d.startswith("doc-") for d in names)
    assert 0 < np.mean(expected_top1_invalid) < 1
    assert metrics["invalid_docid_rate"] == pytest.approx(np.mean(expected_top1_invalid))


def test_invalid_output_names_spell_the_decoded_tokens():
    assert invalid_output_name(np.array([7, 9, EOS_ID, PAD_ID])) == "<invalid:7-9>"
    assert invalid_output_name(np.array([EOS_ID, PAD_ID, PAD_ID])) == "<invalid:>"
    assert invalid_output_name(np.array([5, PAD_ID, 6, 8])) == "<invalid:5-0-6-8...>"  # no EOS: all tokens
    assert invalid_output_name(np.array([5, 6, 8, PAD_ID])) != invalid_output_name(np.array([5, 6, 8, 9]))


def test_bad_inputs_raise(setup):
    with pytest.raises(ValueError, match="query id 'q0' appears twice"):
        RetrievalEvaluator(queries=[("q0", "a"), ("q0", "b")], qrels={}, k=2)
    clash = table_of([(5,), (6,)], names=["<invalid:7>", "d1"])
    with pytest.raises(ValueError, match="has the form of an invalid output's name"):
        make_retriever(setup, clash, constrained=False, num_beams=2)
    with pytest.raises(ValueError, match="token id 70 >= vocab_size 64"):
        make_retriever(setup, table_of([(70,)], names=["x"]), constrained=True, num_beams=2)
