"""Command-line gin handling shared by the entry points (t5x style flags).

    python -m gr_jax.train --gin_file=experiments/wordnet_demo.gin --gin.MODEL_DIR="'/tmp/run'" --gin.TRAIN_STEPS=100

`--gin_file` may repeat; files are looked up as given, then under the repository's `gin_configs/`.
`--gin.KEY=VALUE` is a binding `KEY = VALUE`; VALUE is gin syntax (quote strings), except that a bare word
that is no gin literal, reference or macro (e.g. a path) is taken as a string, so `--gin.MODEL_DIR=/tmp/run` works.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import logging
import os
import pathlib
import re
from typing import TYPE_CHECKING, Sequence

import gin

from gr_jax.run_dir import RunDir

if TYPE_CHECKING:
    from gr_jax import network

GIN_CONFIGS_DIR = pathlib.Path(__file__).resolve().parent.parent / "gin_configs"
_GIN_WORD = re.compile(r"^(@|%|\[|\(|\{|True$|False$|None$|'|\")")


def _as_gin_value(value: str) -> str:
    value = value.strip()
    if _GIN_WORD.match(value):
        return value
    try:
        ast.literal_eval(value)
        return value
    except (ValueError, SyntaxError):
        return repr(value)


def parse_args(argv: Sequence[str], *, description: str) -> tuple[argparse.Namespace, list[str], list[str]]:
    """Splits argv into known flags, gin files and gin bindings."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gin_file", action="append", default=[], help="gin file(s), applied in order")
    parser.add_argument("--gin_search_path", action="append", default=[], help="extra dirs to look up gin files")
    parser.add_argument("--gin_bindings", action="append", default=[], help="raw gin binding(s)")
    args, rest = parser.parse_known_args(argv)
    bindings = list(args.gin_bindings)
    unknown = []
    for arg in rest:
        if arg.startswith("--gin."):
            key, sep, value = arg[len("--gin."):].partition("=")
            if not sep:
                raise SystemExit(f"{arg}: expected --gin.KEY=VALUE")
            bindings.append(f"{key} = {_as_gin_value(value)}")
        else:
            unknown.append(arg)
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)}")
    return args, list(args.gin_file), bindings


def _only_plain_file_readers() -> None:
    """gin 0.5.0 also looks gin paths up as Python package resources, and crashes (TypeError) when a folder of the
    working directory shares the path's first component (e.g. an output folder `runs/` next to `runs/train.gin`):
    namespace packages have no __file__. Our gin files are plain files, so only the plain reader is kept. gin has no
    public way to do this: `gin.config.register_file_reader` only appends readers, and the resource reader is tried
    for the working directory's prefix before any search path."""
    from gin import config as gin_config
    gin_config._FILE_READERS[:] = [(reader, exists) for reader, exists in gin_config._FILE_READERS
                                   if reader is open]


def parse_gin(*, gin_files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str] = ()) -> None:
    """Applies gin files then bindings; gin's own errors (unknown binding, missing REQUIRED) propagate, and a macro
    that a binding sets but no config uses is an error."""
    _only_plain_file_readers()
    for path in [*search_paths, str(GIN_CONFIGS_DIR), os.getcwd()]:
        gin.add_config_file_search_path(path)
    try:
        gin.parse_config_files_and_bindings(list(gin_files), list(bindings), finalize_config=True)
    except ValueError as error:  # e.g. `TRAIN_STEPS set to %gin.REQUIRED`: a misspelt binding is its likely cause
        _check_macros_used(gin_files=gin_files, bindings=bindings, cause=error)
        raise
    _check_macros_used(gin_files=gin_files, bindings=bindings)


def _check_macros_used(*, gin_files: Sequence[str], bindings: Sequence[str], cause: Exception | None = None) -> None:
    """`NAME = value` (a name without a dot) defines a macro: one that nothing refers to is a misspelling such as
    `--gin.TRAIN_STEPZ=5`, which gin would otherwise take without a word."""
    referenced = _referenced_macros()
    bound = [binding.partition("=")[0].strip() for binding in bindings]
    unused = [name for name in bound if name and "." not in name and "/" not in name and name not in referenced]
    if unused:
        name = unused[0]
        close = difflib.get_close_matches(name, sorted(referenced), n=1)
        raise ValueError(f"the binding of macro {name} ({', '.join(unused)}) is used by none of the gin files "
                         f"{list(gin_files)}" + (f": did you mean {close[0]}?" if close else "")) from cause


def _referenced_macros() -> set[str]:
    """The macros the parsed config refers to (`%NAME` anywhere in a binding's value, macros' values included)."""
    from gin import config as gin_config
    names = set()

    def walk(value) -> None:
        if isinstance(value, gin_config.ConfigurableReference):
            scope, _, selector = value.scoped_selector.rpartition("/")
            if selector == "gin.macro":
                names.add(scope)
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    for parameters in gin_config._CONFIG.values():  # gin 0.5.0 keeps the parsed bindings here (no public view)
        for value in parameters.values():
            walk(value)
    return names



def t5_config(gin_files: Sequence[str], *, bindings: Sequence[str] = (), **overrides) -> "network.T5Config":
    """The `network.T5Config` that `gin_files` (a size gin: dimensions only) and `bindings` describe, with
    `overrides` (e.g. vocab_size, dtype) on top, as the training entry points build it. Tools and benchmarks take
    model sizes from here; the gin config is cleared before and after, so no binding outlives the call."""
    from gr_jax import network
    gin.clear_config()
    try:
        parse_gin(gin_files=gin_files, bindings=bindings)
        return gin.get_configurable(network.T5Config)(**overrides)
    finally:
        gin.clear_config()


def parse_run_config(model_dir: str | os.PathLike, *, gin_args: Sequence[str] = (), missing: str) -> None:
    """Parses the gin config a training run wrote (`model_dir/config.gin`), then `gin_args` (`--gin_file=...`,
    `--gin.KEY=VALUE`) on top, replacing any parsed config; `missing` says what to do when there is none."""
    config = RunDir.of(model_dir).config
    if not config.is_file():
        raise FileNotFoundError(f"{config} is missing: {missing}")
    parsed, gin_files, bindings = parse_args(list(gin_args), description=f"gin overrides of {config}")
    gin.clear_config()
    parse_gin(gin_files=[str(config), *gin_files], bindings=bindings, search_paths=parsed.gin_search_path)


def initialize_distributed() -> None:
    """Multi-host start-up before any other JAX call, with the gin bindings of
    `partitioning.initialize_distributed` (coordinator address, process count and id; auto-detected when unset)."""
    from gr_jax import partitioning
    try:
        configured = gin.get_configurable(partitioning.initialize_distributed)
    except ValueError:  # No gin file mentions it: single process or JAX's auto-detection.
        configured = partitioning.initialize_distributed
    try:
        configured()
    except RuntimeError as e:
        # The entry point was called from a process that already used JAX (a notebook, a test): it stays the
        # single process it already is.
        logging.getLogger(__name__).warning("not initialising jax.distributed: %s", e)

