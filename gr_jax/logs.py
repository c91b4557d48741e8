"""Where log records go: the console shows progress, results and problems; a run's log file keeps everything.

At GR_JAX_LOG_LEVEL (default INFO) the console shows gr_jax's own records, other libraries' (orbax, absl, JAX) only
from WARNING, each distinct one once and its first line only (a failed asynchronous save reports every pending write
alike), and tracebacks only with GR_JAX_TRACEBACK=1. A record logged with `extra=FILE_ONLY` (the operative
gin config, checkpoint bookkeeping) never reaches the console. While a run trains or is evaluated, `run_log` writes
every record at INFO and above, tracebacks included, to the run's log file, starting with those logged before it
was opened (held in memory until then).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import pathlib
import sys
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Optional

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TRACEBACK_VARIABLE = "GR_JAX_TRACEBACK"
LEVEL_VARIABLE = "GR_JAX_LOG_LEVEL"
_CONSOLE_KEY = "gr_jax_console"
FILE_ONLY = {_CONSOLE_KEY: False}
logger = logging.getLogger(__name__)
# Records kept in memory before a run's log file is attached (the oldest dropped beyond it).
EARLY_RECORDS = 10_000


def show_tracebacks() -> bool:
    return bool(os.environ.get(TRACEBACK_VARIABLE))


def _is_own(name: str) -> bool:
    return name == "__main__" or name == "gr_jax" or name.startswith("gr_jax.")


def _first_line(message: str) -> str:
    head, newline, _ = message.partition("\n")
    return head + " ..." if newline else head


class ConsoleFilter(logging.Filter):
    """gr_jax's records from `level`; other libraries' from WARNING (or `level`, if higher), each distinct first
    line once; no FILE_ONLY ones."""

    def __init__(self, *, level: int):
        super().__init__()
        self.level = level
        self._shown: set[tuple[str, int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, _CONSOLE_KEY, True):
            return False
        if _is_own(record.name):
            return record.levelno >= self.level
        if record.levelno < max(self.level, logging.WARNING):
            return False
        kind = (record.name, record.levelno, _first_line(record.getMessage()))
        shown = kind in self._shown
        self._shown.add(kind)
        return not shown


class ConsoleFormatter(logging.Formatter):
    """The record's line with its exception's type and message in place of the traceback, and another library's
    message cut to its first line (unless GR_JAX_TRACEBACK is set); the run's log file keeps them whole."""

    def format(self, record: logging.LogRecord) -> str:
        own = _is_own(record.name)
        if show_tracebacks() or (own and not (record.exc_info or record.stack_info)):
            return super().format(record)
        line = logging.makeLogRecord(record.__dict__)  # the file handler still formats the original's traceback
        line.exc_info, line.exc_text, line.stack_info = None, None, None
        message = record.getMessage() if own else _first_line(record.getMessage())
        error = record.exc_info[1] if record.exc_info else None
        line.msg, line.args = f"{message}: {type(error).__name__}: {error}" if error is not None else message, ()
        return super().format(line)


class _EarlyRecords(logging.Handler):
    """Holds the records logged before a run's log file exists, to be written into it first."""

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.records: collections.deque[logging.LogRecord] = collections.deque(maxlen=EARLY_RECORDS)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _RunLogFile(logging.FileHandler):
    """The run's log file; when it cannot be written (a full disk), one line says so and the file is given up:
    `logging` would print a traceback for every record."""

    def __init__(self, path: pathlib.Path):
        super().__init__(path, encoding="utf-8")
        self.broken = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.broken:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.broken:
            self.broken = True
            error = sys.exc_info()[1]
            print(f"warning: cannot write the run's log {self.baseFilename} ({error}); the console only from now",
                  file=sys.stderr, flush=True)


_early: Optional[_EarlyRecords] = None
_TRACEBACK_FILE = "gr_jax_traceback_file"


def configure_console(*, log_format: str = FORMAT) -> None:
    """Console logging at GR_JAX_LOG_LEVEL as the module docstring says; records held for the next run's log file.
    Call it before anything logs (a module-level `logging.warning` would configure the root logger first)."""
    name = os.environ.get(LEVEL_VARIABLE, "INFO").upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValueError(f"{LEVEL_VARIABLE}={name!r} is not a logging level (DEBUG, INFO, WARNING, ERROR)")
    root = logging.getLogger()
    # Ours from an earlier call, or Python's default one that a record logged at import time installed.
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler and h.stream in (sys.stderr,
                                                                                                     sys.__stderr__)]:
        root.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.gr_jax_console = True  # type: ignore[attr-defined]
    console.addFilter(ConsoleFilter(level=level))
    console.setFormatter(ConsoleFormatter(log_format))
    root.addHandler(console)
    root.setLevel(min(level, logging.INFO))  # the run's log file gets INFO even when the console shows less
    threading.excepthook = _log_thread_error
    sys.unraisablehook = _log_unraisable
    _errors_shown.clear()
    _hold_early_records()


_errors_shown: set[tuple[str, str]] = set()


def _log_error_once(message: str, error: BaseException, traceback: Optional[TracebackType]) -> None:
    """`message` with `error`'s traceback in the run's log file every time; on the console once per kind of error."""
    kind = (type(error).__name__, str(error))
    shown = kind in _errors_shown
    _errors_shown.add(kind)
    logger.error(message, exc_info=(type(error), error, traceback), extra=FILE_ONLY if shown else {})


def _log_thread_error(args: threading.ExceptHookArgs) -> None:
    """A background thread's error (an asynchronous checkpoint write) as one console line, once per kind of error:
    Python's default hook prints every traceback."""
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    _log_error_once(f"thread {args.thread.name if args.thread is not None else '?'} ended with an error",
                    args.exc_value, args.exc_traceback)


def _log_unraisable(unraisable: "sys.UnraisableHookArgs") -> None:
    """An error Python could not raise (a callback from native code: tensorstore's writes completing into the event
    loop of a save that failed on a full disk) as one console line per kind: Python's default hook prints each one's
    traceback."""
    if unraisable.exc_value is None:
        return
    where = f" in {unraisable.object!r}" if unraisable.object is not None else ""
    _log_error_once(f"{unraisable.err_msg or 'an error was ignored'}{where}", unraisable.exc_value,
                    unraisable.exc_traceback)


def _hold_early_records() -> None:
    global _early
    if _early is None:
        _early = _EarlyRecords()
        logging.getLogger().addHandler(_early)


@contextlib.contextmanager
def run_log(path: pathlib.Path) -> Iterator[pathlib.Path]:
    """Appends every record to `path` while the body runs, starting with those held since `configure_console` (or
    the previous run log), and the traceback of an error that ends the body; yields the absolute path."""
    global _early
    root = logging.getLogger()
    path = pathlib.Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = _RunLogFile(path)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(FORMAT))
    if _early is not None:
        root.removeHandler(_early)
        for record in _early.records:
            handler.handle(record)
        _early = None
    root.addHandler(handler)
    try:
        yield path
    except Exception as error:
        logger.error("the run ended with an error", exc_info=True, extra=FILE_ONLY)
        with contextlib.suppress(AttributeError):  # a few built-in exceptions take no attributes
            setattr(error, _TRACEBACK_FILE, path)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
        _hold_early_records()


def traceback_file(error: BaseException) -> Optional[pathlib.Path]:
    """The run log that holds `error`'s traceback, if a `run_log` body ended with it."""
    return getattr(error, _TRACEBACK_FILE, None)
