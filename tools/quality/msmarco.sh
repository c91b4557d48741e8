#!/usr/bin/env bash
# docs/quality.md, "msmarco_mini": msmarco_mini ships no valid split, so 50 of its 227 training queries become one
# (tools/valid_split; the collection and dev are links to the shared files), then tools/quality/three_systems.sh
# (BM25, zero-shot MiniLM at 256 document tokens, the demo's generative model at 1,000 steps) on it, then
# tools/quality/distilled_system.sh (the same model distilled from MiniLM's rankings of the training queries).
# SYSTEMS: "three distilled" (default), or either alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
D=${DATA:-data/msmarco_mini_v50}
OUT=${OUT:-runs/quality/msmarco}
mkdir -p "$OUT"
[ -f $D/spm.model ] || {
  $PY -m gr_jax.tools.valid_split --data_dir ../shared/data/msmarco_mini --out_dir $D --queries 50 > $OUT/valid_split.json
  $PY -m gr_jax.tools.make_vocab --data_dir $D --vocab_size 8000 > $OUT/vocab.json; }
for system in ${SYSTEMS:-three distilled}; do
  case $system in
    three) DATA=$D OUT=$OUT DOCUMENT_LENGTH=256 tools/quality/three_systems.sh ;;
    distilled) DATA=$D OUT=$OUT DOCUMENT_LENGTH=256 tools/quality/distilled_system.sh ;;
    *) echo "unknown system $system" >&2; exit 1 ;;
  esac
done
