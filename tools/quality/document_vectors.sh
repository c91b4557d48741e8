#!/usr/bin/env bash
# docs/quality.md: the pure generative model whose atomic docid columns are the documents' zero-shot MiniLM vectors
# (decoders/atomic_document_vectors.gin, fixed) and whose encoder is all-MiniLM-L6-v2 (encoders/minilm.gin), a tiny
# T5.1.1 decoder from scratch learning the projection into the vectors' space; row 2a on WordNet noun.food c93.
# Budget as tools/quality/minilm_encoder.sh: STEPS (1,000) steps of batch 32, AdamW 1e-3 (tower x0.02), 300 warm-up
# steps then constant, at most 1 hour; valid MRR@10 every 250 steps keeps the best state, which ranks dev once. The
# atomic head ranks the whole corpus exactly, so the 100 "beams" are its top 100 (R@100), not a search.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
DATA=${DATA:-data/wordnet_food_c93}
VECTORS=${VECTORS:-data/wordnet_food_c93/embeddings.minilm.npy}
NAME=${NAME:-minilm_2a_document_vectors}
OUT=${OUT:-runs/quality}
STEPS=${STEPS:-1000}
mkdir -p "$OUT"
[ -f "$VECTORS" ] || $PY -m gr_jax.tools.semantic_ids --data_dir data/wordnet_food_c93 --scheme semantic
timeout 3600 $PY -m gr_jax.train --gin_file=runs/train.gin --gin_file=models/t5_1_1/tiny.gin \
  --gin_file=encoders/minilm.gin --gin_file=decoders/atomic_document_vectors.gin --gin_file=runs/select.gin \
  --gin.DATA_DIR="'$DATA'" --gin.DATASET_NAME="'$(basename "$DATA")'" --gin.DOCUMENT_VECTORS="'$VECTORS'" \
  --gin.MODEL_DIR="'$OUT/$NAME'" --gin.TRAIN_STEPS=$STEPS --gin.WARMUP_STEPS=300 --gin.EVAL_EVERY=250 \
  --gin.PATIENCE=4 --gin.training.EvalConfig.num_beams=100 --gin.training.train.progress=False \
  > "$OUT/$NAME.log" 2>&1 || echo "training ended with $? (124: the hour's budget)"
cat "$OUT/$NAME/final_metrics.json" 2>/dev/null || true
