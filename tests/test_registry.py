"""The seqio registry over every dataset x study row x docid scheme: each combination is listed and builds a batch.

Two fixture datasets: the MS MARCO-layout corpus of tests/fixtures/tasks/ with its per-passage `d2q.tsv`, and
the BEIR corpus of tests/fixtures/beir/ with a `pid \\t query` D2Q file. The semantic schemes read the token
tables `python -m gr_jax.tools.semantic_ids` writes; here they are written by hand from fixed semantic ids
(tests/fixtures/tasks/semantic_ids.tsv, a rule for BEIR) following its documented token mapping, so neither
MiniLM nor k-means runs.
"""
import itertools
import logging
import os
import pathlib
import shutil
import types

import numpy as np
import pytest
import seqio
import sentencepiece as spm

from gr_jax import tasks
from gr_jax.data import pipeline
from gr_jax.data.readers import open_dataset, read_beir_corpus, read_collection
from gr_jax.docids import DocidTable, load_docid_table
from gr_jax.vocabulary import EOS_ID, train_sentencepiece

from conftest import FIXTURES

SCHEMES = ("naive", "atomic", "semantic", "semantic2d")
DATASETS = ("toy", "beir")
INPUT_LENGTH, TARGET_LENGTH = 16, 12
# semantic ids: k=10 clusters per level (one digit each), leaves of at most c=100 (two digits).
LEVEL_WIDTH, LEAF_WIDTH, BASE_2D = 1, 2, 100


def _semantic_ids(dataset: str, docids: list[str]) -> dict[str, list[int]]:
    """docid -> cluster digits then leaf position."""
    if dataset == "toy":
        lines = (FIXTURES / "tasks" / "semantic_ids.tsv").read_text().splitlines()
        return {docid: [int(v) for v in code.split()] for docid, code in (line.split("\t") for line in lines)}
    return {docid: [i // 2, i % 2] for i, docid in enumerate(docids)}  # pairs of documents share a cluster


def _semantic_tokens(code: list[int], sp: spm.SentencePieceProcessor) -> list[int]:
    """gr_jax.tools.semantic_ids' "semantic" mapping: every digit as the vocabulary's digit piece, then EOS."""
    digits = "".join(str(v).zfill(LEVEL_WIDTH) for v in code[:-1]) + str(code[-1]).zfill(LEAF_WIDTH)
    return [sp.piece_to_id(d) for d in digits] + [EOS_ID]


def _semantic_2d_tokens(code: list[int], vocab_size: int) -> list[int]:
    """gr_jax.tools.semantic_ids' "semantic2d" mapping: value v at position p is token vocab_size + p * base + v."""
    return [vocab_size + position * BASE_2D + value for position, value in enumerate(code)] + [EOS_ID]


def _write_table(path: pathlib.Path, rows: dict[str, list[int]]) -> None:
    """The `docid \\t token ids` file format of DocidTable.save, written by hand."""
    path.write_text("".join(f"{docid}\t{' '.join(map(str, tokens))}\n" for docid, tokens in rows.items()))


def _write_prebuilt_tables(data_dir: pathlib.Path, docids: list[str]) -> dict[str, dict[str, list[int]]]:
    sp = spm.SentencePieceProcessor(model_file=str(data_dir / "spm.model"))
    ids = _semantic_ids(data_dir.name, docids)
    tables = {"semantic": {d: _semantic_tokens(ids[d], sp) for d in docids},
              "semantic2d": {d: _semantic_2d_tokens(ids[d], sp.get_piece_size()) for d in docids}}
    for scheme, rows in tables.items():
        _write_table(data_dir / f"docids.{scheme}.tsv", rows)
    return tables


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Both datasets with one vocabulary, their D2Q files and the prebuilt semantic tables."""
    root = tmp_path_factory.mktemp("registry")
    toy, beir = root / "toy", root / "beir"
    shutil.copytree(FIXTURES / "tasks", toy)
    shutil.copytree(FIXTURES / "beir", beir)
    texts = [t for _, t in read_collection(toy / "collection.tsv")] + [t for _, t in read_beir_corpus(
        beir / "corpus.jsonl")]
    vocab = train_sentencepiece(texts=texts, model_path=toy / "spm.model", vocab_size=320)
    shutil.copy(vocab, beir / "spm.model")
    beir_docids = [docid for docid, _ in read_beir_corpus(beir / "corpus.jsonl")]
    (beir / "d2q.tsv").write_text("doc1\twhat is cheddar\ndoc1\tenglish cheese\ndoc4\ttallest mountain\n")
    for data_dir, docids in ((toy, [d for d, _ in read_collection(toy / "collection.tsv")]), (beir, beir_docids)):
        _write_prebuilt_tables(data_dir, docids)
    return {"toy": toy, "beir": beir}


def _register(*, name, data_dir, docid_scheme="naive", input_length=64, target_length=16, **kwargs):
    """register_dataset with the docid space a run would build for these lengths; returns (names, space)."""
    space = tasks.load_docid_space(data_dir=data_dir, docid_scheme=docid_scheme, input_length=input_length,
                                   target_length=target_length)
    return tasks.register_dataset(name=name, data_dir=data_dir, docid_space=space, input_length=input_length,
                                  target_length=target_length, **kwargs), space


@pytest.fixture(scope="module")
def registry(data_dirs):
    """Every dataset registered under every scheme: {(dataset, scheme): the names register_dataset returned}, and
    the docid spaces they were registered with."""
    names, spaces = {}, {}
    for dataset, scheme in itertools.product(DATASETS, SCHEMES):
        names[dataset, scheme], spaces[dataset, scheme] = _register(
            name=dataset, data_dir=data_dirs[dataset], docid_scheme=scheme, input_length=INPUT_LENGTH,
            target_length=TARGET_LENGTH)
    yield types.SimpleNamespace(names=names, spaces=spaces)
    for dataset, scheme in names:
        tasks.unregister_dataset(name=dataset, docid_scheme=scheme)


def test_the_registry_lists_every_dataset_row_and_scheme(registry):
    task_names, mixture_names = set(seqio.TaskRegistry.names()), set(seqio.MixtureRegistry.names())
    for dataset, scheme in itertools.product(DATASETS, SCHEMES):
        expected_tasks = {f"{dataset}.{r}.{scheme}" for r in tasks.REPRESENTATIONS}
        expected_mixtures = {f"{dataset}.{row}.{scheme}" for row in [*tasks.MIXTURE_ROWS, *tasks.ROW_IDS]}
        assert expected_tasks <= task_names and expected_mixtures <= mixture_names
        assert set(registry.names[dataset, scheme]) == expected_tasks | expected_mixtures
    assert len(tasks.MIXTURE_ROWS) == len(tasks.ROW_IDS) == 7  # 1a, 2a, 2b, 3a, 3b, 6a, 6b


# Every (row, scheme) pair, on the dataset that alternates with both: each (row, dataset) and (scheme, dataset) pair is
# built too (all pairs of the three factors: 28 pipelines where all 56 triples would build twice as many; the
# readers differ by dataset, the representations by row, the docid tables by scheme).
PAIRWISE = [(DATASETS[(r + s) % 2], scheme, row) for r, row in enumerate(tasks.MIXTURE_ROWS)
            for s, scheme in enumerate(SCHEMES)]


def test_the_pairwise_cases_cover_every_pair_of_dataset_row_and_scheme():
    pairs = ({frozenset({("d", d), ("s", s)}) for d, s, _ in PAIRWISE}
             | {frozenset({("d", d), ("r", r)}) for d, _, r in PAIRWISE}
             | {frozenset({("s", s), ("r", r)}) for _, s, r in PAIRWISE})
    assert len(pairs) == len(DATASETS) * len(SCHEMES) + len(DATASETS) * len(tasks.MIXTURE_ROWS) + len(
        SCHEMES) * len(tasks.MIXTURE_ROWS)


@pytest.mark.parametrize("dataset, scheme, row", PAIRWISE)
def test_every_combination_builds_a_batch(registry, data_dirs, dataset, scheme, row):
    data_dir = data_dirs[dataset]
    table = load_docid_table(
        dataset=open_dataset(data_dir), scheme=scheme, vocabulary=seqio.SentencePieceVocabulary(
            str(data_dir / "spm.model")), vocabulary_path=data_dir / "spm.model")
    rows = {tuple(r[:n].tolist()) for r, n in zip(table.tokens, table.lengths)}
    name = tasks.mixture_name(name=dataset, row=row, docid_scheme=scheme)
    batch = next(pipeline.train_batches(mixture_or_task_name=name, batch_size=4, input_length=INPUT_LENGTH,
                                        target_length=TARGET_LENGTH, seed=0))
    assert {key: value.shape for key, value in batch.items()} == {
        "encoder_input_tokens": (4, INPUT_LENGTH), "decoder_target_tokens": (4, TARGET_LENGTH),
        "decoder_input_tokens": (4, TARGET_LENGTH), "decoder_loss_weights": (4, TARGET_LENGTH)}
    for inputs, targets in zip(batch["encoder_input_tokens"], batch["decoder_target_tokens"]):
        assert tuple(targets[targets != 0].tolist()) in rows  # a docid of this scheme's table
        assert inputs[inputs != 0][-1] == EOS_ID
    assert batch["decoder_target_tokens"].max() < registry.spaces[dataset, scheme].model_vocab_size


def test_atomic_docids_are_one_new_token_per_document(registry, data_dirs):
    vocab_size = spm.SentencePieceProcessor(model_file=str(data_dirs["toy"] / "spm.model")).get_piece_size()
    table = DocidTable.load(data_dirs["toy"] / "docids.atomic.tsv")  # cached like naive
    docids = [d for d, _ in read_collection(data_dirs["toy"] / "collection.tsv")]
    assert table.docids == tuple(docids)
    assert table.tokens.tolist() == [[vocab_size + i, EOS_ID] for i in range(len(docids))]
    assert registry.spaces["toy", "atomic"].model_vocab_size == vocab_size + len(docids)
    # Naive docids are pieces; the vocabulary also reserves the span corruption sentinels after the pieces.
    sentinels = tasks.RepresentationOptions(input_length=INPUT_LENGTH, target_length=TARGET_LENGTH, d2q_path="",
                                            sentinel_start=vocab_size).num_sentinels
    assert sentinels == 2  # windows of 15 tokens fit inputs 16: 2 noise tokens in 1 span (2 if split)
    assert registry.spaces["toy", "naive"].model_vocab_size == vocab_size + sentinels


def test_semantic_tables_are_read_as_prebuilt_and_size_the_output(registry, data_dirs):
    data_dir = data_dirs["toy"]
    vocab_size = spm.SentencePieceProcessor(model_file=str(data_dir / "spm.model")).get_piece_size()
    examples = seqio.get_mixture_or_task("toy.labeled.semantic").get_dataset(
        {"inputs": INPUT_LENGTH, "targets": TARGET_LENGTH}, split="train", shuffle=False)
    tables = {scheme: DocidTable.load(data_dir / f"docids.{scheme}.tsv") for scheme in ("semantic", "semantic2d")}
    for example in examples.as_numpy_iterator():  # targets are the file's rows: "58213" -> digits 3 0 | 0 0
        i = tables["semantic"].docids.index(example["docid"].decode())
        assert example["targets"].tolist() == tables["semantic"].tokens[i, :tables["semantic"].lengths[i]].tolist()
    sp = spm.SentencePieceProcessor(model_file=str(data_dir / "spm.model"))
    i = tables["semantic"].docids.index("58213")
    assert tables["semantic"].tokens[i, :5].tolist() == [sp.piece_to_id(d) for d in "3000"] + [EOS_ID]
    assert registry.spaces["toy", "semantic"].model_vocab_size == vocab_size + 2  # + the 2 sentinels
    # 2D: the largest token is position 2 (the leaf of a depth-2 id), value 1.
    assert registry.spaces["toy", "semantic2d"].model_vocab_size == vocab_size + 2 * BASE_2D + 1 + 1


@pytest.fixture
def scheme_data_dir(data_dirs, tmp_path) -> pathlib.Path:
    shutil.copytree(data_dirs["toy"], tmp_path / "toy")
    return tmp_path / "toy"


@pytest.fixture
def register():
    added = []

    def register_and_remember(**kwargs):
        added.append((kwargs["name"], kwargs["docid_scheme"]))
        return _register(**kwargs)[0]

    yield register_and_remember
    for name, scheme in added:
        tasks.unregister_dataset(name=name, docid_scheme=scheme)


@pytest.mark.parametrize("scheme", ["semantic", "semantic2d"])
def test_a_missing_semantic_table_names_the_command_that_builds_it(scheme_data_dir, register, scheme):
    os.remove(scheme_data_dir / f"docids.{scheme}.tsv")
    with pytest.raises(FileNotFoundError, match=f"python -m gr_jax.tools.semantic_ids --data_dir {scheme_data_dir} "
                                                f"--scheme {scheme}"):
        register(name="missing", data_dir=scheme_data_dir, docid_scheme=scheme)
    assert not (scheme_data_dir / f"docids.{scheme}.tsv").exists()  # nothing built in its place


def test_a_semantic_table_of_another_vocabulary_is_an_error(scheme_data_dir, register):
    semantic, semantic2d = (scheme_data_dir / f"docids.{s}.tsv" for s in ("semantic", "semantic2d"))
    original = semantic.read_text()
    semantic.write_text(semantic2d.read_text())  # appended tokens where digit pieces belong
    with pytest.raises(ValueError, match="not the vocabulary's digit pieces.*rebuild it with `python -m "
                                         "gr_jax.tools.semantic_ids"):
        register(name="wrong1", data_dir=scheme_data_dir, docid_scheme="semantic")
    semantic2d.write_text(original)  # digit pieces where appended tokens belong
    with pytest.raises(ValueError, match="inside the vocabulary of 320 pieces.*--scheme semantic2d"):
        register(name="wrong2", data_dir=scheme_data_dir, docid_scheme="semantic2d")


def test_a_prebuilt_table_is_never_rewritten(scheme_data_dir, register, caplog):
    table = scheme_data_dir / "docids.semantic.tsv"
    content = table.read_text()
    past = (scheme_data_dir / "collection.tsv").stat().st_mtime_ns - 10 * 10**9
    os.utime(table, ns=(past, past))  # older than the collection and the vocabulary: a cache would be rebuilt
    with caplog.at_level(logging.WARNING):
        register(name="old", data_dir=scheme_data_dir, docid_scheme="semantic")
    assert table.read_text() == content and table.stat().st_mtime_ns == past
    assert any("is older than" in r.getMessage() and "gr_jax.tools.semantic_ids" in r.getMessage()
               for r in caplog.records)


def test_a_stale_atomic_cache_is_rebuilt_for_another_vocabulary_size(scheme_data_dir, register):
    cache = scheme_data_dir / "docids.atomic.tsv"
    _write_table(cache, {docid: [1000 + i, EOS_ID] for i, docid in enumerate(DocidTable.load(cache).docids)})
    register(name="atomic", data_dir=scheme_data_dir, docid_scheme="atomic")  # the spot check sees 1000 != 320
    assert DocidTable.load(cache).tokens[:, 0].tolist() == list(range(320, 330))
    assert np.all(DocidTable.load(cache).tokens[:, 1] == EOS_ID)
