#!/usr/bin/env bash
# Data for a before/after comparison of a restructuring (docs/architecture.md), made once with the code of $REPO
# (then read by both versions): the tests' retrieval fixture with a vocabulary, semantic ids, a span index, a
# zero-shot MiniLM run and its GDR clusters, and a ranked-list data dir from the WordNet fixture.
set -euo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}; OUT=${OUT:-${TMPDIR:-/tmp}/gr_jax_restructure/data}; PY=$REPO/.venv/bin/python
export JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=8" GR_JAX_LOG_LEVEL=WARNING TF_CPP_MIN_LOG_LEVEL=3
rm -rf $OUT && mkdir -p $OUT && cd $OUT
cp -r $REPO/tests/fixtures/tasks d && mv d/passages.tsv d/collection.tsv && mv d/judgements.train.tsv d/qrels.train.tsv && mv d/judgements.dev.tsv d/qrels.dev.tsv
$PY -m gr_jax.tools.make_vocab --data_dir d --vocab_size 320 > /dev/null
$PY -m gr_jax.tools.semantic_ids --data_dir d --scheme semantic2d > /dev/null
$PY -m gr_jax.tools.semantic_ids --data_dir d --scheme semantic > /dev/null
$PY -m gr_jax.tools.ngram_index --data_dir d --width 4 > /dev/null
$PY -m gr_jax.train --gin_file=dense/minilm.gin --gin.DATA_DIR="'$OUT/d'" --gin.MODEL_DIR="'$OUT/minilm'" --gin.TRAIN_STEPS=0 --gin.training.train.progress=False --gin.DOCUMENT_LENGTH=32 --gin.training.EvalConfig.ranking_depth=5 > /dev/null
$PY -m gr_jax.tools.dense_index --model_dir $OUT/minilm > /dev/null
$PY -m gr_jax.tools.gdr_index build --index_dir $OUT/minilm/index/0 --branching 2,2 --out_dir $OUT/gidx > /dev/null
$PY -m gr_jax.tools.wordnet_hypernyms --wordnet_dir $REPO/tests/fixtures/wordnet --out_dir hyp --root food.n.02 --dev_fraction 0.5 --seed 1 --in_context > /dev/null
$PY -m gr_jax.tools.make_vocab --data_dir hyp --vocab_size 320 > /dev/null
echo prepared
