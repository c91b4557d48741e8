"""gr_jax.data.pipeline on the fixture corpus: features, targets, determinism, resume, sharding, eval padding.

Reference examples come straight from the files and SentencePiece (not from the pipeline under test).
"""
import hashlib
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import seqio
import sentencepiece as spm
import tensorflow as tf

from gr_jax import tasks
from gr_jax.data import pipeline
from gr_jax.data.readers import read_collection, read_qrels, read_queries
from gr_jax.docids import DocidTable
from gr_jax.vocabulary import EOS_ID, train_sentencepiece

from conftest import FIXTURES

FIXTURE_DATA = FIXTURES / "tasks"
NAME = "pipe"
INPUT_LENGTH, TARGET_LENGTH = 12, 10
TASKS = ("pipe.firstp.naive", "pipe.daq.naive", "pipe.d2q.naive", "pipe.labeled.naive")
MIXTURES = ("pipe.labeled_only.naive", "pipe.firstp_labeled.naive", "pipe.firstp_daq_d2q_labeled.naive")


@pytest.fixture(scope="module", autouse=True)
def data_dir(tmp_path_factory) -> pathlib.Path:
    """The fixture corpus with a vocabulary trained on it, registered as dataset `pipe` for this module."""
    data_dir = tmp_path_factory.mktemp("pipeline") / "data"
    shutil.copytree(FIXTURE_DATA, data_dir)
    texts = [t for _, t in read_collection(data_dir / "collection.tsv")]
    texts += [t for _, t in read_queries(data_dir / "queries.train.tsv")]
    train_sentencepiece(texts=texts, model_path=data_dir / "spm.model", vocab_size=320)
    space = tasks.load_docid_space(data_dir=data_dir, input_length=INPUT_LENGTH, target_length=TARGET_LENGTH)
    tasks.register_dataset(name=NAME, data_dir=data_dir, docid_space=space, input_length=INPUT_LENGTH,
                           target_length=TARGET_LENGTH)
    yield data_dir
    tasks.unregister_dataset(name=NAME)


@pytest.fixture(scope="module")
def table(data_dir) -> DocidTable:
    return DocidTable.load(data_dir / "docids.naive.tsv")


@pytest.fixture(scope="module")
def reference(data_dir) -> dict[str, set[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """(input tokens, target tokens) of every training example, per task, from the files + SentencePiece."""
    sp = spm.SentencePieceProcessor(model_file=str(data_dir / "spm.model"))

    def example(text, docid):
        return tuple(sp.encode(text)[:INPUT_LENGTH - 1] + [EOS_ID]), tuple(sp.encode(docid) + [EOS_ID])

    documents = dict(read_collection(data_dir / "collection.tsv"))
    qrels = read_qrels(data_dir / "qrels.train.tsv")
    labeled = {example(text, docid) for qid, text in read_queries(data_dir / "queries.train.tsv")
               for docid, rel in qrels.get(qid, {}).items() if rel > 0 and docid in documents}
    firstp = {example(text, docid) for docid, text in documents.items()}
    # DaQ: any window of INPUT_LENGTH - 1 tokens of a document (all offsets, brute force).
    daq = {(tuple(tokens[offset:offset + INPUT_LENGTH - 1] + [EOS_ID]), tuple(sp.encode(docid) + [EOS_ID]))
           for docid, tokens in ((docid, sp.encode(text)) for docid, text in documents.items())
           for offset in range(max(len(tokens) - (INPUT_LENGTH - 1), 0) + 1)}
    # D2Q: the first 10 synthetic queries of each passage (the default), from the per-passage file.
    lines = (data_dir / "d2q.tsv").read_text().split("\n")
    d2q = {example(query, docid) for docid, line in zip(documents, lines) if line for query in line.split("\t")[:10]}
    return {"pipe.firstp.naive": firstp, "pipe.labeled.naive": labeled, "pipe.labeled_only.naive": labeled,
            "pipe.firstp_labeled.naive": firstp | labeled, "pipe.daq.naive": daq, "pipe.d2q.naive": d2q,
            "pipe.firstp_daq_d2q_labeled.naive": firstp | daq | d2q | labeled}


@pytest.fixture(scope="module")
def documents_in_file_order(data_dir) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    sp = spm.SentencePieceProcessor(model_file=str(data_dir / "spm.model"))
    return [(tuple(sp.encode(text)[:INPUT_LENGTH - 1] + [EOS_ID]), tuple(sp.encode(docid) + [EOS_ID]))
            for docid, text in read_collection(data_dir / "collection.tsv")]


def _take(iterator, n):
    return list(itertools.islice(iterator, n))


def _train(name, *, n, **kwargs):
    args = dict(mixture_or_task_name=name, batch_size=4, input_length=INPUT_LENGTH, target_length=TARGET_LENGTH,
                seed=0) | kwargs
    return _take(pipeline.train_batches(**args), n)


def _rows(batch):
    """(inputs, targets) of each row, PAD removed."""
    return [(tuple(i[i != 0].tolist()), tuple(t[t != 0].tolist()))
            for i, t in zip(batch["encoder_input_tokens"], batch["decoder_target_tokens"])]


def _assert_same(batches_a, batches_b):
    assert len(batches_a) == len(batches_b)
    for a, b in zip(batches_a, batches_b):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("name", TASKS + MIXTURES)
def test_train_batches_features_shapes_and_targets(name, reference, table):
    batches = _train(name, n=6)
    table_rows = {tuple(row[row != 0].tolist()) for row in table.tokens}
    for batch in batches:
        assert set(batch) == set(pipeline.FEATURES)
        for key, value in batch.items():
            length = INPUT_LENGTH if key == "encoder_input_tokens" else TARGET_LENGTH
            assert value.shape == (4, length) and value.dtype == np.int32, key
        targets = batch["decoder_target_tokens"]
        # Decoder inputs: targets shifted right behind the decoder start token (PAD); loss on target tokens only.
        np.testing.assert_array_equal(batch["decoder_input_tokens"][:, 0], 0)
        np.testing.assert_array_equal(batch["decoder_input_tokens"][:, 1:], targets[:, :-1])
        np.testing.assert_array_equal(batch["decoder_loss_weights"], (targets != 0).astype(np.int32))
        for inputs, target in _rows(batch):
            assert target in table_rows
            assert (inputs, target) in reference[name]


def test_mixture_draws_from_every_task(reference):
    rows = {row for batch in _train("pipe.firstp_labeled.naive", n=10) for row in _rows(batch)}
    assert rows & reference["pipe.firstp.naive"] and rows & reference["pipe.labeled.naive"]
    rows = {row for batch in _train("pipe.firstp_daq_d2q_labeled.naive", n=40) for row in _rows(batch)}
    assert reference["pipe.firstp.naive"] <= reference["pipe.daq.naive"]  # FirstP is DaQ's window at offset 0
    for task in ("pipe.daq.naive", "pipe.d2q.naive", "pipe.labeled.naive"):
        others = set().union(*(reference[t] for t in TASKS if t != task))
        assert rows & (reference[task] - others), task


def test_same_seed_same_batches_other_seed_other_batches():
    first = _train("pipe.firstp_labeled.naive", n=5, seed=7)
    _assert_same(first, _train("pipe.firstp_labeled.naive", n=5, seed=7))
    other = _train("pipe.firstp_labeled.naive", n=5, seed=8)
    assert any(not np.array_equal(a["decoder_target_tokens"], b["decoder_target_tokens"])
               for a, b in zip(first, other))


@pytest.mark.parametrize("name", ["pipe.firstp.naive", "pipe.firstp_labeled.naive",
                                  "pipe.firstp_daq_d2q_labeled.naive"])
def test_resuming_at_start_batch_continues_the_fresh_run(name):
    fresh = _train(name, n=12, seed=3)
    _assert_same(_train(name, n=5, seed=3, start_batch=7), fresh[7:])
    _assert_same(_train(name, n=12, seed=3, start_batch=0), fresh)


_RESUMED_RUN = """
import hashlib, itertools, sys
from gr_jax import tasks
from gr_jax.data import pipeline
space = tasks.load_docid_space(data_dir=sys.argv[1], input_length={input_length}, target_length={target_length})
tasks.register_dataset(name="pipe", data_dir=sys.argv[1], docid_space=space, input_length={input_length},
                       target_length={target_length})
batches = pipeline.train_batches(mixture_or_task_name="pipe.firstp_daq_d2q_labeled.naive", batch_size=4,
                                 input_length={input_length}, target_length={target_length}, seed=3, start_batch=7)
for batch in itertools.islice(batches, 5):
    print(hashlib.sha256(b"".join(batch[key].tobytes() for key in sorted(batch))).hexdigest())
"""


def test_resuming_in_a_new_process_continues_the_fresh_run(data_dir):
    """A restart is a new process: the order (and the DaQ chunks and D2Q selection) must not depend on anything
    but the arguments."""
    fresh = _train("pipe.firstp_daq_d2q_labeled.naive", n=12, seed=3)
    code = _RESUMED_RUN.format(input_length=INPUT_LENGTH, target_length=TARGET_LENGTH)
    repo = pathlib.Path(__file__).parent.parent
    result = subprocess.run([sys.executable, "-c", code, str(data_dir)], cwd=repo, capture_output=True, text=True,
                            env=os.environ | {"PYTHONPATH": str(repo)}, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = [hashlib.sha256(b"".join(batch[key].tobytes() for key in sorted(batch))).hexdigest()
                for batch in fresh[7:]]
    assert result.stdout.split() == expected


def _batches(name, **kwargs):
    args = dict(mixture_or_task_name=name, batch_size=4, input_length=INPUT_LENGTH, target_length=TARGET_LENGTH,
                seed=0) | kwargs
    return pipeline.train_batches(**args)


@pytest.mark.parametrize("name", ["pipe.firstp_labeled.naive", "pipe.firstp_daq_d2q_labeled.naive"])
def test_restoring_the_saved_iterator_state_continues_the_fresh_run(name, tmp_path):
    """The O(1) resume: the tf.data state saved after k batches, restored into a new pipeline, yields batch k on,
    at arbitrary k (before, during and after the first epoch and the caches filling); saving does not disturb the
    saving run either."""
    fresh = _train(name, n=40, seed=3)
    batches, states, seen = _batches(name, seed=3), {}, []
    for k in range(36):
        if k in (0, 1, 6, 17, 35):
            states[k] = tmp_path / str(k)
            states[k].mkdir()
            batches.save_input_state(str(states[k]))
            assert batches.batches_consumed == k
        seen.append(next(batches))
    _assert_same(seen, fresh[:36])
    for k, directory in states.items():
        resumed = _batches(name, seed=3, start_batch=k)
        assert resumed.restore_input_state(str(directory)), k  # from the saved state, not by re-reading
        _assert_same(_take(resumed, 5), fresh[k:k + 5])
        assert resumed.batches_consumed == k + 5


def test_each_host_saves_and_restores_its_own_iterator_state(tmp_path):
    name = "pipe.firstp_daq_d2q_labeled.naive"
    fresh = [_train(name, n=10, seed=1, shard_index=i, num_shards=2) for i in range(2)]
    for i in range(2):
        batches = _batches(name, seed=1, shard_index=i, num_shards=2)
        _take(batches, 6)
        batches.save_input_state(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json") == [
        "train_ds-0-of-2.json", "train_ds-1-of-2.json"]
    for i in range(2):
        resumed = _batches(name, seed=1, shard_index=i, num_shards=2, start_batch=6)
        assert resumed.restore_input_state(str(tmp_path))
        _assert_same(_take(resumed, 4), fresh[i][6:10])


def test_a_saved_state_is_never_restored_into_another_stream_or_position(tmp_path):
    name = "pipe.firstp_labeled.naive"
    batches = _batches(name, seed=3)
    _take(batches, 7)
    batches.save_input_state(str(tmp_path))
    with pytest.raises(ValueError, match=r"train_ds-0-of-1.json: saved for another input stream.*'seed': \(3, 4\)"):
        _batches(name, seed=4, start_batch=7).restore_input_state(str(tmp_path))
    with pytest.raises(ValueError, match="another input stream.*batch_size"):
        _batches(name, seed=3, batch_size=8, start_batch=7).restore_input_state(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"process 1 of 2 \(the checkpoint has \['train_ds-0-of-1'\]\)"):
        _batches(name, seed=3, shard_index=1, num_shards=2, start_batch=7).restore_input_state(str(tmp_path))
    with pytest.raises(ValueError, match="after batch 7, but the checkpoint's input position is batch 6"):
        _batches(name, seed=3, start_batch=6).restore_input_state(str(tmp_path))
    started = _batches(name, seed=3, start_batch=7)
    next(started)
    with pytest.raises(RuntimeError, match="after the iterator started"):
        started.restore_input_state(str(tmp_path))


def _generator_batches(*, start_batch):
    """Batches of a Python generator source read in 40 chunks (as tasks/ reads large corpora): tf.data cannot
    save its iterator while the generator is being read."""
    def chunks():
        for i in range(0, 400, 10):
            yield np.arange(i, i + 10)

    dataset = tf.data.Dataset.from_generator(chunks, output_signature=tf.TensorSpec((None,), tf.int64)).unbatch()
    dataset = dataset.repeat().shuffle(16, seed=5).batch(4).map(lambda x: {"x": x})
    return pipeline.TrainBatches(dataset, stream={"seed": 5, "shard_index": 0, "num_shards": 1},
                                 start_batch=start_batch)


def test_a_state_tf_data_cannot_save_is_recorded_and_resumed_by_re_reading(tmp_path, caplog):
    fresh = _take(_generator_batches(start_batch=0), 12)
    batches = _generator_batches(start_batch=0)
    _take(batches, 5)
    batches.save_input_state(str(tmp_path))
    _assert_same(_take(batches, 7), fresh[5:])  # a failed save leaves the iterator as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_ds-0-of-1.json"]  # no partial state files
    record = json.loads((tmp_path / "train_ds-0-of-1.json").read_text())
    assert record["state"] is False and "stateful" in record["reason"] and record["batches_consumed"] == 5
    resumed = _generator_batches(start_batch=5)
    with caplog.at_level("WARNING"):
        assert not resumed.restore_input_state(str(tmp_path))
    assert "no iterator state was saved" in caplog.text
    _assert_same(_take(resumed, 7), fresh[5:])


def test_training_order_is_shuffled_and_repeats_every_example(documents_in_file_order):
    # 10 documents, batch 2: 30 batches are 6 epochs; every document appears about equally, not in file order.
    rows = [row for batch in _train("pipe.firstp.naive", n=30, batch_size=2) for row in _rows(batch)]
    counts = [rows.count(document) for document in documents_in_file_order]
    assert sum(counts) == 60 and min(counts) >= 3, counts
    assert rows[:10] != documents_in_file_order


def test_hosts_get_disjoint_halves_of_the_examples(reference):
    per_host = [{row for batch in _train("pipe.firstp.naive", n=20, batch_size=4, shard_index=i, num_shards=2)
                 for row in _rows(batch)} for i in range(2)]
    assert all(len(batch_rows) == 5 for batch_rows in per_host)
    assert not per_host[0] & per_host[1]
    assert per_host[0] | per_host[1] == reference["pipe.firstp.naive"]
    batch = _train("pipe.firstp.naive", n=1, batch_size=4, shard_index=1, num_shards=2)[0]
    assert batch["encoder_input_tokens"].shape == (2, INPUT_LENGTH)  # global batch 4 over 2 hosts


def test_hosts_get_the_daq_chunks_of_disjoint_documents(reference):
    # 10 documents x 10 chunks over 2 hosts: each host cuts the chunks of its own 5 documents.
    per_host = [[row for batch in _train("pipe.daq.naive", n=25, batch_size=4, shard_index=i, num_shards=2)
                 for row in _rows(batch)] for i in range(2)]
    targets = [{target for _, target in rows} for rows in per_host]
    assert all(len(host_targets) == 5 for host_targets in targets)
    assert not targets[0] & targets[1]
    assert all(set(rows) <= reference["pipe.daq.naive"] for rows in per_host)


def test_bad_batch_or_shard_arguments_are_errors():
    with pytest.raises(ValueError, match="multiple of num_shards"):
        _train("pipe.firstp.naive", n=1, batch_size=5, num_shards=2)
    with pytest.raises(ValueError, match="shard_index=2"):
        _train("pipe.firstp.naive", n=1, shard_index=2, num_shards=2)
    with pytest.raises(ValueError, match="start_batch"):
        _train("pipe.firstp.naive", n=1, start_batch=-1)


def _eval(name, **kwargs):
    args = dict(mixture_or_task_name=name, batch_size=2, input_length=INPUT_LENGTH, target_length=TARGET_LENGTH)
    return list(pipeline.eval_batches(**(args | kwargs)))


def _real_rows(batches):
    return [row for batch in batches for row, real in zip(_rows(batch), batch["example_mask"]) if real]


def test_eval_batches_one_pass_in_order_with_a_padded_masked_tail(data_dir):
    sp = spm.SentencePieceProcessor(model_file=str(data_dir / "spm.model"))
    queries = dict(read_queries(data_dir / "queries.dev.tsv"))
    # Validation: the first relevant document in the collection per dev query (14 has none).
    expected = [(tuple(sp.encode(queries[qid])[:INPUT_LENGTH - 1] + [EOS_ID]), tuple(sp.encode(docid) + [EOS_ID]))
                for qid, docid in (("11", "4420"), ("12", "9"), ("13", "77"))]
    for name in ("pipe.labeled.naive", "pipe.firstp_labeled.naive"):  # the mixture: only labeled has validation
        batches = _eval(name)
        assert [b["example_mask"].tolist() for b in batches] == [[True, True], [True, False]]
        assert _real_rows(batches) == expected
        for key in pipeline.FEATURES:
            assert batches[-1][key].dtype == np.int32
            np.testing.assert_array_equal(batches[-1][key][1], 0)  # padding row: all PAD, zero loss weight


def test_eval_batches_over_documents_keep_every_one_in_file_order(documents_in_file_order):
    batches = _eval("pipe.firstp.naive", split="train", batch_size=4)
    assert [b["example_mask"].tolist() for b in batches] == [[True] * 4, [True] * 4, [True, True, False, False]]
    assert _real_rows(batches) == documents_in_file_order


def test_eval_batches_hosts_yield_equal_batch_counts_and_split_the_examples():
    everything = _real_rows(_eval("pipe.labeled.naive"))
    hosts = [_eval("pipe.labeled.naive", batch_size=2, shard_index=i, num_shards=2) for i in range(2)]
    # 3 examples over 2 hosts, 1 row per host batch: host 0 holds 2, host 1 holds 1 and a fully masked batch.
    assert [[b["example_mask"].tolist() for b in host] for host in hosts] == [[[True], [True]], [[True], [False]]]
    assert sorted(_real_rows(hosts[0]) + _real_rows(hosts[1])) == sorted(everything)


def test_eval_split_missing_everywhere_is_an_error():
    with pytest.raises(ValueError, match="no task with a 'test' split"):
        _eval("pipe.firstp_labeled.naive", split="test")


@pytest.fixture
def miscounted_task():
    """A task declaring 4 validation examples but holding 3 (e.g. a preprocessor that drops one)."""
    vocabulary = seqio.PassThroughVocabulary(size=50, eos_id=EOS_ID)

    def dataset_fn(split, shuffle_files):
        del split, shuffle_files
        return tf.data.Dataset.from_tensor_slices({"inputs": [[5, 1], [6, 1], [7, 1]], "targets": [[8, 1]] * 3})

    name = "pipe_test.miscounted"
    seqio.TaskRegistry.add(
        name, source=seqio.FunctionDataSource(dataset_fn, splits=["validation"], num_input_examples={"validation": 4}),
        output_features={"inputs": seqio.Feature(vocabulary), "targets": seqio.Feature(vocabulary)})
    yield name
    seqio.TaskRegistry.remove(name)


def test_eval_batches_refuse_a_host_whose_example_count_is_not_the_declared_one(miscounted_task):
    assert len(_eval(miscounted_task, shard_index=0, num_shards=2)) == 2  # host 0 holds its 2 of "4"
    with pytest.raises(RuntimeError, match="host 1 of 2.*read 1 examples, expected 2"):
        _eval(miscounted_task, shard_index=1, num_shards=2)
    assert [b["example_mask"].tolist() for b in _eval(miscounted_task)] == [[True, True], [True, False]]
