"""tasks.register_dataset on the fixture corpus: names, rows, examples of every representation, docid targets,
cache, errors, and the D2Q file reader.

Expected examples are written out by hand from tests/fixtures/tasks/ (see the comments in the qrels and the
fixture README); token ids come from the SentencePiece library itself, not from our code.
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

from gr_jax import tasks
from gr_jax.data import d2q, pipeline, readers
from gr_jax.data.readers import DataFormatError, RetrievalDataset, read_collection, read_queries
from gr_jax.docids import DocidTable
from gr_jax.vocabulary import EOS_ID, train_sentencepiece

from conftest import FIXTURES

FIXTURE_DATA = FIXTURES / "tasks"
DOCIDS = ("101", "2481", "35", "7067274", "4420", "9", "58213", "600", "77", "31415")
# (qid, docid) in queries-file then qrels order: query 5 has two relevant docs, 6's second judgement is
# non-relevant, 8's second names an unknown doc, 9 has no judgement.
TRAIN_PAIRS = [("1", "101"), ("2", "2481"), ("3", "35"), ("4", "7067274"), ("5", "77"), ("5", "2481"),
               ("6", "58213"), ("7", "600"), ("8", "31415")]
# First relevant known doc per dev query: 13's first judgement is unknown; 14 has no known relevant doc.
VALIDATION_PAIRS = [("11", "4420"), ("12", "9"), ("13", "77")]
ROWS = ("labeled_only", "firstp_labeled", "daq_labeled", "daq_d2q_labeled", "firstp_daq_d2q_labeled", "daq_only",
        "d2q_only")
TABLE_IDS = ("1a", "2a", "2b", "3a", "3b", "6a", "6b")
D2Q_ROWS = ("daq_d2q_labeled", "firstp_daq_d2q_labeled", "d2q_only")
# tests/fixtures/tasks/d2q.tsv: line i = the queries of passage DOCIDS[i].
D2Q_QUERIES = {docid: line.split("\t") if line else []
               for docid, line in zip(DOCIDS, (FIXTURE_DATA / "d2q.tsv").read_text().split("\n"))}


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


SPACES: dict[str, object] = {}  # dataset name -> the docid space its last registration used


@pytest.fixture
def register(request):
    """register_dataset, with the docid space a run builds for the same data dir, scheme and lengths, that
    unregisters what it added after the test."""
    added = []

    def _register(*, name, data_dir, docid_scheme="naive", input_length=64, target_length=16, vocabulary_path=None,
                  **kwargs):
        added.append((name, docid_scheme))
        space = tasks.load_docid_space(data_dir=data_dir, docid_scheme=docid_scheme, input_length=input_length,
                                       target_length=target_length, vocabulary_path=vocabulary_path)
        SPACES[name] = space
        return tasks.register_dataset(name=name, data_dir=data_dir, docid_space=space, input_length=input_length,
                                      target_length=target_length, vocabulary_path=vocabulary_path, **kwargs)

    yield _register
    for name, scheme in added:
        tasks.unregister_dataset(name=name, docid_scheme=scheme)


def _sp(data_dir):
    return spm.SentencePieceProcessor(model_file=str(data_dir / "spm.model"))


def _examples(name, split, lengths):
    task = seqio.get_mixture_or_task(name)
    return list(task.get_dataset(lengths, split=split, shuffle=False).as_numpy_iterator())


def test_registers_one_task_per_representation_and_one_mixture_per_row_and_table_id(data_dir, register):
    names = register(name="toy", data_dir=data_dir)
    task_names = ["toy.firstp.naive", "toy.daq.naive", "toy.d2q.naive", "toy.labeled.naive",
                  "toy.span_corruption.naive"]
    assert names == task_names + [f"toy.{row}.naive" for row in ROWS] + [f"toy.{i}.naive" for i in TABLE_IDS]
    assert set(task_names) <= set(seqio.TaskRegistry.names())
    assert set(names[5:]) <= set(seqio.MixtureRegistry.names())
    # The pretraining row is the span corruption Task itself, not a study Mixture.
    assert tasks.mixture_name(name="toy", row="span_corruption", docid_scheme="naive") == "toy.span_corruption.naive"
    for task in task_names[:3]:
        assert seqio.get_mixture_or_task(task).splits == ("train",)
    assert set(seqio.get_mixture_or_task("toy.labeled.naive").splits) == {"train", "validation"}
    rates = lambda row: {t.name.split(".")[1]: m.get_rate(t) for m in [seqio.get_mixture_or_task(  # noqa: E731
        f"toy.{row}.naive")] for t in m.tasks}
    # Default rates: the training example counts. 10 documents, 10 DaQ chunks each, at most 10 synthetic queries
    # for each of the 10 passages, 9 labeled pairs.
    assert rates("firstp_labeled") == {"firstp": 10.0, "labeled": 9.0}
    assert rates("firstp_daq_d2q_labeled") == {"firstp": 10.0, "daq": 100.0, "d2q": 100.0, "labeled": 9.0}
    expected_rows = {"labeled_only": {"labeled"}, "firstp_labeled": {"firstp", "labeled"},
                     "daq_labeled": {"daq", "labeled"}, "daq_d2q_labeled": {"daq", "d2q", "labeled"},
                     "firstp_daq_d2q_labeled": {"firstp", "daq", "d2q", "labeled"}, "daq_only": {"daq"},
                     "d2q_only": {"d2q"}}
    for table_id, row in zip(TABLE_IDS, ROWS):
        assert set(rates(row)) == expected_rows[row]
        assert rates(table_id) == rates(row)
        assert tasks.ROW_IDS[table_id] == row and tasks.row_name(table_id) == row == tasks.row_name(row)
        assert tasks.mixture_name(name="toy", row=table_id, docid_scheme="naive") == f"toy.{table_id}.naive"


def test_table_ids_name_the_same_batches_as_row_names(data_dir, register):
    register(name="toy", data_dir=data_dir)
    for table_id, row in (("3b", "firstp_daq_d2q_labeled"),):
        batches = [pipeline.train_batches(mixture_or_task_name=f"toy.{r}.naive", batch_size=8, input_length=64,
                                          target_length=16, seed=5) for r in (table_id, row)]
        for _ in range(4):
            by_id, by_row = next(batches[0]), next(batches[1])
            for key in by_row:
                np.testing.assert_array_equal(by_id[key], by_row[key])


def test_unknown_rows_are_errors():
    with pytest.raises(ValueError, match="unknown mixture row '2c'.*table ids"):
        tasks.mixture_name(name="toy", row="2c", docid_scheme="naive")
    assert set(tasks.ROW_IDS.values()) == set(tasks.MIXTURE_ROWS)  # every row has exactly one table id


def test_mixing_rates_knob(data_dir, register):
    register(name="rated", data_dir=data_dir, mixing_rates={"firstp": 1.0, "labeled": 32.0, "daq": 2.0, "d2q": 3.0})
    dsi = seqio.get_mixture_or_task("rated.firstp_labeled.naive")
    assert {t.name: dsi.get_rate(t) for t in dsi.tasks} == {"rated.firstp.naive": 1.0, "rated.labeled.naive": 32.0}
    with pytest.raises(ValueError, match="missing: \\['d2q', 'daq', 'firstp'\\]"):
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
    with pytest.raises(ValueError, match="unknown docid scheme 'semantic3d'"):
        register(name="toy", data_dir=data_dir, docid_scheme="semantic3d")


def test_missing_vocabulary_names_the_tool_to_run(data_dir, register):
    os.remove(data_dir / "spm.model")
    with pytest.raises(FileNotFoundError, match="gr_jax.tools.make_vocab"):
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
    assert names == ["docs_only.firstp.naive", "docs_only.daq.naive", "docs_only.span_corruption.naive",
                     "docs_only.daq_only.naive", "docs_only.6a.naive"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("no data for source 'labeled_queries', so no 'labeled' task" in m for m in messages), messages
    assert any("skipping mixture row 2a 'firstp_labeled': no task for ['labeled']" in m for m in messages), messages


@pytest.mark.parametrize("cache_in_memory", [True, False])
def test_training_reads_the_collection_once_when_cached_in_memory(data_dir, register, monkeypatch, cache_in_memory):
    name = f"cached_{cache_in_memory}".lower()
    register(name=name, data_dir=data_dir, cache_in_memory=cache_in_memory)
    reads = []
    original = RetrievalDataset.collection

    def counted(self, **kwargs):
        reads.append(1)
        return original(self, **kwargs)

    monkeypatch.setattr(RetrievalDataset, "collection", counted)
    # seqio itself caches sources under 10,000 examples (ours has 10): turn that off to see our cache alone.
    monkeypatch.setattr(seqio.dataset_providers, "_MAX_EXAMPLES_TO_MEM_CACHE", 0)
    batches = pipeline.train_batches(mixture_or_task_name=f"{name}.firstp.naive", batch_size=5, input_length=64,
                                     target_length=16, seed=0)
    for _ in range(8):  # 40 examples: 4 epochs of the 10 documents
        next(batches)
    assert len(reads) == 1 if cache_in_memory else len(reads) >= 4


# --- DaQ -------------------------------------------------------------------------------------------------------

def test_daq_examples_are_ten_windows_of_each_document_the_same_every_epoch(data_dir, register):
    register(name="toy", data_dir=data_dir, input_length=16, target_length=12)
    sp = _sp(data_dir)
    documents = list(read_collection(data_dir / "collection.tsv"))
    task = seqio.get_mixture_or_task("toy.daq.naive")
    two_epochs = list(task.get_dataset({"inputs": 16, "targets": 12}, split="train", shuffle=False, num_epochs=2)
                      .as_numpy_iterator())
    assert len(two_epochs) == 2 * 10 * len(documents)
    first, second = two_epochs[:100], two_epochs[100:]
    for a, b in zip(first, second):  # after the in-memory cache, the chunks are still the same
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
    for i, (docid, text) in enumerate(documents):
        tokens = sp.encode(text)
        windows = {tuple(tokens[o:o + 15]) for o in range(len(tokens) - 15 + 1)}  # every window: brute force
        chunks = first[10 * i:10 * (i + 1)]
        for chunk in chunks:
            assert chunk["docid"].decode() == docid
            assert chunk["targets"].tolist() == sp.encode(docid) + [EOS_ID]
            assert chunk["inputs"][-1] == EOS_ID and tuple(chunk["inputs"][:-1].tolist()) in windows
        assert len({tuple(c["inputs"].tolist()) for c in chunks}) > 1  # random offsets, not FirstP ten times


def test_daq_knobs_change_the_examples(data_dir, register):
    register(name="daq_a", data_dir=data_dir, input_length=16, target_length=12, daq_num_chunks=3, daq_seed=1)
    register(name="daq_b", data_dir=data_dir, input_length=16, target_length=12, daq_num_chunks=3, daq_seed=2)
    a, b = (_examples(f"daq_{x}.daq.naive", "train", {"inputs": 16, "targets": 12}) for x in "ab")
    assert len(a) == len(b) == 3 * len(DOCIDS)
    assert [e["inputs"].tolist() for e in a] != [e["inputs"].tolist() for e in b]
    rates = seqio.get_mixture_or_task("daq_a.daq_labeled.naive")
    assert {t.name: rates.get_rate(t) for t in rates.tasks} == {"daq_a.daq.naive": 30.0, "daq_a.labeled.naive": 9.0}


# --- D2Q -------------------------------------------------------------------------------------------------------

def _d2q_expected(sp, queries_per_docid, *, input_length=64):
    return [{"docid": docid, "inputs": sp.encode(query)[:input_length - 1] + [EOS_ID],
             "targets": sp.encode(docid) + [EOS_ID]}
            for docid in DOCIDS for query in queries_per_docid.get(docid, [])]


def test_d2q_examples_are_the_first_k_synthetic_queries_of_each_passage(data_dir, register):
    register(name="toy", data_dir=data_dir, d2q_queries_per_passage=2)
    expected = _d2q_expected(_sp(data_dir), {d: q[:2] for d, q in D2Q_QUERIES.items()})
    assert len(expected) == 2 + 2 + 0 + 2 + 1 + 2 + 1 + 2 + 1 + 2
    task = seqio.get_mixture_or_task("toy.d2q.naive")
    assert_dataset(task.get_dataset({"inputs": 64, "targets": 16}, split="train", shuffle=False), expected)


@pytest.mark.parametrize("task", ["firstp", "d2q"])
def test_each_shard_reads_only_its_rows_and_the_shards_make_the_whole_in_order(data_dir, register, monkeypatch, task):
    """3 shards (as 3 preprocessing processes or hosts): each reads only its contiguous third of the collection's
    lines (and of the D2Q file's), none reads a line twice, and their examples, in shard order, are the unsharded
    task's."""
    register(name="sharded", data_dir=data_dir, cache_in_memory=False)
    name, lengths = f"sharded.{task}.naive", {"inputs": 64, "targets": 16}
    read = []
    original = readers.read_lines

    def counted(path, **kwargs):
        for line_number, line in original(path, **kwargs):
            read.append((pathlib.Path(path).name, line_number))
            yield line_number, line

    monkeypatch.setattr(readers, "read_lines", counted)
    monkeypatch.setattr(d2q, "read_lines", counted)
    whole = _examples(name, "train", lengths)
    read.clear()
    shards = []
    for index in range(3):
        dataset = seqio.get_mixture_or_task(name).get_dataset(
            lengths, split="train", shuffle=False, shard_info=seqio.ShardInfo(index=index, num_shards=3))
        shards.append(list(dataset.as_numpy_iterator()))
        share = list(range(1 + 10 * index // 3, 1 + 10 * (index + 1) // 3))
        assert sorted(n for file, n in read if file == "collection.tsv") == share, index
        d2q_lines = [n for file, n in read if file == "d2q.tsv" and not (n == 1 and index)]  # 1: the layout's
        assert sorted(d2q_lines) == (share if task == "d2q" else []) or index == 0 and sorted(d2q_lines) == [
            1, 1, *share], index  # shard 0 reads line 1 for the layout and as its first passage
        read.clear()
    flat = [example for shard in shards for example in shard]
    assert len(flat) == len(whole) and all(
        all(np.array_equal(a[key], b[key]) for key in a) for a, b in zip(flat, whole))


def test_d2q_default_keeps_ten_per_passage(data_dir, register):
    register(name="toy", data_dir=data_dir)
    examples = _examples("toy.d2q.naive", "train", {"inputs": 64, "targets": 16})
    assert len(examples) == 10 + sum(len(q) for d, q in D2Q_QUERIES.items() if d != "101")  # 101 has 12


def test_d2q_random_selection_is_a_seeded_subset(data_dir, register):
    sp = _sp(data_dir)
    kept = {}
    for seed in (0, 1):
        register(name=f"rand{seed}", data_dir=data_dir, d2q_queries_per_passage=3, d2q_selection="random",
                 d2q_seed=seed)
        examples = _examples(f"rand{seed}.d2q.naive", "train", {"inputs": 64, "targets": 16})
        by_docid = {}
        for example in examples:
            by_docid.setdefault(example["docid"].decode(), []).append(example["inputs"].tolist())
        for docid, queries in D2Q_QUERIES.items():
            encoded = [sp.encode(q) + [EOS_ID] for q in queries]
            chosen = by_docid.get(docid, [])
            assert len(chosen) == min(3, len(queries))
            assert sorted(map(encoded.index, chosen)) == list(map(encoded.index, chosen))  # a subset, in file order
        kept[seed] = by_docid["101"]
    assert kept[0] != kept[1]  # 3 of passage 101's 12 queries: another seed, another subset


def test_d2q_pid_layout_gives_the_same_examples(data_dir, register, tmp_path):
    by_pid = tmp_path / "by_pid.tsv"
    by_pid.write_text("".join(f"{docid}\t{q}\n" for docid in DOCIDS for q in D2Q_QUERIES[docid]))
    register(name="lines", data_dir=data_dir)
    register(name="pids", data_dir=data_dir, d2q_path=by_pid)
    lines, pids = (_examples(f"{n}.d2q.naive", "train", {"inputs": 64, "targets": 16}) for n in ("lines", "pids"))
    assert [(e["docid"], e["inputs"].tolist()) for e in lines] == [(e["docid"], e["inputs"].tolist()) for e in pids]


def test_without_a_d2q_file_its_task_and_rows_are_left_out_with_a_warning(data_dir, register, caplog):
    os.remove(data_dir / "d2q.tsv")
    with caplog.at_level(logging.WARNING):
        names = register(name="nod2q", data_dir=data_dir)
    assert "nod2q.d2q.naive" not in names
    assert not [n for n in names if any(f".{row}." in n for row in D2Q_ROWS + ("3a", "3b", "6b"))]
    assert {"nod2q.daq_labeled.naive", "nod2q.2b.naive", "nod2q.daq_only.naive"} <= set(names)
    messages = [r.getMessage() for r in caplog.records]
    assert any("no synthetic-queries file" in m and str(data_dir / "d2q.tsv") in m for m in messages), messages
    for row, table_id in zip(D2Q_ROWS, ("3a", "3b", "6b")):
        assert any(f"skipping mixture row {table_id} {row!r}: no task for ['d2q']" in m for m in messages), messages


def test_a_given_d2q_path_must_exist(data_dir, register):
    with pytest.raises(FileNotFoundError, match="d2q_path .*nowhere.tsv does not exist"):
        register(name="bad", data_dir=data_dir, d2q_path=data_dir / "nowhere.tsv")
    assert not [n for n in seqio.TaskRegistry.names() if n.startswith("bad.")]


def test_malformed_d2q_file_fails_the_pipeline_naming_path_and_line(data_dir, register):
    lines = (data_dir / "d2q.tsv").read_text().split("\n")
    lines[3] = "good query\t \tanother"
    (data_dir / "d2q.tsv").write_text("\n".join(lines))
    register(name="broken", data_dir=data_dir)
    with pytest.raises(Exception, match="d2q.tsv:4: empty query between tabs"):
        _examples("broken.d2q.naive", "train", {"inputs": 64, "targets": 16})


@pytest.mark.parametrize("changed", [{"d2q_queries_per_passage": 20}, {"d2q_selection": "random"},
                                     {"daq_num_chunks": 5}, {"daq_seed": 3}])
def test_representation_knobs_are_part_of_the_registration(data_dir, register, changed):
    register(name="knobs", data_dir=data_dir)
    with pytest.raises(ValueError, match="already registered"):
        register(name="knobs", data_dir=data_dir, **changed)


@pytest.mark.parametrize("bad,message", [({"d2q_selection": "best"}, "d2q_selection"),
                                         ({"d2q_queries_per_passage": 0}, "d2q_queries_per_passage"),
                                         ({"daq_num_chunks": 0}, "daq_num_chunks"), ({"daq_seed": -1}, "daq_seed"),
                                         ({"input_length": 1}, "input_length")])
def test_bad_representation_knobs_are_errors(data_dir, register, bad, message):
    with pytest.raises(ValueError, match=message):
        register(name="badknob", data_dir=data_dir, **bad)


def test_d2q_is_streamed_every_epoch_even_with_the_in_memory_cache(data_dir, register, monkeypatch):
    register(name="stream", data_dir=data_dir, d2q_queries_per_passage=2)
    reads = []
    original = d2q.iter_passage_queries

    def counted(*args, **kwargs):
        reads.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(d2q, "iter_passage_queries", counted)
    monkeypatch.setattr(seqio.dataset_providers, "_MAX_EXAMPLES_TO_MEM_CACHE", 0)
    batches = pipeline.train_batches(mixture_or_task_name="stream.d2q.naive", batch_size=5, input_length=64,
                                     target_length=16, seed=0)
    for _ in range(12):  # 60 examples: 4 epochs of the 15 selected queries
        next(batches)
    assert len(reads) >= 4


# --- the D2Q file reader (gr_jax.data.d2q) ----------------------------------------------------------------------

def _stream(path, docids):
    return list(d2q.iter_passage_queries(path, docids_in_order=iter(docids), is_docid=set(docids).__contains__))


def test_iter_passage_queries_streams_both_layouts(tmp_path):
    per_passage = tmp_path / "per_passage.tsv"
    per_passage.write_text("who is seven\twhat is seven\n\neleven facts\n")
    by_pid = tmp_path / "by_pid.tsv"
    by_pid.write_text("11\televen facts\n7\twho is seven\n7\twhat is seven\n")
    docids = ["7", "3", "11"]
    assert _stream(per_passage, docids) == [("7", ["who is seven", "what is seven"]), ("3", []),
                                             ("11", ["eleven facts"])]
    assert _stream(by_pid, docids) == [("11", ["eleven facts"]), ("7", ["who is seven", "what is seven"])]
    assert d2q.detect_layout(per_passage, is_docid=set(docids).__contains__) == d2q.PER_PASSAGE
    assert d2q.detect_layout(by_pid, is_docid=set(docids).__contains__) == d2q.PID_QUERY
    # The per-passage layout consumes the docids lazily: a generator over the collection is enough.
    consumed = []

    def docids_from_collection():
        for docid in docids:
            consumed.append(docid)
            yield docid

    stream = d2q.iter_passage_queries(per_passage, docids_in_order=docids_from_collection(), is_docid=lambda _: False)
    assert next(stream) == ("7", ["who is seven", "what is seven"]) and consumed == ["7"]


@pytest.mark.parametrize("content,message", [
    ("7\ta\n11\tb\n7\tc\n", r"by_pid\.tsv:3: pid '7' already had its queries on lines 1\.\. before pid '11'"),
    ("7\ta\n12\tb\n", r"by_pid\.tsv:2: pid '12' is not in the collection"),
    ("7\ta\n11\n", r"by_pid\.tsv:2: expected 'pid<TAB>query'"),
    ("a\nb\n", r"by_pid\.tsv:2: the file ends after 2 lines but the collection has 3 passages"),
    ("a\nb\nc\nd\n", r"by_pid\.tsv:4: more lines than the 3 passages"),
    ("", r"by_pid\.tsv:1: the doc2query file is empty"),
])
def test_iter_passage_queries_errors_name_path_and_line(tmp_path, content, message):
    path = tmp_path / "by_pid.tsv"
    path.write_text(content)
    with pytest.raises(DataFormatError, match=message):
        _stream(path, ["7", "3", "11"])


def test_span_corruption_task_covers_every_document_token_within_the_lengths(data_dir, register):
    register(name="toy", data_dir=data_dir, input_length=16, target_length=12)
    vocab_size = _sp(data_dir).get_piece_size()
    examples = _examples("toy.span_corruption.naive", "train", {"inputs": 16, "targets": 12})
    rebuilt: dict[str, list[int]] = {}
    for example in examples:
        inputs, targets = example["inputs"].tolist(), example["targets"].tolist()
        assert len(inputs) <= 16 and len(targets) <= 12 and inputs[-1] == targets[-1] == EOS_ID
        spans, current = {}, None
        for token in targets[:-1]:  # "<s0> a b <s1> c": sentinels are the ids after the pieces
            if token >= vocab_size:
                current = spans.setdefault(token, [])
            else:
                current.append(token)
        assert max(spans) < SPACES["toy"].model_vocab_size  # the model's vocabulary holds every sentinel
        piece = [t for token in inputs[:-1] for t in (spans[token] if token >= vocab_size else [token])]
        rebuilt.setdefault(example["docid"].decode(), []).extend(piece)
    documents = dict(read_collection(data_dir / "collection.tsv"))
    assert rebuilt == {docid: _sp(data_dir).encode(text) for docid, text in documents.items()}


def test_a_run_registers_only_the_rows_it_asks_for(data_dir, register, caplog):
    """An experiment registers its own row: nothing is read or warned about for representations it does not use
    (here the absent D2Q file), and a requested row that cannot be built is an error, not a warning."""
    os.remove(data_dir / "d2q.tsv")
    with caplog.at_level(logging.INFO):
        names = register(name="only2a", data_dir=data_dir, rows=("2a",))
    assert names == ["only2a.firstp.naive", "only2a.labeled.naive", "only2a.firstp_labeled.naive", "only2a.2a.naive"]
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "d2q" in m.lower() or "synthetic" in m or "skipping" in m], messages
    mixture = seqio.get_mixture_or_task("only2a.2a.naive").get_dataset({"inputs": 64, "targets": 16}, split="train")
    assert next(iter(mixture.as_numpy_iterator()))["targets"][-1] == EOS_ID  # a batch-ready example
    with pytest.raises(ValueError, match=r"mixture row 3b 'firstp_daq_d2q_labeled' cannot be registered: no task for "
                                         r"\['d2q'\]"):
        register(name="only3b", data_dir=data_dir, rows=("3b",))
    assert not [n for n in seqio.TaskRegistry.names() if n.startswith("only3b.")]  # nothing left half-registered
    assert register(name="pretrain", data_dir=data_dir, rows=("span_corruption",)) == ["pretrain.span_corruption.naive"]
