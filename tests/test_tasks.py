"""tasks.register_dataset on the fixture corpus: names, examples, docid targets, cache, errors.

Expected examples are written out by hand from tests/fixtures/tasks/ (see the comments in the qrels);
token ids come from the SentencePiece library itself, not from our code.
"""
import logging
import os
import pathlib
import shutil

import numpy as np
import pytest
import seqio
import sentencepiece as spm
from seqio.test_utils import assert_dataset

import tasks
from gr_jax.data import pipeline
from gr_jax.data.readers import RetrievalDataset, read_collection, read_queries
from gr_jax.docids import DocidTable
from gr_jax.vocabulary import EOS_ID, train_sentencepiece

FIXTURE_DATA = pathlib.Path(__file__).parent / "fixtures" / "tasks"
DOCIDS = ("101", "2481", "35", "7067274", "4420", "9", "58213", "600", "77", "31415")
# (qid, docid) in queries-file then qrels order: query 5 has two relevant docs, 6's second judgement is
# non-relevant, 8's second names an unknown doc, 9 has no judgement.
TRAIN_PAIRS = [("1", "101"), ("2", "2481"), ("3", "35"), ("4", "7067274"), ("5", "77"), ("5", "2481"),
               ("6", "58213"), ("7", "600"), ("8", "31415")]
# First relevant known doc per dev query: 13's first judgement is unknown; 14 has no known relevant doc.
VALIDATION_PAIRS = [("11", "4420"), ("12", "9"), ("13", "77")]
ROWS = ("labeled_only", "firstp_labeled")


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory) -> pathlib.Path:
    texts = [t for _, t in read_collection(FIXTURE_DATA / "collection.tsv")]
    texts += [t for _, t in read_queries(FIXTURE_DATA / "queries.train.tsv")]
    return train_sentencepiece(texts=texts, model_path=tmp_path_factory.mktemp("vocab") / "spm.model", vocab_size=320)


@pytest.fixture
def data_dir(tmp_path, vocab_file) -> pathlib.Path:
    """A writable copy of the fixture corpus with its vocabulary beside it."""
    shutil.copytree(FIXTURE_DATA, tmp_path / "data")
    shutil.copy(vocab_file, tmp_path / "data" / "spm.model")
    return tmp_path / "data"


@pytest.fixture
def register(request):
    """register_dataset that unregisters what it added after the test."""
    added = []

    def _register(**kwargs):
        added.append((kwargs["name"], kwargs.get("docid_scheme", "naive")))
        return tasks.register_dataset(**kwargs)

    yield _register
    for name, scheme in added:
        tasks.unregister_dataset(name=name, docid_scheme=scheme)


def _sp(data_dir):
    return spm.SentencePieceProcessor(model_file=str(data_dir / "spm.model"))


def _examples(name, split, lengths):
    task = seqio.get_mixture_or_task(name)
    return list(task.get_dataset(lengths, split=split, shuffle=False).as_numpy_iterator())


def test_registers_one_task_per_representation_and_one_mixture_per_row(data_dir, register):
    names = register(name="toy", data_dir=data_dir)
    assert names == ["toy.firstp.naive", "toy.labeled.naive", "toy.labeled_only.naive", "toy.firstp_labeled.naive"]
    assert {"toy.firstp.naive", "toy.labeled.naive"} <= set(seqio.TaskRegistry.names())
    assert {"toy.labeled_only.naive", "toy.firstp_labeled.naive"} <= set(seqio.MixtureRegistry.names())
    assert seqio.get_mixture_or_task("toy.firstp.naive").splits == ("train",)
    assert set(seqio.get_mixture_or_task("toy.labeled.naive").splits) == {"train", "validation"}
    dsi = seqio.get_mixture_or_task("toy.firstp_labeled.naive")
    # Default rates: proportional to the training example counts (10 documents, 9 labeled pairs).
    assert {t.name: dsi.get_rate(t) for t in dsi.tasks} == {"toy.firstp.naive": 10.0, "toy.labeled.naive": 9.0}
    assert [t.name for t in seqio.get_mixture_or_task("toy.labeled_only.naive").tasks] == ["toy.labeled.naive"]


def test_mixing_rates_knob(data_dir, register):
    register(name="rated", data_dir=data_dir, mixing_rates={"firstp": 1.0, "labeled": 32.0})
    dsi = seqio.get_mixture_or_task("rated.firstp_labeled.naive")
    assert {t.name: dsi.get_rate(t) for t in dsi.tasks} == {"rated.firstp.naive": 1.0, "rated.labeled.naive": 32.0}
    with pytest.raises(ValueError, match="missing: \\['firstp'\\]"):
        register(name="rated2", data_dir=data_dir, mixing_rates={"labeled": 1.0})
    assert "rated2.labeled.naive" not in seqio.TaskRegistry.names()  # nothing left half-registered


def test_firstp_examples_are_the_first_tokens_of_each_document_and_its_docid_row(data_dir, register):
    register(name="toy", data_dir=data_dir, input_length=16, target_length=12)
    sp = _sp(data_dir)
    documents = list(read_collection(data_dir / "collection.tsv"))
    expected = [{"docid": docid, "inputs": sp.encode(text)[:15] + [EOS_ID], "targets": sp.encode(docid) + [EOS_ID]}
                for docid, text in documents]
    assert all(len(sp.encode(text)) > 15 for _, text in documents)  # every document is cut: FirstP matters
    task = seqio.get_mixture_or_task("toy.firstp.naive")
    assert_dataset(task.get_dataset({"inputs": 16, "targets": 12}, split="train", shuffle=False), expected)


def test_labeled_examples_pair_queries_with_relevant_documents(data_dir, register, caplog):
    with caplog.at_level(logging.WARNING):
        register(name="toy", data_dir=data_dir)
    sp = _sp(data_dir)
    queries = dict(read_queries(data_dir / "queries.train.tsv")) | dict(read_queries(data_dir / "queries.dev.tsv"))
    for split, pairs in (("train", TRAIN_PAIRS), ("validation", VALIDATION_PAIRS)):
        expected = [{"qid": qid, "docid": docid, "inputs": sp.encode(queries[qid]) + [EOS_ID],
                     "targets": sp.encode(docid) + [EOS_ID]} for qid, docid in pairs]
        task = seqio.get_mixture_or_task("toy.labeled.naive")
        assert_dataset(task.get_dataset({"inputs": 64, "targets": 16}, split=split, shuffle=False), expected)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("split 'train': 1 qrels name unknown documents" in m for m in warnings), warnings
    assert any("split 'dev': 2 qrels name unknown documents" in m for m in warnings), warnings
    assert any("split 'dev': 1 queries have no relevant document in the collection" in m for m in warnings), warnings


def test_targets_are_the_cached_docid_table_rows(data_dir, register):
    register(name="toy", data_dir=data_dir)
    table = DocidTable.load(data_dir / "docids.naive.tsv")
    assert table.docids == DOCIDS
    sp = _sp(data_dir)
    for docid, row, length in zip(table.docids, table.tokens, table.lengths):
        assert row[:length].tolist() == sp.encode(docid) + [EOS_ID]
    for name in ("toy.firstp.naive", "toy.labeled.naive"):
        for example in _examples(name, "train", {"inputs": 64, "targets": 16}):
            i = table.docids.index(example["docid"].decode())
            np.testing.assert_array_equal(example["targets"], table.tokens[i, :table.lengths[i]])


def test_too_long_docid_is_an_error_and_registers_nothing(data_dir, register):
    # "7067274" is 8 pieces ("▁" + 7 digits) + EOS = 9 tokens.
    assert len(_sp(data_dir).encode("7067274")) + 1 == 9
    with pytest.raises(ValueError, match="'7067274' needs 9 target tokens"):
        register(name="short", data_dir=data_dir, target_length=8)
    assert not [n for n in seqio.TaskRegistry.names() if n.startswith("short.")]
    assert register(name="short", data_dir=data_dir, target_length=9)  # fits exactly


def test_registering_twice_is_idempotent_but_a_different_config_is_an_error(data_dir, register):
    first = register(name="again", data_dir=data_dir)
    assert register(name="again", data_dir=data_dir) == first
    assert len(_examples("again.firstp.naive", "train", {"inputs": 64, "targets": 16})) == len(DOCIDS)
    with pytest.raises(ValueError, match="already registered"):
        register(name="again", data_dir=data_dir, input_length=32)
    assert set(first) <= set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())


def test_pipeline_asking_for_shorter_lengths_than_registered_is_an_error(data_dir, register):
    register(name="toy", data_dir=data_dir, input_length=16, target_length=12)
    task = seqio.get_mixture_or_task("toy.labeled.naive")
    with pytest.raises(ValueError, match="targets: asked 10 < registered 12"):
        task.get_dataset({"inputs": 16, "targets": 10}, split="train", shuffle=False)


def test_bad_names_and_schemes_are_errors(data_dir, register):
    with pytest.raises(ValueError, match="letters, digits and underscores"):
        register(name="msmarco-mini", data_dir=data_dir)
    with pytest.raises(ValueError, match="unknown docid scheme 'semantic'"):
        register(name="toy", data_dir=data_dir, docid_scheme="semantic")


def test_missing_vocabulary_names_the_tool_to_run(data_dir, register):
    os.remove(data_dir / "spm.model")
    with pytest.raises(FileNotFoundError, match="tools.make_vocab"):
        register(name="novocab", data_dir=data_dir)


def test_docid_cache_is_rebuilt_when_the_vocabulary_changes(data_dir, register, caplog):
    register(name="cache1", data_dir=data_dir)
    cache = data_dir / "docids.naive.tsv"
    built = DocidTable.load(cache)
    # Unchanged inputs: the cache is read, not rewritten.
    past = cache.stat().st_mtime_ns - 10 * 10**9
    os.utime(data_dir / "spm.model", ns=(past - 10**9, past - 10**9))
    os.utime(data_dir / "collection.tsv", ns=(past - 10**9, past - 10**9))
    os.utime(cache, ns=(past, past))
    register(name="cache2", data_dir=data_dir)
    assert cache.stat().st_mtime_ns == past
    # A newer vocabulary file (same content): rebuilt, identical rows.
    os.utime(data_dir / "spm.model", ns=(past + 10**9, past + 10**9))
    register(name="cache3", data_dir=data_dir)
    assert cache.stat().st_mtime_ns > past + 10**9
    np.testing.assert_array_equal(DocidTable.load(cache).tokens, built.tokens)
    # Another vocabulary file that is *older* than the cache: the spot check catches it. (A new path: seqio
    # caches SentencePiece models by path within a process.)
    texts = [t for _, t in read_queries(data_dir / "queries.train.tsv")] + ["0 1 2 3 4 5 6 7 8 9 x"] * 3
    other = train_sentencepiece(texts=texts, model_path=data_dir / "other.model", vocab_size=300)
    earlier = cache.stat().st_mtime_ns - 10**9
    os.utime(other, ns=(earlier, earlier))
    sp = spm.SentencePieceProcessor(model_file=str(other))
    assert sp.encode(DOCIDS[0]) + [EOS_ID] != built.tokens[0, :built.lengths[0]].tolist()  # precondition
    with caplog.at_level(logging.WARNING):
        register(name="cache4", data_dir=data_dir, vocabulary_path=other)
    assert any("disagree with the vocabulary" in r.getMessage() for r in caplog.records)
    rebuilt = DocidTable.load(cache)
    assert [rebuilt.tokens[i, :rebuilt.lengths[i]].tolist() for i in range(len(DOCIDS))] == \
        [sp.encode(d) + [EOS_ID] for d in DOCIDS]


def test_data_dir_without_training_queries_registers_no_mixture(tmp_path, vocab_file, register, caplog):
    data_dir = tmp_path / "docs_only"
    data_dir.mkdir()
    shutil.copy(FIXTURE_DATA / "collection.tsv", data_dir)
    shutil.copy(vocab_file, data_dir / "spm.model")
    with caplog.at_level(logging.WARNING):
        names = register(name="docs_only", data_dir=data_dir)
    assert names == ["docs_only.firstp.naive"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("no data for source 'labeled_queries', so no 'labeled' task" in m for m in messages), messages


@pytest.mark.parametrize("cache_in_memory", [True, False])
def test_training_reads_the_collection_once_when_cached_in_memory(data_dir, register, monkeypatch, cache_in_memory):
    name = f"cached_{cache_in_memory}".lower()
    register(name=name, data_dir=data_dir, cache_in_memory=cache_in_memory)
    reads = []
    original = RetrievalDataset.collection

    def counted(self):
        reads.append(1)
        return original(self)

    monkeypatch.setattr(RetrievalDataset, "collection", counted)
    # seqio itself caches sources under 10,000 examples (ours has 10): turn that off to see our cache alone.
    monkeypatch.setattr(seqio.dataset_providers, "_MAX_EXAMPLES_TO_MEM_CACHE", 0)
    batches = pipeline.train_batches(mixture_or_task_name=f"{name}.firstp.naive", batch_size=5, input_length=64,
                                     target_length=16, seed=0)
    for _ in range(8):  # 40 examples: 4 epochs of the 10 documents
        next(batches)
    assert len(reads) == 1 if cache_in_memory else len(reads) >= 4
