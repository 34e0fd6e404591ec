"""``check`` goes down to the operation and its line inside a finding's module: each case of
``scripts/op_bugs.py`` traced for real (``hooktrace run``), its finding naming the operation at
fault and its line, from the calls the tracer zoomed into by itself or through the command the
finding prints; and the healthy look-alikes stay silent, zoomed or not."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from helpers import Cases, Shared, hooktrace_cmd, problems, run_cases, run_findings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "op_bugs.py"
SOURCE = SCRIPT.read_text().splitlines()


def line_of(tag: str) -> str:
    """``op_bugs.py:N``, N the one line whose ``#`` comment names ``tag``."""
    [n] = [i for i, text in enumerate(SOURCE, 1)
           if "# " in text and tag in text.rsplit("# ", 1)[1].split()]
    return f"{SCRIPT.name}:{n}"


def the(found: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [finding] = [f for f in found if f["cause"] == kind and f["severity"] != "note"]
    return finding


def at(finding: dict[str, Any], key: str = "op") -> tuple[str, str]:
    """The operation a finding names and the file name and line it gives."""
    op = finding["evidence"][key]
    file, line = op["line"].rsplit(":", 1)
    return op["op"], f"{Path(file).name}:{line}"


# case -> (finding kind, its module, the operation, where it is when not in that module)
FIRST_RUN = {
    "numpy_clip": ("no-grad", "mid", ".detach()", None),
    "numpy_out": ("no-grad", "", ".detach()", "mid"),  # the root's forward, inside mid
    "mul_zero": ("zero-gradient", "mid", ".mul()", None),
    "mask": ("zero-gradient", "mid", ".mul()", None),
    "round": ("zero-gradient", "mid", "torch.round()", None),
    "no_grad_block": ("no-grad", "mid", ".mul()", None),
    "argmax": ("no-grad", "mid", ".argmax()", None),
    "nan_log": ("nonfinite-forward", "head", "torch.log()", None),
    "sqrt_at_zero": ("nonfinite-backward", "head", "torch.sqrt()", None),
    "where_unsafe": ("nonfinite-backward", "head", "torch.sqrt()", None),
}
# a first NaN whose later steps differ (the weights turned NaN): answered in a rerun
RERUN = {
    "nan_sqrt": ("nonfinite-forward", "head", ".sqrt()"),
    "inf_exp": ("nonfinite-forward", "head", "torch.exp()"),
    "nan_div": ("nonfinite-forward", "head", ".div()"),
}
HEALTHY = ["ok_where_safe", "ok_distance", "ok_straight_through", "ok_mask", "ok_logged",
           "ok_plain"]


@pytest.fixture(scope="module")
def first_runs(shared: Shared) -> Cases:
    cases = [*FIRST_RUN, *RERUN, "inplace_clamp", *HEALTHY]
    return run_cases(shared, "op_lines", cases, lambda case: SCRIPT)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FIRST_RUN))
def test_the_operation_and_its_line(first_runs: Cases, case: str) -> None:
    _, found = run_findings(first_runs[case])
    kind, module, op, inside = FIRST_RUN[case]
    finding = the(found, kind)
    assert finding["module"] == module
    assert at(finding) == (op, line_of(case))
    assert finding["evidence"]["op"].get("module") == inside
    assert f", at {op}" in finding["message"] or f"; made by {op}" in finding["message"] \
        or f"; made by the backward of {op}" in finding["message"]
    assert f"{line_of(case)})" in finding["message"]
    assert "rerun" not in finding["evidence"]


def rerun(tmp: Path, command: str) -> list[dict[str, Any]]:
    """Run the command a finding prints (its ``hooktrace run``, then its ``hooktrace check``)."""
    traced, checked = command.split("; hooktrace check ")
    words = shlex.split(traced)
    assert words[:2] == ["hooktrace", "run"]
    run = hooktrace_cmd(*words[1:], cwd=tmp)
    assert run.returncode in (0, 1), run.stderr
    result = hooktrace_cmd("check", "--json", *shlex.split(checked), cwd=tmp)
    assert result.returncode == 1, result.stderr
    return json.loads(result.stdout)["findings"]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(RERUN))
def test_a_first_nan_through_the_printed_command(first_runs: Cases, case: str) -> None:
    kind, module, op = RERUN[case]
    _, found = run_findings(first_runs[case])
    finding = the(found, kind)
    assert finding["module"] == module and "op" not in finding["evidence"]
    command = finding["evidence"]["rerun"]
    assert f"--ops {module} --ops '{module}.*' " in command
    again = the(rerun(first_runs.folder, command), kind)
    assert at(again) == (op, line_of(case))
    assert again["evidence"]["op"]["step"] == 0


@pytest.mark.slow
def test_an_inplace_change_through_the_printed_command(first_runs: Cases) -> None:
    traced, checked = first_runs["inplace_clamp"]
    assert traced.returncode == 1  # the script raised, as it does untraced
    found = json.loads(checked.stdout)["findings"]
    finding = the(found, "backward-error")
    assert finding["module"] == "mid" and "op" not in finding["evidence"]
    assert Path(finding["evidence"]["line"].rsplit(":", 1)[0]).name == SCRIPT.name
    command = finding["evidence"]["rerun"]
    assert command.startswith("hooktrace run -o ") and " --ops mid --ops 'mid.*' " in command
    assert command.split("; ")[0].endswith(f"{shlex.quote(str(SCRIPT))} inplace_clamp")
    again = the(rerun(first_runs.folder, command), "backward-error")
    assert at(again) == (".clamp_()", line_of("inplace_clamp"))
    assert at(again, "changed") == ("torch.sigmoid()", line_of("inplace_sigmoid"))
    assert "changed in place the output of torch.sigmoid()" in again["message"]


@pytest.mark.slow
@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_look_alikes_stay_silent(first_runs: Cases, case: str) -> None:
    status, found = run_findings(first_runs[case])
    assert (status, problems(found)) == (0, [])
    log = first_runs.folder / f"{case}.jsonl"
    assert b'"type":"ops"' not in log.read_bytes()  # nothing wrong: nothing zoomed


@pytest.mark.slow
@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_look_alikes_zoomed_stay_silent(tmp_path: Path, case: str) -> None:
    log = tmp_path / "zoomed.jsonl"
    traced = hooktrace_cmd("run", "-o", log, "--ops", "*", SCRIPT, case)
    assert traced.returncode == 0, traced.stderr
    assert log.read_bytes().count(b'"type":"ops"') >= 4
    result = hooktrace_cmd("check", "--json", log)
    assert result.returncode == 0, result.stdout
    assert problems(json.loads(result.stdout)["findings"]) == []



@pytest.mark.parametrize(("options", "argv", "world", "module", "step", "expected"), [
    ({"run": "script", "steps": "0:10"}, ["train.py", "--lr", "0.1"], 1, "block.gate", 2,
     "hooktrace run -o runs/a.ops.jsonl --ops block.gate --ops 'block.gate.*' train.py --lr 0.1;"
     " hooktrace check runs/a.ops.jsonl"),
    ({"run": "module", "steps": "0:3", "include": ["block*"]}, ["pkg.train"], 1, "", 7,
     "hooktrace run -o runs/a.ops.jsonl --ops '*' --include 'block*' --steps 7 -m pkg.train;"
     " hooktrace check runs/a.ops.jsonl"),
    ({"run": "script"}, ["ddp.py"], 2, "fc", 0,
     "torchrun --nproc_per_node=2 -m hooktrace run -o runs/a.ops.jsonl --ops fc --ops 'fc.*' "
     "ddp.py; hooktrace check 'runs/a.ops.rank*.jsonl'"),
    ({}, ["notebook"], 1, "fc", 0, "trace it again with hooktrace.trace(..., ops=['fc', 'fc.*'])"),
])
def test_the_command_that_records_the_operations(options: dict[str, Any], argv: list[str],
                                                 world: int, module: str, step: int,
                                                 expected: str) -> None:
    from hooktrace.check.collected import Collected
    from hooktrace.check.oplines import rerun
    from hooktrace.log import schema

    header = schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0", argv=argv,
                           world_size=world, options=options)
    log = "runs/a.rank0.jsonl" if world > 1 else "runs/a.jsonl"
    assert rerun(Collected(header=header, log=log), module, step) == expected


def test_a_nan_made_in_the_parents_own_code_is_answered_there(tmp_path: Path) -> None:
    """Issue 36, item 6: the VAE's forward takes ``torch.sqrt`` of a variance that can be
    negative; ``dec.0`` receives the NaN. The finding is the VAE's, and its zoomed calls
    answer it with the line of the sqrt."""
    script = SCRIPT.with_name("blind_bugs3.py")
    log = tmp_path / "vae.jsonl"
    ran = hooktrace_cmd("run", "-o", log, "--ops", "*", script, "vae_sqrt_var_nan")
    assert ran.returncode == 0, ran.stderr
    checked = hooktrace_cmd("check", "--json", log)
    finding = the(json.loads(checked.stdout)["findings"], "nonfinite-forward")
    assert (finding["module"], finding["evidence"]["received_by"]) == ("", "dec.0")
    op, where = at(finding)
    assert (op, where) == ("torch.sqrt()", f"blind_bugs3.py:{_sqrt_line(script)}")


def _sqrt_line(script: Path) -> int:
    [n] = [i for i, text in enumerate(script.read_text().splitlines(), 1)
           if "torch.sqrt(var)" in text]
    return n
