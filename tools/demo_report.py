"""Prints the demo's generative model next to BM25, dense retrieval and GDR on the same dev queries.

python -m gr_jax.tools.demo_report --model_dir runs/wordnet_demo --bm25 runs/wordnet_demo/bm25.json \
    [--dense runs/wordnet_demo/minilm.json] [--gdr runs/wordnet_demo/gdr/final_metrics.json]

Each file is a metrics JSON: a tool's or `gr_jax.eval`'s printed line (its last line is read), or a run's
final_metrics.json. A system's Recall@k exists only where its ranking is k deep: the generative model's 20 beams
give R@20 but no R@100 ("-"; BM25, the dense model and GDR rank 100 deep).
"""
from __future__ import annotations

import argparse
import json
import pathlib

from gr_jax.run_dir import RunDir

COLUMNS = (("MRR@10", "MRR@10"), ("R@1", "Recall@1"), ("R@10", "Recall@10"), ("R@20", "Recall@20"),
           ("R@100", "Recall@100"))


def _value(metrics: dict, key: str) -> str:
    for candidate in (key, f"eval/{key}"):
        if candidate in metrics:
            return f"{metrics[candidate]:.3f}"
    return "-"


def format_table(rows: list[tuple[str, dict]]) -> str:
    header = f"{'system':<38}" + "".join(f"{name:>9}" for name, _ in COLUMNS)
    lines = [header, "-" * len(header)]
    for label, metrics in rows:
        lines.append(f"{label:<38}" + "".join(f"{_value(metrics, key):>9}" for _, key in COLUMNS))
    return "\n".join(lines)


def read_metrics(path) -> dict:
    """The last line of a metrics file as JSON (a printed JSON line, or a whole final_metrics.json)."""
    text = pathlib.Path(path).read_text().strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--bm25", required=True, help="the JSON line printed by gr_jax.tools.bm25")
    parser.add_argument("--dense", default=None, help="a dense run's metrics (gr_jax.eval's line)")
    parser.add_argument("--gdr", default=None, help="a GDR run's metrics (its final_metrics.json)")
    args = parser.parse_args(argv)
    model = read_metrics(RunDir.of(args.model_dir).final_metrics)
    rows = [("BM25 (bm25s, k1 0.82, b 0.68)", read_metrics(args.bm25))]
    if args.dense:
        rows.append(("all-MiniLM-L6-v2 zero-shot (dense)", read_metrics(args.dense)))
    rows.append(("gr_jax tiny T5.1.1, naive ids + trie", model))
    if args.gdr:
        rows.append(("GDR: tiny T5.1.1 clusters + MiniLM", read_metrics(args.gdr)))
    print(format_table(rows))
    print(f"dev queries: {int(model.get('eval/num_queries', 0))}, "
          f"invalid top-1 docids: {model.get('eval/invalid_docid_rate', float('nan')):.3f}")


if __name__ == "__main__":
    main()
