"""A dense corpus index written by a multi-host job on one machine: two processes on localhost (CPU, 2 devices each)
evaluate a micro T5 dual encoder (no training step), each encoding only its half of the collection into its own shard
file; the index they write together is the one process's (holding all 4 devices), vectors, docids and rankings. Its
own file, so that it runs beside the other multi-process tests rather than after them."""
import json

import numpy as np
import pytest

from gr_jax.data.readers import DataFormatError, open_dataset, shard_rows
from gr_jax.dense.index import EMBEDDINGS, CorpusIndex, IndexConfig, ShardedRows, encode_corpus, shard_file
from test_multiprocess import _free_port, _run


def test_shard_rows_tile_the_collection_in_order():
    def every(rows: int, shards: int) -> list[tuple[int, int]]:
        return [shard_rows(rows, shard_index=i, num_shards=shards) for i in range(shards)]

    assert every(10, 1) == [(0, 10)]
    assert every(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert every(1, 2) == [(0, 0), (0, 1)]
    with pytest.raises(ValueError, match="shard_index=2"):
        shard_rows(10, shard_index=2, num_shards=2)
    assert [shard_file(i, 2) for i in (0, 1)] == ["embeddings.00000-of-00002.npy", "embeddings.00001-of-00002.npy"]
    assert shard_file(0, 1) == EMBEDDINGS


def test_sharded_rows_read_as_the_array_they_stand_for():
    whole = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    rows = ShardedRows([whole[:4], whole[4:4], whole[4:7], whole[7:]])
    assert rows.shape == (10, 3) and len(rows) == 10 and rows.ndim == 2 and rows.dtype == np.float32
    for key in (slice(None), slice(2, 9), slice(4, 7), slice(9, 20), slice(None, None, 3), slice(8, 2, -2),
                slice(3, 3), np.array([9, 0, 5, 5, 3]), np.array([[1, 2], [8, -1]]), [0, 4, 7], np.array([], int), -1,
                np.int64(4)):
        np.testing.assert_array_equal(rows[key], whole[key], err_msg=str(key))
    np.testing.assert_array_equal(np.asarray(rows, np.float64), whole.astype(np.float64))
    with pytest.raises(IndexError, match="row 10 of 10 rows"):
        rows[np.array([10])]


def test_an_index_in_shards_loads_as_one_and_a_missing_shard_is_named(tmp_path):
    vectors = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # unit vectors: each its own best inner product
    docids = np.asarray([f"d{i}".encode() for i in range(5)])
    manifest = {"corpus": {"documents": 5}, "encoder": {"dim": 4}}
    layouts = {"one": [(EMBEDDINGS, (0, 5))], "old": [(EMBEDDINGS, (0, 5))],
               "two": [(shard_file(i, 2), shard_rows(5, shard_index=i, num_shards=2)) for i in range(2)]}
    for name, shards in layouts.items():
        directory = tmp_path / name
        directory.mkdir()
        for file, (start, stop) in shards:
            np.save(directory / file, vectors[start:stop])
        listed = {} if name == "old" else {"shards": [{"file": f, "rows": list(rows)} for f, rows in shards]}
        CorpusIndex(docids=docids, embeddings=vectors, manifest={**manifest, **listed}).save(directory)
        loaded = CorpusIndex.load(directory, expect=lambda manifest, path: None)
        assert isinstance(loaded.embeddings, ShardedRows) == (name == "two")
        np.testing.assert_array_equal(np.asarray(loaded.embeddings), vectors)
        assert loaded.docids.tolist() == docids.tolist()
        _, found = loaded.with_faiss_index(IndexConfig(), write=False).search(vectors, k=1)
        assert found[:, 0].tolist() == [0, 1, 2, 3, 4]
    (tmp_path / "two" / shard_file(1, 2)).unlink()
    with pytest.raises(DataFormatError, match=r"embeddings\.00001-of-00002\.npy is missing: .*manifest\.json names "
                                              r"it as rows \[2, 5\)"):
        CorpusIndex.load(tmp_path / "two", expect=lambda manifest, path: None)
    np.save(tmp_path / "two" / shard_file(1, 2), vectors[:2])
    with pytest.raises(DataFormatError, match=r"00001-of-00002\.npy: \[2, 4\] vectors, but .* rows \[2, 5\)"):
        CorpusIndex.load(tmp_path / "two", expect=lambda manifest, path: None)


def test_the_corpus_is_written_block_by_block_as_it_is_encoded_in_memory(tmp_path):
    texts = [f"text {i}" for i in range(10)]

    def encode(batch):
        return np.asarray([[float(text.split()[1]), len(batch)] for text in batch], np.float32)

    written, _ = encode_corpus(texts=lambda: iter(texts), num_documents=10, encode=encode, shape=(2,),
                               out_path=tmp_path / "e.npy", read_size=4)
    in_memory, _ = encode_corpus(texts=lambda: iter(texts), num_documents=10, encode=encode, shape=(2,), read_size=4)
    assert isinstance(written, np.memmap) and not list(tmp_path.glob(".*tmp"))
    np.testing.assert_array_equal(written, in_memory)
    np.testing.assert_array_equal(written[:, 0], np.arange(10))
    assert written[:, 1].tolist() == [4] * 8 + [2] * 2  # blocks of read_size texts, the last one short
    with pytest.raises(ValueError, match="got 10 texts, expected num_documents=11"):
        encode_corpus(texts=lambda: iter(texts), num_documents=11, encode=encode, shape=(2,))
    with pytest.raises(ValueError, match="more than num_documents=9 texts"):
        encode_corpus(texts=lambda: iter(texts), num_documents=9, encode=encode, shape=(2,))


def _dense_args(data, model_dir) -> list[str]:
    """The zero-shot recipe of docs/dense.md on a micro T5 tower: step 0's evaluation writes index/0."""
    return ["--gin_file=dense/t5.gin", "--gin_file=models/t5_1_1/tiny.gin", f"--gin.DATA_DIR='{data}'",
            f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRAIN_STEPS=0", "--gin.QUERY_LENGTH=8",
            "--gin.DOCUMENT_LENGTH=32", "--gin.PROJECTION_DIM=8", "--gin.network.T5Config.num_encoder_layers=1",
            "--gin.training.train.progress=False"]


def test_two_processes_each_encode_their_half_into_the_one_process_index(spm_data_dir, tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    port = _free_port()

    def process(index: int) -> list[str]:
        return [*_dense_args(spm_data_dir, multi),
                f"--gin.partitioning.initialize_distributed.coordinator_address='localhost:{port}'",
                "--gin.partitioning.initialize_distributed.num_processes=2",
                f"--gin.partitioning.initialize_distributed.process_id={index}"]

    _run([(_dense_args(spm_data_dir, single), 4), (process(0), 2), (process(1), 2)], cwd=tmp_path)

    docids = [docid.encode() for docid, _ in open_dataset(spm_data_dir).collection()]
    assert len(docids) == 10
    one, two = (CorpusIndex.load(run / "index" / "0", expect=lambda manifest, path: None) for run in (single, multi))

    # Each process encoded its half, rows [0, 5) and [5, 10), into its own file; the one process wrote the old layout.
    shards = two.manifest["shards"]
    assert [(s["file"], s["rows"], s["process"], s["documents"]) for s in shards] == [
        ("embeddings.00000-of-00002.npy", [0, 5], 0, 5), ("embeddings.00001-of-00002.npy", [5, 10], 1, 5)]
    assert [np.load(multi / "index" / "0" / s["file"], mmap_mode="r").shape for s in shards] == [(5, 8), (5, 8)]
    assert not (multi / "index" / "0" / EMBEDDINGS).exists()
    assert two.manifest["encoding"]["processes"] == 2
    for index in (0, 1):
        log = (multi / ("log.txt" if index == 0 else f"log.{index}.txt")).read_text()
        assert f"process {index} of 2 encoded rows [{5 * index}, {5 * index + 5}) of 10 documents" in log
    assert [(s["file"], s["rows"], s["documents"]) for s in one.manifest["shards"]] == [(EMBEDDINGS, [0, 10], 10)]
    assert (multi / "index" / "0" / "index.Flat.faiss").is_file()  # process 0's faiss index, beside the shards

    # The same parameters encoded the same collection in order, whatever the number of processes.
    assert two.manifest["encoder"]["params_checksum"] == one.manifest["encoder"]["params_checksum"]
    assert two.docids.tolist() == one.docids.tolist() == docids
    assert two.embeddings.shape == one.embeddings.shape == (10, 8)
    np.testing.assert_allclose(np.asarray(two.embeddings), np.asarray(one.embeddings), rtol=1e-5, atol=1e-6)
    # The shards searched as one index (faiss filled shard by shard) rank as the single file does.
    queries = np.asarray(one.embeddings[[0, 4, 5, 9]]) + 0.01
    found = [index.with_faiss_index(IndexConfig(), write=False).search(queries, k=10) for index in (one, two)]
    assert found[0][1].tolist() == found[1][1].tolist()
    np.testing.assert_allclose(found[0][0], found[1][0], rtol=1e-5, atol=1e-6)

    # The evaluation on that index: the same metrics and the same ranking of every dev query.
    first, second = (json.loads((run / "final_metrics.json").read_text()) for run in (single, multi))
    for key in ("eval/MRR@10", "eval/Recall@10", "eval/Recall@100", "eval/nDCG@10", "eval/Brier/full_softmax",
                "eval/num_queries"):
        assert second[key] == pytest.approx(first[key], rel=1e-5, abs=1e-7), key
    lines = [(run / "run.dev.0.trec").read_text().splitlines() for run in (multi, single)]
    assert [line.split()[:4] for line in lines[0]] == [line.split()[:4] for line in lines[1]] and lines[0]
    assert [float(line.split()[4]) for line in lines[0]] == pytest.approx([float(line.split()[4]) for line in lines[1]],
                                                                          rel=1e-5)
