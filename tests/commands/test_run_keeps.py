"""``hooktrace run`` loses nothing of the user's: a run that records nothing keeps the previous
log, an option of hooktrace's given after the script is pointed out, and without torch (or
without the script) one line says why, before torch is imported."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from helpers import hooktrace_cmd, hooktrace_fresh

from hooktrace.log import schema
from hooktrace.log.reader import LogReader
from tests.commands.test_run import SCRIPTS, TRAIN, start_loop

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "mnist_net.py"
EXIT_3 = SCRIPTS / "exit_code.py"
KEPT = "hooktrace: this run recorded nothing: the log of an earlier run is kept at "

# torch cannot be imported in a process that loads this as its sitecustomize
_NO_TORCH = '''
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
'''


def _argv(log: Path) -> list[str]:
    return LogReader(log).header.argv


def test_a_run_that_fails_before_its_first_event_keeps_the_previous_log(tmp_path: Path) -> None:
    good = hooktrace_cmd("run", SAMPLE, "--steps", "1", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    log = tmp_path / "hooktrace.jsonl"
    before = log.read_bytes()
    failed = hooktrace_cmd("run", SAMPLE, "-o", "out.jsonl", cwd=tmp_path)
    assert failed.returncode == 2  # the script's argparse
    assert "unrecognized arguments: -o out.jsonl" in failed.stderr
    assert log.read_bytes() == before
    lines = [line for line in failed.stderr.splitlines() if line.startswith("hooktrace: ")]
    assert lines == [
        f"{KEPT}hooktrace.jsonl (this run's empty log was dropped)",
        f"hooktrace: -o came after {SAMPLE}, so the script got it, not hooktrace; hooktrace's "
        f"own options go before the script: hooktrace run -o ... {SAMPLE}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hooktrace.jsonl"]


def test_the_captures_of_the_kept_log_stay(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    good = hooktrace_cmd("run", "-o", log, "--capture", "*", TRAIN, cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    captured = sorted((tmp_path / "log.capture").rglob("*.pt"))
    assert captured
    failed = hooktrace_cmd("run", "-o", log, "--capture", "*", EXIT_3, cwd=tmp_path)
    assert failed.returncode == 3
    assert KEPT in failed.stderr
    assert _argv(log)[0] == str(TRAIN)
    assert sorted((tmp_path / "log.capture").rglob("*.pt")) == captured
    again = hooktrace_cmd("run", "-o", log, "--capture", "nothing.matches", TRAIN, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert not list((tmp_path / "log.capture").rglob("*.pt"))  # not this log's captures


def test_a_run_killed_after_its_first_event_leaves_its_own_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    good = hooktrace_cmd("run", "-o", log, TRAIN, cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    proc = start_loop(log)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    reader = LogReader(log)
    assert reader.header.argv[0].endswith("loop_forever.py")
    assert any(isinstance(r, schema.ForwardEvent) for r in reader)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_an_option_after_the_script_is_pointed_out_only_when_the_script_fails(
        tmp_path: Path) -> None:
    failed = hooktrace_cmd("run", "-o", tmp_path / "a.jsonl", EXIT_3, "--steps=0:3", "-x",
                           "--include", "fc*", cwd=tmp_path)
    assert failed.returncode == 3
    assert (f"hooktrace: --steps, --include came after {EXIT_3}, so the script got them, not "
            f"hooktrace; hooktrace's own options go before the script: hooktrace run --steps "
            f"--include ... {EXIT_3}") in failed.stderr.splitlines()
    passed = hooktrace_cmd("run", "-o", tmp_path / "b.jsonl", SCRIPTS / "show_argv.py",
                           "--steps", "3", cwd=tmp_path)
    assert passed.returncode == 0, passed.stderr
    assert "came after" not in passed.stderr


def test_a_script_that_raised_for_another_reason_is_not_told_of_its_options(
        tmp_path: Path) -> None:
    """A script with a ``--steps`` of its own that fails with an error naming no option of
    hooktrace's failed for that error: the line about options would mislead."""
    raised = hooktrace_cmd("run", "-o", tmp_path / "a.jsonl", SCRIPTS / "raise_error.py",
                           "--steps", "3", cwd=tmp_path)
    assert raised.returncode == 1
    assert "ValueError: bad value 42" in raised.stderr
    assert "came after" not in raised.stderr
    from hooktrace.tracing.target import Target, misplaced

    named = Target("t.py", ["--steps", "3"])
    assert misplaced(named, {"--steps"}, "unknown option --steps") is not None
    assert misplaced(named, {"--steps"}, "bad value 42") is None
    assert misplaced(named, {"--steps"}) is not None  # an exit status: the line


def _without_torch(tmp_path: Path) -> dict[str, str]:
    blocker = tmp_path / "no_torch"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(_NO_TORCH)
    paths = [str(blocker), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    return result.stderr


def test_without_torch_run_says_what_to_install(tmp_path: Path) -> None:
    env = _without_torch(tmp_path)
    result = hooktrace_fresh("run", TRAIN, cwd=tmp_path, env=env)
    line = _one_error_line(result)
    assert line.startswith("hooktrace: error: run needs PyTorch, which this Python (")
    assert "pip install torch" in line
    assert not (tmp_path / "hooktrace.jsonl").exists()
    checked = hooktrace_fresh("check", tmp_path / "nope.jsonl", cwd=tmp_path, env=env)
    assert "PyTorch" not in checked.stderr  # the readers need no torch


def test_a_missing_script_is_reported_before_torch_is_imported(tmp_path: Path) -> None:
    result = hooktrace_fresh("run", "nope.py", cwd=tmp_path, env=_without_torch(tmp_path))
    assert _one_error_line(result) == "hooktrace: error: no such script: nope.py\n"


def test_the_line_for_a_module_names_it_with_m() -> None:
    from hooktrace.tracing.target import Target, misplaced

    own = {"-o", "--output", "--steps"}
    assert misplaced(Target("pkg.train", ["--output=x", "-o", "y"], True), own) == (
        "--output, -o came after pkg.train, so the module got them, not hooktrace; hooktrace's "
        "own options go before the module: hooktrace run --output -o ... -m pkg.train")
    assert misplaced(Target("t.py", ["--lr", "0.1", "out.jsonl"]), own) is None
