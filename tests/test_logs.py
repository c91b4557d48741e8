"""Where log records go (`gr_jax.logs`): the console shows gr_jax's records and other libraries' problems, without
tracebacks; a run's log file keeps everything, including what was logged before it was opened."""
import logging

import pytest

from gr_jax import logs


@pytest.fixture
def root_logging():
    """The root logger's handlers and level and the error hooks, put back after a test that configures them."""
    import sys
    import threading

    root = logging.getLogger()
    handlers, level, hooks = list(root.handlers), root.level, (threading.excepthook, sys.unraisablehook)
    yield root
    threading.excepthook, sys.unraisablehook = hooks
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


def _record(name: str, level: int, message: str = "m", *, exc_info=None, **extra) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, message, (), exc_info)
    record.__dict__.update(extra)
    return record


@pytest.mark.parametrize("name, level, shown", [
    ("gr_jax.training", logging.INFO, True), ("gr_jax", logging.INFO, True), ("__main__", logging.INFO, True),
    ("gr_jax.training", logging.DEBUG, False), ("absl", logging.INFO, False),
    ("jax._src.xla_bridge", logging.INFO, False),
    ("absl", logging.WARNING, True), ("gr_jaxx", logging.INFO, False), ("orbax", logging.ERROR, True)])
def test_console_shows_own_records_from_the_level_and_others_from_warning(name, level, shown):
    assert logs.ConsoleFilter(level=logging.INFO).filter(_record(name, level)) is shown


def test_console_level_above_warning_applies_to_every_logger():
    console = logs.ConsoleFilter(level=logging.ERROR)
    assert not console.filter(_record("gr_jax.training", logging.WARNING))
    assert not console.filter(_record("absl", logging.WARNING))
    assert console.filter(_record("absl", logging.ERROR))


def test_file_only_records_never_reach_the_console():
    assert not logs.ConsoleFilter(level=logging.DEBUG).filter(_record("gr_jax.x", logging.ERROR, **logs.FILE_ONLY))


def test_console_line_has_the_error_not_its_traceback(monkeypatch):
    monkeypatch.delenv("GR_JAX_TRACEBACK", raising=False)
    try:
        raise OSError(28, "No space left on device")
    except OSError as e:
        record = _record("orbax", logging.ERROR, "save failed", exc_info=(type(e), e, e.__traceback__))
    formatter = logs.ConsoleFormatter("%(levelname)s %(name)s: %(message)s")
    assert formatter.format(record) == "ERROR orbax: save failed: OSError: [Errno 28] No space left on device"
    full = logging.Formatter("%(message)s").format(record)  # the file's formatter still has the traceback
    assert full.startswith("save failed\nTraceback (most recent call last)") and "No space left" in full
    monkeypatch.setenv("GR_JAX_TRACEBACK", "1")
    assert "Traceback (most recent call last)" in formatter.format(record)


def test_run_log_holds_earlier_records_and_the_error_that_ended_the_run(tmp_path, monkeypatch, root_logging):
    monkeypatch.setenv("GR_JAX_LOG_LEVEL", "WARNING")
    logs.configure_console()
    logging.getLogger("absl").info("before the run")
    with pytest.raises(ValueError) as error:
        with logs.run_log(tmp_path / "run" / "log.txt") as path:
            logging.getLogger("gr_jax.training").info("during the run")
            raise ValueError("bad")
    logging.getLogger("gr_jax.training").info("after the run")
    text = path.read_text()
    assert [line.split(": ", 1)[1] for line in text.splitlines() if " INFO " in line][-2:] == [
        "before the run", "during the run"]  # after whatever an earlier test logged since its run
    assert "ERROR gr_jax.logs: the run ended with an error\nTraceback" in text and "ValueError: bad" in text
    assert logs.traceback_file(error.value) == tmp_path / "run" / "log.txt"
    with logs.run_log(tmp_path / "next.txt") as second:  # the record between the runs opens the next run's log
        pass
    assert [line.split(": ", 1)[1] for line in second.read_text().splitlines()] == ["after the run"]


def test_another_librarys_record_is_one_line_and_each_distinct_one_shown_once(monkeypatch):
    """A save that fails on a full disk: asyncio reports each pending write's error alike, in two lines each."""
    monkeypatch.delenv("GR_JAX_TRACEBACK", raising=False)
    console = logs.ConsoleFilter(level=logging.INFO)
    formatter = logs.ConsoleFormatter("%(levelname)s %(name)s: %(message)s")
    records = [_record("asyncio", logging.ERROR, f"Task exception was never retrieved\nfuture: <Task-{i}>")
               for i in range(3)] + [_record("absl", logging.ERROR, "write failed")]
    assert [formatter.format(r) for r in records if console.filter(r)] == [
        "ERROR asyncio: Task exception was never retrieved ...", "ERROR absl: write failed"]
    own = [_record("gr_jax.training", logging.WARNING, "twice\nin two lines") for _ in range(2)]
    shown = [formatter.format(r) for r in own if console.filter(r)]
    assert shown == ["WARNING gr_jax.training: twice\nin two lines"] * 2


def test_an_unraisable_error_is_one_line_with_its_traceback_in_the_file(tmp_path, monkeypatch, root_logging):
    """What native code's callbacks raise (tensorstore's writes completing into a closed event loop) reaches
    sys.unraisablehook: one console line per kind, every traceback in the run's log."""
    import gc

    monkeypatch.delenv("GR_JAX_TRACEBACK", raising=False)
    logs.configure_console()
    console = next(h for h in root_logging.handlers if type(h) is logging.StreamHandler)
    lines = []
    console.emit = lambda record: lines.append(console.format(record))

    class Callback:
        def __del__(self):
            raise RuntimeError("Event loop is closed")

    with logs.run_log(tmp_path / "log.txt") as path:
        for _ in range(3):
            Callback()
            gc.collect()
    assert len(lines) == 1 and lines[0].endswith("RuntimeError: Event loop is closed"), lines
    assert path.read_text().count("Traceback (most recent call last)") == 3


def test_a_misspelt_level_is_bad_input(monkeypatch):
    monkeypatch.setenv("GR_JAX_LOG_LEVEL", "WARN1NG")
    with pytest.raises(ValueError, match="GR_JAX_LOG_LEVEL='WARN1NG' is not a logging level"):
        logs.configure_console()


def test_a_background_threads_error_is_one_line_with_its_traceback_in_the_file(tmp_path, monkeypatch, root_logging):
    import threading

    monkeypatch.delenv("GR_JAX_TRACEBACK", raising=False)
    logs.configure_console()
    console = next(h for h in root_logging.handlers if type(h) is logging.StreamHandler)
    lines = []
    console.emit = lambda record: lines.append(console.format(record))
    with logs.run_log(tmp_path / "log.txt") as path:
        for _ in range(3):  # a full disk fails each pending write alike: one console line
            thread = threading.Thread(target=lambda: 1 / 0, name="async_save")
            thread.start()
            thread.join()
    assert len(lines) == 1 and lines[0].endswith(
        "ERROR gr_jax.logs: thread async_save ended with an error: ZeroDivisionError: division by zero")
    assert path.read_text().count("thread async_save ended with an error\nTraceback (most recent call last)") == 3


def test_a_run_log_that_cannot_be_written_says_so_once(tmp_path, capsys):
    class FullDisk:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

    with logs.run_log(tmp_path / "log.txt") as path:
        handler = next(h for h in logging.getLogger().handlers if getattr(h, "baseFilename", None) == str(path))
        handler.stream = FullDisk()
        for _ in range(3):
            logging.getLogger("gr_jax.training").warning("a record")
        handler.stream = None
    assert capsys.readouterr().err.count(f"warning: cannot write the run's log {path} ([Errno 28] No space left on "
                                         f"device); the console only from now") == 1
