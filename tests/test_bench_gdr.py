"""The GDR latency benchmark times rankings: each system returns k documents per query (DR's checked against brute
force inside the benchmark), and its ratios are its own medians'."""
import dataclasses

import pytest

from gr_jax.tools.bench import gdr


def test_gdr_bench_times_three_rankings_of_k_documents_and_reports_their_ratios(monkeypatch):
    # tiny's dimensions with one layer a stack: the three systems still compile, rank and are timed as at tiny's
    # depth (what is checked is the report, not the figures), in a third of the compile time of its 4 + 4 layers.
    tiny = gdr.model_config
    monkeypatch.setattr(gdr, "model_config", lambda name, **kwargs: dataclasses.replace(
        tiny(name, **kwargs), num_encoder_layers=1, num_decoder_layers=1))
    line = gdr.run(num_documents=3000, dim=16, branching=(4, 4), model="tiny", batch=2, k=5, beams=3, repeats=1,
                   query_length=8, vocab=None, seed=0)
    assert line["clusters"] == 16 and line["mean_cluster_size"] == pytest.approx(3000 / 16)
    assert line["gdr_over_gr"] == pytest.approx(line["gdr_ms_per_query"] / line["gr_ms_per_query"], rel=1e-2)
    assert line["gdr_over_dr"] == pytest.approx(line["gdr_ms_per_query"] / line["dr_ms_per_query"], rel=1e-2)
    assert line["gr_beams"] == 5 and line["gdr_beams"] == 3
