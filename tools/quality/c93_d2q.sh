#!/usr/bin/env bash
# docs/quality.md, "In-domain pseudo-queries": distillation on WordNet noun.food c93 from doc2query outputs. A tiny
# T5.1.1 doc2query (experiments/doc2query.gin) learns document -> definition on c93's 1,916 training pairs only
# (1,000 steps), samples N_QUERIES per document for all 2,573 (top-k 10, T 1), and the fine-tuned dense teacher
# (runs/quality/minilm_ft at its kept step 400) labels each with its top document (tools/distill --d2q_file); the
# cell "q1" keeps each document's first sample only. Then the teacher's rankings of each data dir's training queries
# (gr_jax.infer at the kept step, its index reused) and the demo's model distilled from them at demo_distill_ft's
# setting (tools/quality/demo_distill.sh, cell trie2: 500 steps, valid every 50; inputs 48 WordPiece tokens, longer
# samples cut and logged).
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
  RANKS=$OUT/$cell/teacher.run.train.trec
  mkdir -p $OUT/$cell
  [ -f $RANKS ] || $PY -m gr_jax.infer --model_dir $T --step $STEP --queries $D/queries.train.tsv --top_k 100 \
    --output $RANKS 2> $OUT/$cell/teacher.run.train.log
  DATA=$D OUT=$OUT/$cell TEACHER=$T TEACHER_STEP=$STEP RANKED_RUN=$RANKS CUT_QUERIES=True CELLS=trie2 \
    tools/quality/demo_distill.sh
done
