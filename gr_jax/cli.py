"""The `gr-jax` command: `gr-jax search ...`, `gr-jax train ...`, `gr-jax eval ...`, `gr-jax infer ...`."""
from __future__ import annotations

import sys

COMMANDS = ("search", "train", "eval", "infer")


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
