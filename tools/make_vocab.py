"""Trains the dataset's SentencePiece vocabulary (T5 ids, digits split) and stores it as DATA_DIR/spm.model.

The vocabulary is trained on the collection plus the training queries (never dev/test queries, which
would leak held-out text into the model's input space), streamed through `gr_jax.data.readers`.

    python -m gr_jax.tools.make_vocab --data_dir data/wordnet_food [--vocab_size 8000]
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import pathlib
import sys
from collections.abc import Iterator, Sequence

import sentencepiece

from gr_jax import vocabulary
from gr_jax.data.readers import RetrievalDataset, open_dataset

TRAIN_SPLIT = "train"


def training_texts(dataset: RetrievalDataset) -> Iterator[str]:
    """Streams the collection's texts, then the training queries when the dataset has a train split."""
    documents = (text for _, text in dataset.collection())
    if TRAIN_SPLIT not in dataset.splits():
        logging.warning("%s has no %r split: training the vocabulary on the collection only", dataset.data_dir,
                        TRAIN_SPLIT)
        return documents
    return itertools.chain(documents, (text for _, text in dataset.queries(TRAIN_SPLIT)))


def make_vocab(*, data_dir: str | pathlib.Path, vocab_size: int, input_sentence_size: int, seed: int,
               overwrite: bool) -> pathlib.Path:
    """Trains and writes `data_dir/spm.model`; refuses to replace an existing one unless `overwrite`.

    Replacing a vocabulary silently would invalidate every checkpoint trained with the old one.
    """
    dataset = open_dataset(data_dir)
    model_path = dataset.data_dir / vocabulary.MODEL_FILENAME
    if model_path.exists() and not overwrite:
        raise FileExistsError(f"{model_path} exists (checkpoints trained with it depend on it); "
                              "pass --overwrite to replace it")
    return vocabulary.train_sentencepiece(texts=training_texts(dataset), model_path=model_path,
                                          vocab_size=vocab_size, input_sentence_size=input_sentence_size, seed=seed)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.make_vocab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="dataset directory read by gr_jax.data.readers")
    parser.add_argument("--vocab_size", type=int, default=8000, help="number of pieces (default: 8000)")
    parser.add_argument("--input_sentence_size", type=int, default=1_000_000,
                        help="texts reservoir-sampled for training (default: 1,000,000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sentence sampling (default: 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing spm.model")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> pathlib.Path:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        model_path = make_vocab(data_dir=args.data_dir, vocab_size=args.vocab_size,
                                input_sentence_size=args.input_sentence_size, seed=args.seed,
                                overwrite=args.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        sys.exit(f"error: {e}")
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(model_path)).get_piece_size()
    print(json.dumps({"vocabulary": str(model_path), "vocab_size": pieces}), flush=True)
    return model_path


if __name__ == "__main__":
    main()
