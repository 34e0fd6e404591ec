"""``check`` names where the gradient dies: each bug of ``scripts/flow_bugs.py`` (real runs of
``hooktrace run``), with the module where the gradient is lost (the boundary) as the finding's
subject and the modules it starves as evidence; and silence on the healthy look-alikes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import hooktrace_cmd

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "flow_bugs.py"


def check_case(tmp_path: Path, case: str, *args: str, exit_code: int = 0
               ) -> tuple[int, list[dict[str, Any]]]:
    log = tmp_path / f"{case}.jsonl"
    run = hooktrace_cmd("run", "-o", log, SCRIPT, case, *args)
    assert run.returncode == exit_code, run.stderr
    result = hooktrace_cmd("check", "--json", log)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["findings"]


# case -> (kind, severity, boundary module, step, starved modules)
BUGS = {
    "detached": ("no-grad", "warning", "", 0, ["encoder.fc1", "encoder.fc2"]),
    "numpy_block": ("no-grad", "warning", "block", 0, ["encoder.fc1", "encoder.fc2"]),
    "no_grad_proj": ("no-grad-under-no_grad", "warning", "", 0,
                     ["encoder.fc1", "encoder.fc2", "proj"]),
    "dead_relu": ("dead-activation", "warning", "4", 0, ["0", "2", "3"]),
    "saturated_sigmoid": ("saturated", "warning", "4", 0, ["0", "2", "3"]),
    "zero_head_frozen": ("zero-gradient", "warning", "4", 0, ["0", "2"]),
    "zero_grad_function": ("zero-gradient", "warning", "3", 0, ["0", "2"]),
    "masked_branch": ("zero-gradient", "warning", "", 0, ["aux.0", "aux.2"]),
    "shared_detached": ("no-grad", "warning", "", 0, ["embed", "encoder.0"]),
    # a head per level, one multiplied by 0 inside the heads' forward, the whole output read
    "zeroed_level": ("zero-gradient", "warning", "boxes", 0, ["boxes.heads.2"]),
    # the loss reads the boxes through a mask that is always empty
    "empty_mask": ("zero-gradient", "warning", "", 0,
                   ["boxes.heads.0", "boxes.heads.1", "boxes.heads.2"]),
}


@pytest.mark.parametrize("case", sorted(BUGS))
def test_the_boundary_is_named(tmp_path: Path, case: str) -> None:
    status, found = check_case(tmp_path, case)
    kind, severity, module, step, starved = BUGS[case]
    [finding] = [f for f in found if f["cause"] == kind]
    assert (finding["severity"], finding["module"], finding["step"]) == (severity, module, step)
    assert finding["evidence"]["starved"] == starved
    assert finding["evidence"]["steps"] == [0, 1, 2]  # every step: it never recovers
    # the starved modules are evidence, not findings of their own
    others = {(f["cause"], f["module"]) for f in found if f is not finding
              and f["severity"] != "note" and f["cause"] != "frozen"}
    assert others == set()
    assert status == 1


def test_detach_names_the_branch_and_the_call(tmp_path: Path) -> None:
    """A shared encoder whose second call is detached: judged per call, the report says which
    call's output gets no gradient back, while its first call trains."""
    _, found = check_case(tmp_path, "shared_detached")
    [finding] = [f for f in found if f["cause"] == "no-grad"]
    assert "the output of embed (call 1), encoder (call 1) gets no gradient back" \
        in finding["message"]


def test_the_source_of_the_boundary_is_named(tmp_path: Path) -> None:
    """The finding points at the forward of the boundary's class, in the user's file."""
    _, found = check_case(tmp_path, "numpy_block")
    [finding] = [f for f in found if f["cause"] == "no-grad"]
    line = int(finding["source"].split(" ")[0].rsplit(":", 1)[1])
    assert finding["source"].endswith("(NumpyBlock.forward)")
    assert SCRIPT.read_text().splitlines()[line - 1].strip().startswith("def forward(")
    assert "its input needed a gradient and none came back" in finding["message"]


def test_zero_initialised_head_is_a_note(tmp_path: Path) -> None:
    """A zero-initialised head (torchvision's ViT) starves every layer before it at the first
    step only: a note naming the head, and no vanishing finding about its victims."""
    status, found = check_case(tmp_path, "zero_head")
    assert status == 0
    [note] = [f for f in found if f["cause"] == "zero-gradient"]
    assert (note["severity"], note["module"], note["step"]) == ("note", "4", 0)
    assert "its weights are zero" in note["message"]
    assert "not in the 2 later steps" in note["message"]
    assert not [f for f in found if f["cause"] == "vanishing"]


def test_a_backward_that_raised_names_its_module(tmp_path: Path) -> None:
    """An in-place op on a tensor that a backward needs: autograd raises inside the backward
    pass; check reports that error with the module whose backward ran, and does not call the
    modules before it, which the aborted pass never reached, detached."""
    status, found = check_case(tmp_path, "backward_inplace", exit_code=1)
    [error] = [f for f in found if f["severity"] != "note"]
    assert (error["cause"], error["severity"], error["module"], error["step"]) == (
        "backward-error", "error", "3", 0)
    assert "modified by an inplace operation" in error["message"]
    assert "make it out of place" in error["hint"]
    assert status == 1


@pytest.mark.parametrize("case", ["ok_layer_scale", "ok_frozen_backbone", "ok_reloaded_eval",
                                  "ok_stochastic_depth", "ok_inplace_dropout_view",
                                  "ok_level_heads", "ok_level_selection"])
def test_healthy_look_alikes_are_silent(tmp_path: Path, case: str) -> None:
    """A layer scale on a residual branch, a frozen backbone, a reloaded copy evaluated under
    no_grad (which never calls its MultiheadAttention's out_proj), stochastic depth dropping a
    whole batch's branch in a few of 8 steps (notes), an in-place Dropout on a flattened
    view (autograd rebases the view's history: its input is not lost), and detection heads
    shared across feature levels whose box loss skips a level, or one head per level whose
    loss reads the matched rows only: no problem."""
    status, found = check_case(tmp_path, case, "8")
    assert [f for f in found if f["severity"] != "note"] == []
    assert status == 0


def test_a_loss_reading_part_of_an_output_is_a_note(tmp_path: Path) -> None:
    """A head per feature level, concatenated; the loss reads the rows the data matches, never
    the last level's (SSD's coarse levels with small boxes): the last head's exactly-zero
    gradient is that selection's (75% of the heads' output gradient is exactly zero, a share
    the log records), a note that names it; the same head multiplied by 0 while every row is
    read, or a mask that is always empty, stays a warning (BUGS)."""
    status, found = check_case(tmp_path, "ok_level_selection")
    [note] = [f for f in found if f["cause"] == "zero-gradient"]
    assert (note["severity"], note["module"], note["evidence"]["starved"]) == (
        "note", "boxes", ["boxes.heads.2"])
    assert "and only part of the output of boxes (75.0% of its gradient exactly zero) is " \
        "read: a selection by the data" in note["message"]
    assert status == 0
