#!/usr/bin/env bash
# docs/quality.md, next measurements: the fine-tuned dense retriever (docs/dense.md: all-MiniLM-L6-v2, in-batch
# negatives, 600 steps x 32, the step kept on valid MRR@10; dev 0.474) as (1) a member of fusions, (2) the vectors
# of dense-space semantic ids, (3) the distillation teacher, each followed by the generative run of
# tools/quality/minilm_encoder.sh on the data dir it makes. Budget: about 20 minutes for the teacher, 45 for each
# generative run on the 2-core host. PARTS (default "ids distill") picks which of (2) and (3) follow the teacher;
# "ranks" makes what a student distilled from it reads (tools/quality/demo_distill.sh): its TREC run of the
# training queries and its documents' vectors at the kept step, for this teacher or for any dense run trained with
# runs/select.gin (TEACHER=RUN_DIR, e.g. a teacher_sweep.sh cell). Another data dir: DATA, OUT, STEPS, EVAL_EVERY,
# DOCUMENT_LENGTH (64), WARMUP_STEPS (50), e.g.
#   DATA=data/wordnet_nouns_c93 OUT=runs/quality/nouns EVAL_EVERY=300 PARTS=ranks tools/quality/dense_teacher.sh
#   DATA=data/msmarco_mini_v50 OUT=runs/quality/msmarco_ft STEPS=100 EVAL_EVERY=25 DOCUMENT_LENGTH=256 \
#     WARMUP_STEPS=10 PARTS=none tools/quality/dense_teacher.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=${DATA:-data/wordnet_food_c93}
OUT=${OUT:-runs/quality}
T=${TEACHER:-$OUT/minilm_ft}
[ -f $T/selection.json ] || $PY -m gr_jax.train --gin_file=dense/minilm.gin --gin_file=runs/select.gin \
  --gin.DATA_DIR="'$D'" --gin.MODEL_DIR="'$T'" --gin.TRAIN_STEPS=${STEPS:-600} \
  --gin.DOCUMENT_LENGTH=${DOCUMENT_LENGTH:-64} --gin.EVAL_EVERY=${EVAL_EVERY:-100} \
  --gin.WARMUP_STEPS=${WARMUP_STEPS:-50} > $T.train.json
STEP=$($PY -c "import json; print(json.load(open('$T/selection.json'))['best_step'])")
for split in valid dev; do   # its runs on both splits (fusion) and its corpus index at the kept step, where its
  # training (select.gin: valid every EVAL_EVERY, dev at the kept step) has not written them already
  [ -f $T/run.$split.$STEP.trec ] || $PY -m gr_jax.eval --gin_file=$T/config.gin --gin.EVAL_SPLIT="'$split'" \
    --gin.training.evaluate.step=$STEP > $T.$split.json
done
PARTS=${PARTS:-ids distill}
if [[ " $PARTS " == *" ranks "* ]]; then
  [ -f $T/run.train.$STEP.trec ] || $PY -m gr_jax.eval --gin_file=$T/config.gin --gin.EVAL_SPLIT="'train'" \
    --gin.training.evaluate.step=$STEP > $T.train_split.json
  [ -f $T.document_vectors.npy ] || $PY -m gr_jax.tools.document_vectors --data_dir $D --index_dir $T/index/$STEP \
    --out $T.document_vectors.npy
fi
if [[ " $PARTS " == *" ids "* ]]; then  # (2) semantic ids from its document vectors, in a data dir linking to $D's
$PY -m gr_jax.tools.train_fraction --data_dir $D --fractions 1 --out_dir ${D}_ft_ids > /dev/null
rm -f ${D}_ft_ids/docids.semantic.tsv ${D}_ft_ids/embeddings.minilm.npy
$PY -m gr_jax.tools.semantic_ids --data_dir ${D}_ft_ids --scheme semantic --index_dir $T/index/$STEP
DATA=${D}_ft_ids NAME=minilm_2a_semantic_ft_ids tools/quality/minilm_encoder.sh
fi
[[ " $PARTS " == *" distill "* ]] || exit 0
# (3) distillation from it: WordNet's plant and animal definitions labeled with its top document
[ -f data/wordnet_plant_animal/collection.tsv ] || $PY -m gr_jax.tools.wordnet --out_dir data/wordnet_plant_animal \
  --lexfiles noun.plant noun.animal
$PY -m gr_jax.tools.distill --data_dir $D --teacher_dir $T --teacher_step $STEP --labels 1 \
  --pseudo_queries data/wordnet_plant_animal/queries.train.tsv --pseudo_queries data/wordnet_plant_animal/queries.dev.tsv \
  --out_dir ${D}_distilled_ft
DATA=${D}_distilled_ft NAME=minilm_2a_semantic_distilled_ft tools/quality/minilm_encoder.sh
