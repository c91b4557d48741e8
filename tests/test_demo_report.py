"""The demo's report: one row per system, read from each tool's printed JSON line or a run's final_metrics.json,
and one line saying what each row is."""
import json

from gr_jax.tools import demo_report


def test_the_report_has_bm25_dense_generative_and_gdr_rows_with_their_metrics_and_descriptions(tmp_path, capsys):
    (tmp_path / "gr").mkdir()
    (tmp_path / "gr" / "final_metrics.json").write_text(json.dumps(
        {"eval/MRR@10": 0.3456, "eval/Recall@1": 0.25, "eval/Recall@10": 0.55, "eval/Recall@20": 0.66,
         "eval/Recall@100": 0.861, "eval/num_queries": 532}, indent=1))
    (tmp_path / "bm25.json").write_text('{"progress": 1}\n{"MRR@10": 0.328, "Recall@1": 0.246, "Recall@10": 0.496}\n')
    (tmp_path / "dense.json").write_text(
        '{"MRR@10": 0.403, "Recall@1": 0.327, "Recall@10": 0.59, "Recall@20": 0.7, "Recall@100": 0.87}\n')
    (tmp_path / "gdr.json").write_text(json.dumps({"eval/MRR@10": 0.41, "eval/Recall@100": 0.9}, indent=1))
    demo_report.main(["--bm25", str(tmp_path / "bm25.json"), "--dense", str(tmp_path / "dense.json"),
                      "--generative", str(tmp_path / "gr"), "--gdr", str(tmp_path / "gdr.json"), "--steps", "300",
                      "--gdr_steps", "150"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "dev: 532 held-out definitions, each of one document"
    assert lines[1].split() == ["system", "MRR@10", "R@1", "R@10", "R@20", "R@100"]
    width = demo_report.LABEL_WIDTH
    rows = {line[:width].strip(): line[width:].split() for line in lines[3:7]}
    assert rows == {"BM25": ["0.328", "0.246", "0.496", "-", "-"],
                    "dense: MiniLM zero-shot": ["0.403", "0.327", "0.590", "0.700", "0.870"],
                    "generative: MiniLM + tiny T5": ["0.346", "0.250", "0.550", "0.660", "0.861"],
                    "GDR: MiniLM + cluster decoder": ["0.410", "-", "-", "-", "0.900"]}
    assert lines[8] == "What each row is:"
    described = {line[2:width].strip(): line[width:] for line in lines[9:13]}
    assert list(described) == list(rows)
    assert "trained 300 steps" in described["generative: MiniLM + tiny T5"]
    assert "trained 150 steps" in described["GDR: MiniLM + cluster decoder"]
