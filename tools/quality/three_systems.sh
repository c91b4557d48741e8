#!/usr/bin/env bash
# docs/quality.md: BM25, zero-shot all-MiniLM-L6-v2 and the pure generative model of `make demo` (frozen MiniLM
# encoder, tiny T5.1.1 decoder from scratch, atomic docids whose columns are the documents' zero-shot MiniLM vectors)
# on a data dir with `valid` and `dev` splits, each ranking both (fusion); row 2a. The generative model trains STEPS
# (1,000) steps of batch 32 under an hour's budget; valid MRR@10 every 250 steps keeps the best state, which ranks
# dev once. DATA: the data dir (with its spm.model); OUT: where the runs go; DOCUMENT_LENGTH: MiniLM's document
# tokens. Called by tools/quality/nouns.sh and tools/quality/msmarco.sh, which make their data dirs.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=$DATA
STEPS=${STEPS:-1000}
mkdir -p "$OUT"
for split in valid dev; do
  [ -f $OUT/bm25.$split.trec ] || $PY -m gr_jax.tools.bm25 --data_dir $D --split $split \
    --run_file $OUT/bm25.$split.trec > $OUT/bm25.$split.json
done
DATA=$D OUT=$OUT DOCUMENT_LENGTH=$DOCUMENT_LENGTH tools/quality/minilm_zero_shot.sh
timeout 3600 $PY -m gr_jax.train --gin_file=experiments/wordnet_document_vectors.gin --gin_file=runs/select.gin \
  --gin.DATA_DIR="'$D'" --gin.DATASET_NAME="'$(basename $D)'" \
  --gin.DOCUMENT_VECTORS="'$OUT/minilm_zs.document_vectors.npy'" --gin.MODEL_DIR="'$OUT/gr_document_vectors'" \
  --gin.TRAIN_STEPS=$STEPS --gin.EVAL_EVERY=250 --gin.PATIENCE=None --gin.training.train.progress=False \
  > $OUT/gr_document_vectors.train.json 2> $OUT/gr_document_vectors.train.log || echo "training ended with $?"
# Fusions (weights chosen on valid, dev scored once) and the paired tests of docs/quality.md's tables.
STEP=$($PY -c "import json; print(json.load(open('$OUT/gr_document_vectors/selection.json'))['best_step'])")
GR="--system gr $OUT/gr_document_vectors/run.valid.$STEP.trec $OUT/gr_document_vectors/run.dev.$STEP.trec"
DENSE="--system minilm $OUT/minilm_zs/run.valid.0.trec $OUT/minilm_zs/run.dev.0.trec"
BM25="--system bm25 $OUT/bm25.valid.trec $OUT/bm25.dev.trec"
for method in wsum rrf; do
  for fused in "gr_bm25|$GR $BM25" "gr_minilm|$GR $DENSE" "gr_minilm_bm25|$GR $DENSE $BM25" "minilm_bm25|$DENSE $BM25"; do
    $PY -m gr_jax.tools.fuse --data_dir $D --method $method ${fused#*|} \
      --run_file $OUT/fused_${fused%%|*}.$method.dev.trec > $OUT/fused_${fused%%|*}.$method.json
  done
done
$PY -m gr_jax.tools.compare --data_dir $D --split dev --run gr $OUT/gr_document_vectors/run.dev.$STEP.trec \
  --run bm25 $OUT/bm25.dev.trec --run minilm $OUT/minilm_zs/run.dev.0.trec \
  --run fused3 $OUT/fused_gr_minilm_bm25.wsum.dev.trec --run minilm_bm25 $OUT/fused_minilm_bm25.wsum.dev.trec \
  --run gr_bm25 $OUT/fused_gr_bm25.rrf.dev.trec > $OUT/compare.dev.json
