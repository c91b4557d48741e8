#!/usr/bin/env bash
# docs/quality.md: the document-vector generative model (tools/quality/document_vectors.sh) started from the
# fine-tuned dense retriever (tools/quality/dense_teacher.sh's runs/quality/minilm_ft): its query tower as the
# encoder (encoders/dense_run.gin, trained on at x0.02) and its document vectors, at the step its model selection
# kept, as the atomic docids' columns (fixed). Budget as document_vectors.sh: STEPS (1,000) steps of batch 32, at
# most 1 hour; valid MRR@10 every 250 steps keeps the best state, which ranks dev once. Then its runs on valid and
# dev (100 deep) and its fusions with the teacher and with BM25, weights chosen on valid.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=data/wordnet_food_c93
OUT=${OUT:-runs/quality}
T=$OUT/minilm_ft
NAME=${NAME:-minilm_ft_2a_document_vectors}
STEPS=${STEPS:-1000}
STEP=$($PY -c "import json; print(json.load(open('$T/selection.json'))['best_step'])")
VECTORS=$OUT/minilm_ft.document_vectors.npy
$PY -m gr_jax.tools.document_vectors --data_dir $D --index_dir $T/index/$STEP --out $VECTORS
R=$OUT/$NAME
timeout 3600 $PY -m gr_jax.train --gin_file=runs/train.gin --gin_file=models/t5_1_1/tiny.gin \
  --gin_file=encoders/dense_run.gin --gin_file=decoders/atomic_document_vectors.gin --gin_file=runs/select.gin \
  --gin.DATA_DIR="'$D'" --gin.DATASET_NAME="'$(basename "$D")'" --gin.DENSE_RUN="'$T'" \
  --gin.DOCUMENT_VECTORS="'$VECTORS'" --gin.MODEL_DIR="'$R'" --gin.TRAIN_STEPS=$STEPS --gin.WARMUP_STEPS=300 \
  --gin.EVAL_EVERY=250 --gin.PATIENCE=4 --gin.training.EvalConfig.num_beams=100 \
  --gin.training.train.progress=False > $R.log 2>&1 || echo "training ended with $? (124: the hour's budget)"
KEPT=$($PY -c "import json; print(json.load(open('$R/selection.json'))['best_step'])")
for split in valid dev; do
  $PY -m gr_jax.eval --gin_file=$R/config.gin --gin.EVAL_SPLIT="'$split'" --gin.training.evaluate.step=$KEPT \
    > $R.$split.json 2>> $R.log
done
# The TREC runs: RunDir's run.{split}.{step}.trec of each run dir.
for member in "minilm_ft:$T/run.valid.$STEP.trec:$T/run.dev.$STEP.trec" \
              "bm25:$OUT/bm25.valid.trec:$OUT/bm25.dev.trec"; do
  IFS=: read -r name valid dev <<< "$member"
  for method in wsum rrf; do
    $PY -m gr_jax.tools.fuse --data_dir $D --method $method --select_split valid --split dev \
      --system gr $R/run.valid.$KEPT.trec $R/run.dev.$KEPT.trec --system $name $valid $dev \
      > $R.fused_$name.$method.json
  done
done
