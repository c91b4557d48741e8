"""docs/quality.md: the non-generative control of GDR with clusters under WordNet's lexicographer files. A
multinomial logistic regression (scikit-learn) predicts a query's lexicographer file from its zero-shot MiniLM
vector, trained on the training definitions; every document d is then scored S / tau + lambda log p(file(d) | q)
over the whole corpus. Prints valid MRR@10 / R@100 for each lambda as JSON: what the labels give without a
generative stage (GDR's decoder predicts the file and a k-means cell below it, and ranks only the clusters it
recalls).

    .venv/bin/python tools/quality/category_classifier.py DATA_DIR GDR_INDEX_DIR GROUPS_TSV SPLIT
"""
import json
import sys

import numpy as np
from sklearn.linear_model import LogisticRegression

from gr_jax.data.readers import open_dataset, read_document_labels
from gr_jax.encoders.minilm import load_minilm
from gr_jax.evaluation import retrieval_metrics
from gr_jax.gdr.index import ClusteredIndex

TAU = 0.05
LAMBDAS = (0.0, 0.1, 0.25, 0.5, 1.0)


def main(data_dir: str, index_dir: str, groups_tsv: str, split: str) -> dict:
    dataset = open_dataset(data_dir)
    index = ClusteredIndex.load(index_dir)
    documents = index.vectors(np.arange(len(index)))
    label_of = dict(read_document_labels(groups_tsv))
    names = sorted(set(label_of.values()))
    document_label = np.asarray([names.index(label_of[d]) for d in index.docid_strings(np.arange(len(index)))])
    encode = load_minilm()
    train = list(dataset.queries("train"))
    train_qrels = dataset.qrels("train")
    x = np.concatenate([encode([t for _, t in train[i:i + 1024]]) for i in range(0, len(train), 1024)])
    y = [names.index(label_of[next(d for d, g in train_qrels[qid].items() if g > 0)]) for qid, _ in train]
    classifier = LogisticRegression(max_iter=300).fit(x, y)
    queries = list(dataset.queries(split))
    qrels = dataset.qrels(split)
    runs: dict[float, dict[str, list[str]]] = {lam: {} for lam in LAMBDAS}
    for start in range(0, len(queries), 512):
        vectors = encode([text for _, text in queries[start:start + 512]])
        scores = vectors @ documents.T / TAU
        log_p = np.full((len(vectors), len(names)), -np.inf)
        log_p[:, classifier.classes_] = classifier.predict_log_proba(vectors)
        for lam in LAMBDAS:
            top = np.argsort(-(scores + lam * log_p[:, document_label]), axis=1)[:, :100]
            for (qid, _), rows in zip(queries[start:start + 512], top):
                runs[lam][qid] = index.docid_strings(rows)
    metrics = {lam: retrieval_metrics(run=run, qrels=qrels, ks=(10, 100)) for lam, run in runs.items()}
    return {"split": split, "queries": len(queries), "tau": TAU,
            "train_accuracy": round(float(classifier.score(x, y)), 4),
            "MRR@10": {str(lam): round(float(m["MRR@10"]), 4) for lam, m in metrics.items()},
            "Recall@100": {str(lam): round(float(m["Recall@100"]), 4) for lam, m in metrics.items()}}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
