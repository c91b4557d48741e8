#!/usr/bin/env bash
# docs/quality.md, "GDR's cluster decoder distilled from the dense retriever": tools/quality/gdr_zero_shot.sh's run
# (zero-shot all-MiniLM-L6-v2 as the frozen query tower, 64 clusters of its document vectors, a tiny T5.1.1
# cluster decoder, 300 steps on WordNet noun.food c93) with one change: each training definition's cluster target
# is a soft one over the clusters of a ranked list, its synset first, then zero-shot MiniLM's next documents for
# it (RANKING_DEPTH in all, mass 1/r^BETA; ranking/trie.gin). Then valid MRR@10 at step 300 for clusters recalled
# x lambda. Needs runs/quality/minilm_zs with its train run (tools/quality/minilm_zero_shot.sh, SPLITS="train
# valid") and gdr_zero_shot.sh's index. SEED, DEPTH, BETA: env; about 10 minutes beside another run.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=data/wordnet_food_c93
OUT=${OUT:-runs/quality}
SEED=${SEED:-0}
DEPTH=${DEPTH:-10}
BETA=${BETA:-2.0}
R=$OUT/gdr_zs_teacher_d${DEPTH}_b${BETA}_s$SEED
[ -f $R/final_metrics.json ] || $PY -m gr_jax.train --gin_file=gdr/minilm.gin --gin_file=models/t5_1_1/tiny.gin \
  --gin_file=ranking/trie.gin --gin.RANKED_RUN="'$OUT/minilm_zs/run.train.0.trec'" --gin.RANKING_DEPTH=$DEPTH \
  --gin.BETA=$BETA --gin.DATA_DIR="'$D'" --gin.GDR_INDEX="'$OUT/gdr_index_zs'" --gin.MODEL_DIR="'$R'" \
  --gin.TRAIN_STEPS=300 --gin.TRAIN_QUERY_TOWER=False --gin.QUERY_LENGTH=32 --gin.WARMUP_STEPS=20 \
  --gin.experiment.GdrExperiment.seed=$SEED --gin.training.EvalConfig.every_steps=-1 --gin.training.train.progress=False \
  > $R.train.json 2> $R.train.log
for clusters in 64 32 20 10; do
  for weight in 0.0 0.25 0.5 1.0; do
    CELL=$R.valid.c$clusters.w$weight.json
    [ -f $CELL ] || $PY -m gr_jax.eval --gin_file=$R/config.gin --gin.EVAL_SPLIT="'valid'" \
      --gin.CLUSTERS_RECALLED=$clusters --gin.CLUSTER_WEIGHT=$weight > $CELL 2> /dev/null
  done
done
