"""gr_jax.tools.model_stats (the study's Table 4): parameter counts by hand, FLOPs against a count of the matmuls."""
import dataclasses
import math

import jax
import pytest

from gr_jax import network
from gr_jax.heads import AtomicHead, PawaHead
from gr_jax.tools import model_stats

INPUT_LENGTH, BEAMS = 16, 4


@pytest.fixture(scope="module")
def tiny_records():
    return {record["row"]: record for record in model_stats.main(["--tiny", "--json"])}


def _pawa_layers(cfg: network.T5Config, head) -> int:
    return head.depth(cfg) if isinstance(head, PawaHead) else 0


def _hand_params(cfg: network.T5Config, head) -> int:
    d, h, k, m, v = cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.vocab_size
    attention, mlp = 4 * d * h * k, 3 * d * m
    decoder_layer = 2 * attention + mlp + 3 * d
    trunk = (v * d + cfg.num_encoder_layers * (attention + mlp + 2 * d) + d
             + cfg.num_decoder_layers * decoder_layer + d + 2 * h * cfg.relative_attention_num_buckets)
    if isinstance(head, AtomicHead):
        return trunk + d * 128 * -(-head.docid_vocab_size // 128)  # one column per docid, padded to 128
    output = d * v
    if isinstance(head, PawaHead):
        output += _pawa_layers(cfg, head) * decoder_layer + d + h * cfg.relative_attention_num_buckets + d ** 3
    return trunk + output


def _matmul_flops_per_step(cfg: network.T5Config, head, *, rows: int, max_len: int, src_len: int) -> int:
    """2 x the multiply-adds of one decoder step (projections, attention against the cache and the encoder, MLP,
    output layer; PAWA: its stack, the generated M_t and h_t M_t)."""
    d, h, k, m = cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim
    layer = 4 * d * h * k + 2 * h * k * max_len + 2 * d * h * k + 2 * h * k * src_len + 3 * d * m
    columns = head.columns() if isinstance(head, AtomicHead) else head.logits_vocab_size(cfg)
    macs = (cfg.num_decoder_layers + _pawa_layers(cfg, head)) * layer + d * columns
    if isinstance(head, PawaHead):
        macs += d ** 3 + d * d
    return 2 * rows * macs


def _matmul_flops_prefill(cfg: network.T5Config, head, *, src_len: int) -> int:
    d, h, k, m = cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim
    encoder = cfg.num_encoder_layers * src_len * (4 * d * h * k + 2 * h * k * src_len + 3 * d * m)
    cross_kv = (cfg.num_decoder_layers + _pawa_layers(cfg, head)) * src_len * 2 * d * h * k
    return 2 * (encoder + cross_kv)


def test_tiny_rows_param_counts_equal_a_hand_count(tiny_records):
    rows = {row.key: row for row in model_stats.tiny_rows()}
    assert set(tiny_records) == set(rows) == {"tiny_atomic", "tiny_naive", "tiny_pawa"}
    for key, row in rows.items():
        assert tiny_records[key]["params"] == _hand_params(row.config, row.head) == model_stats.param_count(
            row.config, row.head), key


def test_tiny_rows_flops_agree_with_the_matmul_count(tiny_records):
    """XLA counts the matmuls (2 per multiply-add) plus a little elementwise work; the loop is counted per step."""
    for row in model_stats.tiny_rows():
        record, cfg, head = tiny_records[row.key], row.config, row.head
        assert record["input_length"] == INPUT_LENGTH and record["num_beams"] == BEAMS
        if isinstance(head, AtomicHead):
            expected = (_matmul_flops_prefill(dataclasses.replace(cfg, num_decoder_layers=0), head,
                                              src_len=INPUT_LENGTH)
                        + _matmul_flops_per_step(cfg, head, rows=1, max_len=1, src_len=INPUT_LENGTH)
                        + 2 * cfg.num_decoder_layers * INPUT_LENGTH * 2 * cfg.emb_dim * cfg.num_heads * cfg.head_dim)
            assert 1.0 <= record["flops"] / expected < 1.25, (row.key, record["flops"], expected)
            assert record["uncached_flops"] == BEAMS * record["flops"]
            continue
        steps = row.decode_steps
        step = _matmul_flops_per_step(cfg, head, rows=BEAMS, max_len=steps, src_len=INPUT_LENGTH)
        prefill = _matmul_flops_prefill(cfg, head, src_len=INPUT_LENGTH)
        assert 1.0 <= record["step_flops"] / step < 1.25, (row.key, record["step_flops"], step)
        assert 1.0 <= record["prefill_flops"] / prefill < 1.25, (row.key, record["prefill_flops"], prefill)
        # The while loop's body is counted once by XLA; the total adds the other steps: prefill + steps x step,
        # plus the search's own bookkeeping (top-k, reordering: little arithmetic).
        at_least = record["prefill_flops"] + steps * record["step_flops"]
        assert 1.0 <= record["flops"] / at_least < 1.1, (row.key, record["flops"], at_least)
        assert record["uncached_flops"] == pytest.approx(
            BEAMS * record["prefill_flops"] + steps * (steps + 1) / 2 * record["step_flops"])
    # PAWA's generated projections make its steps dearer than the standard head's.
    assert tiny_records["tiny_pawa"]["step_flops"] > 2 * tiny_records["tiny_naive"]["step_flops"]


def test_table_explains_differences_with_the_study():
    rows = model_stats.study_rows(naive_length=8, semantic2d_length=8)
    assert [row.key for row in rows] == ["base_atomic", "base_naive", "base_pawa", "large_naive", "large_pawa",
                                         "xl_naive", "xxl_naive"]
    base = next(row for row in rows if row.key == "base_naive").config
    assert (base.emb_dim, base.num_encoder_layers, base.mlp_dim, base.vocab_size) == (768, 12, 2048, 32128)
    # Parameter counts need no compilation: check the study's sizes and that the >5% one is explained.
    counts = {row.key: model_stats.param_count(row.config, row.head) for row in rows}
    assert counts["base_naive"] == 247_577_856  # T5.1.1-Base
    # What `experiment.build_model` makes of each row's size gin and the docid space of its MS MARCO task (token ids
    # [0, model_vocab_size), docid tokens) has the row's count. The atomic head embeds only the text's 32,128 ids: an
    # input embedding over its 8.8M docid tokens would give 13.8B parameters, not 7.0B. (Built with scanned layers:
    # the same parameters, traced in a fraction of the time.)
    from gr_jax import experiment
    for row in rows:
        docid_tokens = row.head.docid_vocab_size if isinstance(row.head, (AtomicHead, PawaHead)) else 0
        size = {768: "base", 1024: "large", 2048: "xl", 4096: "xxl"}[row.config.emb_dim]
        config = dataclasses.replace(model_stats.size_config(size), dropout_rate=0.0, scan_layers=True)
        model = experiment.build_model(
            config=config, head=type(row.head)(), model_vocab_size=model_stats.T5_SPM_SIZE + docid_tokens,
            docid_token_range=((model_stats.T5_SPM_SIZE, model_stats.T5_SPM_SIZE + docid_tokens) if docid_tokens
                               else None))
        built = sum(math.prod(leaf.shape)
                    for leaf in jax.tree.leaves(model_stats.abstract_params(model.config, model.head)))
        assert built == counts[row.key], row.key
    assert counts["base_atomic"] == pytest.approx(7.0e9, rel=0.01)  # 6.8B of them: 8.8M docids x 768
    fake = [(row, model_stats.Stats(params=counts[row.key], flops=row.study_flops / 10,
                                    encoder_flops=1.0, step_flops=1.0, uncached_flops=row.study_flops / 2))
            for row in rows]
    table = model_stats.format_table(fake, input_length=64, num_beams=40)
    for row in rows:
        assert row.label in table
        if abs(counts[row.key] / row.study_params - 1) > 0.05:
            assert f"* {row.label}: params:" in table, row.key
    assert "+12.5%" in table and "T5 1.0-Base" in table
    assert "FLOPs: the study's numbers are 10.0x to 10.0x ours" in table and "within 50%" in table
    assert table.count("FLOPs (T5-") == 2  # the two PAWA rows' remaining gap
    exact = [(row, dataclasses.replace(stats, uncached_flops=row.study_flops)) for row, stats in fake]
    assert "FLOPs (T5-" not in model_stats.format_table(exact, input_length=64, num_beams=40)


def test_unknown_rows_are_refused(capsys):
    with pytest.raises(SystemExit):
        model_stats.main(["--tiny", "--rows", "tiny_nothing"])
    assert "unknown row(s) ['tiny_nothing']" in capsys.readouterr().err


def test_atomic_model_embeds_only_the_text_vocabulary():
    from gr_jax import experiment
    config = dataclasses.replace(model_stats.tiny_rows()[1].config, vocab_size=None)
    model = experiment.build_model(config=config, head=AtomicHead(), model_vocab_size=300 + 1000,
                                   docid_token_range=(300, 1300))
    assert model.config.vocab_size == 384  # 300 text ids rounded up to 128, not 1,300
    assert model.logits_vocab_size == 1300
    fixed = dataclasses.replace(config, vocab_size=256)
    with pytest.raises(ValueError, match="smaller than the 300 token ids"):
        experiment.build_model(config=fixed, head=AtomicHead(), model_vocab_size=1300, docid_token_range=(300, 1300))
    naive = config  # the standard head
    assert experiment.build_model(config=naive, model_vocab_size=1300).config.vocab_size == 1408
