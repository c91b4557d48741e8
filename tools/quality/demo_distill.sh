#!/usr/bin/env bash
# docs/quality.md, "Distillation into the demo's model": the demo's generative model (experiments/
# wordnet_document_vectors.gin) on WordNet noun.food c93, trained on ranked lists whose first docid is the training
# definition's synset and the next ones zero-shot MiniLM's top documents for it (RANKED_RUN, RANKING_DEPTH in all),
# as trie-marginalised soft targets mu(r) = 1/r^beta (ranking/trie.gin: for one-token atomic docids a soft target
# over the list's documents), plus every document's text -> its docid (INDEXING). Against the same model on row 2a's
# seqio mixture and on the ranked lists without a teacher (NTP). 500 steps, valid MRR@10 every 50 (select.gin).
# Inputs 48 WordPiece tokens: ranked lists refuse to cut a query, and the longest training definition has 47.
# Needs runs/quality/minilm_zs (docs/quality.md) with its TREC run of the training definitions and its document
# vectors. About 6 minutes a cell on the 2-core host alone. The fine-tuned teacher instead (its columns and ranks):
#   TEACHER=runs/quality/minilm_ft TEACHER_STEP=400 OUT=runs/quality/demo_distill_ft CELLS="base trie2"
# and CELLS=trie2_tower the same on the teacher's own query tower (frozen; a dense run as TEACHER, not minilm_zs)
# after its training split's run (gr_jax.eval --gin.EVAL_SPLIT="'train'") and tools/document_vectors
# (`PARTS=ranks tools/quality/dense_teacher.sh` makes both). Another data dir: DATA, STEPS, EVAL_EVERY, INPUT_LENGTH
# and CUT_QUERIES=True where a training query is longer than INPUT_LENGTH - 1 tokens (all nouns: 333 of 61,009 at
# 48), e.g. all WordNet nouns (docs/quality.md):
#   DATA=data/wordnet_nouns_c93 STEPS=1000 EVAL_EVERY=250 CUT_QUERIES=True TEACHER=runs/quality/nouns/minilm_ft \
#     TEACHER_STEP=600 OUT=runs/quality/nouns/demo_distill_ft CELLS="base trie2"
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=${DATA:-data/wordnet_food_c93}
OUT=${OUT:-runs/quality/demo_distill}
TEACHER=${TEACHER:-runs/quality/minilm_zs}
TEACHER_STEP=${TEACHER_STEP:-0}   # the step of its run.train.STEP.trec
RANKED_RUN=${RANKED_RUN:-$TEACHER/run.train.$TEACHER_STEP.trec}   # or its ranking of another data dir's training queries
CELLS=${CELLS:-"base ntp trie2 trie1"}
SEED=${SEED:-0}   # a second seed: SEED=1 OUT=runs/quality/demo_distill_s1
mkdir -p "$OUT"
COMMON=(--gin_file=experiments/wordnet_document_vectors.gin)
SETTINGS=(--gin_file=runs/select.gin --gin.DATA_DIR="'$D'" --gin.DATASET_NAME="'$(basename $D)'"
  --gin.DOCUMENT_VECTORS="'$TEACHER.document_vectors.npy'" --gin.INPUT_LENGTH=${INPUT_LENGTH:-48}
  --gin.TRAIN_STEPS=${STEPS:-500} --gin.EVAL_EVERY=${EVAL_EVERY:-50} --gin.PATIENCE=None
  --gin.training.train.progress=False --gin.experiment.Experiment.seed=$SEED)
LISTS=(--gin_file=ranking/ranked_lists.gin --gin.INDEXING=True --gin.CUT_QUERIES=${CUT_QUERIES:-False})
TEACHER_LISTS=(--gin_file=ranking/trie.gin --gin.RANKED_RUN="'$RANKED_RUN'" --gin.RANKING_DEPTH=10)
TRIE2=("${LISTS[@]}" "${TEACHER_LISTS[@]}" --gin.BETA=2.0)
for cell in $CELLS; do
  case $cell in
    base) EXTRA=() ;;
    ntp) EXTRA=("${LISTS[@]}") ;;
    trie2) EXTRA=("${TRIE2[@]}") ;;
    trie1) EXTRA=("${LISTS[@]}" "${TEACHER_LISTS[@]}" --gin.BETA=1.0) ;;
    trie2_tower) EXTRA=(--gin_file=encoders/dense_run.gin --gin.DENSE_RUN="'$TEACHER'" --gin.TRAIN_ENCODER_TOWER=False
      "${TRIE2[@]}") ;;   # trie2 on the teacher's own query tower (frozen)
    *) echo "unknown cell $cell" >&2; exit 1 ;;
  esac
  [ -f $OUT/$cell/final_metrics.json ] || $PY -m gr_jax.train "${COMMON[@]}" "${EXTRA[@]}" "${SETTINGS[@]}" \
    --gin.MODEL_DIR="'$OUT/$cell'" > $OUT/$cell.train.json 2> $OUT/$cell.train.log
done
