"""The preprocessed-input benchmark on the fixture's row 2a: its figures are those of the reader it drives, and the
host's need follows from the FLOP count, which is checked by hand on T5.1.1-XXL."""
import json

import pytest

from conftest import preprocess_examples
from gr_jax.tools.bench import input_records


def test_the_flop_count_of_an_xxl_example_by_hand():
    xxl = {"emb_dim": 4096, "num_heads": 64, "head_dim": 64, "mlp_dim": 10240, "num_encoder_layers": 24,
           "num_decoder_layers": 24, "vocab_size": 32128}
    # encoder: 24 x (4 x 4096^2 + 3 x 4096 x 10240) per input token; decoder: 24 x (8 x 4096^2 + 3 x 4096 x 10240)
    # + 4096 x 32128 per target token; scores: 2 x 4096 x (24 x 64^2 + 24 x (8^2 + 8 x 64)).
    encoder = 24 * (4 * 4096 ** 2 + 3 * 4096 * 10240) * 64
    decoder = (24 * (8 * 4096 ** 2 + 3 * 4096 * 10240) + 4096 * 32128) * 8
    scores = 2 * 4096 * (24 * 64 ** 2 + 24 * (8 ** 2 + 8 * 64))
    flops = input_records.train_flops_per_example(**xxl, input_length=64, target_length=8)
    assert flops == 6 * (encoder + decoder) + 3 * scores
    assert 2.0e12 < flops < 2.2e12  # ~6 x 11B parameters x 32 tokens on average


def test_the_bench_reads_a_hosts_rows_and_resumes_anywhere(spm_data_dir, tmp_path):
    out = tmp_path / "records"
    preprocess_examples(["--gin_file=runs/train.gin", "--gin_file=models/t5_1_1/tiny.gin",
                         "--gin_file=data/preprocessed.gin", f"--gin.DATA_DIR='{spm_data_dir}'",
                         "--gin.MODEL_DIR='unused'", "--gin.DATASET_NAME='bench_records'", "--gin.TRAIN_STEPS=1",
                         f"--gin.PREPROCESSED_DIR='{out}'", "--gin.INPUT_LENGTH=16", "--gin.TARGET_LENGTH=12"])
    model = {"emb_dim": 64, "num_heads": 2, "head_dim": 32, "mlp_dim": 128, "num_encoder_layers": 1,
             "num_decoder_layers": 1, "vocab_size": 384}
    line = input_records.run(directory=str(out), batch=16, hosts=4, seconds=0.2, near=3, far=10**6, repeats=1,
                             model=model)
    assert json.loads(json.dumps(line)) == line
    assert (line["examples"], line["host_rows"]) == (19, 4) and line["batches_read"] >= 1
    assert line["examples_per_second"] == pytest.approx(4 * line["batches_read"] / 0.2, rel=0.5)
    assert line["resume_far_over_near"] == pytest.approx(line["resume_far_s"] / line["resume_near_s"], rel=1e-2)
    assert line["input_state_bytes"] < 1024
    need = 4 * 275e12 / input_records.train_flops_per_example(**model, input_length=16, target_length=12)
    assert line["host_need_examples_per_second"] == pytest.approx(need, rel=1e-3)
    assert line["headroom"] == pytest.approx(line["examples_per_second"] / need, rel=1e-2, abs=0.005)  # 2 decimals
    with pytest.raises(SystemExit, match="multiple of --hosts"):
        input_records.run(directory=str(out), batch=10, hosts=4, seconds=0.1, near=1, far=2, repeats=1, model=model)
