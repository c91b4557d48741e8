"""Prints `make demo`'s report: BM25, dense retrieval, the generative model and GDR on the same dev queries, one
table row each, then what each row is in one line.

python -m gr_jax.tools.demo_report --bm25 runs/wordnet_demo/bm25.json --dense runs/wordnet_demo/minilm.json \
    --generative runs/wordnet_demo/gr [--gdr runs/wordnet_demo/gdr] [--steps 250] [--gdr_steps 150]

Each system is a metrics file (a tool's or `gr_jax.eval`'s printed JSON line, whose last line is read) or a run dir
(its final_metrics.json). A system's Recall@k exists only where its ranking is k deep ("-" otherwise).
"""
from __future__ import annotations

import argparse
import json
import pathlib
from typing import Optional

from gr_jax.run_dir import RunDir

COLUMNS = (("MRR@10", "MRR@10"), ("R@1", "Recall@1"), ("R@10", "Recall@10"), ("R@20", "Recall@20"),
           ("R@100", "Recall@100"))
LABEL_WIDTH = 34


def _value(metrics: dict, key: str) -> str:
    for candidate in (key, f"eval/{key}"):
        if candidate in metrics:
            return f"{metrics[candidate]:.3f}"
    return "-"


def format_table(rows: list[tuple[str, dict]]) -> str:
    header = f"{'system':<{LABEL_WIDTH}}" + "".join(f"{name:>9}" for name, _ in COLUMNS)
    lines = [header, "-" * len(header)]
    for label, metrics in rows:
        lines.append(f"{label:<{LABEL_WIDTH}}" + "".join(f"{_value(metrics, key):>9}" for _, key in COLUMNS))
    return "\n".join(lines)


def read_metrics(path) -> dict:
    """A run dir's final_metrics.json, or the last line of a metrics file as JSON (a printed JSON line, or a whole
    final_metrics.json)."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = RunDir.of(path).final_metrics
    text = path.read_text().strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.splitlines()[-1])


def report(*, bm25: dict, dense: dict, generative: dict, gdr: Optional[dict], steps: Optional[int],
           gdr_steps: Optional[int]) -> str:
    trained = f"trained {steps} steps" if steps is not None else "trained"
    rows = [("BM25", bm25, "lexical baseline: bm25s (k1 0.82, b 0.68) over the documents' words"),
            ("dense: MiniLM zero-shot", dense,
             "all-MiniLM-L6-v2 as shipped: cosine of the definition's vector and each document's, no training"),
            ("generative: MiniLM + tiny T5", generative,
             f"frozen MiniLM encoder, tiny T5.1.1 decoder ({trained} from scratch, each definition's target "
             "its document and, at lower weights, MiniLM's next-ranked ones): one decoding step over docids "
             "whose output columns are the documents' MiniLM vectors")]
    if gdr is not None:
        gdr_trained = f"trained {gdr_steps} steps" if gdr_steps is not None else "trained"
        rows.append(("GDR: MiniLM + cluster decoder", gdr,
                     f"frozen MiniLM, tiny T5.1.1 ({gdr_trained}) decoding clusters of the documents' MiniLM "
                     "vectors; the recalled clusters' documents ranked by the query's vector"))
    queries = int(generative.get("eval/num_queries", 0))
    lines = [f"dev: {queries} held-out definitions, each of one document", format_table(
        [(label, metrics) for label, metrics, _ in rows]), "", "What each row is:"]
    lines += [f"  {label:<{LABEL_WIDTH - 2}}{description}" for label, _, description in rows]
    return "\n".join(lines)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bm25", required=True, help="the JSON line printed by gr_jax.tools.bm25")
    parser.add_argument("--dense", required=True, help="the dense run's metrics (gr_jax.eval's line)")
    parser.add_argument("--generative", required=True, help="the generative run's dir or final_metrics.json")
    parser.add_argument("--gdr", default=None, help="the GDR run's dir or final_metrics.json")
    parser.add_argument("--steps", type=int, default=None, help="the generative run's training steps")
    parser.add_argument("--gdr_steps", type=int, default=None, help="the GDR run's training steps")
    args = parser.parse_args(argv)
    text = report(bm25=read_metrics(args.bm25), dense=read_metrics(args.dense),
                  generative=read_metrics(args.generative), gdr=read_metrics(args.gdr) if args.gdr else None,
                  steps=args.steps, gdr_steps=args.gdr_steps)
    print(text)
    return text


if __name__ == "__main__":
    main()
