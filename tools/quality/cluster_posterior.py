"""docs/quality.md: what a cluster term copied from the dense space adds to the dense ranking. For each query of a
split, S = q . d / tau over every document of a GDR clustered index (zero-shot all-MiniLM-L6-v2 query vectors), and
the teacher's own cluster posterior log p(c | q) = log softmax_c (logsumexp of S over cluster c); prints MRR@10 of
S + lambda log p(cluster(d) | q) for each lambda (lambda 0: the dense ranking), as JSON.

    .venv/bin/python tools/quality/cluster_posterior.py DATA_DIR GDR_INDEX_DIR SPLIT
"""
import json
import sys

import numpy as np

from gr_jax.data.readers import open_dataset
from gr_jax.encoders.minilm import load_minilm
from gr_jax.gdr.index import ClusteredIndex

TAU = 0.05
LAMBDAS = (0.0, 0.05, 0.1, 0.25, 0.5)


def main(data_dir: str, index_dir: str, split: str) -> dict:
    dataset = open_dataset(data_dir)
    index = ClusteredIndex.load(index_dir)
    documents = index.vectors(np.arange(len(index)))
    assignment = np.asarray(index.clusters.assignment)
    queries = list(dataset.queries(split))
    qrels = dataset.qrels(split)
    gold = index.rows_of([next(d for d, grade in qrels[qid].items() if grade > 0) for qid, _ in queries])
    encode = load_minilm()
    reciprocal_ranks: dict[float, list[np.ndarray]] = {lam: [] for lam in LAMBDAS}
    for start in range(0, len(queries), 512):
        scores = encode([text for _, text in queries[start:start + 512]]) @ documents.T / TAU
        per_cluster = np.full((len(scores), index.clusters.num_clusters), -np.inf)
        for cluster in np.unique(assignment):
            members = scores[:, assignment == cluster]
            top = members.max(1)
            per_cluster[:, cluster] = top + np.log(np.exp(members - top[:, None]).sum(1))
        log_p = per_cluster - np.logaddexp.reduce(per_cluster, axis=1, keepdims=True)
        for lam in LAMBDAS:
            top10 = np.argsort(-(scores + lam * log_p[:, assignment]), axis=1)[:, :10]
            hit = top10 == gold[start:start + 512, None]
            reciprocal_ranks[lam].append(np.where(hit.any(1), 1 / (1 + hit.argmax(1)), 0.0))
    return {"split": split, "queries": len(queries), "tau": TAU,
            "MRR@10": {str(lam): round(float(np.concatenate(rr).mean()), 4) for lam, rr in reciprocal_ranks.items()}}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
