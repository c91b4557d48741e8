"""docs/quality.md: how much a grouping of the documents could give GDR's first cluster level at most. Restricts a
retriever's ranking (a TREC run) to the documents in the gold documents' groups, as if the first level were always
predicted right, and prints MRR@10 before and after as JSON. A grouping whose oracle lifts little cannot help;
one whose oracle lifts much helps only as far as queries predict it (`category_classifier.py`).

    .venv/bin/python tools/quality/group_oracle.py DATA_DIR RUN_TREC GROUPS_TSV SPLIT
"""
import json
import sys

from gr_jax.data.readers import DataFormatError, open_dataset, read_document_labels
from gr_jax.evaluation import read_trec_run, retrieval_metrics


def main(data_dir: str, run_file: str, groups_tsv: str, split: str) -> dict:
    qrels = open_dataset(data_dir).qrels(split)
    label = dict(read_document_labels(groups_tsv))
    run = {qid: [docid for docid, _ in ranked] for qid, ranked in read_trec_run(run_file).items()}
    unlabeled = {docid for docids in run.values() for docid in docids} - label.keys()
    if unlabeled:
        raise DataFormatError(f"{groups_tsv}: no group for {len(unlabeled)} documents of {run_file}, e.g. "
                              f"{sorted(unlabeled)[0]!r}")
    oracle = {}
    for qid, docids in run.items():
        gold = {label[docid] for docid, grade in qrels[qid].items() if grade > 0}
        oracle[qid] = [docid for docid in docids if label[docid] in gold]
    return {"split": split, "queries": len(run), "groups": len(set(label.values())),
            "MRR@10": round(float(retrieval_metrics(run=run, qrels=qrels, ks=(10,))["MRR@10"]), 4),
            "oracle MRR@10": round(float(retrieval_metrics(run=oracle, qrels=qrels, ks=(10,))["MRR@10"]), 4)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
