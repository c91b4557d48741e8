#!/usr/bin/env bash
# docs/quality.md, "All 82,115 noun synsets": BM25, zero-shot all-MiniLM-L6-v2 and the pure generative model of
# `make demo` (frozen MiniLM encoder, tiny T5.1.1 decoder from scratch, atomic docids whose columns are the
# documents' zero-shot MiniLM vectors) on WordNet's whole noun hierarchy at the study's coverage 0.93, to see how
# the gap of noun.food c93 (2,573 documents) moves with corpus size. The generative model trains STEPS (1,000)
# steps of batch 32 under an hour's budget, valid MRR@10 every 250 steps keeps the best state, which ranks dev once.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=${DATA:-data/wordnet_nouns_c93}
OUT=${OUT:-runs/quality/nouns}
STEPS=${STEPS:-1000}
mkdir -p "$OUT"
[ -f $D/spm.model ] || {
  $PY -m gr_jax.tools.wordnet --lexfiles all --coverage 0.93 --out_dir $D > $OUT/wordnet.json
  $PY -m gr_jax.tools.make_vocab --data_dir $D --vocab_size 8000 > $OUT/vocab.json; }
for split in valid dev; do
  [ -f $OUT/bm25.$split.trec ] || $PY -m gr_jax.tools.bm25 --data_dir $D --split $split \
    --run_file $OUT/bm25.$split.trec > $OUT/bm25.$split.json
done
[ -d $OUT/minilm_zs ] || $PY -m gr_jax.train --gin_file=dense/minilm.gin --gin.DATA_DIR="'$D'" \
  --gin.MODEL_DIR="'$OUT/minilm_zs'" --gin.TRAIN_STEPS=0 --gin.DOCUMENT_LENGTH=64 \
  --gin.training.EvalConfig.every_steps=-1 > $OUT/minilm_zs.train.json 2> $OUT/minilm_zs.train.log
for split in valid dev; do
  [ -f $OUT/minilm_zs.$split.json ] || $PY -m gr_jax.eval --gin_file=$OUT/minilm_zs/config.gin \
    --gin.EVAL_SPLIT="'$split'" --gin.training.EvalConfig.num_beams=100 > $OUT/minilm_zs.$split.json 2> $OUT/minilm_zs.$split.log
done
[ -f $OUT/minilm_zs.document_vectors.npy ] || $PY -m gr_jax.tools.document_vectors --data_dir $D \
  --index_dir $OUT/minilm_zs/index/0 --out $OUT/minilm_zs.document_vectors.npy
timeout 3600 $PY -m gr_jax.train --gin_file=experiments/wordnet_document_vectors.gin --gin_file=runs/select.gin \
  --gin.DATA_DIR="'$D'" --gin.DATASET_NAME="'$(basename $D)'" \
  --gin.DOCUMENT_VECTORS="'$OUT/minilm_zs.document_vectors.npy'" --gin.MODEL_DIR="'$OUT/gr_document_vectors'" \
  --gin.TRAIN_STEPS=$STEPS --gin.EVAL_EVERY=250 --gin.PATIENCE=None --gin.training.train.progress=False \
  > $OUT/gr_document_vectors.train.json 2> $OUT/gr_document_vectors.train.log || echo "training ended with $?"
