"""doc2query: the document -> query task, training through our trainer, resumable sampling of synthetic queries."""
import json
import pathlib
import shutil

import gin
import jax
import numpy as np
import pytest
import seqio

from gr_jax import partitioning
from gr_jax.data.readers import DataFormatError, read_collection, read_qrels, read_queries
from gr_jax.vocabulary import encode_inputs
from gr_jax.vocabulary import EOS_ID, PAD_ID, load_vocabulary, train_sentencepiece
from gr_jax.tasks import doc2query as doc2query_tasks
from gr_jax.tools import doc2query

from conftest import FIXTURES

FIXTURE_DATA = FIXTURES / "tasks"
INPUT_LENGTH, TARGET_LENGTH = 16, 12
MICRO = ["--gin.network.T5Config.emb_dim=32", "--gin.network.T5Config.num_heads=2",
         "--gin.network.T5Config.num_encoder_layers=1", "--gin.network.T5Config.num_decoder_layers=1",
         "--gin.network.T5Config.head_dim=8", "--gin.network.T5Config.mlp_dim=64", "--gin.BATCH_SIZE=8",
         f"--gin.INPUT_LENGTH={INPUT_LENGTH}", f"--gin.TARGET_LENGTH={TARGET_LENGTH}", "--gin.WARMUP_STEPS=1"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("data") / "fixture"
    shutil.copytree(FIXTURE_DATA, path)
    (path / "d2q.tsv").unlink(missing_ok=True)
    texts = [line.split("\t", 1)[1] for name in ("collection.tsv", "queries.train.tsv")
             for line in (path / name).read_text().splitlines()]
    train_sentencepiece(texts=texts * 3, model_path=path / "spm.model", vocab_size=320)
    return path


def _expected_pairs(data_dir: pathlib.Path, split: str, *, first_only: bool) -> list[tuple[str, str]]:
    """(document, query) texts by brute force over the files: queries in file order, relevant known documents."""
    documents = dict(read_collection(data_dir / "collection.tsv"))
    qrels = read_qrels(data_dir / f"qrels.{split}.tsv")
    pairs = []
    for qid, query in read_queries(data_dir / f"queries.{split}.tsv"):
        relevant = [d for d, rel in qrels.get(qid, {}).items() if rel > 0 and d in documents]
        pairs += [(documents[d], query) for d in relevant[:1 if first_only else None]]
    return pairs


def test_task_pairs_every_relevant_document_with_its_query(data_dir):
    name = doc2query_tasks.register_doc2query(name="d2q_pairs", data_dir=data_dir, input_length=INPUT_LENGTH,
                                              target_length=TARGET_LENGTH)
    assert name == "d2q_pairs.doc2query"
    vocabulary = load_vocabulary(data_dir)
    task = seqio.get_mixture_or_task(name)
    for split, reader_split, first_only in (("train", "train", False), ("validation", "dev", True)):
        expected = _expected_pairs(data_dir, reader_split, first_only=first_only)
        examples = list(task.get_dataset({"inputs": INPUT_LENGTH, "targets": TARGET_LENGTH}, split=split,
                                         shuffle=False).as_numpy_iterator())
        assert len(examples) == len(expected) == task.num_input_examples(split)
        for example, (document, query) in zip(examples, expected):
            np.testing.assert_array_equal(example["inputs"], vocabulary.encode(document)[:INPUT_LENGTH - 1] + [EOS_ID])
            np.testing.assert_array_equal(example["targets"], vocabulary.encode(query)[:TARGET_LENGTH - 1] + [EOS_ID])
    # The fixture: 9 relevant training pairs (query 5 has two documents; 600 has relevance 0 for query 6 and
    # 999999 is not in the collection), 3 dev queries with a known relevant document.
    assert task.num_input_examples("train") == 9 and task.num_input_examples("validation") == 3

    # Same arguments re-register; different ones would change what the name means.
    doc2query_tasks.register_doc2query(name="d2q_pairs", data_dir=data_dir, input_length=INPUT_LENGTH,
                                       target_length=TARGET_LENGTH)
    with pytest.raises(ValueError, match="already registered"):
        doc2query_tasks.register_doc2query(name="d2q_pairs", data_dir=data_dir, input_length=INPUT_LENGTH,
                                           target_length=TARGET_LENGTH + 4)
    assert doc2query_tasks.unregister_doc2query(name="d2q_pairs")
    assert "d2q_pairs.doc2query" not in seqio.TaskRegistry.names()


def test_task_needs_training_pairs(data_dir, tmp_path):
    no_train = tmp_path / "no_train"
    shutil.copytree(data_dir, no_train)
    for path in no_train.glob("*.train.tsv"):
        path.unlink()
    with pytest.raises(FileNotFoundError, match="no training queries"):
        doc2query_tasks.register_doc2query(name="d2q_no_train", data_dir=no_train)


@pytest.fixture(scope="module")
def model_dir(data_dir, tmp_path_factory) -> pathlib.Path:
    """A micro doc2query model trained 3 steps with the train command (gin, trainer, checkpoints)."""
    path = tmp_path_factory.mktemp("d2q") / "model"
    gin.clear_config()
    summary = doc2query.main(["train", "--data_dir", str(data_dir), "--model_dir", str(path), "--steps", "3",
                              "--name", "d2q_fixture", *MICRO])
    assert summary["validation/step"] == 3 and np.isfinite(summary["validation/loss"])
    return path


def test_train_command_trains_the_doc2query_task(model_dir):
    config = (model_dir / "config.gin").read_text()
    assert "DATASET = @experiment.Doc2QueryData()" in config and "dataset = %DATASET" in config
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert np.isfinite(final["train/loss"]) and not any(k.startswith("eval/") for k in final)
    validation = json.loads((model_dir / "eval.doc2query.validation.3.json").read_text())
    assert validation["perplexity"] == pytest.approx(np.exp(validation["loss"]))


@pytest.fixture(scope="module")
def sampler(model_dir):
    return doc2query.restore_sampler(model_dir=model_dir, num_queries=3, documents_per_batch=4)


def test_generate_writes_one_line_per_document_in_collection_order(sampler, data_dir, tmp_path):
    # 3 samples per document on 8 'data' devices: 4 requested documents are rounded up to 8 (24 rows).
    assert sampler.documents_per_batch == 8 and sampler.top_k == 10 and sampler.temperature == 1.0
    out = tmp_path / "d2q.tsv"
    summary = doc2query.generate(sampler=sampler, data_dir=data_dir, out=out, progress=False)
    lines = out.read_text().split("\n")
    assert lines[-1] == "" and len(lines) - 1 == summary.documents == summary.written == 10
    queries = [line.split("\t") if line else [] for line in lines[:-1]]
    assert all(len(q) <= 3 for q in queries)
    assert sum(map(len, queries)) == summary.queries == 30 - summary.empty_samples
    assert all(q.strip() == q and q and "\t" not in q for line in queries for q in line)
    assert any(len(set(line)) > 1 for line in queries)  # top-10 sampling: the samples of a document differ
    metadata = json.loads(doc2query.metadata_path(out).read_text())
    assert metadata["checkpoint_step"] == 3 and metadata["num_queries"] == 3 and metadata["top_k"] == 10
    # The docTTTTTquery layout the BM25 + D2Q baseline reads: line i holds the queries of the i-th document.
    from gr_jax.data.d2q import read_d2q_file
    docids = [docid for docid, _ in read_collection(data_dir / "collection.tsv")]
    assert read_d2q_file(out, docids_in_order=docids) == dict(zip(docids, queries))


def test_generate_resumes_after_the_documents_already_written(sampler, data_dir, tmp_path):
    straight = tmp_path / "straight.tsv"
    doc2query.generate(sampler=sampler, data_dir=data_dir, out=straight, progress=False)

    resumed = tmp_path / "resumed.tsv"
    first = doc2query.generate(sampler=sampler, data_dir=data_dir, out=resumed, max_documents=8, progress=False)
    assert (first.skipped, first.written) == (0, 8)
    with open(resumed, "a") as f:  # A run killed while writing its next batch leaves half a line.
        f.write("half a que")
    second = doc2query.generate(sampler=sampler, data_dir=data_dir, out=resumed, progress=False)
    assert (second.skipped, second.written, second.documents) == (8, 2, 10)
    assert resumed.read_bytes() == straight.read_bytes()  # same keys per batch: as if never interrupted

    done = doc2query.generate(sampler=sampler, data_dir=data_dir, out=resumed, progress=False)
    assert (done.skipped, done.written) == (10, 0) and resumed.read_bytes() == straight.read_bytes()


def test_resume_refuses_foreign_or_malformed_files(sampler, data_dir, tmp_path):
    foreign = tmp_path / "foreign.tsv"
    foreign.write_text("a query\n")
    with pytest.raises(FileExistsError, match="not written by gr_jax.tools.doc2query"):
        doc2query.generate(sampler=sampler, data_dir=data_dir, out=foreign, progress=False)

    out = tmp_path / "d2q.tsv"
    doc2query.generate(sampler=sampler, data_dir=data_dir, out=out, max_documents=8, progress=False)
    meta = doc2query.metadata_path(out)
    settings = json.loads(meta.read_text())
    meta.write_text(json.dumps({**settings, "top_k": 5}))
    with pytest.raises(ValueError, match="top_k: file 5 vs now 10"):
        doc2query.generate(sampler=sampler, data_dir=data_dir, out=out, progress=False)
    meta.write_text(json.dumps(settings))
    lines = out.read_text().split("\n")
    lines[2] = "q1\t\tq2"
    out.write_text("\n".join(lines))
    with pytest.raises(DataFormatError, match=r"d2q.tsv:3: empty query between tabs"):
        doc2query.generate(sampler=sampler, data_dir=data_dir, out=out, progress=False)
    lines[2] = "q1\tq2\tq3\tq4"
    out.write_text("\n".join(lines))
    with pytest.raises(DataFormatError, match=r"d2q.tsv:3: 4 queries; this run samples 3"):
        doc2query.generate(sampler=sampler, data_dir=data_dir, out=out, progress=False)


def _greedy_by_full_forward(built, params, documents: list[str], length: int) -> np.ndarray:
    """Greedy decoding by brute force: the whole decoder re-run on the prefix at every step, no cache."""
    encoder = encode_inputs(documents, vocabulary=built.vocabulary, input_length=INPUT_LENGTH)
    decoder = np.full((len(documents), length), PAD_ID, np.int32)
    out = np.full((len(documents), length), PAD_ID, np.int32)
    finished = np.zeros(len(documents), bool)
    forward = jax.jit(lambda p, e, d: built.model.module.apply({"params": p}, e, d))
    with partitioning.partitioning_context(mesh=built.mesh, rules=built.trainer.rules):
        for position in range(length):
            logits = np.asarray(forward(params, encoder, decoder))
            token = np.where(finished, PAD_ID, logits[:, position].argmax(-1))
            out[:, position] = token
            finished |= token == EOS_ID
            if position + 1 < length:
                decoder[:, position + 1] = token
    return out


def test_top_k_1_sampling_is_greedy_decoding(model_dir, data_dir):
    greedy_sampler = doc2query.restore_sampler(model_dir=model_dir, num_queries=2, documents_per_batch=4,
                                               top_k=1, seed=7)
    documents = [text for _, text in read_collection(data_dir / "collection.tsv")][:4]
    sampled = greedy_sampler.sample_tokens(documents, first_document=0)
    assert sampled.shape == (4, 2, TARGET_LENGTH)
    assert len(np.unique(sampled)) > 2  # more than EOS and PAD: a real comparison
    expected = _greedy_by_full_forward(greedy_sampler.built, greedy_sampler.params, documents, TARGET_LENGTH)
    for d in range(4):
        for s in range(2):
            np.testing.assert_array_equal(sampled[d, s], expected[d])
