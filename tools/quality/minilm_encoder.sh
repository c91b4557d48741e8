#!/usr/bin/env bash
# docs/quality.md, first measurement: a pure generative model whose encoder is all-MiniLM-L6-v2 (encoders/minilm.gin)
# and whose decoder is a tiny T5.1.1 from scratch, row 2a (FirstP indexing + labeled definitions), semantic ids from
# zero-shot MiniLM, on WordNet noun.food at coverage 0.93 (data/wordnet_food_c93: 532 dev definitions of documents
# without a training query, 125 valid ones for selection). Budget: 1 CPU hour of training on the 2-core host
# (TRAIN_STEPS is the cap; the run keeps the best state on valid and stops after PATIENCE evaluations without gain).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
DATA=data/wordnet_food_c93
OUT=${OUT:-runs/quality}
STEPS=${STEPS:-2500}
mkdir -p "$OUT"
[ -f $DATA/collection.tsv ] || {
  $PY -m gr_jax.tools.wordnet --out_dir $DATA --lexfiles noun.food --coverage 0.93
  cp data/wordnet_food/spm.model $DATA/; }      # the demo's 2,000-piece vocabulary (make demo builds it)
[ -f $DATA/docids.semantic.tsv ] || $PY -m gr_jax.tools.semantic_ids --data_dir $DATA --scheme semantic
timeout 3600 $PY -m gr_jax.train --gin_file=runs/train.gin --gin_file=models/t5_1_1/tiny.gin \
  --gin_file=encoders/minilm.gin --gin_file=runs/select.gin --gin.DATA_DIR="'$DATA'" \
  --gin.DATASET_NAME="'wordnet_food_c93'" --gin.DOCID_SCHEME="'semantic'" --gin.MODEL_DIR="'$OUT/minilm_2a_semantic'" \
  --gin.TRAIN_STEPS=$STEPS --gin.WARMUP_STEPS=300 --gin.EVAL_EVERY=250 --gin.PATIENCE=4 \
  --gin.training.EvalConfig.num_beams=20 --gin.training.train.progress=False \
  > "$OUT/minilm_2a_semantic.log" 2>&1 || echo "training ended with $? (124: the hour's budget)"
cat "$OUT/minilm_2a_semantic/final_metrics.json" 2>/dev/null || true
