"""What every entry point does around its work: TensorFlow's start-up noise dropped (and nothing else), bad input
ending in one line with exit status 1."""
import os
import subprocess
import sys

import pytest

from gr_jax import entry_point
from gr_jax import logs
from gr_jax.data.readers import DataFormatError


def test_start_up_noise_is_dropped_and_everything_else_replayed(capfd):
    noise = ["WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
             "I0000 00:00:1795505584.178190   11088 port.cc:153] oneDNN custom operations are on. You may see ...",
             "I0000 00:00:1795505584.179187   11088 cudart_stub.cc:31] Could not find cuda drivers on your machine.",
             "E0000 00:00:1795506327.753723   13700 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error"]
    real = ["E0000 00:00:1795505584.1 11088 op_kernel.cc:1857] a real TensorFlow error", "plain text"]
    with entry_point._quiet_stderr():
        os.write(2, ("\n".join([noise[0], real[0], *noise[1:], real[1]]) + "\n").encode())
    assert capfd.readouterr().err.splitlines() == real


def test_a_real_start_has_no_noise():
    """`setup` in a fresh process: importing TensorFlow prints nothing."""
    out = subprocess.run([sys.executable, "-c", "from gr_jax import entry_point; entry_point.setup(); "
                          "import tensorflow, seqio; print('ok')"], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert out.stdout == "ok\n" and out.stderr == ""


def test_entry_points_keep_compiled_programs_in_the_persistent_cache(tmp_path):
    """Programs compiled after `setup` are written to GR_JAX_COMPILATION_CACHE and read back by the next process (its
    compiles are cache hits), also where JAX was imported before `setup`; `off` keeps none."""
    program = ("jax.config.update('jax_persistent_cache_min_compile_time_secs', 0); "
               "from jax._src import monitoring; hits = []; "
               "monitoring.register_event_listener(lambda event, **_: hits.append(event)); "
               "jax.jit(lambda x: (x @ x.T).sum())(jax.numpy.ones((8, 8))).block_until_ready(); "
               "print(sum(e == '/jax/compilation_cache/cache_hits' for e in hits))")
    setup = ("import sys; sys.modules['tensorflow'] = None; "  # setup imports TensorFlow if it can: not needed here
             "from gr_jax import entry_point; entry_point.setup(); ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    cache = tmp_path / "cache"

    def hits(script: str, where: str) -> int:
        return int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                  env={**env, "GR_JAX_COMPILATION_CACHE": where}).stdout)

    assert hits(setup + "import jax; " + program, str(cache)) == 0  # compiled and written
    written = sorted(p.name for p in cache.iterdir())
    assert any(name.endswith("-cache") for name in written)
    assert hits("import jax; " + setup + program, str(cache)) > 0  # read back; JAX imported first
    assert hits(setup + "import jax; " + program, "off") == 0
    assert sorted(p.name for p in cache.iterdir()) == written


def _exit_code(body):
    """What `entry_point.run(body)` exits with (the `error:` line, which Python prints to stderr, or a status)."""
    with pytest.raises(SystemExit) as exit_info:
        entry_point.run(body)
    return exit_info.value.code


@pytest.mark.parametrize("error", [FileNotFoundError("no file x"), FileExistsError("x exists"),
                                   OSError("Unable to open file: runs/typo/config.gin."),  # gin's missing file
                                   DataFormatError("data/c.tsv:3: duplicate pid '7'"), ValueError("bad setting")])
def test_bad_input_ends_with_one_line(error, monkeypatch):
    monkeypatch.delenv("GR_JAX_TRACEBACK", raising=False)

    def body():
        raise error

    assert _exit_code(body) == f"error: {error}"  # exit status 1
    monkeypatch.setenv("GR_JAX_TRACEBACK", "1")
    with pytest.raises(type(error)):
        entry_point.run(body)
    assert entry_point.run(lambda: 42) == 42


def test_other_errors_end_in_one_line_naming_the_log_that_holds_their_traceback(tmp_path, monkeypatch):
    monkeypatch.delenv("GR_JAX_TRACEBACK", raising=False)
    assert _exit_code(lambda: {}["missing"]) == "error: KeyError: 'missing' (GR_JAX_TRACEBACK=1 shows its traceback)"

    def failing_run():
        with logs.run_log(tmp_path / "log.txt"):
            raise RuntimeError("a bug")

    assert _exit_code(failing_run) == f"error: RuntimeError: a bug (its traceback is in {tmp_path / 'log.txt'})"
    log = (tmp_path / "log.txt").read_text()
    assert "Traceback (most recent call last)" in log and 'raise RuntimeError("a bug")' in log
    monkeypatch.setenv("GR_JAX_TRACEBACK", "1")
    with pytest.raises(KeyError):
        entry_point.run(lambda: {}["missing"])


def test_an_interrupt_ends_in_one_line(monkeypatch, capsys):
    monkeypatch.delenv("GR_JAX_TRACEBACK", raising=False)

    def interrupted():
        raise KeyboardInterrupt

    assert _exit_code(interrupted) == 130 and capsys.readouterr().err == "interrupted\n"


def test_gin_call_context_is_dropped_from_the_line(monkeypatch):
    monkeypatch.delenv("GR_JAX_TRACEBACK", raising=False)
    message = ("no SentencePiece vocabulary at /x/spm.model; train one beside the data\n"
               "  In call to configurable 'train' (<function train at 0x7fa11a6d23e0>)")

    def body():
        raise FileNotFoundError(message)

    assert _exit_code(body) == "error: no SentencePiece vocabulary at /x/spm.model; train one beside the data"


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["--no_such_flag"], 2)])
def test_help_and_a_bad_flag_answer_before_tensorflow_and_jax_are_imported(argv, code):
    """`python -m gr_jax.train --help` took 18 s (TensorFlow and JAX were imported before the arguments were read)."""
    probe = ("import contextlib, io, sys\n"
             "from gr_jax import eval as evaluate, train\n"
             "for entry in (train, evaluate):\n"
             "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
             "        try:\n"
             f"            entry.main({argv!r})\n"
             "        except SystemExit as e:\n"
             f"            assert e.code == {code}, e.code\n"
             "print(sorted(name for name in ('tensorflow', 'jax', 'seqio') if name in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout == "[]\n"


def test_a_blank_search_query_is_refused_before_any_work(capsys, tmp_path):
    """`gr-jax search ""` ranked documents for an empty query."""
    from gr_jax import search
    with pytest.raises(SystemExit) as exit_info:
        search.main(["--model_dir", str(tmp_path / "no_run"), "sourdough bread", "  "])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("error: query 2 of 2 is empty or blank")
