"""``hooktrace diff`` on real traced runs: the same script with one thing changed in run B.

The runs are made once for the module (one traced subprocess each, started together). Numbers
in the reports depend on the machine's kernels, so they are masked (``#``) before a report is
compared; everything else (sections, steps, modules, positions, shapes, dtypes) is exact.
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import ROOT, Shared, hooktrace_cmd

from commands.test_multirank import _torchrun

SCRIPT = ROOT / "tests" / "scripts" / "diff_train.py"
RUNS = {
    "a": (), "a2": (), "lr": ("--lr", "0.2"), "extra": ("--extra",), "batch": ("--batch", "6"),
    "nan": ("--nan-step", "3"), "bf16": ("--bf16",), "rename": ("--rename",),
    "swap": ("--swap",), "twice": ("--twice",),
}
AGREE_34 = """\
3. numbers (rtol #, atol 0): agree
4. parameter-gradient norms: agree"""


@pytest.fixture(scope="module")
def logs(shared: Shared) -> Path:
    """The runs of ``RUNS``, made once per test run (the diffs only read them)."""
    def make(folder: Path) -> str:
        def run(name: str, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
            options = ("--no-stats", "--steps", "0:3") if name == "nostats" else ()
            return hooktrace_cmd("run", "-o", f"{name}.jsonl", *options, SCRIPT, *args,
                                 cwd=folder)

        with ThreadPoolExecutor(max_workers=2) as pool:
            for result in pool.map(run, *zip(*{**RUNS, "nostats": ()}.items(), strict=True)):
                assert result.returncode == 0, result.stderr
        return str(folder)

    return Path(shared("diff", make))


def diff(folder: Path, *args: str) -> tuple[int, str]:
    result = hooktrace_cmd("diff", *args, cwd=folder)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, re.sub(r"\d+\.\d+(e[-+]\d+)?", "#", result.stdout)


def head(report: str, sections: int) -> str:
    """The first line, then the sections up to (not including) section ``sections + 1``."""
    return report.split(f"\n{sections + 1}. ")[0]


def test_same_script_twice_agrees(logs: Path) -> None:
    assert diff(logs, "a.jsonl", "a2.jsonl") == (0, f"""\
hooktrace diff a.jsonl a2.jsonl: 5 steps compared (0-4)

1. what ran: the same
2. shapes and dtypes: the same (in the calls both runs made)
{AGREE_34}

The runs agree.
""")


def test_extra_layer_is_named_with_its_step_and_position(logs: Path) -> None:
    status, report = diff(logs, "a.jsonl", "extra.jsonl")
    assert status == 1
    assert head(report, 2) == """\
hooktrace diff a.jsonl extra.jsonl: 5 steps compared (0-4)

1. what ran: differs
   step 0 · model 'model' · extra · position 3 in the step
   forward of extra call 0 ran in B only
   A: forward act #0 · forward poison #0 · [forward fc2 #0] · forward (root) #0 · backward (root) #0 · ...
   B: forward act #0 · forward poison #0 · [forward extra #0] · forward fc2 #0 · forward (root) #0 · ...
2. shapes and dtypes: the same (in the calls both runs made)"""  # noqa: E501
    assert report.endswith("The runs differ: what ran, numbers, parameter gradients.\n")


def test_another_order_names_both_calls(logs: Path) -> None:
    status, report = diff(logs, "a.jsonl", "swap.jsonl")
    assert status == 1
    assert head(report, 1).split("\n\n")[1] == """\
1. what ran: differs
   step 0 · model 'model' · fc1 · position 0 in the step
   another order: A ran forward of fc1 call 0 where B ran forward of act call 0
   A: [forward fc1 #0] · forward act #0 · forward poison #0 · ...
   B: [forward act #0] · forward fc1 #0 · forward poison #0 · ..."""


def test_more_calls_in_b_says_how_many_a_made(logs: Path) -> None:
    status, report = diff(logs, "a.jsonl", "twice.jsonl")
    assert status == 1
    assert head(report, 2).split("\n\n")[1] == """\
1. what ran: differs
   step 0 · model 'model' · act · position 2 in the step
   act has more forward calls in B than in A (A: 1): forward of act call 1 ran in B only
   A: forward fc1 #0 · forward act #0 · [forward poison #0] · forward fc2 #0 · forward (root) #0 · ...
   B: forward fc1 #0 · forward act #0 · [forward act #1] · forward poison #0 · forward fc2 #0 · ...
2. shapes and dtypes: the same (in the calls both runs made)"""  # noqa: E501


def test_tolerances_decide_whether_numbers_agree(logs: Path) -> None:
    assert diff(logs, "a.jsonl", "lr.jsonl")[0] == 1
    # gradient norms are never negative: a relative difference is at most 1
    for option, value in [("--rtol", "1"), ("--atol", "100")]:
        status, report = diff(logs, "a.jsonl", "lr.jsonl", option, value)
        rtol, atol = ("1", "0") if option == "--rtol" else ("#", "100")
        assert (status, report.split("\n\n")[1:]) == (0, [f"""\
1. what ran: the same
2. shapes and dtypes: the same (in the calls both runs made)
3. numbers (rtol {rtol}, atol {atol}): agree
4. parameter-gradient norms: agree""", "The runs agree.\n"])


def test_other_batch_size_names_the_first_call_with_other_shapes(logs: Path) -> None:
    status, report = diff(logs, "a.jsonl", "batch.jsonl")
    assert status == 1
    assert head(report, 2).split("\n\n")[1] == """\
1. what ran: the same
2. shapes and dtypes: shapes differ
   step 0 · model 'model' · fc1
   forward of fc1 call 0: the input/output shapes differ
   A: [[4, 8]] -> [[4, 16]]
   B: [[6, 8]] -> [[6, 16]]"""


def test_other_learning_rate_agrees_at_step_0_and_diverges_at_step_1(logs: Path) -> None:
    status, report = diff(logs, "a.jsonl", "lr.jsonl")
    assert status == 1
    assert report.split("\n3. ")[1].split("\n")[:5] == [
        "numbers (rtol #, atol 0): first divergence",
        "   step 1 · model 'model' · (root)",
        "   backward of (root) call 0: grad_output 0 norm differs by # (relative)",
        "   A: #", "   B: #"]
    assert "   growth (relative difference): step 1: (root) # -> fc2 # -> poison # -> act # " \
           "-> fc1 #; step 2: " in report
    assert report.endswith("The runs differ: numbers, parameter gradients.\n")
    assert diff(logs, "a.jsonl", "lr.jsonl", "--step", "0") == (0, f"""\
hooktrace diff a.jsonl lr.jsonl: 1 step compared (0)

1. what ran: the same
2. shapes and dtypes: the same (in the calls both runs made)
{AGREE_34}

The runs agree.
""")
    data = json.loads(hooktrace_cmd("diff", "--json", "a.jsonl", "lr.jsonl", cwd=logs).stdout)
    found = data["divergence"]
    assert (data["differ"], data["steps"], data["ran"], data["shapes"]) == (
        True, [0, 1, 2, 3, 4], None, None)
    assert (found["kind"], found["step"], found["module"], found["phase"]) == (
        "value", 1, "", "backward")
    assert data["params"][0]["step"] == 1  # step 0 agrees


def test_nan_in_one_run_is_named_with_its_module(logs: Path) -> None:
    status, report = diff(logs, "a.jsonl", "nan.jsonl")
    assert status == 1
    assert report.split("\n3. ")[1].split("\n4. ")[0] == """\
numbers (rtol #, atol 0): first divergence
   step 3 · model 'model' · poison
   forward of poison call 0: output 0 has NaN/Inf in B only
   A: finite
   B: 64 NaN, 0 Inf
   growth (relative difference): step 3: poison NaN/Inf -> (root) NaN/Inf -> fc2 NaN/Inf \
-> poison NaN/Inf -> fc1 NaN/Inf; step 4: fc1 NaN/Inf"""
    assert "   step 3 · model 'model': fc1 # vs nan, fc2 # vs nan\n" in report


def test_bfloat16_autocast_dtypes_differ(logs: Path) -> None:
    status, report = diff(logs, "a.jsonl", "bf16.jsonl")
    assert status == 1
    assert head(report, 2).split("\n\n")[1] == """\
1. what ran: the same
2. shapes and dtypes: dtypes differ
   step 0 · model 'model' · fc1
   forward of fc1 call 0: the input/output dtypes differ
   A: [float32] -> [float32]
   B: [float32] -> [bfloat16]"""


def test_renamed_module_is_reported_once_and_compared_under_its_old_name(logs: Path) -> None:
    assert diff(logs, "a.jsonl", "rename.jsonl") == (1, f"""\
hooktrace diff a.jsonl rename.jsonl: 5 steps compared (0-4)

1. what ran: differs
   renamed: fc2 in A is head in B (model 'model'); compared under A's name
2. shapes and dtypes: the same (in the calls both runs made)
{AGREE_34}

The runs differ: what ran.
""")


def test_other_steps_and_no_stats_compare_what_both_have(logs: Path) -> None:
    assert diff(logs, "a.jsonl", "nostats.jsonl") == (0, """\
hooktrace diff a.jsonl nostats.jsonl: 3 steps compared (0-2)

1. what ran: the same
2. shapes and dtypes: the same (in the calls both runs made)
3. numbers (rtol #, atol 0): not compared
4. parameter-gradient norms: not compared

not compared:
   steps 3-4: only in A (B recorded with --steps 0:3)
   numbers and parameter gradients: B recorded with --no-stats

The runs agree.
""")


def test_a_run_cut_off_is_compared_up_to_the_step_it_did_not_finish(logs: Path) -> None:
    whole = (logs / "a.jsonl").read_bytes()
    lines = whole.splitlines(keepends=True)
    step_2 = next(i for i, line in enumerate(lines) if b'"step":2' in line)
    # killed while writing the fourth event of step 2: a partial last line, no end record
    (logs / "cut.jsonl").write_bytes(b"".join(lines[:step_2 + 3]) + lines[step_2 + 3][:20])
    assert diff(logs, "a.jsonl", "cut.jsonl") == (0, f"""\
hooktrace diff a.jsonl cut.jsonl: 2 steps compared (0-1)
warning: cut.jsonl ends with a partial line {step_2 + 4} (the run was cut off); read up to the \
line before it
warning: cut.jsonl has no end record: the run did not finish

1. what ran: the same
2. shapes and dtypes: the same (in the calls both runs made)
{AGREE_34}

not compared:
   step 2: cut off in B (the run did not finish it)
   steps 3-4: only in A (B was cut off in step 2)

The runs agree.
""")
    # killed between steps: the last step was closed by its step record, so it is compared
    (logs / "no-end.jsonl").write_bytes(b"".join(lines[:-1]))
    status, report = diff(logs, "no-end.jsonl", "a.jsonl")
    assert (status, report.splitlines()[:2]) == (0, [
        "hooktrace diff no-end.jsonl a.jsonl: 5 steps compared (0-4)",
        "warning: no-end.jsonl has no end record: the run did not finish"])
    result = hooktrace_cmd("diff", "cut.jsonl", "a.jsonl", "--step", "2", cwd=logs)
    assert (result.returncode, result.stderr) == (
        2, "hooktrace: error: step 2 was cut off in A\n")


def test_bad_input_is_one_line_and_exit_2(logs: Path) -> None:
    old = logs / "old.jsonl"
    lines = (logs / "a.jsonl").read_text().splitlines(keepends=True)
    old.write_text(lines[0].replace('"schema":3', '"schema":2') + "".join(lines[1:]))
    (logs / "newer.jsonl").write_text(lines[0].replace('"schema":3', '"schema":4')
                                      + "".join(lines[1:]))
    (logs / "empty.jsonl").write_text("")
    (logs / "notes.txt").write_text("step 1: loss 0.25\n")
    for args, message in [
        (("a.jsonl", "newer.jsonl"), "newer.jsonl has log schema 4, newer than this hooktrace "
                                     "reads (3): upgrade hooktrace"),
        (("empty.jsonl", "a.jsonl"), "empty.jsonl is empty, not a hooktrace log"),
        (("a.jsonl", "notes.txt"), "notes.txt is not a hooktrace log (its first line is not a "
                                   "header)"),
        (("a.jsonl", "old.jsonl"), "old.jsonl has log schema 2, written by an older hooktrace "
                                   "(0.2.0); this one reads schema 3: trace the run again"),
        (("a.jsonl", "a2.jsonl", "--model", "gen"),
         "no model 'gen' in a.jsonl or a2.jsonl; their models: model"),
        (("a.jsonl", "a2.jsonl", "--step", "7"), "step 7 is not in both logs"),
        (("a.jsonl", "missing.jsonl"), "no such log: missing.jsonl"),
    ]:
        result = hooktrace_cmd("diff", *args, cwd=logs)
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr.splitlines() == [f"hooktrace: error: {message}"]


def _as_rank(log: Path, rank: int, to: Path) -> None:
    """``log`` relabelled as rank ``rank`` of a 2-process run of the plain script."""
    header, rest = log.read_text().split("\n", 1)
    d = json.loads(header)
    d.update(rank=rank, world_size=2, argv=["diff_train.py"])
    to.write_text(json.dumps(d) + "\n" + rest)


@pytest.mark.parametrize(("run", "kind", "module", "position"), [
    ("extra", "ran", "extra", 3), ("batch", "shapes", "fc1", 0), ("bf16", "dtypes", "fc1", 0)])
def test_check_on_ranks_and_diff_part_the_logs_at_the_same_call(
        logs: Path, run: str, kind: str, module: str, position: int) -> None:
    """One engine: ``check``'s rank divergence is the first of diff's sections 1 and 2."""
    _as_rank(logs / "a.jsonl", 0, logs / f"{run}-ranks.rank0.jsonl")
    _as_rank(logs / f"{run}.jsonl", 1, logs / f"{run}-ranks.rank1.jsonl")
    pair = (f"{run}-ranks.rank0.jsonl", f"{run}-ranks.rank1.jsonl")
    checked = hooktrace_cmd("check", "--json", *pair, cwd=logs)
    assert checked.returncode == 1, checked.stderr
    rank = next(f for f in json.loads(checked.stdout)["findings"]
                if f["cause"] == "rank-divergence")
    found = json.loads(hooktrace_cmd("diff", "--json", *pair, cwd=logs).stdout)
    first = found["ran" if kind == "ran" else "shapes"]
    assert (first["kind"], first["step"], first["module"], first["position"]) == (
        kind, rank["step"], rank["module"], rank["evidence"]["position"]) == (
        kind, 0, module, position)
    assert rank["message"].startswith(f"the ranks ran different "
                                      f"{'modules' if kind == 'ran' else kind} at step 0")


@pytest.mark.slow
def test_two_ranks_give_the_answer_check_gives(tmp_path: Path) -> None:
    run = _torchrun(tmp_path, 2, "--diverge", "1")
    assert run.returncode == 0, run.stderr
    checked = json.loads(hooktrace_cmd("check", "--json", "ddp.rank0.jsonl", "ddp.rank1.jsonl",
                                       cwd=tmp_path).stdout)
    rank = next(f for f in checked["findings"] if f["cause"] == "rank-divergence")
    result = hooktrace_cmd("diff", "--json", "ddp.rank0.jsonl", "ddp.rank1.jsonl", cwd=tmp_path)
    assert result.returncode == 1
    ran = json.loads(result.stdout)["ran"]
    assert (ran["step"], ran["module"], ran["position"]) == (
        rank["step"], rank["module"], rank["evidence"]["position"]) == (2, "extra", 1)
    assert ran["message"] == "forward of extra call 0 ran in B only"
