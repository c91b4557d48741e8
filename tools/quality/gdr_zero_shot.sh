#!/usr/bin/env bash
# docs/quality.md, "GDR on the zero-shot tower": GDR whose query tower is zero-shot all-MiniLM-L6-v2, frozen, so the
# cluster decoder is the only part that learns from the training definitions (on the fine-tuned teacher's tower the
# tower had learnt from them already). 64 clusters (8 x 8) of the zero-shot document vectors on WordNet noun.food
# c93, a tiny T5.1.1 cluster decoder, 300 steps; then valid MRR@10 at step 300 for clusters recalled x lambda (the
# weight of log p(cluster | q) beside S / tau). 64 clusters at lambda 0 is the dense-only ranking (zero-shot
# MiniLM's). Needs runs/quality/minilm_zs (docs/quality.md). About 10 minutes beside another run.
# TEACHER=1 ("The cluster decoder distilled from the dense retriever"): each training definition's cluster target
# is a soft one over a ranked list, its synset first, then zero-shot MiniLM's next documents for it (DEPTH in all,
# mass 1/r^BETA; ranking/trie.gin); needs minilm_zs's train run (minilm_zero_shot.sh with SPLITS="train valid").
# HYPERNYM_DEPTH=5: the clusters' first level is each document's hypernym 5 below WordNet's root (45 groups,
# tools/wordnet_groups.py), k-means into BELOW (2) below it, instead of 8 x 8 k-means of the zero-shot vectors.
# CLUSTER_GROUPS=runs/quality/groups.lexical32.tsv: the same with any groups file, e.g. tools/quality/lexical_groups.py's.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=data/wordnet_food_c93
OUT=${OUT:-runs/quality}
R=$OUT/gdr_zs_frozen
OPTIONS=()
if [ "${TEACHER:-0}" = 1 ]; then
  SEED=${SEED:-0}
  DEPTH=${DEPTH:-10}
  BETA=${BETA:-2.0}
  R=$OUT/gdr_zs_teacher_d${DEPTH}_b${BETA}_s$SEED
  OPTIONS=(--gin_file=ranking/trie.gin --gin.RANKED_RUN="'$OUT/minilm_zs/run.train.0.trec'" --gin.RANKING_DEPTH=$DEPTH
           --gin.BETA=$BETA --gin.experiment.GdrExperiment.seed=$SEED)
fi
INDEX=$OUT/gdr_index_zs
CLUSTERING=(--branching 8,8)
if [ -n "${HYPERNYM_DEPTH:-}" ]; then  # the first cluster level: the hypernym HYPERNYM_DEPTH below the root
  CLUSTER_GROUPS=$OUT/groups.depth$HYPERNYM_DEPTH.tsv
  [ -f $CLUSTER_GROUPS ] || $PY -m gr_jax.tools.wordnet_groups --data_dir $D --depth $HYPERNYM_DEPTH \
    --out $CLUSTER_GROUPS
fi
if [ -n "${CLUSTER_GROUPS:-}" ]; then  # a groups.NAME.tsv file (docid \t label): the first level, k-means below
  NAME=$(basename $CLUSTER_GROUPS .tsv)
  NAME=${NAME#groups.}
  INDEX=$OUT/gdr_index_$NAME
  CLUSTERING=(--branching ${BELOW:-2} --cluster_groups $CLUSTER_GROUPS)
  R=${R}_${NAME}x${BELOW:-2}
fi
[ -d $INDEX ] || $PY -m gr_jax.tools.gdr_index build --index_dir $OUT/minilm_zs/index/0 "${CLUSTERING[@]}" \
  --out_dir $INDEX > $INDEX.json
[ -f $R/final_metrics.json ] || $PY -m gr_jax.train --gin_file=gdr/minilm.gin --gin_file=models/t5_1_1/tiny.gin \
  "${OPTIONS[@]}" --gin.DATA_DIR="'$D'" --gin.GDR_INDEX="'$INDEX'" --gin.MODEL_DIR="'$R'" \
  --gin.TRAIN_STEPS=300 --gin.TRAIN_QUERY_TOWER=False --gin.QUERY_LENGTH=32 --gin.WARMUP_STEPS=20 \
  --gin.training.EvalConfig.every_steps=-1 --gin.training.train.progress=False > $R.train.json 2> $R.train.log
for clusters in 64 32 20 10; do
  for weight in 0.0 0.25 0.5 1.0; do
    CELL=$R.valid.c$clusters.w$weight.json
    [ -f $CELL ] || $PY -m gr_jax.eval --gin_file=$R/config.gin --gin.EVAL_SPLIT="'valid'" \
      --gin.CLUSTERS_RECALLED=$clusters --gin.CLUSTER_WEIGHT=$weight > $CELL 2> /dev/null
  done
done
