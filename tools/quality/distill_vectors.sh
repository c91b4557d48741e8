#!/usr/bin/env bash
# docs/quality.md, "Distillation on and off": the demo-setting generative model (frozen MiniLM encoder, tiny T5.1.1
# decoder, atomic docids whose columns are the fine-tuned teacher's document vectors; 500 steps, valid MRR@10 every
# 50 steps keeps the best state, dev once) trained on c93 plus 15,539 pseudo-queries (WordNet's noun.plant and
# noun.animal definitions) labeled with the fine-tuned dense teacher's top document (docs/dense.md's MiniLM, its
# kept step 400), against the same model without them (runs/quality/demo_setting_c93_ftcols). About 20 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=data/wordnet_food_c93
OUT=${OUT:-runs/quality}
T=$OUT/minilm_ft
[ -f data/wordnet_plant_animal/collection.tsv ] || $PY -m gr_jax.tools.wordnet --out_dir data/wordnet_plant_animal \
  --lexfiles noun.plant noun.animal > /dev/null
[ -f ${D}_distilled_ft/qrels.train.tsv ] || $PY -m gr_jax.tools.distill --data_dir $D --teacher_dir $T \
  --teacher_step 400 --labels 1 --pseudo_queries data/wordnet_plant_animal/queries.train.tsv \
  --pseudo_queries data/wordnet_plant_animal/queries.dev.tsv --out_dir ${D}_distilled_ft > $OUT/distilled_ft.json
$PY -m gr_jax.train --gin_file=experiments/wordnet_document_vectors.gin --gin_file=runs/select.gin \
  --gin.DATA_DIR="'${D}_distilled_ft'" --gin.DATASET_NAME="'wordnet_food_c93_distilled_ft'" \
  --gin.DOCUMENT_VECTORS="'$OUT/minilm_ft.document_vectors.npy'" --gin.MODEL_DIR="'$OUT/demo_setting_c93_ftcols_distilled'" \
  --gin.TRAIN_STEPS=500 --gin.EVAL_EVERY=50 --gin.PATIENCE=None --gin.training.train.progress=False \
  > $OUT/demo_setting_c93_ftcols_distilled.train.json 2> $OUT/demo_setting_c93_ftcols_distilled.train.log
