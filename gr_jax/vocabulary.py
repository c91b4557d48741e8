"""Local SentencePiece vocabularies with the T5 id convention, trained on the dataset itself.

Why local: runs have no network, so the public `gs://t5-data/vocabs/...` models cannot be fetched; a
vocabulary trained on the collection and training queries is also what DSI-style setups do for new corpora.

The id convention is T5's (PAD=0, EOS=1, UNK=2, no BOS; the decoder start token is PAD), so
`seqio.SentencePieceVocabulary` and the model code can rely on it. Digits are split one per piece
(`split_digits`): naive docids are digit strings, and one piece per digit keeps the docid prefix trie
small (10-way branching) and every docid tokenised the same way whatever text surrounds it.
"""
from __future__ import annotations

import functools
import io
import logging
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import sentencepiece as spm

if TYPE_CHECKING:  # seqio imports TensorFlow; keep it out of the import path of the training tools.
    import seqio

    from gr_jax.data.hf_tokenizer import HFTokenizerVocabulary

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
MODEL_FILENAME = "spm.model"
DIGITS = "0123456789"

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def _counted(texts: Iterable[str], *, max_sentence_bytes: int, counts: dict[str, int]) -> Iterator[str]:
    """Passes texts through to SentencePiece, counting what it will not train on (empty / overlong)."""
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts must yield str, got {type(text).__name__}")
        counts["texts"] += 1
        if not text.strip():
            counts["empty"] += 1
        elif len(text.encode("utf-8")) > max_sentence_bytes:
            counts["overlong"] += 1
        yield text


def train_sentencepiece(
    *,
    texts: Iterable[str],
    model_path: PathLike,
    vocab_size: int,
    input_sentence_size: int = 1_000_000,
    character_coverage: float = 0.9999,
    max_sentence_bytes: int = 16384,
    seed: int = 0,
    num_threads: int | None = None,
) -> pathlib.Path:
    """Trains a unigram SentencePiece model with the T5 id convention and writes it to `model_path`.

    `texts` is streamed: SentencePiece reservoir-samples at most `input_sentence_size` of them (uniformly,
    seeded by `seed`), so an 8.8M-passage collection never sits in Python memory. Digits are always in the
    alphabet and split one per piece; `byte_fallback` spells any character outside the alphabet as
    UTF-8 byte pieces instead of UNK, so decoding is lossless. Texts longer than `max_sentence_bytes`
    are skipped by SentencePiece; their number is logged. Returns `model_path`.
    """
    model_path = pathlib.Path(model_path)
    if vocab_size <= 3 + 256 + len(DIGITS):
        raise ValueError(f"vocab_size={vocab_size} leaves no room beyond the 3 special ids, 256 byte pieces "
                         f"and {len(DIGITS)} digits")
    counts = {"texts": 0, "empty": 0, "overlong": 0}
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_counted(texts, max_sentence_bytes=max_sentence_bytes, counts=counts),
            model_writer=model,
            model_type="unigram",
            vocab_size=vocab_size,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            pad_piece="<pad>",
            eos_piece="</s>",
            unk_piece="<unk>",
            split_digits=True,
            required_chars=DIGITS,
            byte_fallback=True,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            max_sentence_length=max_sentence_bytes,
            num_threads=num_threads or os.cpu_count() or 1,
            minloglevel=1,
        )
    except RuntimeError as e:
        if counts["texts"] == 0:
            raise ValueError("train_sentencepiece got no texts") from e
        too_high = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", str(e))
        if too_high:
            raise ValueError(f"the {counts['texts']} texts are too few for vocab_size={vocab_size}: SentencePiece "
                             f"can build at most {too_high.group(1)} pieces from them; pass a smaller vocab_size "
                             "(--vocab_size)") from e
        raise ValueError(f"SentencePiece training on {counts['texts']} texts failed: {e}") from e
    if counts["empty"] or counts["overlong"]:
        logger.warning("vocabulary training skipped %d empty texts and %d texts over %d bytes (of %d)",
                       counts["empty"], counts["overlong"], max_sentence_bytes, counts["texts"])
    logger.info("trained a %d-piece SentencePiece model on a sample of %d texts (at most %d used)",
                vocab_size, counts["texts"], input_sentence_size)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = model_path.with_name(f".{model_path.name}.tmp")
    tmp_path.write_bytes(model.getvalue())
    os.replace(tmp_path, model_path)
    return model_path


class HostSentencePieceVocabulary:
    """The host-side part of `seqio.SentencePieceVocabulary` (extra_ids=0) without TensorFlow.

    What host-made datasets, decoding and evaluation use (`encode`, `decode` up through the first EOS,
    `vocab_size`, the special ids, `tokenizer`), with seqio's semantics, so that a JAX-only host (an accelerator
    image without TensorFlow) trains and evaluates them. seqio tasks need seqio's own class.
    """

    def __init__(self, path: PathLike):
        self.path = str(path)
        self.tokenizer = spm.SentencePieceProcessor(model_file=self.path)
        self.vocab_size = self.tokenizer.GetPieceSize()
        self.pad_id, self.eos_id, self.unk_id = PAD_ID, EOS_ID, UNK_ID

    def encode(self, s: str) -> list[int]:
        """Token ids of `s`, without EOS."""
        return self.tokenizer.EncodeAsIds(s)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` up through the first EOS; ids past the vocabulary decode as UNK."""
        clean = [self.unk_id if int(i) >= self.vocab_size else int(i) for i in ids]
        if self.eos_id in clean:
            clean = clean[:clean.index(self.eos_id) + 1]
        return self.tokenizer.DecodeIds(clean)


@functools.lru_cache(maxsize=4)
def wordpiece_tokenizer(model_dir: pathlib.Path):
    """The `tokenizers` WordPiece tokenizer of a sentence-transformers folder (its tokenizer.json), without padding
    or truncation: what a MiniLM tower's texts and a WordPiece input vocabulary are encoded with, loaded once."""
    import tokenizers
    tokenizer = tokenizers.Tokenizer.from_file(str(pathlib.Path(model_dir) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def vocabulary_file(data: Any) -> pathlib.Path:
    """The SentencePiece model of a run's data (anything with `data_dir` and `vocabulary_path`): `vocabulary_path`,
    else `{data_dir}/spm.model`."""
    return pathlib.Path(data.vocabulary_path or pathlib.Path(data.data_dir) / MODEL_FILENAME)


def load_vocabulary(
        path: PathLike) -> "seqio.SentencePieceVocabulary | HostSentencePieceVocabulary | HFTokenizerVocabulary":
    """Loads a vocabulary trained by `train_sentencepiece` (a `spm.model` file, or the data dir holding it), or a
    Hugging Face checkpoint's `tokenizer.json` (any `.json` file: `gr_jax.data.hf_tokenizer`, its ids shifted past
    PAD and EOS).

    Checks the T5 id convention, since a model trained with a different one would silently learn to
    emit the wrong end-of-sequence token. `extra_ids=0`: generative retrieval needs no sentinels.
    seqio's vocabulary where seqio (and TensorFlow) can be imported, else `HostSentencePieceVocabulary`.
    """
    path = pathlib.Path(path)
    if path.suffix == ".json":
        from gr_jax.data.hf_tokenizer import HFTokenizerVocabulary  # seqio and TensorFlow: only for such runs
        return HFTokenizerVocabulary(path, pad_id=PAD_ID, eos_id=EOS_ID)
    if path.is_dir():
        path = path / MODEL_FILENAME
    if not path.is_file():
        data_dir = path.parent
        raise FileNotFoundError(f"no SentencePiece vocabulary at {path}; train one beside the data with "
                                f"`python -m gr_jax.tools.make_vocab --data_dir {data_dir}`")
    processor = spm.SentencePieceProcessor(model_file=str(path))
    ids = (processor.pad_id(), processor.eos_id(), processor.unk_id(), processor.bos_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID, -1):
        raise ValueError(f"{path}: ids (pad, eos, unk, bos) are {ids}; expected the T5 convention "
                         f"({PAD_ID}, {EOS_ID}, {UNK_ID}, -1). Retrain with `python -m gr_jax.tools.make_vocab`.")
    try:
        import seqio  # Lazy: TensorFlow is only needed once a vocabulary is used in a seqio pipeline.
    except ImportError:
        logger.info("seqio cannot be imported: %s loads as a HostSentencePieceVocabulary", path)
        return HostSentencePieceVocabulary(path)
    return seqio.SentencePieceVocabulary(str(path), extra_ids=0)


def encode_inputs(texts: Sequence[str], *, vocabulary: Any, input_length: int) -> np.ndarray:
    """int32[len(texts), input_length]: each text's tokens trimmed to input_length - 1, the vocabulary's EOS
    appended, PAD after, exactly as the seqio tasks make `inputs` (queries at retrieval time, documents for
    doc2query sampling)."""
    return encode_and_count_cut(texts, vocabulary=vocabulary, input_length=input_length)[0]


def encode_and_count_cut(texts: Sequence[str], *, vocabulary: Any, input_length: int) -> tuple[np.ndarray, int]:
    """(`encode_inputs`'s tokens, how many texts had more than input_length - 1 tokens and were cut)."""
    out = np.zeros((len(texts), input_length), np.int32)
    cut = 0
    for i, text in enumerate(texts):
        pieces = list(vocabulary.encode(text))
        cut += len(pieces) > input_length - 1
        ids = pieces[:input_length - 1] + [vocabulary.eos_id]
        out[i, :len(ids)] = ids
    return out, cut
