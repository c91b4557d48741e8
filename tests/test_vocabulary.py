"""Tests of gr_jax.vocabulary and gr_jax.tools.make_vocab: T5 ids, one digit per piece, lossless round trip, seqio."""
import json
import shutil
import subprocess
import sys

import pytest
import sentencepiece as spm

from gr_jax import vocabulary
from gr_jax.data import readers
from gr_jax.tools import make_vocab

from conftest import FIXTURES

VOCAB_SIZE = 400
TEXTS_WITH_RARE_CHARACTERS = [
    "docid 07555863 and 8841822",
    "Café au lait costs $3.65 at 12:30 — “naïve” ☃ 東京",
    "numbers 1234567890 0000 99",
]


MSMARCO_FIXTURE = FIXTURES / "msmarco"


@pytest.fixture(scope="module")
def fixture_texts():
    return list(make_vocab.training_texts(readers.open_dataset(MSMARCO_FIXTURE)))


# Frequent digit strings: without split_digits SentencePiece would learn "07555863" or "2024" as one piece.
REPEATED_DOCIDS = [f"docid 07555863 year 2024 pid {i % 7}{i % 7}{i % 7}" for i in range(200)]


@pytest.fixture(scope="module")
def vocab_texts(fixture_texts):
    return fixture_texts + REPEATED_DOCIDS


@pytest.fixture(scope="module")
def model_path(tmp_path_factory, vocab_texts):
    path = tmp_path_factory.mktemp("vocab") / "spm.model"
    return vocabulary.train_sentencepiece(texts=iter(vocab_texts), model_path=path, vocab_size=VOCAB_SIZE)


@pytest.fixture(scope="module")
def processor(model_path):
    return spm.SentencePieceProcessor(model_file=str(model_path))


def test_training_texts_are_the_collection_then_the_training_queries_only(fixture_texts, fixtures_dir):
    passages = [text for _, text in readers.read_collection(fixtures_dir / "msmarco" / "collection.tsv")]
    train = [text for _, text in readers.read_queries(fixtures_dir / "msmarco" / "queries.train.tsv")]
    assert fixture_texts == passages + train
    assert "how to convert fahrenheit to celsius" not in fixture_texts  # A dev query: never trained on.


def test_special_ids_follow_the_t5_convention(processor):
    assert processor.get_piece_size() == VOCAB_SIZE
    assert (processor.pad_id(), processor.eos_id(), processor.unk_id(), processor.bos_id()) == (0, 1, 2, -1)
    assert [processor.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert (vocabulary.PAD_ID, vocabulary.EOS_ID, vocabulary.UNK_ID) == (0, 1, 2)


def test_every_digit_is_its_own_piece(processor):
    for text in ["07555863", "docid 07555863", "year 2024 pid 555", "8841822 passages", "x1y22z333"]:
        pieces = processor.encode(text, out_type=str)
        digits = [piece.lstrip("▁") for piece in pieces if any(c.isdigit() for c in piece)]
        assert digits == [c for c in text if c.isdigit()], pieces
    for digit in "0123456789":  # In the alphabet even when rare: a docid never needs byte fallback.
        assert processor.piece_to_id(digit) != processor.unk_id()


@pytest.mark.parametrize("text", TEXTS_WITH_RARE_CHARACTERS)
def test_encode_decode_round_trips_with_byte_fallback(processor, text):
    ids = processor.encode(text)
    assert processor.unk_id() not in ids
    assert processor.decode(ids) == text


def test_training_is_deterministic(tmp_path, vocab_texts, model_path):
    again = vocabulary.train_sentencepiece(texts=vocab_texts, model_path=tmp_path / "spm.model",
                                           vocab_size=VOCAB_SIZE)
    assert again.read_bytes() == model_path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model"]  # No .vocab or temporary files.


def test_training_rejects_a_vocabulary_too_small_and_no_texts(tmp_path, fixture_texts):
    with pytest.raises(ValueError, match="leaves no room"):
        vocabulary.train_sentencepiece(texts=fixture_texts, model_path=tmp_path / "spm.model", vocab_size=260)
    with pytest.raises(ValueError, match=r"too few for vocab_size=5000: SentencePiece can build at most \d+ pieces"):
        vocabulary.train_sentencepiece(texts=fixture_texts, model_path=tmp_path / "spm.model", vocab_size=5000)
    with pytest.raises(ValueError, match="got no texts"):
        vocabulary.train_sentencepiece(texts=[], model_path=tmp_path / "spm.model", vocab_size=VOCAB_SIZE)
    assert not (tmp_path / "spm.model").exists()


def test_seqio_reads_the_vocabulary(model_path, processor):
    vocab = vocabulary.load_vocabulary(model_path.parent)  # The data dir form.
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.vocab_size == VOCAB_SIZE  # extra_ids=0: no sentinel ids appended.
    text = "docid 07555863"
    assert list(vocab.encode(text)) == processor.encode(text)
    assert vocab.decode(vocab.encode(text)) == text


def test_load_vocabulary_says_which_tool_makes_a_missing_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"python -m gr_jax.tools.make_vocab --data_dir {tmp_path}"):
        vocabulary.load_vocabulary(tmp_path)


def test_load_vocabulary_rejects_other_id_conventions(tmp_path, fixture_texts):
    # SentencePiece's own defaults: unk=0, bos=1, eos=2, no pad.
    spm.SentencePieceTrainer.train(sentence_iterator=iter(fixture_texts), model_prefix=str(tmp_path / "spm"),
                                   vocab_size=200, minloglevel=2)
    with pytest.raises(ValueError, match=r"ids \(pad, eos, unk, bos\) are \(-1, 2, 0, 1\)"):
        vocabulary.load_vocabulary(tmp_path / "spm.model")


def test_make_vocab_writes_spm_model_beside_the_data_and_refuses_to_replace_it(tmp_path, fixtures_dir, capsys):
    data_dir = tmp_path / "msmarco"
    shutil.copytree(fixtures_dir / "msmarco", data_dir)
    model = make_vocab.main(["--data_dir", str(data_dir), "--vocab_size", str(VOCAB_SIZE)])
    assert model == data_dir / "spm.model"
    assert f'"vocab_size": {VOCAB_SIZE}' in capsys.readouterr().out
    assert spm.SentencePieceProcessor(model_file=str(model)).pad_id() == 0
    with pytest.raises(SystemExit, match="exists .*pass --overwrite"):
        make_vocab.main(["--data_dir", str(data_dir), "--vocab_size", str(VOCAB_SIZE)])
    make_vocab.main(["--data_dir", str(data_dir), "--vocab_size", str(VOCAB_SIZE + 10), "--overwrite"])
    assert spm.SentencePieceProcessor(model_file=str(model)).get_piece_size() == VOCAB_SIZE + 10


def test_host_vocabulary_matches_seqio_without_tensorflow(model_path, tmp_path):
    """Where seqio cannot be imported, load_vocabulary gives a TensorFlow-free vocabulary with seqio's results."""
    seqio_vocab = vocabulary.load_vocabulary(model_path)
    texts = ["Hello world", "ruminant.n.01 deer.n.01", "1234567 caf\u00e9", ""]
    ids = [[5, 7, 1, 9, 0], [3, 1], [seqio_vocab.vocab_size + 4, 6]]  # EOS cuts; ids past the vocabulary are UNK
    expected = {"vocab_size": seqio_vocab.vocab_size, "eos_id": seqio_vocab.eos_id,
                "encode": [list(seqio_vocab.encode(t)) for t in texts], "decode": [seqio_vocab.decode(i) for i in ids]}
    script = ("import json, sys; sys.modules['seqio'] = None; sys.modules['tensorflow'] = None\n"
              "from gr_jax import vocabulary\n"
              f"v = vocabulary.load_vocabulary({str(model_path)!r})\n"
              "print(json.dumps({'type': type(v).__name__, 'vocab_size': v.vocab_size, 'eos_id': v.eos_id,\n"
              f"    'encode': [v.encode(t) for t in {texts!r}], 'decode': [v.decode(i) for i in {ids!r}]}}))\n")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    host = json.loads(out.strip().splitlines()[-1])
    assert host.pop("type") == "HostSentencePieceVocabulary"
    assert host == expected
