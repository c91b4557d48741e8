#!/usr/bin/env bash
# docs/quality.md, "In-domain pseudo-queries": distillation on WordNet noun.food c93 from doc2query outputs. A tiny
# T5.1.1 doc2query (experiments/doc2query.gin) learns document -> definition on c93's 1,916 training pairs only
# (1,000 steps), samples N_QUERIES per document for all 2,573 (top-k 10, T 1), and the fine-tuned dense teacher
# (runs/quality/minilm_ft at its kept step 400) labels each with its top document (tools/distill --d2q_file); the
# cell "q1" keeps each document's first sample only. Then the teacher's rankings of each data dir's training queries
# (its kept state copied to a run dir of the cell's, which indexes the documents again, so the original's runs stay)
# and the demo's model distilled from them at demo_distill_ft's setting (tools/quality/demo_distill.sh, cell trie2:
# 500 steps, valid every 50; inputs 48 WordPiece tokens, longer samples cut and logged).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
SRC=data/wordnet_food_c93
OUT=${OUT:-runs/quality/c93_d2q}
T=runs/quality/minilm_ft
STEP=400
N_QUERIES=${N_QUERIES:-4}
mkdir -p "$OUT"
[ -f $OUT/d2q/final_metrics.json ] || $PY -m gr_jax.tools.doc2query train --data_dir $SRC --model_dir $OUT/d2q \
  --steps 1000 > $OUT/d2q.train.json 2> $OUT/d2q.train.log
[ -f $OUT/d2q.done ] || { $PY -m gr_jax.tools.doc2query generate --data_dir $SRC --model_dir $OUT/d2q \
  --num_queries $N_QUERIES --batch_size 64 --out $OUT/d2q.tsv > $OUT/d2q.generate.json 2> $OUT/d2q.generate.log
  touch $OUT/d2q.done; }
cut -f1 $OUT/d2q.tsv > $OUT/d2q.first.tsv      # the per-document layout: each document's first sample
for cell in q$N_QUERIES q1; do
  D=${SRC}_d2q_$cell
  FILE=$OUT/d2q.tsv; [ $cell = q1 ] && FILE=$OUT/d2q.first.tsv
  [ -f $D/distill.json ] || $PY -m gr_jax.tools.distill --data_dir $SRC --teacher_dir $T --teacher_step $STEP \
    --d2q_file $FILE --labels 1 --out_dir $D > $OUT/distill.$cell.json
  TC=$OUT/$cell/minilm_ft
  if [ ! -f $TC/run.train.$STEP.trec ]; then
    mkdir -p $TC/best
    cp -r $T/config.gin $T/selection.json $TC/ && cp -r $T/best/$STEP $TC/best/
    ln -sf $PWD/$T.document_vectors.npy $TC.document_vectors.npy
    $PY -m gr_jax.eval --gin_file=$TC/config.gin --gin.MODEL_DIR="'$TC'" --gin.DATA_DIR="'$D'" \
      --gin.EVAL_SPLIT="'train'" --gin.training.evaluate.step=$STEP > $TC.train_split.json 2> $TC.train_split.log
  fi
  DATA=$D OUT=$OUT/$cell TEACHER=$TC TEACHER_STEP=$STEP CUT_QUERIES=True CELLS=trie2 tools/quality/demo_distill.sh
done
