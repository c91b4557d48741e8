#!/usr/bin/env bash
# docs/quality.md, "The dense teacher, measured as the paper measures it" (gr_vs_dense_limitations.txt Fig. 1: more
# negatives K; Table 1: the hard-negative ratio rho), reduced to the 2-core host's budget: all-MiniLM-L6-v2
# fine-tuned as docs/dense.md's teacher (AdamW 2e-5, 50 warm-up steps then constant, batch 32, in-batch negatives
# always on) plus K extra negatives per query, round(rho K) of them BM25's top-100 non-relevant documents for the
# training query and the rest uniform over the collection; STEPS (100) steps, valid MRR@10 every 50. The K = 0 cell
# is the teacher's own run (runs/quality/minilm_ft, valid at its step 100; a constant rate after warm-up makes its
# step 100 the 100-step run). Runs: K 1 rho 1; K 4 rho 0, 0.5, 1; CELLS="4:0.25 4:0.75 8:0.25" runs others, and a cell
# "K:rho:mvdr" the same with the multi-vector MaxSim tower (dense/mvdr.gin, the paper's MVDR).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=data/wordnet_food_c93
OUT=${OUT:-runs/quality/teacher_sweep}
STEPS=${STEPS:-100}
mkdir -p "$OUT"
[ -f $OUT/bm25.train.trec ] || $PY -m gr_jax.tools.bm25 --data_dir $D --split train --k 100 \
  --run_file $OUT/bm25.train.trec > $OUT/bm25.train.json
for cell in ${CELLS:-1:1.0 4:1.0 4:0.0 4:0.5}; do  # K:rho[:mvdr]
  set -- ${cell//:/ }
  NAME=k$1_rho$2${3:+_$3}
  [ -f $OUT/$NAME/final_metrics.json ] || $PY -m gr_jax.train --gin_file=dense/minilm.gin ${3:+--gin_file=dense/$3.gin} \
    --gin_file=runs/select.gin \
    --gin.DATA_DIR="'$D'" --gin.MODEL_DIR="'$OUT/$NAME'" --gin.TRAIN_STEPS=$STEPS --gin.DOCUMENT_LENGTH=64 \
    --gin.EVAL_EVERY=50 --gin.PATIENCE=None --gin.WARMUP_STEPS=50 --gin.NUM_NEGATIVES=$1 \
    --gin.HARD_NEGATIVE_FRACTION=$2 --gin.NEGATIVES_RUN="'$OUT/bm25.train.trec'" \
    --gin.training.train.progress=False > $OUT/$NAME.train.json 2> $OUT/$NAME.train.log
done
