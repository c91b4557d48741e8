"""The `gr-jax` command: `gr-jax search ...`, `gr-jax train ...`, `gr-jax eval ...`, `gr-jax infer ...`."""
from __future__ import annotations

import json
import logging
import sys
from typing import Callable

COMMANDS = ("search", "train", "eval", "infer")


def run_tool(build: Callable[[], dict], *, report: Callable[[dict], dict] = lambda summary: summary,
             indent: int | None = None) -> dict:
    """Body of a data-preparation tool's main: logs to the console, turns a bad-input error (missing file,
    existing output, malformed line) into a one-line message and exit status 1, and prints the summary as JSON."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        summary = build()
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(json.dumps(report(summary), indent=indent), flush=True)
    return summary


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"usage: gr-jax {{{','.join(COMMANDS)}}} [args]")
    command, rest = argv[0], argv[1:]
    if command == "search":
        from gr_jax import search
        search.main(rest)
    elif command == "train":
        from gr_jax import train
        train.main(rest)
    elif command == "eval":
        from gr_jax import eval as eval_main
        eval_main.main(rest)
    else:
        from gr_jax import infer
        infer.main(rest)


if __name__ == "__main__":
    main()
