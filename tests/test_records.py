"""Preprocessed training examples (gr_jax.data.records, python -m gr_jax.tools.preprocess): the files hold one pass of
each task of the run's seqio mixture, batches are the seqio converter's features, the seeded stream is addressed by
position (every host its rows of the same global batch, any start), and a directory made from other settings or
another vocabulary is refused."""
import collections
import dataclasses
import json
import pathlib

import gin
import numpy as np
import pytest

from conftest import preprocess_examples
from gr_jax.data import pipeline
from gr_jax.data import records

LENGTHS = {"input_length": 16, "target_length": 12}


def _gin_args(data_dir, out_dir, *, name: str, row: str = "firstp_labeled") -> list[str]:
    return ["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin", "--gin_file=data/preprocessed.gin",
            f"--gin.DATA_DIR='{data_dir}'", "--gin.MODEL_DIR='unused'", f"--gin.DATASET_NAME='{name}'",
            "--gin.TRAIN_STEPS=2",
            f"--gin.PREPROCESSED_DIR='{out_dir}'", "--gin.INPUT_LENGTH=16", "--gin.TARGET_LENGTH=12",
            f"--gin.experiment.DatasetConfig.row='{row}'", "--gin.network.T5Config.num_encoder_layers=1",
            "--gin.network.T5Config.num_decoder_layers=1"]


def _preprocess(args: list[str], capsys) -> dict:
    from gr_jax.tools import preprocess
    gin.clear_config()
    try:
        preprocess.main(args)
    finally:
        gin.clear_config()
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _file_examples(path) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    from array_record.python.array_record_module import ArrayRecordReader
    reader = ArrayRecordReader(str(path))
    try:
        return [tuple(tuple(int(t) for t in part) for part in records.decode_example(r, where=str(path)))
                for r in reader.read_all()]
    finally:
        reader.close()


@pytest.fixture(scope="module")
def preprocessed(spm_data_dir, tmp_path_factory):
    """The fixture's row 2a (FirstP + labeled queries, naive docids) preprocessed into one part."""
    out = tmp_path_factory.mktemp("records") / "row2a"
    report = preprocess_examples(_gin_args(spm_data_dir, out, name="records2a"))
    return out, report


def test_the_files_hold_one_pass_of_each_task_of_the_mixture_with_its_rate(preprocessed):
    out, report = preprocessed
    manifest = records.Manifest.read(out)
    assert report["mixture"] == manifest.description["mixture"] == "records2a.firstp_labeled.naive"
    rates = pipeline.task_rates("records2a.firstp_labeled.naive")
    assert [(t.task, t.rate) for t in manifest.tasks] == rates == [("records2a.firstp.naive", 10.0),
                                                                    ("records2a.labeled.naive", 9.0)]
    for task in manifest.tasks:
        expected = [(tuple(int(t) for t in i), tuple(int(t) for t in o))
                    for i, o in pipeline.task_examples(task.task, **LENGTHS)]
        assert _file_examples(task.files[0]) == expected and task.num_examples == len(expected)
    assert report["examples"] == manifest.num_examples == 19


def test_batch_features_are_the_seqio_converters(preprocessed):
    import seqio
    import tensorflow as tf
    out, _ = preprocessed
    manifest = records.Manifest.read(out)
    examples = [pair for task in manifest.tasks for pair in pipeline.task_examples(task.task, **LENGTHS)]
    ours = records.example_features([records.encode_example(i, t) for i, t in examples], **LENGTHS, where="test")
    dataset = tf.data.Dataset.from_generator(lambda: ({"inputs": i, "targets": t} for i, t in examples),
                                             output_signature={"inputs": tf.TensorSpec([None], tf.int32),
                                                               "targets": tf.TensorSpec([None], tf.int32)})
    converted = seqio.EncDecFeatureConverter(pack=False)(dataset, {"inputs": 16, "targets": 12})
    theirs = list(converted.batch(len(examples)).as_numpy_iterator())[0]
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        assert ours[name].dtype == value.dtype, name
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def _batches(out, *, batch_size=4, seed=0) -> records.RecordBatches:
    return records.RecordBatches(manifest=records.Manifest.read(out), batch_size=batch_size, seed=seed, **LENGTHS)


def test_every_host_gets_its_rows_of_the_same_global_batch_from_any_start(preprocessed):
    out, _ = preprocessed
    source = _batches(out)
    for b in (0, 3, 1000, 10**9):
        whole = source.batch(b)
        halves = [source.batch(b, shard_index=s, num_shards=2) for s in (0, 1)]
        quarters = [source.batch(b, shard_index=s, num_shards=4) for s in range(4)]
        for name, value in whole.items():
            np.testing.assert_array_equal(np.concatenate([h[name] for h in halves]), value)
            np.testing.assert_array_equal(np.concatenate([q[name] for q in quarters]), value)
    resumed = source.batches(start_batch=7)
    for b in range(7, 10):
        got = next(resumed)
        for name, value in _batches(out).batch(b).items():  # a fresh reader: nothing carried over
            np.testing.assert_array_equal(got[name], value)
    other_seed = _batches(out, seed=1).batch(0)["encoder_input_tokens"]
    assert not np.array_equal(other_seed, source.batch(0)["encoder_input_tokens"])


def _rows(batch) -> list[bytes]:
    return [batch["encoder_input_tokens"][r].tobytes() + batch["decoder_target_tokens"][r].tobytes()
            for r in range(len(batch["encoder_input_tokens"]))]


def test_each_epoch_is_a_fresh_permutation_and_tasks_come_at_their_rates(preprocessed):
    out, _ = preprocessed
    manifest = records.Manifest.read(out)
    source = _batches(out, batch_size=19)  # 19 examples: rates 10 and 9, one of each per 19 examples
    features = records.example_features(
        [records.encode_example(i, t) for task in manifest.tasks for i, t in pipeline.task_examples(task.task,
                                                                                                   **LENGTHS)],
        **LENGTHS, where="test")
    everything = collections.Counter(_rows(features))
    epochs = [source.batch(e) for e in range(3)]
    for batch in epochs:  # each task's examples once per its epoch; the mix gives 10 + 9 of 19
        assert collections.Counter(_rows(batch)) == everything
    assert len({tuple(_rows(batch)) for batch in epochs}) == 3


def test_preprocessing_in_shards_makes_the_same_examples(spm_data_dir, preprocessed, tmp_path, capsys):
    out, _ = preprocessed
    parts = tmp_path / "parts"
    args = _gin_args(spm_data_dir, parts, name="records2a")
    with pytest.raises(FileNotFoundError, match=r"parts \[1\] of 2 are missing"):
        _preprocess([*args, "--gin.preprocess.preprocess.shard_index=0", "--gin.preprocess.preprocess.num_shards=2"],
                    capsys)
        records.Manifest.read(parts)
    _preprocess([*args, "--gin.preprocess.preprocess.shard_index=1", "--gin.preprocess.preprocess.num_shards=2"],
                capsys)
    whole, sharded = records.Manifest.read(out), records.Manifest.read(parts)
    assert [t.num_examples for t in sharded.tasks] == [t.num_examples for t in whole.tasks]
    for a, b in zip(whole.tasks, sharded.tasks):
        assert len(b.files) == 2
        assert sorted(_file_examples(a.files[0])) == sorted(e for f in b.files for e in _file_examples(f))
        # The reader's source: the files' records in order, by index, whichever file holds them.
        source = records.RecordFiles(b.files)
        in_order = [e for f in b.files for e in _file_examples(f)]
        assert len(source) == len(in_order) == b.num_examples
        assert [tuple(tuple(int(t) for t in part) for part in records.decode_example(source[i], where="test"))
                for i in range(len(source))] == in_order
        with pytest.raises(IndexError):
            source[len(source)]
    with pytest.raises(SystemExit, match="error: .*manifest.00001-of-00002.json: this part is already written"):
        _preprocess([*args, "--gin.preprocess.preprocess.shard_index=1",
                     "--gin.preprocess.preprocess.num_shards=2"], capsys)


def test_a_directory_of_other_settings_or_vocabulary_is_refused(spm_data_dir, preprocessed, tmp_path):
    from gr_jax.experiment import DatasetConfig
    out, _ = preprocessed
    source = DatasetConfig(name="records2a", data_dir=str(spm_data_dir), **LENGTHS)
    docids = source.docid_space()
    records.PreprocessedData(source=source, directory=str(out)).check(docids)  # the same: accepted
    records.PreprocessedData(source=dataclasses.replace(source, eval_split="train", cache_in_memory=False),
                             directory=str(out)).check(docids)  # no training example changes
    with pytest.raises(ValueError, match=r"other data settings.*'row': \('firstp_labeled', 'firstp'\)"):
        records.PreprocessedData(source=dataclasses.replace(source, row="firstp"), directory=str(out)).check(docids)
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in out.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    manifest = copy / "manifest.00000-of-00001.json"
    saved = json.loads(manifest.read_text())
    saved["description"]["input_fingerprint"]["vocabulary"] = "0" * 64
    manifest.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="another vocabulary or docid table"):
        records.PreprocessedData(source=source, directory=str(copy)).check(docids)
    with pytest.raises(FileNotFoundError, match="no preprocessed examples"):
        records.PreprocessedData(source=source, directory=str(tmp_path / "none")).check(docids)
    # Evaluation and search register the run's data and need none of it; training checks before it reads.
    missing = records.PreprocessedData(source=source, directory=str(tmp_path / "none"))
    assert missing.register(docids) == [] and missing.mixture_name == source.mixture_name
    with pytest.raises(FileNotFoundError, match="no preprocessed examples"):
        missing.train_batches(docid_space=docids, batch_size=4, seed=0, start_batch=0, shard_index=0, num_shards=1)
    with pytest.raises(ValueError, match="another vocabulary or docid table"):
        wrong = records.PreprocessedData(source=source, directory=str(copy))
        wrong.register(docids)
        wrong.train_batches(docid_space=docids, batch_size=4, seed=0, start_batch=0, shard_index=0, num_shards=1)


def test_a_record_that_is_not_an_example_is_an_error():
    good = records.encode_example(np.array([5, 6, 1]), np.array([7, 1]))
    inputs, targets = records.decode_example(good, where="f")
    assert inputs.tolist() == [5, 6, 1] and targets.tolist() == [7, 1]
    with pytest.raises(ValueError, match="f: a record of 12 bytes is not a gr_jax example"):
        records.decode_example(good[:12], where="f")
    with pytest.raises(ValueError, match="longer than this run's 2 / 12"):
        records.example_features([good], input_length=2, target_length=12, where="f")


def test_reading_needs_neither_tensorflow_nor_seqio(preprocessed):
    import subprocess
    import sys
    out, _ = preprocessed
    code = ("import sys\n"
            "for name in ('tensorflow', 'seqio'):\n"
            "    sys.modules[name] = None\n"
            "from gr_jax.data import records\n"
            f"m = records.Manifest.read({str(out)!r})\n"
            "b = records.RecordBatches(manifest=m, batch_size=4, seed=0, input_length=16, target_length=12)\n"
            "print(next(b.batches())['encoder_input_tokens'].shape)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=pathlib.Path(__file__).parent.parent)
    assert result.returncode == 0 and result.stdout.strip() == "(4, 16)", result.stderr[-2000:]


def test_a_task_larger_than_a_file_is_written_in_several_and_read_back_in_order(tmp_path):
    examples = [(np.array([5 + i, 1]), np.array([7, i % 3 + 2, 1])) for i in range(10)]
    manifest = records.write_part(directory=tmp_path, description={"input_length": 4}, records_per_file=4,
                                  tasks=[("t", 1.0, iter(examples)), ("empty", 1.0, iter([]))])
    assert manifest["tasks"][0]["files"] == [f"t.00000-of-00001.{k:05d}.array_record" for k in range(3)]
    assert manifest["tasks"][1] == {"task": "empty", "rate": 1.0, "num_examples": 0, "files": []}
    task = records.Manifest.read(tmp_path).tasks[0]
    assert task.num_examples == 10 and [len(_file_examples(f)) for f in task.files] == [4, 4, 2]
    source = records.RecordFiles(task.files)
    assert [tuple(map(tuple, records.decode_example(source[i], where="test"))) for i in range(len(source))] == [
        (tuple(i.tolist()), tuple(t.tolist())) for i, t in examples]
