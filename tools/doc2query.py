"""doc2query-T5 with our trainer: learn document -> query on a data dir's labeled pairs, then sample synthetic
queries for every document (Nogueira & Lin's docTTTTTquery; the study's D2Q representation and its
"BM25 w/ doc2query-T5" baseline).

    python -m gr_jax.tools.doc2query train --data_dir DIR --model_dir MD [--steps N] [--gin_file F]
        [--gin.KEY=VALUE ...]
    python -m gr_jax.tools.doc2query generate --data_dir DIR --model_dir MD --num_queries 20 --out DIR/d2q.tsv

`train` runs `gr_jax.training.train` on the seqio task `{dataset}.doc2query` (`gr_jax.tasks.doc2query`) with
`gin_configs/experiments/doc2query.gin` (tiny T5.1.1 by default; a later `--gin_file=models/t5_1_1/base.gin`
changes the size), then reports the teacher-forced loss on the dev pairs. `generate` rebuilds the model from
`MD/config.gin`, samples `--num_queries` queries per document with top-k sampling (k=10, temperature 1.0, as the
study) in batched, jitted decoding, and writes one line per document in collection order, its queries separated by
tabs: the docTTTTTquery layout that `gr_jax.tools.bm25 --d2q_file` and the D2Q task read. Generation is resumable: lines
are appended and flushed per batch, and a restart checks the partial file and continues after its last complete
line. Each batch's random key is derived from the seed and the index of its first document, so a resumed run
with the same `--batch_size` writes exactly what an uninterrupted one would.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import pathlib
import re
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import gin
import jax
import numpy as np
import tqdm

from gr_jax import entry_point
from gr_jax import gin_utils
from gr_jax import partitioning
from gr_jax.data.readers import DataFormatError, open_dataset, read_lines
from gr_jax.experiment import Built, Doc2QueryData, Experiment
from gr_jax.run_dir import RunDir, write_json
from gr_jax.vocabulary import EOS_ID, encode_inputs

logger = logging.getLogger(__name__)

EXPERIMENT_GIN = "experiments/doc2query.gin"
METADATA_SUFFIX = ".meta.json"
# Sampling settings a partial file must share with a resumed run (anything else would mix two distributions).
_RESUME_KEYS = ("model_dir", "checkpoint_step", "collection", "documents", "num_queries", "top_k", "temperature",
                "seed", "max_query_length")


def default_dataset_name(data_dir: str | os.PathLike) -> str:
    """A seqio-safe dataset name from a data dir's folder name (`data/msmarco-100k` -> `msmarco_100k`)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", pathlib.Path(data_dir).resolve().name)
    return name or "dataset"


# --- Training -----------------------------------------------------------------------------------------------


def validation_loss(*, experiment: Experiment, step: Optional[int] = None) -> dict[str, float]:
    """Teacher-forced loss and token accuracy of a checkpoint on the task's 'validation' pairs (dev queries)."""
    import seqio

    from gr_jax.data import pipeline

    built = experiment.build()
    params, step = built.restore_params(step)
    dataset = experiment.dataset
    if "validation" not in seqio.get_mixture_or_task(dataset.mixture_name).splits:
        return {}
    batches = pipeline.eval_batches(mixture_or_task_name=dataset.mixture_name, batch_size=experiment.batch_size,
                                    input_length=dataset.input_length, target_length=dataset.target_length,
                                    split="validation")
    features = ({k: v for k, v in batch.items() if k != pipeline.EXAMPLE_MASK} for batch in batches)
    metrics = built.trainer.evaluate_loss(params, features)
    metrics["perplexity"] = math.exp(min(metrics["loss"], 50.0))
    metrics["step"] = step
    return metrics


def train_main(argv: Sequence[str]) -> dict[str, Any]:
    """`train` subcommand: gin = experiments/doc2query.gin, then `--gin_file`s, then the data/model bindings."""
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.doc2query train",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="data dir with training queries, qrels and spm.model")
    parser.add_argument("--model_dir", required=True, help="checkpoints, config.gin and metrics go here")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the gin's TRAIN_STEPS)")
    parser.add_argument("--name", default=None, help="dataset name in task names (default: the data dir's name)")
    args, rest = parser.parse_known_args(argv)
    gin_args, gin_files, bindings = gin_utils.parse_args(rest, description=__doc__)
    bindings = [f"DATA_DIR = {str(pathlib.Path(args.data_dir).resolve())!r}",
                f"MODEL_DIR = {str(pathlib.Path(args.model_dir).resolve())!r}",
                f"DATASET_NAME = {args.name or default_dataset_name(args.data_dir)!r}",
                *([f"TRAIN_STEPS = {args.steps}"] if args.steps is not None else []), *bindings]
    gin.clear_config()
    gin_utils.parse_gin(gin_files=[EXPERIMENT_GIN, *gin_files], bindings=bindings,
                        search_paths=gin_args.gin_search_path)
    gin_utils.initialize_distributed()
    from gr_jax import training  # TensorFlow: after `main`'s quiet start-up

    final = gin.get_configurable(training.train)(gin_config_str=gin.config_str())
    experiment = gin.get_configurable(Experiment)()
    validation = validation_loss(experiment=experiment)
    if validation:
        write_json(RunDir.of(experiment.model_dir).doc2query_validation(validation["step"]), validation)
    summary = {"model_dir": experiment.model_dir, **final, **{f"validation/{k}": v for k, v in validation.items()}}
    print(json.dumps(summary), flush=True)
    return summary


# --- Sampling -----------------------------------------------------------------------------------------------


def clean_query(text: str) -> str:
    """One line of plain words: tabs and line breaks would break the file layout."""
    return " ".join(text.split())


@dataclasses.dataclass
class SampleCounts:
    """Per-run sample statistics: empty samples are left out of the file, cut ones are kept as decoded."""
    queries: int = 0
    empty: int = 0  # EOS first, or only whitespace: nothing to write
    unfinished: int = 0  # no EOS within max_query_length: the query is cut


class QuerySampler:
    """Batched, jitted top-k sampling of `num_queries` queries per document with a restored model.

    Each document's tokens (cut to the model's input_length, EOS appended, as in training) are repeated
    `num_queries` times, so one call of `EncoderDecoderModel.sample_batch` decodes
    `documents_per_batch * num_queries` rows, split over the mesh's 'data' axis. `documents_per_batch` is
    rounded up so that this row count divides evenly; a short last batch is padded with empty documents.
    Single process (as the retrieval evaluator): the batch is put on the mesh from this host's memory.
    """

    def __init__(self, *, built: Built, params: Any, checkpoint_step: int, num_queries: int,
                 documents_per_batch: int, top_k: int = 10, temperature: float = 1.0, seed: int = 0,
                 max_query_length: Optional[int] = None):
        for arg, value in (("num_queries", num_queries), ("documents_per_batch", documents_per_batch),
                           ("top_k", top_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive integer, got {value!r}")
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.built = built
        self.params = params
        self.checkpoint_step = checkpoint_step
        self.num_queries = num_queries
        self.top_k = top_k
        self.temperature = float(temperature)
        self.seed = seed
        self.input_length = built.experiment.dataset.input_length
        self.max_query_length = max_query_length or built.experiment.dataset.target_length
        data_size = built.mesh.shape[partitioning.DATA_AXIS]
        multiple = data_size // math.gcd(num_queries, data_size)
        self.documents_per_batch = -(-documents_per_batch // multiple) * multiple
        self._rows_sharding = partitioning.batch_sharding(built.mesh)
        self._sample = jax.jit(self._sample_impl,
                               in_shardings=(built.trainer.state_shardings.params, self._rows_sharding, None),
                               out_shardings=self._rows_sharding)

    def _sample_impl(self, params, tokens: jax.Array, rng: jax.Array) -> jax.Array:
        """tokens: int32[documents * num_queries, input_length] -> int32[same rows, max_query_length]."""
        return self.built.model.sample_batch(params, tokens, rng=rng, max_decode_len=self.max_query_length,
                                             top_k=self.top_k, temperature=self.temperature).sequences

    def sample_tokens(self, texts: Sequence[str], *, first_document: int) -> np.ndarray:
        """int32[len(texts), num_queries, max_query_length]: sampled query tokens, EOS included, PAD after.

        `first_document`: the index of `texts[0]` in the collection; with the seed it fixes the batch's key.
        """
        if not 0 < len(texts) <= self.documents_per_batch:
            raise ValueError(f"sample takes 1 to {self.documents_per_batch} documents, got {len(texts)}")
        tokens = np.zeros((self.documents_per_batch, self.input_length), np.int32)
        tokens[:len(texts)] = encode_inputs(list(texts), vocabulary=self.built.vocabulary,
                                             input_length=self.input_length)
        rows = np.repeat(tokens, self.num_queries, axis=0)  # document d -> rows d * num_queries + [0, num_queries)
        rng = jax.random.fold_in(jax.random.PRNGKey(self.seed), first_document)
        with partitioning.partitioning_context(mesh=self.built.mesh, rules=self.built.trainer.rules):
            sequences = jax.device_get(self._sample(self.params, jax.device_put(rows, self._rows_sharding), rng))
        return sequences.reshape(self.documents_per_batch, self.num_queries, -1)[:len(texts)]

    def sample(self, texts: Sequence[str], *, first_document: int, counts: Optional[SampleCounts] = None
               ) -> list[list[str]]:
        """The queries of each text: at most `num_queries`, empty samples left out (and counted in `counts`)."""
        counts = counts if counts is not None else SampleCounts()
        out = []
        for samples in self.sample_tokens(texts, first_document=first_document):
            queries = []
            for row in samples:
                counts.unfinished += int(EOS_ID not in row)
                query = clean_query(self.built.vocabulary.decode(row.tolist()))
                if query:
                    queries.append(query)
                else:
                    counts.empty += 1
            counts.queries += len(queries)
            out.append(queries)
        return out


def restore_sampler(*, model_dir: str | os.PathLike, num_queries: int, documents_per_batch: int, top_k: int = 10,
                    temperature: float = 1.0, seed: int = 0, max_query_length: Optional[int] = None,
                    step: Optional[int] = None, gin_args: Sequence[str] = ()) -> QuerySampler:
    """A QuerySampler of the checkpoint in `model_dir` (latest, or `step`), rebuilt from `model_dir/config.gin`
    with `gin_args` (`--gin.KEY=VALUE`, `--gin_file=...`) applied on top."""
    gin_utils.parse_run_config(model_dir, gin_args=gin_args, missing=f"train first (python -m gr_jax.tools.doc2query "
                               f"train --data_dir DIR --model_dir {model_dir})")
    experiment = gin.get_configurable(Experiment)()
    if not isinstance(experiment.dataset, Doc2QueryData):
        raise ValueError(f"{RunDir.of(model_dir).config} trains {experiment.dataset.mixture_name!r}, not a "
                         f"doc2query task: {model_dir} is a retrieval model")
    built = experiment.build()
    params, checkpoint_step = built.restore_params(step)
    return QuerySampler(built=built, params=params, checkpoint_step=checkpoint_step,
                        num_queries=num_queries, documents_per_batch=documents_per_batch, top_k=top_k,
                        temperature=temperature, seed=seed, max_query_length=max_query_length)


# --- The resumable expansion file ---------------------------------------------------------------------------


def metadata_path(out: str | os.PathLike) -> pathlib.Path:
    out = pathlib.Path(out)
    return out.with_name(out.name + METADATA_SUFFIX)


def check_partial_file(path: str | os.PathLike, *, num_documents: int, num_queries: int) -> int:
    """Verifies a partly written expansion file and returns its number of complete lines.

    A last line without its line break (a run killed mid-write) is cut off the file, with a warning, and
    written again. More lines than documents, more than `num_queries` queries on a line, or an empty query
    between tabs raise DataFormatError naming path:line.
    """
    path = pathlib.Path(path)
    with open(path, "rb") as f:
        data = f.read()
    complete = data.rfind(b"\n") + 1
    if complete < len(data):
        logger.warning("%s: dropping an incomplete last line (%d bytes) left by an interrupted run; it is "
                       "generated again", path, len(data) - complete)
        with open(path, "r+b") as f:
            f.truncate(complete)
    lines = 0
    for lines, line in read_lines(path):
        if lines > num_documents:
            raise DataFormatError.at(path, lines, f"more lines than the {num_documents} documents of the collection")
        queries = line.split("\t") if line else []
        if len(queries) > num_queries:
            raise DataFormatError.at(path, lines, f"{len(queries)} queries; this run samples {num_queries} per "
                                                  "document")
        if any(not query.strip() for query in queries):
            raise DataFormatError.at(path, lines, "empty query between tabs")
    return lines


def _check_metadata(out: pathlib.Path, metadata: dict[str, Any]) -> None:
    """Refuses to append to a file written by another model, checkpoint, collection or sampling setting."""
    meta_path = metadata_path(out)
    if not meta_path.is_file():
        raise FileExistsError(f"{out} exists but {meta_path} does not: it was not written by gr_jax.tools.doc2query "
                              "generate, so it cannot be resumed. Move it away or choose another --out.")
    previous = json.loads(meta_path.read_text())
    different = {key: (previous.get(key), metadata[key]) for key in _RESUME_KEYS if previous.get(key) != metadata[key]}
    if different:
        detail = ", ".join(f"{key}: file {old!r} vs now {new!r}" for key, (old, new) in different.items())
        raise ValueError(f"{out} was written with other settings ({detail}); resuming would mix them. Pass the "
                         "same settings, or another --out.")
    if previous.get("documents_per_batch") != metadata["documents_per_batch"]:
        logger.warning("%s was started with %s documents per batch, now %s: the new lines are equally valid "
                       "samples but differ from those of an uninterrupted run", out,
                       previous.get("documents_per_batch"), metadata["documents_per_batch"])


@dataclasses.dataclass(frozen=True)
class GenerationSummary:
    out: str
    documents: int  # in the collection
    skipped: int  # already in the file when this run started
    written: int  # lines written by this run
    queries: int
    empty_samples: int
    unfinished_samples: int
    seconds: float
    documents_per_second: float


def _batches(documents: Iterator[tuple[str, str]], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for _, text in documents:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def generate(*, sampler: QuerySampler, data_dir: str | os.PathLike, out: str | os.PathLike,
             max_documents: Optional[int] = None, progress: bool = True) -> GenerationSummary:
    """Appends the queries of every document of `data_dir` not yet in `out` (see the module docstring).

    max_documents: stop once the file holds this many documents (a partial run, e.g. to look at samples).
    """
    dataset = open_dataset(data_dir)
    out = pathlib.Path(out)
    num_documents = sum(1 for _ in dataset.collection())
    target = num_documents if max_documents is None else min(max_documents, num_documents)
    metadata = {
        "model_dir": str(pathlib.Path(sampler.built.experiment.model_dir).resolve()),
        "checkpoint_step": sampler.checkpoint_step,
        "collection": str(dataset.collection_path.resolve()), "documents": num_documents,
        "num_queries": sampler.num_queries, "top_k": sampler.top_k, "temperature": sampler.temperature,
        "seed": sampler.seed, "max_query_length": sampler.max_query_length,
        "documents_per_batch": sampler.documents_per_batch,
    }
    if out.exists():
        _check_metadata(out, metadata)
        done = check_partial_file(out, num_documents=num_documents, num_queries=sampler.num_queries)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        metadata_path(out).write_text(json.dumps(metadata, indent=1))
        out.touch()
        done = 0
    if done:
        logger.info("%s: %d of %d documents already written; resuming after them", out, done, num_documents)
    counts = SampleCounts()
    start = time.perf_counter()
    written = 0
    documents = dataset.collection()
    for _ in range(done):
        next(documents)
    bar = tqdm.tqdm(total=target, initial=min(done, target), desc="doc2query", unit="doc", disable=not progress)
    with open(out, "a", encoding="utf-8", newline="\n") as f:
        index = done
        for texts in _batches(documents, sampler.documents_per_batch):
            texts = texts[:max(0, target - index)]
            if not texts:
                break
            queries = sampler.sample(texts, first_document=index, counts=counts)
            f.write("".join("\t".join(q) + "\n" for q in queries))
            f.flush()
            os.fsync(f.fileno())
            index += len(texts)
            written += len(texts)
            bar.update(len(texts))
            bar.set_postfix(docs_per_s=f"{written / max(time.perf_counter() - start, 1e-9):.1f}")
    bar.close()
    seconds = time.perf_counter() - start
    return GenerationSummary(out=str(out), documents=num_documents, skipped=done, written=written,
                             queries=counts.queries, empty_samples=counts.empty,
                             unfinished_samples=counts.unfinished, seconds=seconds,
                             documents_per_second=written / seconds if written else 0.0)


def generate_main(argv: Sequence[str]) -> GenerationSummary:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.doc2query generate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", required=True, help="a model dir written by `gr_jax.tools.doc2query train`")
    parser.add_argument("--data_dir", default=None, help="the collection to expand (default: the model's data dir)")
    parser.add_argument("--out", default=None, help="output file (default: DATA_DIR/d2q.tsv)")
    parser.add_argument("--num_queries", type=int, default=20, help="queries sampled per document")
    parser.add_argument("--top_k", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=16, help="documents per decoding batch")
    parser.add_argument("--max_query_length", type=int, default=None,
                        help="decoded tokens per query, EOS included (default: the model's TARGET_LENGTH)")
    parser.add_argument("--max_documents", type=int, default=None, help="stop after this many documents")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    args, gin_args = parser.parse_known_args(argv)
    sampler = restore_sampler(model_dir=args.model_dir, gin_args=gin_args, step=args.step,
                              num_queries=args.num_queries, documents_per_batch=args.batch_size,
                              top_k=args.top_k, temperature=args.temperature, seed=args.seed,
                              max_query_length=args.max_query_length)
    data_dir = args.data_dir or sampler.built.experiment.dataset.data_dir
    summary = generate(sampler=sampler, data_dir=data_dir, out=args.out or pathlib.Path(data_dir) / "d2q.tsv",
                       max_documents=args.max_documents, progress=sys.stderr.isatty())
    print(json.dumps(dataclasses.asdict(summary)), flush=True)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> Any:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": train_main, "generate": generate_main}
    if not argv or argv[0] not in commands:
        raise SystemExit(f"usage: python -m gr_jax.tools.doc2query {{{','.join(commands)}}} [args] "
                         "(see --help of each)")
    entry_point.setup()
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
