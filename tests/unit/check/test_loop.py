"""Training-loop findings on hand-built logs: what the ``signal`` records say the loop did (eval
mode, optimizers, gradients carried over, cleared or zeroed, deprecated hooks), and frozen and
unused modules; each beside a look-alike that stays silent or is only a note."""

from __future__ import annotations

from pathlib import Path

import pytest

from .logbuild import CHAIN, C, chain, findings, header, healthy, signal, summary, write_log

BN = [("", "Net", 0), ("fc1", "Linear", 40), ("bn", "BatchNorm1d", 16), ("fc2", "Linear", 18)]


def bn_steps(n: int = 3) -> list[list[C]]:
    return [[C("fc1", g_in=None), C("bn"), C("fc2"), C("")] for _ in range(n)]


# -- eval mode -------------------------------------------------------------------------------

STEPPED = signal("optimizer-steps", 0, optimizer="SGD", count=2, after=[0, 1])


def test_backward_in_eval_mode_with_a_batchnorm_that_trains(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", bn_steps(), modules=BN,
                     signals=[signal("eval-backward", 1), STEPPED])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("eval-backward", "warning", "", 1)
    assert f.evidence == {"layers": ["bn"]}


def test_backward_in_eval_mode_that_no_optimizer_step_follows_is_silent(tmp_path: Path) -> None:
    """Grad-CAM, saliency: a backward that explains the model, which nothing trains."""
    path = write_log(tmp_path / "log.jsonl", bn_steps(), modules=BN,
                     signals=[signal("eval-backward", 1)])
    assert findings(path) == []


def test_backward_in_eval_mode_without_modal_layers_is_silent(tmp_path: Path) -> None:
    """Linear and ReLU act the same in eval mode: nothing that trains changes."""
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=[signal("eval-backward", 1)])
    assert findings(path) == []


def test_eval_mode_with_a_frozen_batchnorm_is_silent(tmp_path: Path) -> None:
    """Linear probing: the BatchNorm is frozen (no trainable parameters), kept in eval mode on
    purpose; only its being frozen is noted."""
    frozen_bn = [*BN[:2], ("bn", "BatchNorm1d", 16, 0), BN[3]]
    path = write_log(tmp_path / "log.jsonl", bn_steps(), modules=frozen_bn,
                     signals=[signal("eval-backward", 1)])
    assert summary(path) == [("frozen", "note", "bn", None)]


# -- what the optimizer holds ----------------------------------------------------------------

def test_no_optimizer_holds_the_model(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), optimizer=False,
                     signals=[signal("optimizers", held=[], not_held=["fc1", "fc2"])])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("not-optimized", "warning", "", None)
    assert f.evidence == {"modules": ["fc1", "fc2"]}


def test_an_optimizer_missing_one_module(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), optimizer=False,
                     signals=[signal("optimizers", held=["fc1"], not_held=["fc2"])])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("not-optimized", "warning", "fc2", None)
    assert f.hint.startswith("the optimizer holds only fc1's parameters")


def test_not_held_but_never_given_a_gradient_is_silent(tmp_path: Path) -> None:
    """An optimizer that leaves out a module whose parameters never get a gradient (it is not
    in the log's calls) is no finding."""
    path = write_log(tmp_path / "log.jsonl", healthy(), optimizer=False,
                     signals=[signal("optimizers", held=["fc1", "fc2"], not_held=["ghost"])])
    assert findings(path) == []


def test_the_last_optimizers_signal_counts(tmp_path: Path) -> None:
    """A second optimizer stepped later with the rest: the earlier partial view is not a
    finding."""
    path = write_log(tmp_path / "log.jsonl", healthy(), optimizer=False, signals=[
        signal("optimizers", 0, held=["fc1"], not_held=["fc2"]),
        signal("optimizers", 1, held=["fc1", "fc2"], not_held=[])])
    assert findings(path) == []


# -- gradients between backward and step -----------------------------------------------------

@pytest.mark.parametrize("kind", ["grads-carried-over", "grads-cleared", "grads-zeroed"])
def test_gradient_signals_name_the_first_module_in_forward_order(tmp_path: Path,
                                                                 kind: str) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(),
                     signals=[signal(kind, 1, modules=["fc2", "fc1"])])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == (kind, "warning", "fc1", 1)
    assert f.evidence == {"modules": ["fc1", "fc2"]}


def test_grads_zeroed_after_a_backward_that_gave_zero_is_not_a_loop_bug(tmp_path: Path) -> None:
    """The backward itself gave exactly-zero gradients (a loss of 0): nothing was zeroed."""
    path = write_log(tmp_path / "log.jsonl", healthy(), params={1: {"fc1": 0.0, "fc2": 0.0}},
                     signals=[signal("grads-zeroed", 1, modules=["fc2", "fc1"])])
    assert [f.cause for f in findings(path)] == ["zero-gradient"]
    assert findings(path)[0].severity == "note"


def test_deprecated_backward_hook(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(),
                     signals=[signal("backward-hook", 0, "fc1", hook="my_hook")])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("backward-hook", "warning", "fc1", None)
    assert f.evidence == {"hook": "my_hook"}


def test_frozen_batchnorm_in_train_mode_is_a_note(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(),
                     signals=[signal("frozen-bn-training", 0, "fc1")])
    assert summary(path) == [("frozen-bn-training", "note", "fc1", 0)]


def test_unknown_signal_kinds_are_ignored(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(),
                     signals=[signal("from-the-future", 0, "fc1", x=1)])
    assert findings(path) == []


# -- frozen and unused modules ---------------------------------------------------------------

def test_a_layer_frozen_after_a_trainable_twin_is_a_warning(tmp_path: Path) -> None:
    modules = [*CHAIN[:3], ("fc2", "Linear", 18, 0)]
    (f,) = findings(write_log(tmp_path / "log.jsonl", healthy(), modules=modules))
    assert (f.cause, f.severity, f.module, f.step) == ("frozen", "warning", "fc2", None)
    assert f.evidence == {"params": 18, "trainable_siblings": ["fc1"]}


def test_a_frozen_first_layer_is_a_backbone_note(tmp_path: Path) -> None:
    """A frozen prefix (a pretrained backbone, on purpose): a note, and the missing backward of
    fc1 is no lost gradient."""
    modules = [CHAIN[0], ("fc1", "Linear", 40, 0), *CHAIN[2:]]
    path = write_log(tmp_path / "log.jsonl", [chain(fc1=C("fc1", g_out=None))] * 3,
                     modules=modules)
    assert summary(path) == [("frozen", "note", "fc1", None)]


def test_unfrozen_during_the_run_with_no_optimizer_holding_it(tmp_path: Path) -> None:
    modules = [CHAIN[0], ("fc1", "Linear", 40, 0), *CHAIN[2:]]
    path = write_log(tmp_path / "log.jsonl", [chain(fc1=C("fc1", g_out=None)), *healthy(2)],
                     modules=modules, optimizer=False, signals=[
                         signal("trainable-changed", 1, unfrozen=["fc1"]),
                         signal("optimizers", 1, held=["fc2"], not_held=["fc1"])])
    found = findings(path)
    assert [(f.cause, f.severity, f.module, f.step) for f in found] == [
        ("not-optimized", "warning", "fc1", 1), ("frozen", "note", "fc1", None)]
    assert found[0].evidence == {"modules": ["fc1"], "unfrozen_at": 1}
    assert "until step 1, trainable from then on" in found[1].message


def test_frozen_during_the_run(tmp_path: Path) -> None:
    steps = [chain(), chain(fc1=C("fc1", g_out=None)), chain(fc1=C("fc1", g_out=None))]
    path = write_log(tmp_path / "log.jsonl", steps,
                     signals=[signal("trainable-changed", 1, frozen=["fc1"])])
    assert summary(path) == [("frozen-during-run", "warning", "fc1", 1)]


def test_a_trainable_module_never_called(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), modules=[*CHAIN, ("aux", "Linear", 10)])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("unused", "warning", "aux", None)
    assert f.evidence == {"submodules": 0, "trainable": 10}


def test_an_unused_subtree_is_one_finding(tmp_path: Path) -> None:
    modules = [*CHAIN, ("spare", "Sequential", 0), ("spare.0", "Linear", 5),
               ("spare.1", "ReLU", 0)]
    path = write_log(tmp_path / "log.jsonl", healthy(), modules=modules)
    (f,) = findings(path)
    assert (f.cause, f.module) == ("unused", "spare")
    assert f.evidence == {"submodules": 2, "trainable": 5}


@pytest.mark.parametrize(("extra", "want"), [
    ([("drop", "Dropout", 0)], [("unused", "note", "drop", None)]),
    ([("a", "ReLU", 0), ("b", "Dropout", 0)], [("unused", "note", "a", None)]),
    ([("id", "Sequential", 0)], []),  # an empty Sequential: an identity placeholder
    ([("blocks", "ModuleList", 0)], []),  # containers are never called
])
def test_unused_modules_without_parameters_are_a_note_or_nothing(
        tmp_path: Path, extra: list[tuple[str, str, int]],
        want: list[tuple[str, str, str, None]]) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), modules=[*CHAIN, *extra])
    assert summary(path) == want


def test_unused_is_not_judged_with_include_filters(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), modules=[*CHAIN, ("aux", "Linear", 10)],
                     head=header(include=["fc*"]))
    assert findings(path) == []


def test_a_module_used_through_its_parent_is_not_unused(tmp_path: Path) -> None:
    """Never called, but its parameters got a gradient (MultiheadAttention's out_proj)."""
    modules = [*CHAIN, ("fc2.out", "Linear", 6)]
    path = write_log(tmp_path / "log.jsonl", healthy(), modules=modules,
                     params={s: {"fc2.out": 0.3} for s in range(3)})
    assert findings(path) == []
