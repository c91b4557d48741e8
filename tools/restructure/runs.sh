#!/usr/bin/env bash
# Trains and evaluates a micro run of every head and family with the code of $REPO into $RUNS (3 steps each).
set -uo pipefail
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}; DATA=${DATA:-${TMPDIR:-/tmp}/gr_jax_restructure/data}; RUNS=${RUNS:?}; PY=$REPO/.venv/bin/python
export JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=8" GR_JAX_LOG_LEVEL=WARNING TF_CPP_MIN_LOG_LEVEL=3
mkdir -p $RUNS; cd $RUNS
MICRO="--gin.network.T5Config.num_encoder_layers=1 --gin.network.T5Config.num_decoder_layers=1 --gin.network.T5Config.emb_dim=32 --gin.network.T5Config.mlp_dim=64 --gin.network.T5Config.num_heads=2 --gin.network.T5Config.head_dim=8"
COMMON="--gin.TRAIN_STEPS=3 --gin.training.train.progress=False --gin.training.train.checkpoint_every_steps=3 --gin.BATCH_SIZE=8 --gin.training.EvalConfig.batch_size=8"
GEN="--gin_file=runs/train.gin --gin_file=models/t5_1_1/tiny.gin --gin.DATA_DIR='$DATA/d' --gin.DATASET_NAME='cmp' --gin.INPUT_LENGTH=16 --gin.TARGET_LENGTH=12 --gin.training.EvalConfig.num_beams=5 $MICRO $COMMON"
run() { name=$1; shift; echo "== $name"; $PY -m gr_jax.train "$@" --gin.MODEL_DIR="'$RUNS/$name'" > $name.log 2>&1 || { echo "FAILED $name"; tail -5 $name.log; }; }
run standard_naive $GEN
run standard_semantic $GEN --gin.DOCID_SCHEME="'semantic'"
run atomic $GEN --gin_file=decoders/atomic.gin
run pawa $GEN --gin_file=decoders/pawa.gin
run consistency $GEN --gin_file=losses/consistency.gin
run scanned $GEN --gin.network.T5Config.scan_layers=True --gin.network.T5Config.num_encoder_layers=2
run microbatched $GEN --gin.BATCH_SIZE=16 --gin.experiment.Experiment.num_microbatches=2  # 8 rows a microbatch: one per device
run ngrams $GEN --gin_file=ngrams/train.gin --gin.SPAN_WIDTH=4 --gin.SPANS_PER_PAIR=2 --gin.TARGET_LENGTH=32  # spans of 4 words
HYP="--gin_file=runs/train.gin --gin_file=ranking/ranked_lists.gin --gin_file=models/t5_1_1/tiny.gin --gin.DATA_DIR='$DATA/hyp' --gin.DATASET_NAME='hyp' --gin.INPUT_LENGTH=192 --gin.TARGET_LENGTH=32 --gin.training.EvalConfig.num_beams=4 $MICRO $COMMON"
run ranked_trie $HYP --gin_file=ranking/trie.gin
run ranked_combined $HYP --gin_file=ranking/combined.gin
run doc2query --gin_file=experiments/doc2query.gin --gin.DATA_DIR="'$DATA/d'" $MICRO $COMMON --gin.INPUT_LENGTH=16 --gin.TARGET_LENGTH=12
DENSE="--gin.DATA_DIR='$DATA/d' --gin.QUERY_LENGTH=16 --gin.DOCUMENT_LENGTH=32 $COMMON --gin.training.EvalConfig.ranking_depth=5"
run dense_t5 --gin_file=dense/t5.gin --gin_file=models/t5_1_1/tiny.gin $DENSE $MICRO
run dense_minilm --gin_file=dense/minilm.gin $DENSE
run dense_mvdr --gin_file=dense/t5.gin --gin_file=dense/mvdr.gin --gin_file=models/t5_1_1/tiny.gin $DENSE $MICRO
GDR="--gin.DATA_DIR='$DATA/d' --gin.GDR_INDEX='$DATA/gidx' --gin.QUERY_LENGTH=16 $COMMON --gin.training.EvalConfig.ranking_depth=5 --gin.CLUSTERS_RECALLED=3 $MICRO"
run gdr_t5 --gin_file=gdr/train.gin --gin_file=models/t5_1_1/tiny.gin $GDR
run gdr_minilm --gin_file=gdr/minilm.gin --gin_file=models/t5_1_1/tiny.gin $GDR
run gdr_pawa --gin_file=gdr/train.gin --gin_file=models/t5_1_1/tiny.gin --gin_file=decoders/pawa.gin $GDR
echo done
