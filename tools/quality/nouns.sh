#!/usr/bin/env bash
# docs/quality.md, "All 82,115 noun synsets": WordNet's whole noun hierarchy at the study's coverage 0.93, then
# tools/quality/three_systems.sh (BM25, zero-shot MiniLM, the demo's generative model at 1,000 steps) on it, to see
# how noun.food c93's gap (2,573 documents) moves with corpus size.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=${DATA:-data/wordnet_nouns_c93}
OUT=${OUT:-runs/quality/nouns}
mkdir -p "$OUT"
[ -f $D/spm.model ] || {
  $PY -m gr_jax.tools.wordnet --lexfiles all --coverage 0.93 --out_dir $D > $OUT/wordnet.json
  $PY -m gr_jax.tools.make_vocab --data_dir $D --vocab_size 8000 > $OUT/vocab.json; }
DATA=$D OUT=$OUT DOCUMENT_LENGTH=64 tools/quality/three_systems.sh
