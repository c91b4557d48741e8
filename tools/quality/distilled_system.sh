#!/usr/bin/env bash
# docs/quality.md: the demo's distilled generative model (experiments/wordnet_document_vectors_distilled.gin: each
# training query's soft target over its judged document and zero-shot MiniLM's next 9) on a data dir with `valid` and
# `dev` splits, at three_systems.sh's budget (STEPS, 1,000; valid every 250; the best state's dev once), then the
# paired tests against BM25, MiniLM and the undistilled model where three_systems.sh ran them. DATA: the data dir;
# OUT: where the runs go; DOCUMENT_LENGTH: MiniLM's document tokens. Called by tools/quality/msmarco.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=$DATA
STEPS=${STEPS:-1000}
DATA=$D OUT=$OUT DOCUMENT_LENGTH=$DOCUMENT_LENGTH SPLITS="train valid dev" tools/quality/minilm_zero_shot.sh
[ -f $OUT/bm25.dev.trec ] || $PY -m gr_jax.tools.bm25 --data_dir $D --split dev --run_file $OUT/bm25.dev.trec \
  > $OUT/bm25.dev.json
$PY -m gr_jax.train --gin_file=experiments/wordnet_document_vectors_distilled.gin --gin_file=runs/select.gin \
  --gin.DATA_DIR="'$D'" --gin.DATASET_NAME="'$(basename $D)'" \
  --gin.DOCUMENT_VECTORS="'$OUT/minilm_zs.document_vectors.npy'" --gin.RANKED_RUN="'$OUT/minilm_zs/run.train.0.trec'" \
  --gin.MODEL_DIR="'$OUT/gr_distilled'" --gin.TRAIN_STEPS=$STEPS --gin.EVAL_EVERY=250 --gin.PATIENCE=None \
  --gin.training.train.progress=False > $OUT/gr_distilled.train.json 2> $OUT/gr_distilled.train.log
best_step() { $PY -c "import json; print(json.load(open('$1/selection.json'))['best_step'])"; }
RUNS=(--run gr_distilled $OUT/gr_distilled/run.dev.$(best_step $OUT/gr_distilled).trec)
[ -f $OUT/gr_document_vectors/selection.json ] && \
  RUNS+=(--run gr $OUT/gr_document_vectors/run.dev.$(best_step $OUT/gr_document_vectors).trec)
$PY -m gr_jax.tools.compare --data_dir $D --split dev "${RUNS[@]}" --run bm25 $OUT/bm25.dev.trec \
  --run minilm $OUT/minilm_zs/run.dev.0.trec > $OUT/compare_distilled.dev.json
