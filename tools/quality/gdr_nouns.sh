#!/usr/bin/env bash
# docs/quality.md, "GDR on all 82,115 nouns": GDR whose query tower is zero-shot all-MiniLM-L6-v2, frozen, on
# WordNet's whole noun hierarchy at coverage 0.93 (tools/quality/nouns.sh's data dir): 256 clusters (16 x 16) of the
# zero-shot document vectors, a tiny T5.1.1 cluster decoder trained STEPS steps on the 61,009 training definitions
# and the 82,115 documents' own texts (indexing). The tower is frozen, so the cluster decoder is the only part that
# learns from the training definitions: its cluster term must beat the same model's dense-only ranking (all
# clusters, lambda 0: zero-shot MiniLM's) on valid (4,628 definitions). TEACHER=1: each training definition's
# cluster target is the soft one over its ranked list (synset first, then zero-shot MiniLM's next 9 documents,
# mass 1/r^2; ranking/trie.gin). Needs runs/quality/nouns/minilm_zs with its train run (minilm_zero_shot.sh with
# SPLITS="valid train"). LEXNAME=1: the clusters' first level is WordNet's lexicographer file (26), k-means 8
# below it (gdr_index build --cluster_groups). Valid MRR@10 for clusters recalled x lambda at the last step (all
# clusters at lambda 0 is zero-shot MiniLM's ranking, minilm_zs.valid.json; all beams over 4,628 queries cost too
# much to repeat it), each cell's JSON and TREC run; SPLIT=dev: the cells on dev (once, at the setting chosen).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=${DATA:-data/wordnet_nouns_c93}
OUT=${OUT:-runs/quality/nouns}
STEPS=${STEPS:-3000}
TEACHER=${TEACHER:-0}
if [ "${LEXNAME:-0}" = 1 ]; then
  INDEX=$OUT/gdr_index_lexname
  [ -f $OUT/groups.lexname.tsv ] || $PY -m gr_jax.tools.wordnet_groups --data_dir $D --out $OUT/groups.lexname.tsv
  CLUSTERING=(--branching 8 --cluster_groups $OUT/groups.lexname.tsv)
  R=$OUT/gdr_lexname_frozen_$STEPS
else
  INDEX=$OUT/gdr_index_zs
  CLUSTERING=(--branching 16,16)
  R=$OUT/gdr_zs_frozen_$STEPS
fi
[ -d $INDEX ] || $PY -m gr_jax.tools.gdr_index build --index_dir $OUT/minilm_zs/index/0 "${CLUSTERING[@]}" \
  --out_dir $INDEX > $INDEX.json
TARGETS=()
if [ "$TEACHER" = 1 ]; then
  R=$OUT/gdr_zs_teacher_$STEPS
  TARGETS=(--gin_file=ranking/trie.gin --gin.RANKED_RUN="'$OUT/minilm_zs/run.train.0.trec'" --gin.RANKING_DEPTH=10)
fi
if [ -n "${PEAK:-}" ]; then  # AdamW at PEAK, warmed up 100 steps, then linear decay to 0 at STEPS (default: 1e-3 constant)
  R=${R}_lr$PEAK
  TARGETS+=(--gin_file=schedules/linear_decay.gin --gin.LEARNING_RATE=$PEAK)
fi
[ -f $R/final_metrics.json ] || $PY -m gr_jax.train --gin_file=gdr/minilm.gin --gin_file=models/t5_1_1/tiny.gin \
  "${TARGETS[@]}" --gin.DATA_DIR="'$D'" --gin.GDR_INDEX="'$INDEX'" --gin.MODEL_DIR="'$R'" \
  --gin.TRAIN_STEPS=$STEPS --gin.TRAIN_QUERY_TOWER=False --gin.QUERY_LENGTH=32 --gin.WARMUP_STEPS=100 \
  --gin.training.EvalConfig.every_steps=-1 --gin.training.train.progress=False > $R.train.json 2> $R.train.log
SPLIT=${SPLIT:-valid}  # dev: once, at the setting chosen on valid
for clusters in ${CLUSTERS:-64 32}; do
  for weight in ${WEIGHTS:-0.0 0.1 0.25}; do
    CELL=$R.$SPLIT.c$clusters.w$weight
    [ -f $CELL.json ] || { $PY -m gr_jax.eval --gin_file=$R/config.gin --gin.EVAL_SPLIT="'$SPLIT'" \
      --gin.CLUSTERS_RECALLED=$clusters --gin.CLUSTER_WEIGHT=$weight > $CELL.json 2> /dev/null
      cp $R/run.$SPLIT.$STEPS.trec $CELL.trec; }  # each cell's ranking, for tools/compare
  done
done
