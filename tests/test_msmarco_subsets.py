"""Tests of gr_jax.tools.msmarco_subsets on a small official-format MS MARCO fixture written to tmp_path.

Fixture (12 passages, pids in shuffled line order):
    dev:   d1 -> 3 (rel 1), 5 (rel 0);  d2 -> 9, 1;  d3 -> 42 (not in the collection);  d4 unjudged
    train: t1 -> 7;  t2 -> 11, 0;  t3 -> 3 (also dev-relevant);  t4 -> 2;  t5 -> 99 (not in the collection);
           t6 unjudged;  qrels also judge t7, which queries.train.tsv lacks
Tiers: dev-relevant {3, 9, 1}; train-relevant {7, 11, 0, 2}; others {5, 8, 10, 4, 6}.
"""
import json
import pathlib

import pytest

from gr_jax.data import readers
from gr_jax.data.readers import DataFormatError
from gr_jax.tools import msmarco_subsets
from gr_jax.tools.msmarco_subsets import SubsetSpec, build_subsets, passage_key

PIDS = ("7", "3", "11", "0", "5", "9", "2", "8", "1", "10", "4", "6")
TEXTS = {pid: f"passage {pid} about café number {pid}" for pid in PIDS}
TEXTS["8"] = "a stray \r inside passage 8 is kept verbatim"
DEV_RELEVANT = {"3", "9", "1"}
TRAIN_RELEVANT = {"7", "11", "0", "3", "2"}
DEV_QUERIES = {"d1": "what is three", "d2": "nine or one", "d3": "lost passage", "d4": "never judged"}
DEV_QRELS = [("d1", "3", 1), ("d1", "5", 0), ("d2", "9", 1), ("d2", "1", 1), ("d3", "42", 1)]
TRAIN_QUERIES = {"t1": "seven", "t2": "eleven and zero", "t3": "three again", "t4": "two", "t5": "missing",
                 "t6": "unjudged"}
TRAIN_QRELS = [("t1", "7", 1), ("t2", "11", 1), ("t2", "0", 1), ("t3", "3", 1), ("t4", "2", 1), ("t5", "99", 1),
               ("t7", "6", 1)]


def _write(path: pathlib.Path, lines) -> None:
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))


def _make_msmarco(directory: pathlib.Path, *, pids=PIDS) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / "collection.tsv", [f"{pid}\t{TEXTS[pid]}" for pid in pids])
    for split, queries, qrels in (("dev", DEV_QUERIES, DEV_QRELS), ("train", TRAIN_QUERIES, TRAIN_QRELS)):
        _write(directory / f"queries.{split}.tsv", [f"{qid}\t{text}" for qid, text in queries.items()])
        _write(directory / f"qrels.{split}.tsv", [f"{qid}\t0\t{pid}\t{rel}" for qid, pid, rel in qrels])
    return directory


@pytest.fixture
def msmarco_dir(tmp_path) -> pathlib.Path:
    return _make_msmarco(tmp_path / "msmarco")


def _brute_force(size: int, *, seed: int, fill: str, train_tier: bool = False) -> list[str]:
    """The first `size` pids by (tier, seeded key, line), computed independently of the tool's numpy sort."""
    def tier(pid):
        if pid in DEV_RELEVANT:
            return 0
        if (fill == "train_relevant" or train_tier) and pid in TRAIN_RELEVANT:
            return 1
        return 2
    ranked = sorted(PIDS, key=lambda pid: (tier(pid), passage_key(pid, seed=seed), PIDS.index(pid)))
    return ranked[:size]


def _collection(out: pathlib.Path) -> list[str]:
    return [pid for pid, _ in readers.read_collection(out / "collection.tsv")]


def _build(msmarco_dir, out, sizes, **kwargs):
    specs = [SubsetSpec(name=msmarco_subsets.size_label(size), size=size, keep=kwargs.pop("keep", ("dev",)))
             for size in sizes]
    return build_subsets(msmarco_dir=msmarco_dir, out_dir=out, subsets=specs, progress=False, **kwargs)


# ---------------------------------------------------------------------------------------------------- selection


@pytest.mark.parametrize("fill", ["train_relevant", "uniform"])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_nested_subsets_match_brute_force(msmarco_dir, tmp_path, fill, seed):
    out = tmp_path / "out"
    _build(msmarco_dir, out, [4, 5, 9, None], fill=fill, seed=seed)
    previous: set[str] = set()
    for size, name in ((4, "4"), (5, "5"), (9, "9"), (12, "all")):
        pids = _collection(out / name)
        assert len(pids) == size
        assert set(pids) == set(_brute_force(size, seed=seed, fill=fill))
        assert pids == [pid for pid in PIDS if pid in set(pids)]  # Collection line order is kept.
        assert DEV_RELEVANT <= set(pids)  # Dev-relevant passages are always in.
        assert previous <= set(pids)  # Nested.
        previous = set(pids)


def test_train_relevant_fill_prefers_training_passages(msmarco_dir, tmp_path):
    _build(msmarco_dir, tmp_path / "out", [7], fill="train_relevant")
    assert set(_collection(tmp_path / "out" / "7")) == DEV_RELEVANT | TRAIN_RELEVANT


def test_passages_are_copied_verbatim_and_the_full_subset_is_the_collection(msmarco_dir, tmp_path):
    _build(msmarco_dir, tmp_path / "out", [None])
    written = (tmp_path / "out" / "all" / "collection.tsv").read_bytes()
    assert written == (msmarco_dir / "collection.tsv").read_bytes()
    assert dict(readers.read_collection(tmp_path / "out" / "all" / "collection.tsv"))["8"] == TEXTS["8"]


def test_deterministic_and_seed_dependent(msmarco_dir, tmp_path):
    for name in ("a", "b"):
        _build(msmarco_dir, tmp_path / name, [5, 8], seed=3)
    for subset in ("5", "8"):
        for file in msmarco_subsets.OUTPUT_FILES[:-1]:
            assert (tmp_path / "a" / subset / file).read_bytes() == (tmp_path / "b" / subset / file).read_bytes()
    # Seeds 0 and 1 draw different train-relevant passages for the 5-passage subset (checked by brute force).
    assert set(_brute_force(5, seed=0, fill="train_relevant")) != set(_brute_force(5, seed=1, fill="train_relevant"))
    _build(msmarco_dir, tmp_path / "s0", [5], seed=0)
    _build(msmarco_dir, tmp_path / "s1", [5], seed=1)
    assert set(_collection(tmp_path / "s0" / "5")) != set(_collection(tmp_path / "s1" / "5"))


def test_selection_does_not_depend_on_collection_line_order(tmp_path):
    original = _make_msmarco(tmp_path / "original")
    shuffled = _make_msmarco(tmp_path / "shuffled", pids=tuple(reversed(PIDS)))
    for directory in (original, shuffled):
        _build(directory, directory / "out", [5, 8], fill="uniform", seed=11)
    for name in ("5", "8"):
        assert set(_collection(original / "out" / name)) == set(_collection(shuffled / "out" / name))


# -------------------------------------------------------------------------------------- queries, qrels, coverage


def test_coverage_and_query_counts_hand_computed(msmarco_dir, tmp_path):
    out = tmp_path / "out"
    summary = _build(msmarco_dir, out, [3, 7, None], fill="train_relevant")
    by_name = {s["name"]: s for s in summary["subsets"]}

    # Size 3 holds exactly the dev-relevant passages {3, 9, 1}.
    s3 = by_name["3"]
    assert (s3["passages"], s3["passages_with_train_query"], s3["train_coverage"]) == (3, 1, pytest.approx(1 / 3))
    assert s3["train"] == {
        "input_split": "train", "queries": 1, "judgements": 1, "queries_in_file": 6,
        "queries_without_relevant_judgement": 1,  # t6
        "queries_dropped_relevant_passages_not_in_subset": 4,  # t1, t2, t4 (outside the subset), t5 (missing)
        "judgements_dropped_passage_not_in_subset": 0,
    }
    assert s3["dev"] == {
        "input_split": "dev", "queries": 2, "judgements": 3, "queries_in_file": 4,
        "queries_without_relevant_judgement": 1,  # d4
        "queries_dropped_relevant_passages_not_in_subset": 1,  # d3
        "judgements_dropped_passage_not_in_subset": 1,  # d1's rel-0 judgement of passage 5
    }
    assert s3["passages_relevant_to_dev"] == 3
    dataset = readers.open_dataset(out / "3")
    assert dict(dataset.queries("train")) == {"t3": "three again"}
    assert dataset.qrels("train") == {"t3": {"3": 1}}
    assert dict(dataset.queries("dev")) == {"d1": "what is three", "d2": "nine or one"}
    assert dataset.qrels("dev") == {"d1": {"3": 1}, "d2": {"9": 1, "1": 1}}

    # Size 7 adds the training-relevant passages {7, 11, 0, 2}: 5 of 7 passages have a training query.
    s7 = by_name["7"]
    assert (s7["passages_with_train_query"], s7["train_coverage"]) == (5, pytest.approx(5 / 7))
    assert (s7["train"]["queries"], s7["train"]["queries_dropped_relevant_passages_not_in_subset"]) == (4, 1)
    assert readers.open_dataset(out / "7").qrels("train") == {
        "t1": {"7": 1}, "t2": {"11": 1, "0": 1}, "t3": {"3": 1}, "t4": {"2": 1}}

    # The whole collection: coverage 5/12 and d1 keeps its judgement of passage 5.
    full = by_name["all"]
    assert (full["passages"], full["train_coverage"]) == (12, pytest.approx(5 / 12))
    assert full["dev"]["judgements_dropped_passage_not_in_subset"] == 0
    assert readers.open_dataset(out / "all").qrels("dev")["d1"] == {"3": 1, "5": 0}

    assert summary["splits"]["train"] == {
        "input_split": "train", "queries_in_file": 6, "queries_with_relevant_judgement": 5,
        "qrels_queries_missing_from_queries_file": 1, "relevant_passages": 6,
        "judged_passages_missing_from_collection": 1}
    assert summary["splits"]["dev"]["judged_passages_missing_from_collection"] == 1
    assert json.loads((out / "summary.json").read_text()) == summary
    assert json.loads((out / "7" / "summary.json").read_text())["train_coverage"] == pytest.approx(5 / 7)


def test_partially_covered_query_keeps_its_passages_in_the_subset(msmarco_dir, tmp_path):
    # Uniform fill at size 5: two random passages join {3, 9, 1}; t2 (11, 0) may keep one of its two passages.
    for seed in range(40):
        chosen = set(_brute_force(5, seed=seed, fill="uniform"))
        if len(chosen & {"11", "0"}) == 1:
            break
    else:
        pytest.fail("no seed puts exactly one of t2's passages in the subset")
    summary = _build(msmarco_dir, tmp_path / "out", [5], fill="uniform", seed=seed)
    qrels = readers.open_dataset(tmp_path / "out" / "5").qrels("train")
    assert qrels["t2"] == {pid: 1 for pid in chosen & {"11", "0"}}
    expected_queries = {"t3"} | {qid for qid, pid, _ in TRAIN_QRELS if pid in chosen and qid in TRAIN_QUERIES}
    assert set(qrels) == expected_queries
    train = summary["subsets"][0]["train"]
    assert train["judgements_dropped_passage_not_in_subset"] == 1
    assert train["queries_dropped_relevant_passages_not_in_subset"] == 5 - len(expected_queries)
    assert summary["subsets"][0]["passages_with_train_query"] == len(chosen & TRAIN_RELEVANT)


def test_keep_train_checks_every_training_passage_fits(msmarco_dir, tmp_path):
    with pytest.raises(ValueError, match="at least 7"):
        _build(msmarco_dir, tmp_path / "out", [6], keep=("train", "dev"), fill="uniform")
    summary = _build(msmarco_dir, tmp_path / "ok", [7], keep=("train", "dev"), fill="uniform")
    assert set(_collection(tmp_path / "ok" / "7")) == DEV_RELEVANT | TRAIN_RELEVANT
    assert summary["subsets"][0]["train"]["queries"] == 4


# ---------------------------------------------------------------------------------------------------- errors, CLI


def test_size_larger_than_the_collection_is_an_error(msmarco_dir, tmp_path):
    with pytest.raises(ValueError, match="exceeds the 12 passages"):
        _build(msmarco_dir, tmp_path / "out", [13])


def test_size_smaller_than_the_dev_passages_is_an_error(msmarco_dir, tmp_path):
    with pytest.raises(ValueError, match="at least 3"):
        _build(msmarco_dir, tmp_path / "out", [2])


def test_existing_outputs_need_overwrite(msmarco_dir, tmp_path):
    _build(msmarco_dir, tmp_path / "out", [5])
    with pytest.raises(FileExistsError, match="--overwrite"):
        _build(msmarco_dir, tmp_path / "out", [5], seed=1)
    _build(msmarco_dir, tmp_path / "out", [5], seed=1, overwrite=True)
    assert set(_collection(tmp_path / "out" / "5")) == set(_brute_force(5, seed=1, fill="train_relevant"))
    assert not list((tmp_path / "out").glob(".build-*"))


def test_malformed_collection_names_file_and_line(msmarco_dir, tmp_path):
    with open(msmarco_dir / "collection.tsv", "a", encoding="utf-8") as f:
        f.write("12\tone\ttab too many\n")
    with pytest.raises(DataFormatError, match=r"collection\.tsv:13: expected 2 tab-separated columns"):
        _build(msmarco_dir, tmp_path / "out", [5])


@pytest.mark.parametrize("text, size", [("2000", 2000), ("100k", 100_000), ("1m", 1_000_000), ("ALL", None)])
def test_parse_size_and_label(text, size):
    assert msmarco_subsets.parse_size(text) == size
    assert msmarco_subsets.parse_size(msmarco_subsets.size_label(size)) == size


@pytest.mark.parametrize("text", ["0", "-5", "1.5k", "lots"])
def test_parse_size_rejects_bad_sizes(text):
    with pytest.raises(ValueError, match="invalid subset size"):
        msmarco_subsets.parse_size(text)


def test_presets_are_the_studys_corpora():
    args = msmarco_subsets._parse_args(
        ["--msmarco_dir", "x", "--out_dir", "y", "--preset", "msmarco100k,msmarco1m,full"])
    specs, fill = msmarco_subsets._subsets_from_args(args)
    assert [(s.name, s.size, s.keep) for s in specs] == [
        ("msmarco100k", 100_000, ("dev",)), ("msmarco1m", 1_000_000, ("train", "dev")),
        ("full", None, ("train", "dev"))]
    assert fill == "train_relevant"
    args = msmarco_subsets._parse_args(["--msmarco_dir", "x", "--out_dir", "y", "--preset", "full", "--keep", "dev"])
    with pytest.raises(ValueError, match="presets fix --keep"):
        msmarco_subsets._subsets_from_args(args)


def test_cli_writes_nested_subsets_and_prints_the_coverage_table(msmarco_dir, tmp_path, capsys):
    summary = msmarco_subsets.main(["--msmarco_dir", str(msmarco_dir), "--out_dir", str(tmp_path / "out"),
                                    "--sizes", "7,all", "--no_progress"])
    printed = capsys.readouterr().out
    assert [s["name"] for s in summary["subsets"]] == ["7", "all"]
    rows = {line.split()[0]: line.split() for line in printed.splitlines()[1:3]}
    assert rows["7"] == ["7", "7", "5", "(71.4%)", "4", "2", "1", "1"]
    assert rows["all"] == ["all", "12", "5", "(41.7%)", "4", "2", "1", "1"]
    assert "train 1, dev 1" in printed  # t6 and d4 have no relevant judgement.
    assert readers.open_dataset(tmp_path / "out" / "all").splits() == ("dev", "train")
