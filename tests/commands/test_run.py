"""``hooktrace run`` for real: a subprocess per run, compared with what plain ``python`` does.

The scripts live in tests/scripts/. Each traced run imports torch (~2 s), so runs whose log and
output several tests look at are made once per module (the ``*_run`` fixtures).
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import events, hooktrace_fresh, read_log

from hooktrace.log import schema
from hooktrace.log.reader import LogReader

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
TRAIN = SCRIPTS / "train_small.py"
RAISE = SCRIPTS / "raise_error.py"
LOOP = SCRIPTS / "loop_forever.py"

Run = subprocess.CompletedProcess[str]


def python(*args: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None) -> Run:
    """The same thing run by plain python, for comparison."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def script_stderr(stderr: str) -> list[str]:
    """stderr without hooktrace's own lines (the summary): what the script itself printed."""
    return [line for line in stderr.splitlines() if not line.startswith("hooktrace: ")]


def from_script_frame(lines: list[str], script_name: str) -> list[str]:
    """The lines from the first ``File "...script_name", line N`` on."""
    pattern = re.compile(r'^\s*File ".*' + re.escape(script_name) + r'", line \d+')
    for i, line in enumerate(lines):
        if pattern.match(line):
            return lines[i:]
    raise AssertionError(f"no frame of {script_name} in:\n" + "\n".join(lines))


def summary(events_: int, steps: int, log: str, dropped: int = 0, unseen: str = ""
            ) -> list[str]:
    """run's closing lines; ``unseen``: why nothing was traced, said instead of what next."""
    more = f", {dropped} more not written (--max-events)" if dropped else ""
    plural = "" if steps == 1 else "s"
    then = (f"nothing traced: {unseen}" if unseen else
            f"next: hooktrace render {log}; hooktrace check {log}")
    return [f"hooktrace: {events_} events, {steps} step{plural}{more} -> {log}",
            f"hooktrace: {then}"]


def end_of(path: Path) -> schema.End:
    records = read_log(path)
    assert isinstance(records[-1], schema.End), records[-1]
    return records[-1]


def assert_user_error(result: Run, message: str) -> None:
    """Bad input: exit 2, one line ``hooktrace: error: ...`` on stderr, no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"hooktrace: error: {message}"]
    assert result.stdout == ""


# -- a successful run: the log's contents ------------------------------------------------------

@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    cwd = tmp_path_factory.mktemp("train")
    result = hooktrace_fresh("run", "-o", "train.jsonl", TRAIN, "3", cwd=cwd)
    return result, cwd / "train.jsonl"


def test_run_passes_output_and_exit_status(train_run: tuple[Run, Path]) -> None:
    result, _ = train_run
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained 3 steps\n"
    assert result.stderr.splitlines() == summary(24, 3, "train.jsonl")


def test_run_log_header_first(train_run: tuple[Run, Path]) -> None:
    _, log = train_run
    first = log.read_bytes().split(b"\n", 1)[0]
    assert first.startswith(b'{"type":"header"')
    header = read_log(log)[0]
    assert isinstance(header, schema.Header)
    assert header.schema == schema.SCHEMA_VERSION == 3
    assert header.argv == [str(TRAIN), "3"]
    assert header.options["max_events"] == 1_000_000
    assert not {"include", "exclude"} & header.options.keys()
    assert header.pid > 0 and header.world_size == 1 and header.rank == 0


def test_run_log_model_and_modules(train_run: tuple[Run, Path]) -> None:
    _, log = train_run
    records = read_log(log)
    models = [r for r in records if isinstance(r, schema.Model)]
    assert models == [schema.Model(model=0, name="net", cls="Sequential")]
    modules = [(r.fqn, r.cls, r.params, r.trainable) for r in records
               if isinstance(r, schema.Module)]
    assert modules == [("", "Sequential", 0, 0), ("fc1", "Linear", 40, 40),
                       ("act", "ReLU", 0, 0), ("fc2", "Linear", 18, 18)]


def test_run_log_events_steps_and_end(train_run: tuple[Run, Path]) -> None:
    _, log = train_run
    evs = events(log)
    assert len(evs) == 24
    assert [e.seq for e in evs] == list(range(1, 25))
    for step in range(3):
        fwd = [e for e in evs if e.step == step and e.phase == "forward"]
        bwd = [e for e in evs if e.step == step and e.phase == "backward"]
        assert [e.fqn for e in fwd] == ["fc1", "act", "fc2", ""]
        assert [e.fqn for e in bwd] == ["", "fc2", "act", "fc1"]
    fc1 = next(e for e in evs if e.fqn == "fc1" and e.phase == "forward")
    assert isinstance(fc1, schema.ForwardEvent)
    assert (fc1.input_shapes, fc1.output_shapes) == ([[5, 4]], [[5, 8]])
    records = read_log(log)
    assert [r for r in records if isinstance(r, schema.Step)] == [
        schema.Step(0, 4, 4), schema.Step(1, 4, 4), schema.Step(2, 4, 4)]
    assert records[-1] == schema.End(status="ok", events=24, steps=3, exit_code=0, backward=3)
    reader = LogReader(log)
    list(reader)
    assert reader.warnings == []


def test_run_default_output_and_argv_passthrough(tmp_path: Path) -> None:
    """No -o: ./hooktrace.jsonl. Options after TARGET (even -o, --help) are the script's."""
    args = ["a b", "--flag", "-o", "x", "--help"]
    result = hooktrace_fresh("run", SCRIPTS / "show_argv.py", *args, cwd=tmp_path)
    plain = python(SCRIPTS / "show_argv.py", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == plain.stdout
    assert result.stdout.splitlines() == [
        "name __main__",
        f"argv {[str(SCRIPTS / 'show_argv.py'), *args]!r}",
        f"path0 {SCRIPTS}",
        f"file {SCRIPTS / 'show_argv.py'}",
        "main True",
    ]
    assert result.stderr.splitlines() == summary(0, 0, "hooktrace.jsonl", unseen=(
        "the script finished without calling any nn.Module: nothing to check"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hooktrace.jsonl"]
    header = read_log(tmp_path / "hooktrace.jsonl")[0]
    assert isinstance(header, schema.Header)
    assert header.argv == [str(SCRIPTS / "show_argv.py"), *args]
    assert end_of(tmp_path / "hooktrace.jsonl") == schema.End(status="ok", exit_code=0)


def test_run_relative_script_path_file_is_absolute_as_in_python(tmp_path: Path) -> None:
    result = hooktrace_fresh("run", "-o", tmp_path / "log.jsonl", "show_argv.py", "z",
                           cwd=SCRIPTS)
    plain = python("show_argv.py", "z", cwd=SCRIPTS)
    assert result.returncode == plain.returncode == 0, result.stderr
    assert result.stdout == plain.stdout


def test_run_imports_sibling_module(tmp_path: Path) -> None:
    """The script's folder is first on sys.path, wherever the command runs from."""
    result = hooktrace_fresh("run", "-o", "log.jsonl", SCRIPTS / "uses_sibling.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello from helper_mod\n"
    assert end_of(tmp_path / "log.jsonl").status == "ok"


def test_run_overwrites_existing_log(tmp_path: Path, train_run: tuple[Run, Path]) -> None:
    """A run that records something replaces the log; one that records nothing keeps it
    (tests/commands/test_run_keeps.py)."""
    log = tmp_path / "old.jsonl"
    log.write_bytes(train_run[1].read_bytes())
    result = hooktrace_fresh("run", "-o", log, "--steps", "0", TRAIN, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert {e.step for e in events(log)} == {0}
    assert LogReader(log).header.argv == [str(TRAIN)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.jsonl"]


# -- exceptions and exit status -----------------------------------------------------------------

@pytest.fixture(scope="module")
def raise_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run, Path]:
    cwd = tmp_path_factory.mktemp("raise")
    traced = hooktrace_fresh("run", "-o", "log.jsonl", RAISE, cwd=cwd)
    return traced, python(RAISE, cwd=cwd), cwd / "log.jsonl"


def test_exception_traceback_and_exit_code_as_python(raise_runs: tuple[Run, Run, Path]) -> None:
    traced, plain, _ = raise_runs
    assert plain.returncode == 1
    assert traced.returncode == plain.returncode
    assert traced.stdout == plain.stdout == "before the error\n"
    expected = from_script_frame(plain.stderr.splitlines(), "raise_error.py")
    assert expected[-1] == "ValueError: bad value 42"
    assert len(expected) == 7  # three frames of two lines, then the exception
    assert from_script_frame(script_stderr(traced.stderr), "raise_error.py") == expected
    assert traced.stderr.splitlines()[-2:] == summary(0, 0, "log.jsonl", unseen=(
        f"the script stopped with ValueError before any model ran ({RAISE}:5)"))


def test_exception_traceback_has_no_hooktrace_or_runpy_frames(
        raise_runs: tuple[Run, Run, Path]) -> None:
    traced, plain, _ = raise_runs
    assert script_stderr(traced.stderr) == plain.stderr.splitlines()


def test_exception_end_record(raise_runs: tuple[Run, Run, Path]) -> None:
    _, _, log = raise_runs
    # the innermost line of the script the error came through (the script lies outside cwd)
    assert end_of(log) == schema.End(status="error", exit_code=1, error={
        "type": "ValueError", "message": "bad value 42", "file": str(RAISE), "line": 5})


def test_exception_traceback_relative_script_path(tmp_path: Path) -> None:
    traced = hooktrace_fresh("run", "-o", tmp_path / "log.jsonl", "raise_error.py", cwd=SCRIPTS)
    plain = python("raise_error.py", cwd=SCRIPTS)
    assert traced.returncode == plain.returncode == 1
    expected = from_script_frame(plain.stderr.splitlines(), "raise_error.py")
    assert from_script_frame(script_stderr(traced.stderr), "raise_error.py") == expected


def test_sys_exit_code(tmp_path: Path) -> None:
    traced = hooktrace_fresh("run", "-o", "log.jsonl", SCRIPTS / "exit_code.py", cwd=tmp_path)
    plain = python(SCRIPTS / "exit_code.py")
    assert traced.returncode == plain.returncode == 3
    assert traced.stdout == plain.stdout == "exiting with 3\n"
    assert traced.stderr.splitlines() == summary(0, 0, "log.jsonl", unseen=(
        f"the script exited with status 3 before any model ran "
        f"({SCRIPTS / 'exit_code.py'}:4: sys.exit(3))"))
    end = end_of(tmp_path / "log.jsonl")
    assert (end.status, end.exit_code) == ("error", 3)
    assert end.error is not None and end.error["type"] == "SystemExit"


def test_sys_exit_message(tmp_path: Path) -> None:
    traced = hooktrace_fresh("run", "-o", "log.jsonl", SCRIPTS / "exit_message.py", cwd=tmp_path)
    plain = python(SCRIPTS / "exit_message.py")
    assert traced.returncode == plain.returncode == 1
    assert traced.stdout == plain.stdout == "exiting with a message\n"
    assert plain.stderr == "bye\n"
    exited = f"{SCRIPTS / 'exit_message.py'}:4"
    assert traced.stderr.splitlines() == ["bye", *summary(0, 0, "log.jsonl", unseen=(
        f"the script exited with status 1 before any model ran ({exited}: sys.exit(\"bye\"))"))]
    assert end_of(tmp_path / "log.jsonl") == schema.End(
        status="error", exit_code=1, error={
            "type": "SystemExit", "message": "bye", "file": str(SCRIPTS / "exit_message.py"),
            "line": 4, "code": 'sys.exit("bye")'})


@pytest.fixture(scope="module")
def syntax_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run, Path, Path]:
    # written here, not kept in tests/scripts: `ruff check tests` would fail on it
    cwd = tmp_path_factory.mktemp("syntax")
    script = cwd / "syntax_error.py"
    script.write_text('print("this line is fine")\nx = (1,\n')
    traced = hooktrace_fresh("run", "-o", "log.jsonl", script, cwd=cwd)
    return traced, python(script, cwd=cwd), cwd / "log.jsonl", script


def test_syntax_error_as_python(syntax_runs: tuple[Run, Run, Path, Path]) -> None:
    traced, plain, log, script = syntax_runs
    assert traced.returncode == plain.returncode == 1
    assert traced.stdout == plain.stdout == ""
    expected = plain.stderr.splitlines()
    assert expected[0] == f'  File "{script}", line 2'
    assert expected[-1] == "SyntaxError: '(' was never closed"
    assert from_script_frame(script_stderr(traced.stderr), "syntax_error.py") == expected
    end = end_of(log)
    assert (end.status, end.exit_code) == ("error", 1)
    assert end.error is not None and end.error["type"] == "SyntaxError"


def test_syntax_error_no_traceback_header(syntax_runs: tuple[Run, Run, Path, Path]) -> None:
    traced, plain, _, _ = syntax_runs
    assert script_stderr(traced.stderr) == plain.stderr.splitlines()


# -- module mode ---------------------------------------------------------------------------------

def test_module_mode_relative_import(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = hooktrace_fresh("run", "-o", log, "-m", "pkg.mod", "q", "r", cwd=SCRIPTS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "name __main__", "package pkg", f"argv {[str(SCRIPTS / 'pkg' / 'mod.py'), 'q', 'r']!r}",
        "done"]
    assert result.stderr.splitlines() == summary(8, 1, str(log))
    header = read_log(log)[0]
    assert isinstance(header, schema.Header) and header.argv[1:] == ["q", "r"]
    assert [e.fqn for e in events(log, "forward")] == ["0", "1", "2", ""]
    assert [e.fqn for e in events(log, "backward")] == ["", "2", "1", "0"]
    assert end_of(log) == schema.End(status="ok", events=8, steps=1, exit_code=0, backward=1)


def test_module_mode_package_main(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = hooktrace_fresh("run", "-o", log, "-m", "pkg", "q", cwd=SCRIPTS)
    plain = python("-m", "pkg", "q", cwd=SCRIPTS)
    assert result.returncode == plain.returncode == 0, result.stderr
    assert result.stdout == plain.stdout == "pkg main __main__ pkg ['q'] True\n"
    assert end_of(log) == schema.End(status="ok", exit_code=0)


def test_module_mode_with_console_script(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "hooktrace"
    if not exe.exists():
        pytest.skip("no hooktrace console script next to this python")
    log = tmp_path / "log.jsonl"
    result = subprocess.run([str(exe), "run", "-o", str(log), "-m", "pkg.mod"], cwd=SCRIPTS,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "done"
    assert end_of(log).status == "ok"


# -- filters ---------------------------------------------------------------------------------------

def test_steps_filter_records_only_that_step(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = hooktrace_fresh("run", "-o", log, "--steps", "1:2", TRAIN, "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    evs = events(log)
    assert {e.step for e in evs} == {1}
    assert [e.fqn for e in evs if e.phase == "forward"] == ["fc1", "act", "fc2", ""]
    assert [e.fqn for e in evs if e.phase == "backward"] == ["", "fc2", "act", "fc1"]
    records = read_log(log)
    assert isinstance(records[0], schema.Header) and records[0].options["steps"] == "1:2"
    assert [r for r in records if isinstance(r, schema.Step)] == [schema.Step(1, 4, 4)]
    end = records[-1]
    assert isinstance(end, schema.End) and (end.status, end.events) == ("ok", 8)


@pytest.mark.parametrize(("flag", "pattern", "expected"), [
    ("--include", "fc*", ["fc1", "fc2"]),
    ("--exclude", "fc*", ["act", ""]),
])
def test_include_exclude_filters(tmp_path: Path, flag: str, pattern: str,
                                 expected: list[str]) -> None:
    log = tmp_path / "log.jsonl"
    result = hooktrace_fresh("run", "-o", log, flag, pattern, TRAIN, "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for step in range(2):
        assert [e.fqn for e in events(log, "forward", step)] == expected
        assert [e.fqn for e in events(log, "backward", step)] == expected[::-1]
    assert len(events(log)) == 4 * len(expected)
    header = read_log(log)[0]
    assert isinstance(header, schema.Header) and header.options[flag[2:]] == [pattern]
    assert end_of(log) == schema.End(status="ok", events=4 * len(expected), steps=2, exit_code=0,
                                     backward=2)


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    cwd = tmp_path_factory.mktemp("capped")
    result = hooktrace_fresh("run", "-o", "log.jsonl", "--max-events", "5", TRAIN, "3", cwd=cwd)
    return result, cwd / "log.jsonl"


def test_max_events_caps_the_log(capped_run: tuple[Run, Path]) -> None:
    result, log = capped_run
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained 3 steps\n"
    evs = events(log)
    assert len(evs) == 5
    assert [e.seq for e in evs] == [1, 2, 3, 4, 5]
    end = end_of(log)
    assert (end.status, end.events, end.exit_code) == ("ok", 5, 0)
    assert end.dropped is not None and end.dropped > 0
    lines = result.stderr.splitlines()
    assert lines[0] == ("hooktrace: --max-events 5 reached at step 0; recording stopped, "
                        "the log stays valid")
    assert lines[1:] == summary(5, 3, "log.jsonl", dropped=end.dropped)


def test_max_events_dropped_counts_every_unrecorded_event(capped_run: tuple[Run, Path]) -> None:
    _, log = capped_run
    assert end_of(log).dropped == 3 * 8 - 5


# -- signals ---------------------------------------------------------------------------------------

def _default_signals() -> None:
    # a shell's background job inherits SIGINT ignored; python then never raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_loop(log: Path) -> subprocess.Popen[str]:
    """Start the endless training script traced; return once it printed "ready"."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hooktrace", "run", "-o", str(log), str(LOOP)],
        cwd=log.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_signals,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
    line = proc.stdout.readline() if ready else ""
    if line != "ready\n":
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"no 'ready' from the script (got {line!r}); stderr:\n{err}")
    time.sleep(0.2)  # a few more steps
    return proc


def test_sigint_ends_interrupted_and_dies_by_sigint(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    proc = start_loop(log)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT, err
    lines = err.splitlines()
    assert "KeyboardInterrupt" in lines
    end = end_of(log)
    assert (end.status, end.exit_code) == ("interrupted", -2)
    assert end.error == {"type": "KeyboardInterrupt", "message": ""}
    assert end.steps >= 1
    assert end.events == len(events(log))
    steps = [r.step for r in read_log(log) if isinstance(r, schema.Step)]
    assert steps == list(range(len(steps))) and 1 <= len(steps) <= end.steps
    assert lines[-2:] == summary(end.events, end.steps, str(log))


def test_sigterm_ends_interrupted_and_dies_by_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    proc = start_loop(log)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    end = end_of(log)
    assert (end.status, end.exit_code, end.error) == ("interrupted", -15, None)
    assert end.steps >= 1
    assert end.events == len(events(log))
    assert err.splitlines() == summary(end.events, end.steps, str(log))


def test_sigkill_leaves_a_readable_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    proc = start_loop(log)
    proc.kill()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert err == ""
    reader = LogReader(log)
    records = list(reader)
    assert reader.end is None
    assert any("no end record" in w for w in reader.warnings), reader.warnings
    assert records[0] == schema.Model(model=0, name="net", cls="Sequential")
    steps = [r for r in records if isinstance(r, schema.Step)]
    assert steps[0] == schema.Step(0, 4, 4)  # step 0 ended before "ready" was printed
    assert [r.step for r in steps] == list(range(len(steps)))
    evs = [r for r in records if isinstance(r, (schema.ForwardEvent, schema.BackwardEvent))]
    assert len(evs) >= 8 * len(steps)
    # check and render work on it, and say the run did not finish (check: a problem)
    checked = hooktrace_fresh("check", log)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "has no end record: the run did not finish" in checked.stdout
    assert "[stopped]" in checked.stdout
    rendered = hooktrace_fresh("render", "--format", "dot", log)
    assert rendered.returncode == 0, rendered.stderr
    assert "has no end record: the run did not finish" in rendered.stderr


# -- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["nope.py"], "no such script: nope.py"),
    (["-m", "no_such_module_xyz"], "no module named no_such_module_xyz"),
    (["-m", "pkg.no_such_mod"], "no module named pkg.no_such_mod"),
    (["-m", "no_such_pkg_xyz.sub"], "no module named no_such_pkg_xyz.sub"),
    (["-o", "exit_code.py", "exit_code.py"],
     "the log would overwrite the script exit_code.py; choose another -o"),
    (["-o", "./pkg/../exit_code.py", "exit_code.py"],
     "the log would overwrite the script exit_code.py; choose another -o"),
    (["-o", "helper_mod.py", "exit_code.py"],
     "helper_mod.py exists and is not a hooktrace log; refusing to overwrite it"),
    (["-o", "pkg/mod.py", "-m", "pkg.mod"],
     "pkg/mod.py exists and is not a hooktrace log; refusing to overwrite it"),
    (["-o", "pkg", "exit_code.py"], "pkg is a directory; give a file name for the log"),
    (["--steps", "3:1", "exit_code.py"], "--steps '3:1': '3:1' selects no step"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    files = [SCRIPTS / "exit_code.py", SCRIPTS / "helper_mod.py", SCRIPTS / "pkg" / "mod.py"]
    before = [p.read_bytes() for p in files]
    result = hooktrace_fresh("run", *args, cwd=SCRIPTS)
    assert_user_error(result, message)
    assert [p.read_bytes() for p in files] == before
    assert not (SCRIPTS / "hooktrace.jsonl").exists()


def test_an_unknown_option_is_said_as_such(tmp_path: Path) -> None:
    """An option of run's that does not exist, before the script, is not taken for the
    script's name; after the script, options are the script's own."""
    result = hooktrace_fresh("run", "--stepz", "0:3", "exit_code.py", cwd=SCRIPTS)
    assert result.returncode == 2, result.stderr
    assert "No such option '--stepz'" in result.stderr and "'--steps'" in result.stderr
    assert "no such script" not in result.stderr and result.stdout == ""
    assert not (SCRIPTS / "hooktrace.jsonl").exists()
    passed = hooktrace_fresh("run", "-o", tmp_path / "log.jsonl", "show_argv.py", "--stepz",
                           "-o", "x", cwd=SCRIPTS)
    assert passed.returncode == 0, passed.stderr
    assert "argv ['show_argv.py', '--stepz', '-o', 'x']" in passed.stdout.splitlines()


def test_an_error_raised_inside_backward_has_python_s_traceback(tmp_path: Path) -> None:
    """hooktrace wraps backward(): an error inside it shows no frame of hooktrace's."""
    traced = hooktrace_fresh("run", "-o", tmp_path / "log.jsonl", "backward_raises.py",
                             cwd=SCRIPTS)
    plain = python("backward_raises.py", cwd=SCRIPTS)
    assert traced.returncode == plain.returncode == 1
    assert plain.stderr.splitlines()[-1] == "ValueError: bad backward"
    assert script_stderr(traced.stderr) == plain.stderr.splitlines()
