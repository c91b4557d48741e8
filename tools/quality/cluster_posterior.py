"""docs/quality.md: what a cluster term copied from the dense space adds to the dense ranking. For each query of a
split, S = q . d / tau over every document of a GDR clustered index (zero-shot all-MiniLM-L6-v2 query vectors), and
the teacher's own cluster posterior log p(c | q) = log softmax_c (logsumexp of S over cluster c); prints MRR@10 of
S + lambda log p(cluster(d) | q) for each lambda (lambda 0: the dense ranking; `gr_jax.evaluation.retrieval_metrics`
over every qrels query), as JSON.

    .venv/bin/python tools/quality/cluster_posterior.py DATA_DIR GDR_INDEX_DIR SPLIT
"""
import json
import sys

import numpy as np

from gr_jax.data.readers import open_dataset
from gr_jax.encoders.minilm import load_minilm
from gr_jax.evaluation import retrieval_metrics
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
    encode = load_minilm()
    runs: dict[float, dict[str, list[str]]] = {lam: {} for lam in LAMBDAS}
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
            for (qid, _), rows in zip(queries[start:start + 512], top10):
                runs[lam][qid] = index.docid_strings(rows)
    return {"split": split, "queries": len(queries), "tau": TAU,
            "MRR@10": {str(lam): round(float(retrieval_metrics(run=run, qrels=qrels, ks=(10,))["MRR@10"]), 4)
                       for lam, run in runs.items()}}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
