"""Prints the demo's generative model next to BM25 on the same dev queries.

python -m gr_jax.tools.demo_report --model_dir runs/wordnet_demo --bm25 runs/wordnet_demo/bm25.json
"""
from __future__ import annotations

import argparse
import json
import pathlib

COLUMNS = (("MRR@10", "MRR@10"), ("R@1", "Recall@1"), ("R@10", "Recall@10"), ("R@100", "Recall@100"))


def _value(metrics: dict, key: str) -> str:
    for candidate in (key, f"eval/{key}"):
        if candidate in metrics:
            return f"{metrics[candidate]:.3f}"
    return "-"


def format_table(rows: list[tuple[str, dict]]) -> str:
    header = f"{'system':<34}" + "".join(f"{name:>9}" for name, _ in COLUMNS)
    lines = [header, "-" * len(header)]
    for label, metrics in rows:
        lines.append(f"{label:<34}" + "".join(f"{_value(metrics, key):>9}" for _, key in COLUMNS))
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--bm25", required=True, help="the JSON line printed by gr_jax.tools.bm25")
    args = parser.parse_args(argv)
    model = json.loads((pathlib.Path(args.model_dir) / "final_metrics.json").read_text())
    bm25 = json.loads(pathlib.Path(args.bm25).read_text().strip().splitlines()[-1])
    print(format_table([("BM25 (bm25s, k1 0.82, b 0.68)", bm25), ("gr_jax tiny T5.1.1, naive ids + trie", model)]))
    print(f"dev queries: {int(model.get('eval/num_queries', 0))}, "
          f"invalid top-1 docids: {model.get('eval/invalid_docid_rate', float('nan')):.3f}")


if __name__ == "__main__":
    main()
