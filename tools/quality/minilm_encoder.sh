#!/usr/bin/env bash
# docs/quality.md: a pure generative model whose encoder is all-MiniLM-L6-v2 (encoders/minilm.gin) and whose decoder
# is a tiny T5.1.1 from scratch, row 2a (FirstP indexing + labeled definitions), semantic ids from zero-shot MiniLM,
# on WordNet noun.food at coverage 0.93 (data/wordnet_food_c93: 532 dev definitions of documents without a training
# query, 125 valid ones for selection). Budget: STEPS steps of batch 32 (AdamW, 300 warm-up steps then constant, so a
# shorter run is a prefix of a longer one), at most 1 hour of wall time on the 2-core host; valid MRR@10 every 250
# steps keeps the best state, which ranks dev once at the end.
#   DATA=data/wordnet_food_c93_distilled NAME=minilm_2a_semantic_distilled tools/quality/minilm_encoder.sh
# trains the same model on tools/distill's data dir (docs/quality.md, distillation).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
DATA=${DATA:-data/wordnet_food_c93}
NAME=${NAME:-minilm_2a_semantic}
OUT=${OUT:-runs/quality}
STEPS=${STEPS:-1000}
mkdir -p "$OUT"
[ -f data/wordnet_food_c93/collection.tsv ] || {
  $PY -m gr_jax.tools.wordnet --out_dir data/wordnet_food_c93 --lexfiles noun.food --coverage 0.93
  cp data/wordnet_food/spm.model data/wordnet_food_c93/; }      # the demo's 2,000-piece vocabulary (make demo)
[ -f data/wordnet_food_c93/docids.semantic.tsv ] || $PY -m gr_jax.tools.semantic_ids --data_dir data/wordnet_food_c93 \
  --scheme semantic
timeout 3600 $PY -m gr_jax.train --gin_file=runs/train.gin --gin_file=models/t5_1_1/tiny.gin \
  --gin_file=encoders/minilm.gin --gin_file=runs/select.gin --gin.DATA_DIR="'$DATA'" \
  --gin.DATASET_NAME="'$(basename "$DATA")'" --gin.DOCID_SCHEME="'semantic'" --gin.MODEL_DIR="'$OUT/$NAME'" \
  --gin.TRAIN_STEPS=$STEPS --gin.WARMUP_STEPS=300 --gin.EVAL_EVERY=250 --gin.PATIENCE=4 \
  --gin.training.EvalConfig.num_beams=20 --gin.training.train.progress=False \
  > "$OUT/$NAME.log" 2>&1 || echo "training ended with $? (124: the hour's budget)"
cat "$OUT/$NAME/final_metrics.json" 2>/dev/null || true
