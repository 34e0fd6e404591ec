"""A run that did not finish is a problem ``check`` names (exit 1): killed (no end record),
interrupted by a signal, or crashed; each says
how it ended and the last step it completed. Real runs, real signals."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import events, hooktrace_fresh, read_log

from hooktrace.log import schema

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
LOOP = SCRIPTS / "loop_forever.py"


def _default_signals() -> None:
    # a shell's background job inherits SIGINT ignored; python then never raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop_loop(log: Path, how: signal.Signals, *options: str) -> None:
    """Trace the endless training script until it printed "ready" and a few steps more, then
    send it ``how``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hooktrace", "run", "-o", str(log), *options, str(LOOP)],
        cwd=log.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_signals)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if line != "ready\n":
        proc.kill()
        raise AssertionError(f"no 'ready' from the script: {line!r} {proc.communicate()[1]}")
    time.sleep(0.3)
    proc.send_signal(how)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -how, err


def _check(log: Path) -> tuple[int, list[dict[str, Any]], str]:
    """check's exit status, its findings (--json) and its text report."""
    found = hooktrace_fresh("check", "--json", log)
    text = hooktrace_fresh("check", log)
    assert found.returncode == text.returncode, found.stderr + text.stderr
    return found.returncode, json.loads(found.stdout)["findings"], text.stdout


def _stopped(findings: list[dict[str, Any]]) -> dict[str, Any]:
    stopped = [f for f in findings if f["cause"] == "stopped"]
    assert len(stopped) == 1, findings
    assert stopped[0]["severity"] == "error"
    return stopped[0]


def test_a_killed_run_is_a_problem_with_its_last_step(tmp_path: Path) -> None:
    log = tmp_path / "killed.jsonl"
    _stop_loop(log, signal.SIGKILL, "--steps", "all")
    records = read_log(log)
    assert not any(isinstance(r, schema.End) for r in records)
    last = max(r.step for r in records if isinstance(r, schema.Step))
    code, findings, text = _check(log)
    assert code == 1, text
    stopped = _stopped(findings)
    assert stopped["evidence"] == {"status": "killed", "last_step": last}
    assert (stopped["model"], stopped["module"], stopped["step"]) == ("net", "", last + 1)
    assert "no end record" in stopped["message"]
    assert stopped["message"].endswith(f"the last step it completed is {last}")
    # the header counts every event the log holds, forward and backward, as with an end record
    logged = events(log)
    assert {e.phase for e in logged} == {"forward", "backward"}
    assert text.splitlines()[0].endswith(f", {len(logged)} events"), text
    assert "No problems found" not in text


def test_a_killed_run_past_its_recorded_steps_may_have_gone_further(tmp_path: Path) -> None:
    log = tmp_path / "watched.jsonl"
    _stop_loop(log, signal.SIGKILL, "--steps", "0:2")  # the steps after 1 are watched
    code, findings, _ = _check(log)
    assert code == 1
    assert _stopped(findings)["message"].endswith(
        "the last step it completed is 1 or later (steps after 1 were not recorded in full: "
        "--steps)")


@pytest.mark.parametrize(("how", "said"), [(signal.SIGTERM, "SIGTERM"),
                                           (signal.SIGINT, "Ctrl-C (SIGINT)")])
def test_an_interrupted_run_is_a_problem_with_its_last_step(tmp_path: Path, how: signal.Signals,
                                                             said: str) -> None:
    log = tmp_path / "interrupted.jsonl"
    _stop_loop(log, how)
    end = read_log(log)[-1]
    assert isinstance(end, schema.End) and end.status == "interrupted" and end.steps >= 2
    code, findings, text = _check(log)
    assert code == 1, text
    stopped = _stopped(findings)
    assert stopped["evidence"] == {"status": "interrupted", "exit_code": -how,
                                   "last_step": end.steps - 1}
    assert stopped["message"] == (f"the run did not finish: it was interrupted by {said}; the "
                                  f"last step it completed is {end.steps - 1}")
    assert f"  [stopped] (root) · model 'net' · step {end.steps}" in text.splitlines()


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "script.py"
    script.write_text("import sys\nimport torch\nfrom torch import nn\n\n"
                      "net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
                      "for _ in range(2):\n"
                      "    net(torch.randn(5, 4)).sum().backward()\n" + body)
    return script


def test_an_exit_status_the_script_chose_is_a_run_that_finished(tmp_path: Path) -> None:
    """``sys.exit(n)`` after training (a framework's runner does so) is not a stopped run."""
    log = tmp_path / "exit.jsonl"
    for status in (3, 0):
        ran = hooktrace_fresh("run", "-o", log, _script(tmp_path, f"sys.exit({status})\n"))
        assert ran.returncode == status, ran.stderr
        code, _, text = _check(log)
        assert code == 0 and "No problems found" in text, text


def test_exit_before_any_model_ran(tmp_path: Path) -> None:
    """A script that exits non-zero before any model ran is not a stopped run, and nothing was
    seen: one nothing-traced error with its status and line, never "No problems found"."""
    log = tmp_path / "exit.jsonl"
    ran = hooktrace_fresh("run", "-o", log, SCRIPTS / "exit_code.py")
    assert ran.returncode == 3
    code, findings, text = _check(log)
    assert code == 1, text
    assert [(f["cause"], f["severity"]) for f in findings] == [("nothing-traced", "error")]
    assert "exited with status 3 before any model ran" in findings[0]["message"]


def test_a_crash_before_any_model_ran_says_so(tmp_path: Path) -> None:
    """A crash is said once, as the error it stopped on (not also as a stopped run), and not at
    "(root) · step 0" when no model had run."""
    log = tmp_path / "raise.jsonl"
    ran = hooktrace_fresh("run", "-o", log, SCRIPTS / "raise_error.py")
    assert ran.returncode == 1
    code, findings, text = _check(log)
    assert code == 1
    assert [(f["cause"], f["model"], f["module"], f["step"]) for f in findings] == [
        ("script-error", "", "", None)]
    message = findings[0]["message"]
    assert message.startswith("the script stopped before any model ran, with ValueError (")
    assert message.endswith("raise_error.py:5): bad value 42")
    assert "  [script-error] before any model ran" in text.splitlines()
    assert "(root)" not in text and "step 0" not in text


def test_a_long_coloured_error_keeps_its_cause_in_plain_text(tmp_path: Path) -> None:
    words = " ".join(f"detail{i}" for i in range(200))
    body = ('raise RuntimeError("\\x1b[1;31mloading failed:\\x1b[0m ' + words +
            '\\nthe cause: size mismatch for fc.weight [10, 512] vs [2, 512]")\n')
    log = tmp_path / "long.jsonl"
    ran = hooktrace_fresh("run", "-o", log, _script(tmp_path, body))
    assert ran.returncode == 1, ran.stderr
    end = read_log(log)[-1]
    assert isinstance(end, schema.End) and end.error is not None
    assert end.error["message"].startswith("loading failed: detail0 detail1")  # kept whole,
    assert "\x1b" not in end.error["message"] and words in end.error["message"]  # plain
    code, findings, text = _check(log)
    assert code == 1
    crash = next(f for f in findings if f["cause"] == "script-error")
    message = crash["message"]
    assert (crash["model"], crash["step"]) == ("net", 2)
    assert "\x1b" not in message and "[1;31m" not in message
    assert message.endswith(" ... the cause: size mismatch for fc.weight [10, 512] vs [2, 512]")
    assert "loading failed: detail0 detail1" in message
    cut = message.split(" ... ")[0].split()[-1]
    assert cut in words.split(), cut  # cut between words, not inside one
    assert len(message) < 800
    assert "\x1b" not in text and "the cause: size mismatch" in text
