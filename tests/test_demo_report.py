"""The demo's table: one row per system, read from each tool's printed JSON line or a run's final_metrics.json."""
import json

from gr_jax.tools import demo_report


def test_the_table_has_bm25_dense_generative_and_gdr_rows_with_their_metrics(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "final_metrics.json").write_text(json.dumps(
        {"eval/MRR@10": 0.0123, "eval/Recall@1": 0.0, "eval/Recall@10": 0.05, "eval/Recall@20": 0.2,
         "eval/num_queries": 532, "eval/invalid_docid_rate": 0.0}, indent=1))  # 20 beams: no Recall@100
    (tmp_path / "bm25.json").write_text('{"progress": 1}\n{"MRR@10": 0.328, "Recall@1": 0.246, "Recall@10": 0.496}\n')
    (tmp_path / "dense.json").write_text(
        '{"MRR@10": 0.403, "Recall@1": 0.327, "Recall@10": 0.59, "Recall@20": 0.7, "Recall@100": 0.87}\n')
    (tmp_path / "gdr.json").write_text(json.dumps({"eval/MRR@10": 0.41, "eval/Recall@100": 0.9}, indent=1))
    demo_report.main(["--model_dir", str(tmp_path / "run"), "--bm25", str(tmp_path / "bm25.json"),
                      "--dense", str(tmp_path / "dense.json"), "--gdr", str(tmp_path / "gdr.json")])
    lines = capsys.readouterr().out.splitlines()
    rows = {line[:38].strip(): line[38:].split() for line in lines[2:6]}
    assert list(rows) == ["BM25 (bm25s, k1 0.82, b 0.68)", "all-MiniLM-L6-v2 zero-shot (dense)",
                          "gr_jax tiny T5.1.1, naive ids + trie", "GDR: tiny T5.1.1 clusters + MiniLM"]
    assert lines[0].split() == ["system", "MRR@10", "R@1", "R@10", "R@20", "R@100"]
    assert rows["BM25 (bm25s, k1 0.82, b 0.68)"] == ["0.328", "0.246", "0.496", "-", "-"]
    assert rows["all-MiniLM-L6-v2 zero-shot (dense)"] == ["0.403", "0.327", "0.590", "0.700", "0.870"]
    assert rows["gr_jax tiny T5.1.1, naive ids + trie"] == ["0.012", "0.000", "0.050", "0.200", "-"]
    assert rows["GDR: tiny T5.1.1 clusters + MiniLM"] == ["0.410", "-", "-", "-", "0.900"]
    assert lines[6] == "dev queries: 532, invalid top-1 docids: 0.000"
