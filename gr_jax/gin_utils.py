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
import io
import logging
import os
import pathlib
import re
from typing import TYPE_CHECKING, Sequence

import gin

from gr_jax.run_dir import RunDir

if TYPE_CHECKING:
    from gr_jax import network
    from gr_jax.decoder_only.network import DecoderOnlyConfig
    from gr_jax.heads import OutputHead

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
    namespace packages have no __file__. Our gin files are plain files, so only the plain reader is kept, and it
    migrates what older code wrote (`read_gin_file`). gin has no public way to do this:
    `gin.config.register_file_reader` only appends readers, and the resource reader is tried for the working
    directory's prefix before any search path."""
    from gin import config as gin_config
    gin_config._FILE_READERS[:] = [(read_gin_file, os.path.isfile)]


class _GinText(io.StringIO):
    """A gin file's text as gin parses it; `name` is the file's path, which gin's errors name."""

    def __init__(self, text: str, *, name: str):
        super().__init__(text)
        self.name = name


def read_gin_file(path: str) -> io.StringIO:
    """The gin file `path` for gin to parse, its bindings of older code migrated (`migrate_head_bindings`)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return _GinText(migrate_head_bindings(text, source=path), name=path)


# --- Run configs written by older code ---------------------------------------------------------------------------
#
# Before each output head owned its settings, the head was named by `network.T5Config.decoder_head` and its settings
# were T5Config fields; a run dir's config.gin (gin's config_str, one flat binding per line) still holds them.

# decoder_head's old names -> the head class that replaced each.
_OLD_HEADS = {"standard": "gr_jax.heads.standard.StandardHead", "atomic": "gr_jax.heads.atomic.AtomicHead",
              "pawa": "gr_jax.heads.pawa.PawaHead"}
# Old T5Config field -> (the heads that had the setting, its name on them).
_OLD_HEAD_SETTINGS = {"docid_vocab_start": (("atomic", "pawa"), "docid_vocab_start"),
                      "docid_vocab_size": (("atomic", "pawa"), "docid_vocab_size"),
                      "pawa_num_layers": (("pawa",), "num_layers")}
_OLD_HEAD_LINE = re.compile(r"^network\.T5Config\.(decoder_head|docid_vocab_start|docid_vocab_size|pawa_num_layers)"
                            r"[ \t]*=[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_OLD_HEAD_LEFT = re.compile(r"^[^#\n]*\b(decoder_head|pawa_num_layers)\b", re.MULTILINE)
_TAKES_NETWORK_CONFIG = re.compile(r"^([\w.]+)\.network_config[ \t]*=", re.MULTILINE)


def migrate_head_bindings(text: str, *, source: str) -> str:
    """`text` (a gin config, e.g. a run's config.gin written before heads owned their settings) with its old head
    bindings rewritten; unchanged when it has none.

        network.T5Config.decoder_head = 'pawa'                      # each old line becomes a comment, and at the end:
        network.T5Config.pawa_num_layers = %PAWA_NUM_LAYERS         import gr_jax.heads.pawa
        network.T5Config.docid_vocab_start = %DOCID_VOCAB_START     HEAD = @gr_jax.heads.pawa.PawaHead()
        experiment.Experiment.network_config = @network.T5Config()  gr_jax.heads.pawa.PawaHead.num_layers = ...
                                                                    (docid_vocab_start, docid_vocab_size alike)
                                                                    experiment.Experiment.head = %HEAD

    The head goes to every configurable that takes the `network_config` (a generative or GDR experiment); the
    standard head, every model's default, is not bound. A setting the old head ignored (the standard head's docid
    range) is dropped, as it had no effect. Old bindings this cannot
    place (no `network_config` binding, a `network.T5Config:` block) raise an error naming `source` and the line,
    and what to write instead."""
    found = list(_OLD_HEAD_LINE.finditer(text))
    if not found:
        _check_no_old_head_bindings(text, source=source)
        return text

    values = {match.group(1): (match.group(2), _line_of(text, match.start())) for match in found}
    name = "standard"
    if "decoder_head" in values:
        value, line = values["decoder_head"]
        try:
            name = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            name = value
        if name not in _OLD_HEADS:
            raise ValueError(f"{source}:{line}: network.T5Config.decoder_head = {value} names no head of the code "
                             f"that wrote it ({', '.join(map(repr, _OLD_HEADS))}); bind the head itself instead, e.g. "
                             "HEAD = @gr_jax.heads.pawa.PawaHead() (gin_configs/decoders/*.gin)")
    takers = sorted(set(_TAKES_NETWORK_CONFIG.findall(text)))
    if not takers:
        raise ValueError(f"{source}:{_line_of(text, found[0].start())}: {found[0].group(0).strip()} is an old "
                         "binding (the head is its own configurable now) and nothing here takes a network_config to "
                         f"give the head to: write HEAD = @{_OLD_HEADS[name]}() and bind the experiment's head = %HEAD "
                         "(gin_configs/decoders/*.gin, runs/train.gin)")
    if "dynamic_registration" not in text:
        raise ValueError(f"{source}: old head bindings in a config without `from __gin__ import dynamic_registration`: "
                         f"add it, or write HEAD = @{_OLD_HEADS[name]}() as gin_configs/decoders/*.gin do")
    migrated = _OLD_HEAD_LINE.sub(lambda match: f"# migrated: {match.group(0)}", text)
    _check_no_old_head_bindings(migrated, source=source)
    if name == "standard":
        return migrated  # every model's default head, which has no settings
    head = _OLD_HEADS[name]
    new = ["", "# Migrated by gr_jax.gin_utils.migrate_head_bindings: the output head is its own configurable.",
           f"import {head.rpartition('.')[0]}", f"HEAD = @{head}()"]
    for old, (heads, setting) in _OLD_HEAD_SETTINGS.items():
        if old in values and name in heads:
            new.append(f"{head}.{setting} = {values[old][0]}")
    new += [f"{taker}.head = %HEAD" for taker in takers]
    return migrated.rstrip("\n") + "\n" + "\n".join(new) + "\n"


def _line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _check_no_old_head_bindings(text: str, *, source: str) -> None:
    """Raises on a binding of decoder_head / pawa_num_layers that `migrate_head_bindings` cannot place."""
    match = _OLD_HEAD_LEFT.search(text)
    if match:
        raise ValueError(f"{source}:{_line_of(text, match.start())}: {match.group(1)} is no longer a T5Config "
                         "setting: the output head is its own configurable, e.g. HEAD = @pawa.PawaHead() with "
                         "pawa.PawaHead.num_layers = ... (after `from gr_jax.heads import pawa`; "
                         "gin_configs/decoders/*.gin)")


def parse_gin(*, gin_files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str] = ()) -> None:
    """Applies gin files then bindings; gin's own errors (unknown binding, missing REQUIRED) propagate, and a macro
    that a binding sets but no config uses is an error."""
    _only_plain_file_readers()
    for path in [*search_paths, str(GIN_CONFIGS_DIR), os.getcwd()]:
        gin.add_config_file_search_path(path)
    _check_no_old_head_bindings("\n".join(bindings), source="--gin bindings")
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
    return t5_config_and_head(gin_files, bindings=bindings, **overrides)[0]


def t5_config_and_head(gin_files: Sequence[str], *, bindings: Sequence[str] = (),
                       **overrides) -> tuple["network.T5Config", "OutputHead"]:
    """`t5_config`, and the output head the files bind as `HEAD` (a decoder gin, gin_configs/decoders/*.gin; the
    standard head where none does), for tools that build a model without an experiment."""
    from gr_jax import network
    from gr_jax.heads import StandardHead
    gin.clear_config()
    try:
        parse_gin(gin_files=gin_files, bindings=bindings)
        config = gin.get_configurable(network.T5Config)(**overrides)
        try:
            head = gin.query_parameter("%HEAD").scoped_configurable_fn()
        except ValueError:  # no HEAD bound
            head = StandardHead()
        return config, head
    finally:
        gin.clear_config()


def binds_decoder_only(gin_files: Sequence[str], *, bindings: Sequence[str] = ()) -> bool:
    """Whether the files configure the decoder-only family's network (a size file of gin_configs/decoder_only/)."""
    gin.clear_config()
    try:
        parse_gin(gin_files=gin_files, bindings=bindings)
        try:
            gin.query_parameter("DecoderOnlyConfig.emb_dim")
        except ValueError:  # not bound (or the configurable not registered: no file imports it)
            return False
        return True
    finally:
        gin.clear_config()


def decoder_only_config(gin_files: Sequence[str], *, bindings: Sequence[str] = (),
                        **overrides) -> "DecoderOnlyConfig":
    """The decoder-only network's config the files bind, with `overrides`, for tools that build a model without an
    experiment."""
    from gr_jax.decoder_only import network
    gin.clear_config()
    try:
        parse_gin(gin_files=gin_files, bindings=bindings)
        return gin.get_configurable(network.DecoderOnlyConfig)(**overrides)
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

