#!/usr/bin/env bash
# docs/quality.md: zero-shot all-MiniLM-L6-v2 on a data dir: its corpus index (DOCUMENT_LENGTH document tokens), a
# TREC run of each split in SPLITS (default "valid dev"; "train" gives the teacher's rankings of the training
# queries that distillation reads) and the documents' vectors in collection order (the document-vector head's
# columns). DATA: the data dir; OUT: where the runs go. Each output is made once. Called by three_systems.sh and
# msmarco_distill.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=$DATA
mkdir -p "$OUT"
[ -d $OUT/minilm_zs ] || $PY -m gr_jax.train --gin_file=dense/minilm.gin --gin.DATA_DIR="'$D'" \
  --gin.MODEL_DIR="'$OUT/minilm_zs'" --gin.TRAIN_STEPS=0 --gin.DOCUMENT_LENGTH=$DOCUMENT_LENGTH \
  --gin.training.EvalConfig.every_steps=-1 > $OUT/minilm_zs.index.json 2> $OUT/minilm_zs.index.log
for split in ${SPLITS:-valid dev}; do
  [ -f $OUT/minilm_zs.$split.json ] || $PY -m gr_jax.eval --gin_file=$OUT/minilm_zs/config.gin \
    --gin.EVAL_SPLIT="'$split'" --gin.training.EvalConfig.num_beams=100 > $OUT/minilm_zs.$split.json 2> $OUT/minilm_zs.$split.log
done
[ -f $OUT/minilm_zs.document_vectors.npy ] || $PY -m gr_jax.tools.document_vectors --data_dir $D \
  --index_dir $OUT/minilm_zs/index/0 --out $OUT/minilm_zs.document_vectors.npy
