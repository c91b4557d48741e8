#!/usr/bin/env bash
# The reliability probes of docs/reliability.md: each runs a command as a new user or an operator would, on a copy
# of the tests' retrieval fixture and a micro T5.1.1, and prints a markdown row `| probe | command | observed |`
# whose observed column is what the command printed last (its `error:` line, or the line that shows the outcome).
# Usage: tools/reliability/probes.sh [OUT_DIR]  (root also runs the full-disk probe on a 160 KiB tmpfs)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd); OUT=${1:-${TMPDIR:-/tmp}/gr_jax_probes}; PY=$REPO/.venv/bin/python
export JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3
unset GR_JAX_TRACEBACK GR_JAX_LOG_LEVEL
rm -rf "$OUT" && mkdir -p "$OUT" && cd "$OUT"
cp -r "$REPO/tests/fixtures/tasks" d && mv d/passages.tsv d/collection.tsv && mv d/judgements.train.tsv d/qrels.train.tsv
mv d/judgements.dev.tsv d/qrels.dev.tsv
$PY -m gr_jax.tools.make_vocab --data_dir d --vocab_size 320 > /dev/null 2>&1
MICRO="--gin_file=runs/train.gin --gin_file=models/t5_1_1/tiny.gin --gin.DATASET_NAME='probe' --gin.INPUT_LENGTH=16
 --gin.TARGET_LENGTH=12 --gin.BATCH_SIZE=8 --gin.training.EvalConfig.num_beams=5 --gin.training.EvalConfig.batch_size=8
 --gin.network.T5Config.num_encoder_layers=1 --gin.network.T5Config.num_decoder_layers=1 --gin.network.T5Config.emb_dim=32
 --gin.network.T5Config.mlp_dim=64 --gin.network.T5Config.num_heads=2 --gin.network.T5Config.head_dim=8"
MICRO=$(echo $MICRO)

row() {  # row PROBE COMMAND...: runs COMMAND in bash, prints the row with its last non-empty output line
  local probe=$1; shift
  local observed
  observed=$(bash -c "$*" 2>&1 | grep -v '^\s*$' | tail -1 | cut -c1-400)
  local command
  command=$(echo "$*" | sed "s|$PY|python|g; s|$OUT/||g; s|$MICRO|\$MICRO|g")
  printf '| %s | `%s` | `%s` |\n' "$probe" "${command//|/\\|}" "${observed//|/\\|}"
}
train() { echo "$PY -m gr_jax.train $MICRO --gin.DATA_DIR=\"'$1'\" --gin.MODEL_DIR=\"'$2'\" ${*:3}"; }

echo "| probe | command | observed |"
echo "|---|---|---|"
# Answer fast: --help against python -c pass, the two alternated in one run.
cat > help_ratio.py <<EOF
import subprocess, sys, time
def clock(args):
    start = time.perf_counter(); subprocess.run([sys.executable, *args], capture_output=True); return time.perf_counter() - start
help_, bad, base = [], [], []
for _ in range(3):
    help_.append(clock(["-m", "gr_jax.train", "--help"])); bad.append(clock(["-m", "gr_jax.train", "--no_such_flag"]))
    base.append(clock(["-c", "pass"]))
print(f"--help {min(help_) / min(base):.1f}x and a bad flag {min(bad) / min(base):.1f}x python -c pass "
      f"(best of 3, alternated; python -c pass {min(base):.2f} s here)")
EOF
row "--help and a bad flag" "$PY help_ratio.py"
row "TRAIN_STEPS=-5" "$(train d runs/neg --gin.TRAIN_STEPS=-5)"
row "TRAIN_STEPS=abc" "$(train d runs/abc --gin.TRAIN_STEPS=abc)"
row "misspelt macro" "$(train d runs/typo --gin.TRAIN_STEPZ=5)"
row "eval of a missing config" "$PY -m gr_jax.eval --gin_file=runs/typo/config.gin"
cp -r d ws && sed -i '1s/^101\t/a 6\t/' ws/collection.tsv
row "id with whitespace" "$(train ws runs/ws --gin.TRAIN_STEPS=1)"
cp -r d eq && sed -i '1s/\t.*/\t /' eq/queries.train.tsv
row "empty query (training)" "$(train eq runs/eq --gin.TRAIN_STEPS=1)"
row "empty query (BM25)" "$PY -m gr_jax.tools.bm25 --data_dir eq --split train"
cp -r d mq && sed -i '1d' mq/queries.dev.tsv
row "judged query missing from the queries file (BM25)" "$PY -m gr_jax.tools.bm25 --data_dir mq --split dev 2>&1 | grep -m1 'queries'"
# A finished micro run: its console at the default level, its final metrics at WARNING, its files.
bash -c "$(train d runs/ok --gin.TRAIN_STEPS=4 --gin.training.train.checkpoint_every_steps=2)" > ok.out 2> ok.err
row "a 4-step run at the default level" "echo \"console: \$(tr '\\r' '\\n' < ok.err | grep -v '^\\s*\$' | grep -vc '^train:\\|^ranking:') lines besides the progress bars; runs/ok/log.txt: \$(wc -l < runs/ok/log.txt) lines\""
row "final metrics at GR_JAX_LOG_LEVEL=WARNING (stdout)" "GR_JAX_LOG_LEVEL=WARNING $(train d runs/ok --gin.TRAIN_STEPS=4) 2>/dev/null | cut -c1-120"
row "rerunning a finished run keeps its training metrics" "$PY -c \"import json; m = json.load(open('runs/ok/final_metrics.json')); print(sorted(k for k in m if k.startswith('train/'))[:3])\""
row "TREC runs follow the umask (022)" "umask 022; stat -c '%a %n' runs/ok/run.dev.4.trec"
row "Recall@k from 5 beams" "$PY -c \"import json; print([k for k in sorted(json.load(open('runs/ok/final_metrics.json'))) if 'Recall' in k])\"; grep -o 'WARNING gr_jax.evaluation: Recall@10.*' ok.err"
row "blank search query" "$PY -m gr_jax.cli search --model_dir runs/ok '   '"
row "blank line on search's standard input" "printf 'bread\\n   \\n' | $PY -m gr_jax.cli search --model_dir runs/ok 2>&1 | grep blank"
row "internal error: non-finite loss" "$(train d runs/nan --gin.TRAIN_STEPS=3 --gin.LEARNING_RATE=1e30)"
# A BEIR-layout set with train and test qrels only (no dev), as a new user meets it.
cp -r "$REPO/tests/fixtures/beir" beir && $PY -m gr_jax.tools.make_vocab --data_dir beir --vocab_size 320 > /dev/null 2>&1
row "BEIR set without dev: train" "$(train beir runs/beir --gin.TRAIN_STEPS=1)"
row "dense_index of a directory that is not a run" "$PY -m gr_jax.tools.dense_index --model_dir runs/no_such_run"
row "WordNet verbs" "$PY -m gr_jax.tools.wordnet --out_dir wn_motion --lexfiles verb.motion | $PY -c 'import json, sys; s = json.load(sys.stdin); print({k: s[k] for k in (\"documents\", \"train_queries\", \"dev_queries\")})'; head -1 wn_motion/collection.tsv | cut -c1-80"
row "checkpoint cadence by default" "grep -h checkpoint_every runs/ok/config.gin | tr '\\n' ' '"
# Damaged checkpoints: the newest step of a 4-step run (steps 2 and 4 kept) flipped, truncated or deleted.
for damage in flip truncate delete; do
  rm -rf runs/$damage && cp -r runs/ok runs/$damage
  file=$(ls -S runs/$damage/checkpoints/4/state/d/* | head -1)
  case $damage in
    flip) $PY -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2:len(b) // 2 + 64] = bytes(x ^ 0xFF for x in b[len(b) // 2:len(b) // 2 + 64]); open(p, 'wb').write(b)" "$file" ;;
    truncate) truncate -s $(($(stat -c %s "$file") / 2)) "$file" ;;
    delete) rm "$file" ;;
  esac
  row "checkpoint step 4 damaged ($damage): eval" "$PY -m gr_jax.eval --gin_file=runs/$damage/config.gin --gin.MODEL_DIR=\"'runs/$damage'\""
  row "checkpoint step 4 damaged ($damage): resume to step 6" "$(train d runs/$damage --gin.TRAIN_STEPS=6 --gin.training.train.checkpoint_every_steps=2) 2>&1 | grep -m1 -i 'damaged\\|intact\\|falling back'"
done
if [ "$(id -u)" = 0 ] && mkdir -p full && mount -t tmpfs -o size=160k tmpfs full 2>/dev/null; then
  row "full disk (160 KiB tmpfs)" "$(train d full/run --gin.TRAIN_STEPS=2 --gin.training.train.checkpoint_every_steps=1) 2> full.err; echo \"\$(tr '\\r' '\\n' < full.err | grep -v '^\\s*\$' | grep -vc '^train:') lines on stderr besides the progress bar, the last: \$(tail -1 full.err)\""
  umount full
fi
