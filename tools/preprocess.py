"""Preprocessing of a run's training examples into ArrayRecord files (`gr_jax.data.records`), from the seqio tasks
that define them, once, before training reads them without TensorFlow:

    python -m gr_jax.tools.preprocess --gin_file=runs/train.gin ... --gin_file=data/preprocessed.gin \
        --gin.PREPROCESSED_DIR=DIR [--gin.preprocess.preprocess.shard_index=i --gin.preprocess.preprocess.num_shards=n]

takes the run's own gin (the experiment's files with data/preprocessed.gin), so the files hold exactly the examples
of the run's mixture: one unshuffled pass over each of its tasks, with its mixing rate. With several processes
(`jax.distributed`) or `shard_index`/`num_shards` given, each writes its shard of every task; training reads the
directory once all shards are there. Prints one JSON line: examples written, seconds, examples per second.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Optional

import jax

from gr_jax import entry_point
from gr_jax.data import records
from gr_jax.data.fingerprint import input_fingerprint
from gr_jax.vocabulary import vocabulary_file

logger = logging.getLogger(__name__)


def preprocess(*, experiment: Any, shard_index: Optional[int] = None, num_shards: Optional[int] = None
               ) -> dict[str, Any]:
    """Writes shard `shard_index` of `num_shards` (default: this process's of all) of `experiment.dataset`'s examples
    (a `records.PreprocessedData`; `experiment` a generative family) into its directory. Returns the report."""
    from gr_jax.data import pipeline  # TensorFlow: imported after the entry point's quiet start-up
    data = experiment.dataset
    if not isinstance(data, records.PreprocessedData):
        raise ValueError(f"the run's dataset is {type(data).__name__}, not preprocessed data: include "
                         "data/preprocessed.gin after the experiment's gin files")
    shard_index = jax.process_index() if shard_index is None else shard_index
    num_shards = jax.process_count() if num_shards is None else num_shards
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
    # One pass: the tasks' in-memory caches would hold the whole corpus for nothing.
    source = dataclasses.replace(data.source, cache_in_memory=False)
    input_vocabulary_dir = experiment.input_vocabulary_dir()
    docid_space = source.docid_space()
    source.register(docid_space, input_vocabulary_dir=input_vocabulary_dir)
    mixture = source.mixture_name
    fingerprint = input_fingerprint(vocabulary_file=vocabulary_file(source), docid_space=docid_space,
                                    input_vocabulary_dir=input_vocabulary_dir)
    description = {**records.source_description(data.source), "mixture": mixture, "input_fingerprint": fingerprint}
    tasks = [(task, rate, pipeline.task_examples(task, input_length=source.input_length,
                                                 target_length=source.target_length, shard_index=shard_index,
                                                 num_shards=num_shards))
             for task, rate in pipeline.task_rates(mixture)]
    start = time.perf_counter()
    manifest = records.write_part(directory=data.directory, description=description, tasks=tasks,
                                  shard_index=shard_index, num_shards=num_shards)
    seconds = time.perf_counter() - start
    examples = sum(task["num_examples"] for task in manifest["tasks"])
    logger.info("%s: %d examples of %s (shard %d of %d) in %.1f s", data.directory, examples, mixture, shard_index,
                num_shards, seconds)
    return {"directory": data.directory, "mixture": mixture, "shard_index": shard_index, "num_shards": num_shards,
            "examples": examples, "tasks": {task["task"]: task["num_examples"] for task in manifest["tasks"]},
            "seconds": round(seconds, 3), "examples_per_second": round(examples / max(seconds, 1e-9), 1)}


def _configurable():
    from gr_jax.tools import preprocess as module  # the function runs/preprocess.gin binds, not __main__'s copy
    return module.preprocess


def main(argv=None) -> None:
    entry_point.run_configured(argv, description=__doc__, gin_file="runs/preprocess.gin", function=_configurable)


if __name__ == "__main__":
    main()
