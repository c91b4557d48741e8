#!/usr/bin/env bash
# docs/quality.md, "In-domain pseudo-queries": distillation on msmarco_mini from pseudo-queries cut from its own
# passages. One sentence of at least 4 words per passage (tools/document_spans, seed 0), each labeled by zero-shot
# MiniLM's top passage (tools/distill --labels 1), beside the 177 training queries; then the teacher's rankings of
# all of them (gr_jax.infer, its index reused) and the demo's model distilled from them
# (tools/quality/demo_distill.sh, cell trie2: soft targets over the teacher's top 10, beta 2, plus every passage's
# FirstP -> its docid) at msmarco.sh's budget: 1,000 steps, valid every 250, the best state's dev once. Inputs 48
# WordPiece tokens, longer pseudo-queries cut (logged). Then the paired tests against BM25, MiniLM and the
# distillation from the training queries alone (tools/quality/msmarco.sh's gr_distilled).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
SRC=${SRC:-data/msmarco_mini_v50}
D=${DATA:-data/msmarco_mini_v50_spans}
OUT=${OUT:-runs/quality/msmarco_spans}
TEACHER=${TEACHER:-runs/quality/msmarco}   # tools/quality/msmarco.sh's runs: its minilm_zs, bm25 and gr_distilled
mkdir -p "$OUT"
[ -f $OUT/spans.tsv ] || $PY -m gr_jax.tools.document_spans --data_dir $SRC --out $OUT/spans.tsv > $OUT/spans.json
[ -f $D/distill.json ] || $PY -m gr_jax.tools.distill --data_dir $SRC --teacher_dir $TEACHER/minilm_zs \
  --pseudo_queries $OUT/spans.tsv --labels 1 --out_dir $D > $OUT/distill.json
[ -f $OUT/teacher.run.train.trec ] || $PY -m gr_jax.infer --model_dir $TEACHER/minilm_zs \
  --queries $D/queries.train.tsv --top_k 100 --output $OUT/teacher.run.train.trec 2> $OUT/teacher.run.train.log
DATA=$D OUT=$OUT TEACHER=$TEACHER/minilm_zs RANKED_RUN=$OUT/teacher.run.train.trec STEPS=1000 EVAL_EVERY=250 \
  CUT_QUERIES=True CELLS=trie2 tools/quality/demo_distill.sh
best_step() { $PY -c "import json; print(json.load(open('$1/selection.json'))['best_step'])"; }
$PY -m gr_jax.tools.compare --data_dir $SRC --split dev \
  --run spans $OUT/trie2/run.dev.$(best_step $OUT/trie2).trec \
  --run gr_distilled $TEACHER/gr_distilled/run.dev.$(best_step $TEACHER/gr_distilled).trec \
  --run bm25 $TEACHER/bm25.dev.trec --run minilm $TEACHER/minilm_zs/run.dev.0.trec > $OUT/compare.dev.json
