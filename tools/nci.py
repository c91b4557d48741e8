"""Converts NCI's NQ or TriviaQA release into the MS MARCO layout (`gr_jax.data.nci`) and prints a JSON summary.

    python -m gr_jax.tools.nci --nci_dir Data_process/NQ_dataset --out_dir data/nq100k [--dataset nq|trivia]
        [--corpus auto|content|title_abs] [--overwrite]
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

from gr_jax.data import nci
from gr_jax.entry_point import run_tool


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gr_jax.tools.nci", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nci_dir", required=True,
                        help="NCI's Data_process/NQ_dataset or Data_process/trivia_dataset directory")
    parser.add_argument("--out_dir", required=True, help="dataset directory to write (MS MARCO layout)")
    parser.add_argument("--dataset", choices=tuple(nci.LAYOUTS), default=None, help="default: detected from the files")
    parser.add_argument("--corpus", choices=("auto", "content", "title_abs"), default="auto",
                        help="document file: the full-text content file (default when present) or the title file")
    parser.add_argument("--overwrite", action="store_true", help="replace a different dataset in --out_dir")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = _parse_args(argv)
    return run_tool(lambda: nci.convert_nci(nci_dir=args.nci_dir, out_dir=args.out_dir, dataset=args.dataset,
                                        corpus=args.corpus, overwrite=args.overwrite),
                    report=lambda summary: {"out_dir": str(args.out_dir), **summary}, indent=2)


if __name__ == "__main__":
    main()
