"""What the log says ran, on the field programs of tests/scripts/field_names.py (issue 47, items
1 to 3): each case run by ``hooktrace run``, read by the real commands."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import Traced, events, hooktrace_cmd, read_log

from hooktrace.log import schema

SCRIPT = Path(__file__).parent.parent / "scripts" / "field_names.py"


def _line(text: str, after: str = "") -> int:
    """The line number of the first line of the script that starts with ``text`` (stripped),
    after the first that starts with ``after``."""
    lines = [line.strip() for line in SCRIPT.read_text().splitlines()]
    start = lines.index(next(x for x in lines if x.startswith(after))) if after else 0
    return next(i for i, x in enumerate(lines[start:], start + 1) if x.startswith(text))


def _sources(log: Path) -> list[str]:
    """check's ``source:`` lines, each file by its name (where the run was is no matter)."""
    result = hooktrace_cmd("check", log)
    assert result.returncode == 1, result.stderr  # the detached branch
    return [f"{Path(site).name} {where}" for line in result.stdout.splitlines()
            if line.strip().startswith("source:")
            for site, where in [line.split()[1:3]]]


def test_a_decorated_forward_is_found_at_its_def(traced: Traced) -> None:
    """``@torch.autocast`` wraps ``forward`` in torch's ``decorate_autocast``: the source is the
    user's ``def``, not the decorator's file."""
    line = _line("def forward", after="@torch.autocast")
    assert _sources(traced(SCRIPT, "decorated")) == [
        f"field_names.py:{line} (Decorated.forward)"]


def test_an_undecorated_forward_keeps_its_line(traced: Traced) -> None:
    line = _line("def forward", after="class Branches")
    assert _sources(traced(SCRIPT, "plain")) == [f"field_names.py:{line} (Branches.forward)"]


def _classes(log: Path, fqn: str) -> list[str]:
    """The classes the log's ``module`` records give ``fqn``, in order."""
    return [r.cls for r in read_log(log) if isinstance(r, schema.Module) and r.fqn == fqn]


def _shown(log: Path, step: int) -> dict[str, str]:
    """``show --step``'s class of each fqn, from its forward rows."""
    result = hooktrace_cmd("show", log, "--step", str(step))
    assert result.returncode == 0, result.stderr
    return {words[3]: words[4] for line in result.stdout.splitlines()
            if len(words := line.split()) > 4 and words[0].isdigit() and words[1] == "forward"}


@pytest.mark.parametrize(("case", "new"), [("replaced", "Sigmoid"),
                                           ("replaced_identity", "Identity")])
def test_a_replaced_module_is_named_by_its_own_class(traced: Traced, case: str, new: str
                                                     ) -> None:
    """``model[1] = nn.Sigmoid()`` after two steps: a module record of its own, the class
    ``show`` gives its calls after it."""
    log = traced(SCRIPT, case)
    assert _classes(log, "1") == ["ReLU", new]
    assert _shown(log, 3) == {"0": "Linear", "1": new, "2": "Linear", "(root)": "Sequential"}


@pytest.mark.parametrize("case", ["replaced_relu", "kept"])
def test_a_module_of_the_same_class_or_none_keeps_its_record(traced: Traced, case: str) -> None:
    log = traced(SCRIPT, case)
    assert _classes(log, "1") == ["ReLU"]
    assert _shown(log, 3)["1"] == "ReLU"


def test_diff_sees_another_class_in_the_same_place(traced: Traced) -> None:
    """Two runs that differ only by the class put in ``model[1]`` at step 2 differ in what ran
    there; a new ReLU in its place is what ran before."""
    kept = traced(SCRIPT, "kept")
    result = hooktrace_cmd("diff", kept, traced(SCRIPT, "replaced_gelu"))
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert result.returncode == 1 and "1. what ran: differs" in lines, result.stdout
    assert lines[lines.index("1. what ran: differs") + 1:][:2] == [
        "step 2 · model 'model' · 1 · position 1 in the step",
        "forward of 1 call 0: ReLU in A, GELU in B"]
    same = hooktrace_cmd("diff", kept, traced(SCRIPT, "replaced_relu"))
    assert "1. what ran: the same" in same.stdout and same.returncode == 0, same.stdout


def _edges(log: Path) -> list[str]:
    """``show --edges``' edges of step 0, numbers and norms left out."""
    result = hooktrace_cmd("show", log, "--step", "0", "--edges")
    assert result.returncode == 0, result.stderr
    return [" ".join(line.split()[1:4]) for line in result.stdout.splitlines()
            if line.startswith("  ") and "->" in line]


def test_a_module_two_models_hold_is_named_by_the_model_that_calls_it(traced: Traced) -> None:
    """ultralytics' ``Conv.default_act``: one SiLU in the Convs of a probe model run once
    under ``no_grad`` and of the model trained after it. The trained model's calls are its
    own: no edge between the models, no backward event for the probe."""
    log = traced(SCRIPT, "shared_act")
    acts = [(e.model, e.fqn, e.phase, e.call) for e in events(log, step=0)
            if e.fqn.endswith(".act")]
    assert acts == [(0, "layers.0.act", "forward", 0), (0, "layers.1.act", "forward", 0),
                    (1, "layers.0.act", "forward", 0), (1, "layers.1.act", "forward", 0),
                    (1, "layers.1.act", "backward", 0), (1, "layers.0.act", "backward", 0)]
    assert not [e for e in events(log, "backward") if e.model == 0]
    assert _edges(log) == [
        "probe:layers.0.conv -> probe:layers.0.act", "probe:layers.0.act -> probe:layers.1.conv",
        "probe:layers.1.conv -> probe:layers.1.act", "probe:layers.1.act -> probe:head",
        "model:layers.0.conv -> model:layers.0.act", "model:layers.0.act -> model:layers.1.conv",
        "model:layers.1.conv -> model:layers.1.act", "model:layers.1.act -> model:head",
        "model:head -> model:layers.1.act", "model:layers.1.act -> model:layers.1.conv",
        "model:layers.1.conv -> model:layers.0.act", "model:layers.0.act -> model:layers.0.conv"]


def test_a_module_shared_inside_one_model_keeps_its_names(traced: Traced) -> None:
    """The same Convs in one model: the activation is ``layers.0.act``, and
    ``layers.1.act`` (``alias_of`` it) where ``layers.1`` calls it."""
    log = traced(SCRIPT, "shared_act_one_model")
    modules = {r.fqn: r for r in read_log(log) if isinstance(r, schema.Module)}
    assert (modules["layers.0.act"].aliases, modules["layers.1.act"].alias_of) == (
        ["layers.1.act"], "layers.0.act")
    assert [(e.fqn, e.phase) for e in events(log, step=0) if e.fqn.endswith(".act")] == [
        ("layers.0.act", "forward"), ("layers.1.act", "forward"),
        ("layers.1.act", "backward"), ("layers.0.act", "backward")]


def _backward(log: Path, step: int = 0) -> list[tuple[str, int]]:
    return [(e.fqn, e.call) for e in events(log, "backward", step)]


def test_a_view_no_gradient_reached_has_no_backward_event(traced: Traced) -> None:
    """``nn.Flatten`` of the features, read for a metric: its output is a whole view of the
    features, whose own node gets a gradient through the head; none came through the view."""
    assert _backward(traced(SCRIPT, "unused_view")) == [("", 0), ("head", 0), ("body", 0)]


def test_views_changed_in_place_keep_the_gradient_of_each_call(traced: Traced) -> None:
    """swin V2's position bias on a buffer, its first Linear's output changed in place by
    ``ReLU(inplace=True)``, called twice a step (and once under ``no_grad``): a backward event
    for each call the loss reads, and check finds nothing wrong."""
    log = traced(SCRIPT, "position_bias")
    bias = [(fqn, call) for fqn, call in _backward(log) if fqn.startswith("block.cpb_mlp.")]
    assert bias == [(f"block.cpb_mlp.{i}", call) for call in (1, 0) for i in (2, 1, 0)]
    result = hooktrace_cmd("check", log)
    assert result.returncode == 0, result.stdout
