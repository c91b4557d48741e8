"""docs/quality.md: a lexical view of the documents for GDR's given first cluster level, on sets without WordNet's
lexicographer files (noun.food c93, msmarco_mini). scikit-learn's TF-IDF of each document's text (unigrams and
bigrams, English stop words out, sublinear tf), reduced by truncated SVD to 256 dimensions and normalised (latent
semantic analysis), then k-means into K groups: which documents share words, where the dense vectors say which
share meaning. Writes `docid \\t group` in the collection's order (`gdr_index build --cluster_groups`,
`category_classifier.py`) and prints one JSON line: documents, groups, the largest and median group, the
vocabulary's size.

    .venv/bin/python tools/quality/lexical_groups.py DATA_DIR K OUT_TSV
"""
import collections
import json
import sys

import numpy as np
from sklearn.cluster import KMeans
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.preprocessing import normalize

from gr_jax.data.readers import read_collection, write_tsv

DIMENSIONS = 256


def main(data_dir: str, k: str, out: str) -> dict:
    docids, texts = zip(*read_collection(f"{data_dir}/collection.tsv"))
    tfidf = TfidfVectorizer(ngram_range=(1, 2), stop_words="english", sublinear_tf=True, min_df=2)
    x = tfidf.fit_transform(texts)
    vectors = normalize(TruncatedSVD(n_components=DIMENSIONS, random_state=0).fit_transform(x))
    labels = KMeans(n_clusters=int(k), n_init=4, random_state=0).fit_predict(vectors)
    write_tsv(out, [(docid, f"lexical{label}") for docid, label in zip(docids, labels)])
    sizes = collections.Counter(labels.tolist())
    return {"documents": len(docids), "groups": len(sizes), "largest": max(sizes.values()),
            "median": int(np.median(list(sizes.values()))), "vocabulary": len(tfidf.vocabulary_)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
