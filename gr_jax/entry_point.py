"""What every entry point and tool does around its work: a quiet start-up, console logging, and every error ending
in one clear line.

* TensorFlow (seqio's pipelines) prints C++ start-up lines when it is first imported (absl's "before
  InitializeLog", oneDNN, the CUDA stub on CPU hosts) that `TF_CPP_MIN_LOG_LEVEL` does not silence. `setup` imports
  it with the process's stderr captured, drops those known lines and replays anything else, so a real problem
  still shows. It also keeps TensorFlow off the accelerators, which belong to JAX.
* Bad input (a missing file, an existing output, a malformed line, a setting that cannot work) ends the program
  with `error: <message>` (the message names the file and line where there is one) and exit status 1, not a
  traceback. Any other error ends with `error: <type>: <message>` and its traceback goes to the run's log file
  (`gr_jax.logs`). Set GR_JAX_TRACEBACK=1 to see tracebacks instead.
* Programs that take a second or more to compile (a train step, a constrained search) are kept in JAX's persistent
  compilation cache, so a second run of an entry point (another `gr-jax search`, each evaluation) loads them
  instead of compiling again: `compilation_cache_dir` says where.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, Optional, TypeVar

from gr_jax import logs

# Errors that mean the input or the machine is wrong, not the program: a missing, existing or unreadable file (gin's
# "Unable to open file" is a plain OSError), a full disk, a malformed line (DataFormatError is a ValueError).
BAD_INPUT = (OSError, ValueError)

_STARTUP_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:. ]+\d+ (port\.cc|cudart_stub\.cc|cpu_feature_guard\.cc):\d+\] .*"
    r"|E\d{4} [\d:. ]+\d+ cuda_platform\.cc:\d+\] failed call to cuInit: .*")

# gin appends this to every exception raised inside a configurable; it names a function object, not the input.
_GIN_CALL_CONTEXT = re.compile(r"\n\s+In call to configurable '[^']*' \(<[^>]*>\)")

T = TypeVar("T")


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Captures file descriptor 2 (C++ writes there directly); replays every line but the known start-up noise."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode("utf-8", "replace").splitlines()
                    if line.strip() and not _STARTUP_NOISE.fullmatch(line.strip())]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


class _DropSeqioCacheAdvice(logging.Filter):
    """seqio advises caching every FunctionDataSource task offline before training, for shuffling on restarts. Our
    tasks cache their examples in memory (`gr_jax.data.preprocessors.cache_in_memory`) and a resumed run restarts at
    its exact input position (`gr_jax.data.pipeline`), so the advice does not apply; it is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Using an uncached FunctionDataset for training is not recommended")


_SEQIO_CACHE_ADVICE = _DropSeqioCacheAdvice()


COMPILATION_CACHE_ENV = "GR_JAX_COMPILATION_CACHE"
COMPILATION_CACHE_MAX_BYTES = 4 << 30  # JAX evicts the least recently used programs beyond it


def compilation_cache_dir() -> Optional[str]:
    """Where entry points keep compiled programs: $GR_JAX_COMPILATION_CACHE (a directory, or a bucket path on a pod,
    which JAX's cache reads; `off` for none), else $XDG_CACHE_HOME/gr_jax/jax or ~/.cache/gr_jax/jax. A
    JAX_COMPILATION_CACHE_DIR already set (JAX's own variable, e.g. the test suite's) is used as it is."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    chosen = os.environ.get(COMPILATION_CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off") else chosen
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "gr_jax", "jax")


def _use_compilation_cache() -> None:
    """Points JAX's persistent compilation cache at `compilation_cache_dir()`: through JAX's environment variables
    when JAX is not imported yet (they reach subprocesses too), else through its config, unless a cache is set."""
    directory = compilation_cache_dir()
    if directory is None:
        return
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", directory)
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(COMPILATION_CACHE_MAX_BYTES))
    jax = sys.modules.get("jax")
    if jax is not None:  # imported before setup: its config read the environment already
        if not jax.config.jax_compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", directory)
            if jax.config.jax_compilation_cache_max_size < 0:
                jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_MAX_BYTES)


def setup(*, log_format: str = logs.FORMAT) -> None:
    """JAX's persistent compilation cache (`compilation_cache_dir`), TensorFlow imported quietly and kept off the
    accelerators, then console logging (`gr_jax.logs`) at GR_JAX_LOG_LEVEL (default INFO; e.g. WARNING for a demo
    that should show only progress bars and results). Call it first: before any import that loads TensorFlow (seqio,
    `gr_jax.training`), whose start-up would otherwise print, and before anything logs."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _use_compilation_cache()
    if "tensorflow" not in sys.modules:
        with _quiet_stderr():  # hiding GPUs initialises TensorFlow's CUDA platform, which prints too
            try:
                import tensorflow as tf
                tf.config.set_visible_devices([], "GPU")
            except ImportError:  # pragma: no cover - a tool that does not need TensorFlow
                pass
            except RuntimeError:  # pragma: no cover - devices already initialised
                pass
    logs.configure_console(log_format=log_format)
    logging.getLogger("absl").addFilter(_SEQIO_CACHE_ADVICE)  # added once, however often setup runs


def run(body: Callable[[], T]) -> T:
    """Runs an entry point's body, ending any error in one `error:` line and exit status 1 (130 when interrupted).

    Bad input (`BAD_INPUT`) is its message alone; any other error also names its type and says where its traceback
    went: into the run's log file (`gr_jax.logs`), if one is attached. GR_JAX_TRACEBACK=1 raises it as usual. The
    error's line is the last: what the failed work left to be collected (a failed save's futures, which asyncio
    reports when they are freed) is collected before it."""
    try:
        return body()
    except KeyboardInterrupt:
        if logs.show_tracebacks():
            raise
        last_line, status = "interrupted", 130
    except Exception as e:  # noqa: BLE001 - the one place every entry point's errors end
        if logs.show_tracebacks():
            raise
        message = _GIN_CALL_CONTEXT.sub("", str(e))
        log = logs.traceback_file(e)
        where = f"its traceback is in {log}" if log else "GR_JAX_TRACEBACK=1 shows its traceback"
        last_line = f"error: {message}" if isinstance(e, BAD_INPUT) else (
            f"error: {type(e).__name__}: {message} ({where})")
        status = 1
    gc.collect()  # the error and its traceback's frames are released here, outside the except clause
    if status == 1:
        sys.exit(last_line)  # printed by Python on the way out; the message stays the SystemExit's
    print(last_line, file=sys.stderr, flush=True)
    sys.exit(status)


def run_tool(build: Callable[[], dict], *, report: Callable[[dict], Any] = lambda summary: summary,
             indent: int | None = None) -> dict:
    """Body of a data-preparation tool's main: `setup`, `run(build)`, and the summary printed as one JSON line."""
    setup(log_format="%(levelname)s %(name)s: %(message)s")
    summary = run(build)
    print(json.dumps(report(summary), indent=indent), flush=True)
    return summary


def run_configured(argv, *, description: str, gin_file: str, function: Callable[[], Callable[[], Any]]) -> None:
    """Body of an entry point that calls one gin-configured function: `--gin_file`s (the run's config.gin) and
    `--gin.KEY=VALUE`s, then `gin_file` (which binds the function, e.g. runs/eval.gin), then the function's result
    printed as one JSON line. `function` returns the configurable; it is called after `setup`, so its module may
    import TensorFlow."""
    import gin

    from gr_jax import gin_utils
    # The arguments first: --help and a bad flag answer before TensorFlow and JAX are imported.
    args, gin_files, bindings = gin_utils.parse_args(sys.argv[1:] if argv is None else argv, description=description)
    setup()
    if gin_file not in gin_files:
        gin_files.append(gin_file)

    def body() -> None:
        configurable = function()
        gin_utils.parse_gin(gin_files=gin_files, bindings=bindings, search_paths=args.gin_search_path)
        gin_utils.initialize_distributed()
        print(json.dumps(gin.get_configurable(configurable)()))

    run(body)
