"""``hooktrace check`` in process: bad input is exit 2 with one line and no traceback, a log cut
off is read up to its cut with a warning, the exit status follows the problems, and the logs of
several ranks are checked together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from hooktrace.check.checklog import run_checks_ranks
from hooktrace.cli import cli
from hooktrace.log import schema
from hooktrace.log.errors import HooktraceError

from .logbuild import C, chain, header, healthy, write_log


def check(*args: Any) -> Result:
    return CliRunner().invoke(cli, ["check", *map(str, args)])


def one_error_line(result: Result, *contains: str) -> None:
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hooktrace: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for text in contains:
        assert text in lines[0]


def header_line(**over: Any) -> bytes:
    return orjson.dumps({**header().to_dict(), **over}) + b"\n"


# -- bad input --------------------------------------------------------------------------------

BAD: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "is empty, not a hooktrace log"),
    "blank": (b"\n\n", "is empty, not a hooktrace log"),
    "text": (b"hello world\n", "is not a hooktrace log (its first line is not a header)"),
    "json list": (b"[1, 2]\n", "is not a hooktrace log (its first line is not a header)"),
    "other record first": (b'{"type":"model","model":0}\n', "its first line is not a header"),
    "future schema": (header_line(schema=schema.SCHEMA_VERSION + 1),
                      f"has log schema {schema.SCHEMA_VERSION + 1}, newer than this hooktrace "
                      "reads"),
    "older schema": (header_line(schema=1), "has log schema 1, written by an older hooktrace"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_file_that_is_not_a_log_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    content, message = BAD[case]
    path = tmp_path / "log.jsonl"
    path.write_bytes(content)
    one_error_line(check(path), str(path), message)
    one_error_line(check(path, "--json"), message)


def test_a_missing_log(tmp_path: Path) -> None:
    one_error_line(check(tmp_path / "nope.jsonl"), f"no such log: {tmp_path / 'nope.jsonl'}")


def test_a_directory(tmp_path: Path) -> None:
    one_error_line(check(tmp_path), "is a directory, not a log")


def test_a_glob_matching_nothing(tmp_path: Path) -> None:
    one_error_line(check(str(tmp_path / "run.rank*.jsonl")), "no log matches")


def test_a_bad_line_in_the_middle_names_it(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy())
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([*lines[:10], b"{not json", *lines[10:]]))
    one_error_line(check(path), "line 11 is not valid JSON")


def test_a_record_missing_a_key_names_its_line(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy())
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([*lines[:3], b'{"type":"model"}', *lines[3:]]))
    one_error_line(check(path), "line 4: missing key 'model'")


@pytest.mark.parametrize("step", ["9", "-1"])
def test_a_step_the_log_does_not_have(tmp_path: Path, step: str) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy())
    one_error_line(check(path, "--step", step), f"no step {step} in", "its steps: 0-2")


def test_a_bad_option_value_is_a_usage_error(tmp_path: Path) -> None:
    result = check(write_log(tmp_path / "log.jsonl", healthy()), "--vanishing", "abc")
    assert result.exit_code == 2
    assert "'abc' is not a valid float" in result.stderr


# -- a log cut off ----------------------------------------------------------------------------

def test_a_truncated_last_line_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy())
    data = path.read_bytes()
    path.write_bytes(data[:-10])  # inside the end record
    result = check(path, "--json")
    data_out = json.loads(result.stdout)
    assert result.exit_code == 1  # it did not finish
    assert len(data_out["warnings"]) == 2
    assert "ends with a partial line" in data_out["warnings"][0]
    assert "has no end record" in data_out["warnings"][1]
    assert [(f["cause"], f["step"]) for f in data_out["findings"]] == [("stopped", 3)]
    assert data_out["findings"][0]["evidence"] == {"status": "killed", "last_step": 2}
    text = check(path).stdout
    assert text.splitlines()[1].startswith("warning: ") and "partial line" in text


def cut_at(path: Path, keep: int) -> None:
    """Keep the log's first ``keep`` lines."""
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:keep]) + b"\n")


def line_of(path: Path, kind: str, step: int) -> int:
    """The index of the first line of ``kind`` in ``step``."""
    for i, line in enumerate(path.read_bytes().split(b"\n")):
        d = orjson.loads(line) if line else {}
        if d.get("type") == kind and d.get("step") == step:
            return i
    raise AssertionError(f"no {kind} line of step {step}")


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_log_cut_mid_step_reports_the_run_stopped(tmp_path: Path, where: str) -> None:
    """Killed inside step 1 (after its first forward, or its first backward event): the
    completed step 0 is checked, the run said stopped after it; no lost gradient is made up
    for the step it was cut in."""
    path = write_log(tmp_path / "log.jsonl", healthy())
    cut_at(path, line_of(path, where, 1) + 1)
    result = check(path, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1
    assert data["warnings"] == [f"{path} has no end record: the run did not finish"]
    assert [(f["cause"], f["severity"], f["step"]) for f in data["findings"]] == [
        ("stopped", "error", 1)]
    assert data["findings"][0]["evidence"]["last_step"] == 0


def test_a_log_of_the_header_only(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(header_line())
    result = check(path, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1
    assert [(f["cause"], f["model"], f["step"]) for f in data["findings"]] == [
        ("stopped", "", None)]


# -- exit status and output -------------------------------------------------------------------

def test_healthy_exits_0(tmp_path: Path) -> None:
    result = check(write_log(tmp_path / "log.jsonl", healthy()))
    assert result.exit_code == 0
    assert result.stdout.endswith("No problems found (0 notes).\n")
    assert result.stderr == ""


def test_notes_only_exit_0(tmp_path: Path) -> None:
    step = [C("fc1", g_in=None), C("act"), C("fc2"), C("act"), C("")]
    result = check(write_log(tmp_path / "log.jsonl", [step] * 2), "--json")
    data = json.loads(result.stdout)
    assert (result.exit_code, data["problems"]) == (0, 0)
    assert [f["severity"] for f in data["findings"]] == ["note"]


def test_step_option_turns_the_exit_status(tmp_path: Path) -> None:
    nan = chain(act=C("act", nonfinite=[[0, 1, 0]]))
    path = write_log(tmp_path / "log.jsonl", [chain(), nan, chain()])
    assert check(path).exit_code == 1
    assert check(path, "--step", "0").exit_code == 0
    assert check(path, "--step", "1").exit_code == 1
    data = json.loads(check(path, "--step", "2", "--json").stdout)
    assert (data["problems"], data["steps"], data["events"]) == (0, 1, 24)


@pytest.mark.parametrize(("args", "code"), [
    ([], 1), (["--exploding", "1e6"], 0), (["--exploding", "1e5"], 0), (["--exploding", "1e4"], 1)])
def test_exploding_option(tmp_path: Path, args: list[str], code: int) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(),
                     params={s: {"fc1": 1e5, "fc2": 0.5} for s in range(3)})
    assert check(path, *args).exit_code == code


@pytest.mark.parametrize(("args", "code"), [
    ([], 1), (["--vanishing", "1e-10"], 0), (["--vanishing", "1e-8"], 1)])
def test_vanishing_option(tmp_path: Path, args: list[str], code: int) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(),
                     params={s: {"fc1": 1e-9, "fc2": 1e-9} for s in range(3)})
    assert check(path, *args).exit_code == code


# -- the ranks of one run ---------------------------------------------------------------------

def rank_log(tmp_path: Path, rank: int, steps: list[list[C]], stem: str = "run") -> Path:
    head = header()
    head.rank, head.world_size = rank, 2
    return write_log(tmp_path / f"{stem}.rank{rank}.jsonl", steps, head=head)


def test_ranks_that_agree_are_healthy(tmp_path: Path) -> None:
    a, b = rank_log(tmp_path, 0, healthy()), rank_log(tmp_path, 1, healthy())
    rep = run_checks_ranks([a, b])
    assert (rep.findings, rep.steps, rep.events) == ([], 3, 48)
    result = check(str(tmp_path / "run.rank*.jsonl"), "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["events"] == 48


def test_ranks_that_run_different_modules(tmp_path: Path) -> None:
    a = rank_log(tmp_path, 0, healthy())
    skip = [C("fc1", g_in=None), C("fc2"), C("")]
    b = rank_log(tmp_path, 1, [chain(), skip, chain()])
    (f,) = run_checks_ranks([b, a]).findings  # in any order: sorted by rank
    assert (f.cause, f.severity, f.module, f.step, f.ranks) == (
        "rank-divergence", "error", "fc2", 1, [0, 1])
    assert f.evidence["position"] == 1
    assert set(f.evidence["ranks"]) == {"0", "1"}
    assert check(a, b).exit_code == 1


def test_a_finding_on_one_rank_only_says_so(tmp_path: Path) -> None:
    a = rank_log(tmp_path, 0, healthy())
    b = rank_log(tmp_path, 1, [chain(), chain(), chain(act=C("act", nonfinite=[[0, 1, 0]]))])
    (f,) = run_checks_ranks([a, b]).findings
    assert (f.cause, f.ranks) == ("nonfinite-forward", [1])
    assert "· rank 1 only" in check(a, b).stdout


def test_a_finding_on_every_rank_is_not_rank_local(tmp_path: Path) -> None:
    nan = chain(act=C("act", nonfinite=[[0, 1, 0]]))
    a = rank_log(tmp_path, 0, [chain(), nan])
    b = rank_log(tmp_path, 1, [chain(), nan])
    (f,) = run_checks_ranks([a, b]).findings
    assert (f.cause, f.ranks) == ("nonfinite-forward", None)


def test_logs_of_different_runs_are_refused(tmp_path: Path) -> None:
    a = rank_log(tmp_path, 0, healthy())
    other = write_log(tmp_path / "other.jsonl", healthy())  # rank 0 too
    with pytest.raises(HooktraceError, match="not the ranks of one run: two logs are rank 0"):
        run_checks_ranks([a, other])
    one_error_line(check(a, other), "the logs are not the ranks of one run")


def test_a_rank_that_ran_fewer_steps(tmp_path: Path) -> None:
    a, b = rank_log(tmp_path, 0, healthy()), rank_log(tmp_path, 1, healthy(2))
    (f,) = run_checks_ranks([a, b]).findings
    assert (f.cause, f.model, f.step) == ("rank-divergence", "", 2)
    assert f.message == ("the ranks ran different steps at step 2 (rank 0: 8 events; rank 1: "
                         "no events)")


def test_a_finding_on_some_of_three_ranks_lists_them(tmp_path: Path) -> None:
    nan = chain(act=C("act", nonfinite=[[0, 1, 0]]))
    logs = []
    for rank, last in enumerate([nan, nan, chain()]):
        head = header()
        head.rank, head.world_size = rank, 3
        logs.append(write_log(tmp_path / f"run.rank{rank}.jsonl", [chain(), last], head=head))
    (f,) = run_checks_ranks(logs).findings
    assert (f.cause, f.step, f.ranks) == ("nonfinite-forward", 1, [0, 1])
    assert "· ranks 0, 1 only" in check(*logs).stdout
