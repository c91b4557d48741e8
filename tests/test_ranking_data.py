"""Ranked-list training (SToICaL): lists from graded qrels and a teacher run, examples and batches by hand, the soft
cross entropy against brute force and against the one-hot loss, and a micro run through train and ranking_eval."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import losses
from gr_jax import network
from gr_jax.data.examples import ExampleBatches
from gr_jax.data.readers import DataFormatError, open_dataset
from gr_jax.docids import DocidSpace
from gr_jax.docids.table import DocidTable
from gr_jax.data.features import SOFT_TARGET_MASS, SOFT_TARGET_TOKENS
from gr_jax.models import EncoderDecoderModel
from gr_jax.ranking.data import RankedListData, TrieTargets, ranked_list_examples, ranked_lists
from gr_jax.ranking.evaluation import ranking_candidates, ranking_metrics
from gr_jax.ranking.targets import Fractional, Stepwise, trie_targets
from gr_jax.vocabulary import EOS_ID, PAD_ID

from conftest import FIXTURES, micro_ranked_run_args

LETTERS = {ch: 3 + i for i, ch in enumerate("acdefghinorstquwxy ")}
WORDS = ["cat", "dog", "cats", "deer", "fish", "fox"]


class LetterVocabulary:
    """One id per letter: what `ranked_list_examples` needs of a SentencePiece vocabulary."""
    eos_id = 1  # T5's, as `gr_jax.vocabulary.encode_inputs` appends it

    def encode(self, text):
        return [LETTERS[ch] for ch in text]


def _write(path, rows):
    path.write_text("".join("\t".join(map(str, row)) + "\n" for row in rows))


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "animals"
    d.mkdir()
    _write(d / "collection.tsv", [(w, f"a {w}") for w in WORDS])
    _write(d / "queries.train.tsv", [("q1", "query one"), ("q2", "query two")])
    _write(d / "queries.dev.tsv", [("q3", "query three")])
    # q1: cat > dog > cats > deer > fish (grades 5..1, listed out of order); q2: fox, then a tie in file order.
    _write(d / "qrels.train.tsv", [("q1", 0, "deer", 2), ("q1", 0, "cat", 5), ("q1", 0, "fish", 1),
                                   ("q1", 0, "dog", 4), ("q1", 0, "cats", 3), ("q2", 0, "fox", 3),
                                   ("q2", 0, "dog", 1), ("q2", 0, "cat", 1), ("q2", 0, "fish", 0)])
    _write(d / "qrels.dev.tsv", [("q3", 0, "dog", 2), ("q3", 0, "deer", 1)])
    return d


def _space():
    tokens = np.zeros((len(WORDS), 6), np.int32)
    for i, word in enumerate(WORDS):
        tokens[i, :len(word)] = [LETTERS[ch] for ch in word]
        tokens[i, len(word)] = EOS_ID
    return DocidSpace.from_table(DocidTable(docids=tuple(WORDS), tokens=tokens), scheme="naive",
                                 text_vocab_size=32)


def test_ranked_lists_from_graded_qrels_and_a_teacher_run(data_dir, tmp_path):
    dataset = open_dataset(data_dir)
    assert ranked_lists(dataset, split="train") == {"q1": ["cat", "dog", "cats", "deer", "fish"],
                                                    "q2": ["fox", "dog", "cat"]}  # grade 0 is not relevant
    run = tmp_path / "bm25.trec"
    _write(run, [("q2", "Q0", "deer", 1, 9.0, "t"), ("q2", "Q0", "dog", 2, 8.0, "t"),
                 ("q2", "Q0", "fish", 3, 7.0, "t"), ("q1", "Q0", "fox", 1, 1.0, "t")])
    assert ranked_lists(dataset, split="train", run_file=str(run), depth=5) == {
        "q1": ["cat", "dog", "cats", "deer", "fish"], "q2": ["fox", "dog", "cat", "deer", "fish"]}
    assert ranked_lists(dataset, split="train", depth=2)["q1"] == ["cat", "dog"]


def test_examples_per_item_weight_and_trie_targets(data_dir):
    space, vocabulary = _space(), LetterVocabulary()
    make = lambda **kw: ranked_list_examples(  # noqa: E731
        data=RankedListData(name="t", data_dir=str(data_dir), input_length=12, target_length=8, **kw),
        docid_space=space, vocabulary=vocabulary)
    ntp = make()
    assert len(ntp) == 2 and ntp.soft_tokens is None  # the top document of each query only
    assert [space.table.lookup(row) for row in ntp.targets] == ["cat", "fox"]
    assert ntp.inputs[0, :10].tolist() == [LETTERS[ch] for ch in "query one"] + [EOS_ID]
    fractional = make(item_weights=Fractional(alpha=2))
    np.testing.assert_allclose(fractional.weights, [1, 1 / 4, 1 / 9, 1 / 16, 1 / 25, 1, 1 / 4, 1 / 9])
    stepwise = make(item_weights=Stepwise(), indexing=True)
    np.testing.assert_allclose(stepwise.weights, [1, .8, .6, .4, .2, 1, 2 / 3, 1 / 3] + [1] * 6)
    assert [space.table.lookup(row) for row in stepwise.targets[8:]] == WORDS  # each document -> its docid
    assert stepwise.inputs[8, :4].tolist() == [LETTERS[ch] for ch in "a c"] + [LETTERS["a"]]
    combined = make(item_weights=Fractional(alpha=2), token_targets=TrieTargets(beta=1.0, from_rank=True,
                                                                                  max_children=4), indexing=True)
    ranked = np.zeros((5, 8), np.int32)
    ranked[:, :6] = space.table.tokens[space.table.rows_of(["cat", "dog", "cats", "deer", "fish"])]
    for rank in range(1, 6):  # query q1's examples: the trie of ranks r..5
        expected = trie_targets(ranked, rank=rank, beta=1.0, max_children=4, from_rank=True)
        np.testing.assert_array_equal(combined.soft_tokens[rank - 1], expected[0])
        np.testing.assert_array_equal(combined.soft_mass[rank - 1], expected[1])
    # Indexing examples are one-hot on their own docid.
    assert (combined.soft_mass[8:, :, 0] == (combined.targets[8:] != PAD_ID)).all()
    assert (combined.soft_tokens[8:, :, 0] == combined.targets[8:]).all() and (combined.soft_mass[8:, :, 1:] == 0).all()
    with pytest.raises(ValueError, match="max_children=2"):
        make(item_weights=Fractional(alpha=2), token_targets=TrieTargets(max_children=2))


def test_unknown_documents_and_long_queries_are_refused_unless_cutting_is_asked_for(data_dir):
    (data_dir / "qrels.train.tsv").write_text("q1\t0\tcow\t1\n")
    data = RankedListData(name="t", data_dir=str(data_dir), input_length=12, target_length=8)
    with pytest.raises(DataFormatError, match="'cow'"):
        ranked_list_examples(data=data, docid_space=_space(), vocabulary=LetterVocabulary())
    (data_dir / "qrels.train.tsv").write_text("q1\t0\tcat\t1\n")
    with pytest.raises(ValueError, match="input_length=4"):
        ranked_list_examples(data=RankedListData(name="t", data_dir=str(data_dir), input_length=4, target_length=8),
                             docid_space=_space(), vocabulary=LetterVocabulary())
    data = RankedListData(name="t", data_dir=str(data_dir), input_length=4, target_length=8, cut_queries=True)
    cut = ranked_list_examples(data=data, docid_space=_space(), vocabulary=LetterVocabulary())
    assert cut.inputs[:, :4].tolist() == [[LETTERS[ch] for ch in "que"] + [EOS_ID]] * len(cut)  # asked for: FirstP


def test_batches_are_a_function_of_the_batch_index_and_split_over_hosts(data_dir):
    examples = ranked_list_examples(
        data=RankedListData(name="t", data_dir=str(data_dir), input_length=12, target_length=8,
                            item_weights=Fractional(alpha=1), token_targets=TrieTargets(max_children=4)),
        docid_space=_space(), vocabulary=LetterVocabulary())
    source = ExampleBatches(examples=examples, batch_size=4, seed=3)
    stream = source.batches(start_batch=0)
    first = [next(stream) for _ in range(5)]
    resumed = next(source.batches(start_batch=3))
    for key in first[3]:
        np.testing.assert_array_equal(first[3][key], resumed[key])
    halves = [source.batch(3, shard_index=i, num_shards=2) for i in range(2)]
    for key in first[3]:
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), first[3][key])
    batch = first[0]
    targets = batch["decoder_target_tokens"]
    assert (batch["decoder_input_tokens"][:, 0] == 0).all()
    np.testing.assert_array_equal(batch["decoder_input_tokens"][:, 1:], targets[:, :-1])
    weights = batch["decoder_loss_weights"]
    assert ((weights > 0) == (targets != PAD_ID)).all()
    assert all(np.isclose(w, [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5]).any() for w in weights.max(axis=1))  # 1 / r
    assert batch[SOFT_TARGET_TOKENS].shape == (4, 8, 4)
    np.testing.assert_allclose(batch[SOFT_TARGET_MASS].sum(-1), (targets != PAD_ID).astype(np.float32), rtol=1e-6)


def test_a_towers_wordpiece_tokenises_the_inputs_as_its_own_tokenizer_does(data_dir):
    """With a tower encoder (MiniLM), host-made examples take its WordPiece ids, [CLS] first and [SEP] last, as the
    tower's tokenizer.json makes them: each row's input is the text of its example (a query whose top document is
    the target, or the target document's own text)."""
    import tokenizers
    from gr_jax.dense.towers import MiniLMTower
    wordpiece = MiniLMTower().input_vocabulary_dir()
    data = RankedListData(name="t", data_dir=str(data_dir), input_length=12, target_length=8, indexing=True)
    source = data.train_batches(docid_space=_space(), batch_size=8, seed=0, start_batch=0, shard_index=0,
                                num_shards=1, input_vocabulary_dir=wordpiece)
    batch = next(source)
    reference = tokenizers.Tokenizer.from_file(f"{wordpiece}/tokenizer.json")
    reference.no_padding()
    texts = {"cat": ["query one", "a cat"], "fox": ["query two", "a fox"]}
    for row, target in zip(batch["encoder_input_tokens"], batch["decoder_target_tokens"]):
        docid = _space().table.lookup(target)
        ids = row[row != PAD_ID].tolist()
        assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
        assert ids in [reference.encode(text).ids for text in texts.get(docid, [f"a {docid}"])], (docid, ids)


MICRO = network.T5Config(vocab_size=32, emb_dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         head_dim=8, mlp_dim=32, dropout_rate=0.0)


def test_soft_cross_entropy_against_brute_force_and_one_hot():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 3, 7)), jnp.float32)
    columns = jnp.asarray(rng.integers(0, 7, size=(2, 3, 4)), jnp.int32)
    raw = rng.random((2, 3, 4)) * (rng.random((2, 3, 4)) > 0.3)
    raw[..., 0] += 0.1
    mass = raw / raw.sum(-1, keepdims=True)
    loss, z = losses.soft_cross_entropy_with_z_loss(logits, columns, jnp.asarray(mass, jnp.float32), z_loss=0.01)
    log_p = np.asarray(jax.nn.log_softmax(logits))
    expected = -np.sum(mass * np.take_along_axis(log_p, np.asarray(columns), axis=-1), axis=-1)
    log_z = np.log(np.exp(np.asarray(logits)).sum(-1))
    np.testing.assert_allclose(loss, expected + 0.01 * log_z ** 2, rtol=1e-5)
    np.testing.assert_allclose(z, 0.01 * log_z ** 2, rtol=1e-5)
    targets = columns[..., 0]
    one_hot = jnp.zeros((2, 3, 4)).at[..., 0].set(1.0)
    np.testing.assert_allclose(losses.soft_cross_entropy_with_z_loss(logits, columns, one_hot, z_loss=0.01)[0],
                               losses.cross_entropy_with_z_loss(logits, targets, z_loss=0.01)[0], rtol=1e-6)


def test_the_model_loss_reads_soft_targets_and_item_weights():
    model = EncoderDecoderModel(config=MICRO)
    loss_fn = jax.jit(model.loss_fn)  # whole programs: op by op, the network's ops compile one at a time
    rng = np.random.default_rng(1)
    params = jax.jit(lambda: model.init(jax.random.PRNGKey(0), input_length=5, target_length=4))()["params"]
    targets = np.array([[5, 6, EOS_ID, 0], [7, EOS_ID, 0, 0]], np.int32)
    batch = {"encoder_input_tokens": rng.integers(2, 32, size=(2, 5)).astype(np.int32),
             "decoder_target_tokens": targets, "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
             "decoder_loss_weights": np.array([[1, 1, 1, 0], [.25, .25, 0, 0]], np.float32)}
    hard, hard_metrics = loss_fn(params, batch, None)
    one_hot = {**batch, SOFT_TARGET_TOKENS: np.stack([targets, np.zeros_like(targets)], -1),
               SOFT_TARGET_MASS: np.stack([(targets > 0).astype(np.float32), np.zeros(targets.shape, np.float32)], -1)}
    same, _ = loss_fn(params, one_hot, None)
    np.testing.assert_allclose(same, hard, rtol=1e-6)
    # Half the mass of the first position moves to token 9: the loss is the weighted soft cross entropy.
    soft = {k: np.array(v) for k, v in one_hot.items()}
    soft[SOFT_TARGET_TOKENS][0, 0, 1], soft[SOFT_TARGET_MASS][0, 0] = 9, [0.5, 0.5]
    value, metrics = loss_fn(params, soft, None)
    logits = jax.jit(model.module.apply)({"params": params}, batch["encoder_input_tokens"],
                                         batch["decoder_input_tokens"])
    log_p = np.asarray(jax.nn.log_softmax(logits))
    per_token = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
    per_token[0, 0] = -0.5 * (log_p[0, 0, 5] + log_p[0, 0, 9])
    z = 1e-4 * np.log(np.exp(np.asarray(logits, np.float64)).sum(-1)) ** 2
    np.testing.assert_allclose(value, np.sum((per_token + z) * batch["decoder_loss_weights"]), rtol=1e-5)
    assert metrics["loss"].count == pytest.approx(3.5)
    grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, soft, None)[0]))(params)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_ranking_candidates_and_metrics_by_hand(data_dir):
    dataset = open_dataset(data_dir)
    table = _space().table
    _write(data_dir / "negatives.train.tsv", [("q1", "fox"), ("q2", "deer")])
    candidates = ranking_candidates(dataset, split="train", table=table)
    assert candidates.texts == ["query one", "query two"]
    names = [[table.docids[r] if r >= 0 else None for r in row] for row in candidates.rows]
    assert names == [["cat", "dog", "cats", "deer", "fish", "fox"], ["fox", "dog", "cat", None, None, "deer"]]
    sampled = ranking_candidates(dataset, split="dev", table=table, seed=0)  # no negatives file: one drawn
    assert table.docids[sampled.rows[0, -1]] not in ("dog", "deer")
    (data_dir / "negatives.train.tsv").write_text("q1\tfox\n")
    with pytest.raises(DataFormatError, match="'q2'"):
        ranking_candidates(dataset, split="train", table=table)
    # Scores: q1 ranks its list perfectly and the negative last; q2 puts its negative second.
    scores = np.array([[5, 4, 3, 2, 1, 0], [3, 1, 0, -9, -9, 2]], np.float64)
    result = ranking_metrics(scores, candidates.valid, max_k=4)
    assert result["cvr"] == 0.5 and result["R@1"] == 1.0 and result["R@1_queries"] == 2
    assert result["R@2"] == pytest.approx((1 + 0.5) / 2) and result["R@4_queries"] == 1
    gains = np.log([4, 3, 2]) / np.log2([2, 4, 5])  # q2: fox, deer (the negative), dog, cat
    ideal = np.log([4, 3, 2]) / np.log2([2, 3, 4])
    assert result["ndcg"] == pytest.approx((1 + gains.sum() / ideal.sum()) / 2)


def _micro_args(data, model_dir) -> list[str]:
    return micro_ranked_run_args(data=data, model_dir=model_dir, name="ranked_fixture",
                                 gin_files=["ranking/combined.gin"])


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    """(data dir, model dir) of one micro run on ranked lists (trie targets, item weights, indexing), trained in this
    process (TensorFlow importable): the ranking evaluation reads it, the TensorFlow-free run must equal it."""
    import gin
    from gr_jax import train as train_main
    from gr_jax.tools import make_vocab, wordnet_hypernyms
    root = tmp_path_factory.mktemp("micro_run")
    data = root / "hyp"  # as the suite's ranked_hypernyms fixture, once for this module
    wordnet_hypernyms.main(["--wordnet_dir", str(FIXTURES / "wordnet"), "--out_dir", str(data), "--root", "food.n.02",
                            "--dev_fraction", "0.5", "--seed", "1", "--in_context"])
    make_vocab.main(["--data_dir", str(data), "--vocab_size", "320"])
    gin.clear_config()
    try:
        train_main.main(_micro_args(data, root / "with_tf"))
    finally:
        gin.clear_config()
    return data, root / "with_tf"


def test_a_micro_run_trains_on_ranked_lists_and_is_ranking_evaluated(micro_run, capsys):
    import gin
    from gr_jax import ranking_eval
    data, model_dir = micro_run
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert np.isfinite(final["train/loss"])
    gin.clear_config()
    ranking_eval.main(["--gin_file", str(model_dir / "config.gin"), "--gin.RANKING_SPLIT='train'"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result == json.loads((model_dir / "ranking.train.2.json").read_text())
    assert 0 <= result["cvr"] <= 1 and 0 < result["ndcg"] <= 1 and result["step"] == 2
    assert result["num_queries"] == len(open_dataset(data).qrels("train"))
    by_sum = result["by_log_likelihood"]
    assert 0 <= by_sum["cvr"] <= 1 and by_sum["num_queries"] == result["num_queries"]


def test_the_decoder_only_family_trains_on_ranked_lists_and_is_ranking_evaluated(micro_run, tmp_path, capsys):
    """SToICaL's in-context setting with a decoder-only model (issue 33's experiment 2): decoder_only/experiment.gin
    after the ranked-list data switches the family and keeps the data, combined targets included (item weights,
    soft trie targets); the ranking evaluation scores each candidate list through the family's
    `score_candidates`."""
    import gin
    from gr_jax import ranking_eval
    from gr_jax import train as train_main
    data, _ = micro_run
    model_dir = tmp_path / "decoder_only"
    gin.clear_config()
    try:
        train_main.main(micro_ranked_run_args(
            data=data, model_dir=model_dir, name="ranked_decoder_only",
            gin_files=["ranking/combined.gin", "decoder_only/experiment.gin", "decoder_only/micro.gin"]))
    finally:
        gin.clear_config()
    assert "DecoderOnlyExperiment()" in (model_dir / "config.gin").read_text()
    assert "RankedListData()" in (model_dir / "config.gin").read_text()
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert np.isfinite(final["train/loss"]) and final["eval/invalid_docid_rate"] == 0
    ranking_eval.main(["--gin_file", str(model_dir / "config.gin"), "--gin.RANKING_SPLIT='dev'"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= result["cvr"] <= 1 and 0 < result["ndcg"] <= 1 and result["step"] == 2
    assert result["num_queries"] == len(open_dataset(data).qrels("dev"))
    # Another run of the family warm-starts from this one (init_checkpoint a run dir): its parameters as trained.
    from gr_jax import warm_start
    from gr_jax.search import restore_run
    gin.clear_config()
    try:
        built = restore_run(str(model_dir))
    finally:
        gin.clear_config()
    started = warm_start.initialize_from_run(state=built.init_state(), trainer=built.trainer, model_dir=model_dir,
                                             seed=0)
    trained, _ = built.restore_params(2)
    for a, b in zip(jax.tree.leaves(started.params), jax.tree.leaves(trained)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_host_made_training_needs_no_tensorflow(micro_run, tmp_path):
    """A JAX-only host (an accelerator image without TensorFlow or seqio) trains on host-made data and writes its
    metrics; the losses equal those of the micro run, made with TensorFlow importable (the same tokens, batches and
    steps; this process's compiled programs, in the session's compilation cache, spare the subprocess compiling)."""
    data, with_tf_dir = micro_run
    script = ("import sys\n"
              "for name in ('tensorflow', 'seqio', 'tensorflow_text', 'tensorflow_datasets'):\n"
              "    sys.modules[name] = None  # importing any of them now fails\n"
              "from gr_jax import train\n"
              f"train.main({_micro_args(data, tmp_path / 'jax_only')!r})\n")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    with_tf = json.loads((with_tf_dir / "final_metrics.json").read_text())
    jax_only = json.loads((tmp_path / "jax_only" / "final_metrics.json").read_text())
    assert list((tmp_path / "jax_only").glob("events.out.tfevents.*"))
    for key in ("train/loss", "train/token_accuracy", "eval/MRR@10", "eval/Recall@1"):  # 4 beams: no Recall@10
        assert jax_only[key] == pytest.approx(with_tf[key], rel=1e-5, abs=1e-7), key
