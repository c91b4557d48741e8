#!/usr/bin/env bash
# docs/quality.md, "make demo": the demo's generative model (experiments/wordnet_document_vectors.gin: frozen MiniLM
# encoder, tiny T5.1.1 decoder, zero-shot MiniLM document vectors as the atomic docids' columns) on WordNet noun.food
# c93, whose `valid` split (125 definitions) the demo's own data dir lacks: valid MRR@10 every 50 steps up to 500,
# which chose DEMO_STEPS (250). Needs the zero-shot MiniLM run of docs/quality.md's measurements
# (runs/quality/minilm_zs, its corpus index at step 0). About 6 minutes on the 2-core host.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=data/wordnet_food_c93
OUT=${OUT:-runs/quality}
$PY -m gr_jax.tools.document_vectors --data_dir $D --index_dir $OUT/minilm_zs/index/0 \
  --out $OUT/minilm_zs.document_vectors.npy
$PY -m gr_jax.train --gin_file=experiments/wordnet_document_vectors.gin --gin_file=runs/select.gin \
  --gin.DATA_DIR="'$D'" --gin.DATASET_NAME="'wordnet_food_c93'" \
  --gin.DOCUMENT_VECTORS="'$OUT/minilm_zs.document_vectors.npy'" --gin.MODEL_DIR="'$OUT/demo_setting_c93'" \
  --gin.TRAIN_STEPS=500 --gin.EVAL_EVERY=50 --gin.PATIENCE=None --gin.training.train.progress=False \
  > $OUT/demo_setting_c93.train.json
