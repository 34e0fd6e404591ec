"""A module called twice in one forward whose second call gets no gradient back (issue 36,
item 5; ``scripts/twice_calls.py``, real runs of ``hooktrace run``): silent where its result is
only looked at (kept on ``self``, ``.item()``, under ``no_grad``), a ``no-grad`` warning naming
the forward where its detached result goes into the output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import hooktrace_cmd

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "twice_calls.py"
BUGS = ["added_detached", "cat_detached"]
HEALTHY = ["ok_kept_on_self", "ok_item", "ok_under_no_grad"]


def check_case(tmp_path: Path, case: str) -> tuple[int, list[dict[str, Any]]]:
    log = tmp_path / f"{case}.jsonl"
    run = hooktrace_cmd("run", "-o", log, SCRIPT, case)
    assert run.returncode == 0, run.stderr
    result = hooktrace_cmd("check", "--json", log)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["findings"]


@pytest.mark.parametrize("case", BUGS)
def test_a_detached_call_in_the_output_is_said(tmp_path: Path, case: str) -> None:
    status, found = check_case(tmp_path, case)
    problems = [(f["cause"], f["severity"], f["module"], f["step"], f["evidence"]["starved"])
                for f in found if f["severity"] != "note"]
    assert problems == [("no-grad", "warning", "", 0, ["body.0", "body.2"])]
    assert "the output of body (call 1) gets no gradient back" in found[0]["message"]
    assert ".detach()" in found[0]["hint"]
    assert status == 1


@pytest.mark.parametrize("case", HEALTHY)
def test_a_call_only_looked_at_is_silent(tmp_path: Path, case: str) -> None:
    status, found = check_case(tmp_path, case)
    assert [f for f in found if f["severity"] != "note"] == []
    assert status == 0
