"""Where the gradient dies, on hand-built logs: each boundary kind (no-grad, no-grad-under-no_grad,
dead-activation, zero-gradient, saturated, vanishing) beside a healthy look-alike that must stay
silent."""

from __future__ import annotations

from pathlib import Path

import pytest

from hooktrace.check.findings import Thresholds

from .logbuild import CHAIN, C, chain, findings, healthy, signal, summary, write_log

SIGMOID = [("", "Net", 0), ("fc1", "Linear", 40), ("act", "Sigmoid", 0), ("fc2", "Linear", 18)]
TEACHER = [("", "Teacher", 0), ("enc", "Linear", 30, 0)]


def test_healthy_chain_is_silent(tmp_path: Path) -> None:
    assert findings(write_log(tmp_path / "log.jsonl", healthy())) == []


def test_a_backward_that_never_arrives_is_a_detached_child(tmp_path: Path) -> None:
    """fc1 ran with gradients on and its backward never came: the gradient stops inside the
    root's forward, which is named, with fc1 as what it starves."""
    path = write_log(tmp_path / "log.jsonl", [chain(fc1=C("fc1", g_out=None))] * 3)
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("no-grad", "warning", "", 0)
    assert f.evidence["starved"] == ["fc1"]
    assert f.evidence["steps"] == [0, 1, 2]
    assert "the output of fc1 gets no gradient back" in f.message
    assert "--ops '*'" in f.evidence["rerun"]  # the log has no zoomed call to answer


def test_a_module_without_parameters_and_no_backward_is_healthy(tmp_path: Path) -> None:
    """act's backward never came (a functional op in its place ran backward), but act has no
    trainable parameters and fc1 before it got its gradient: nothing starves."""
    path = write_log(tmp_path / "log.jsonl", [chain(act=C("act", g_out=None))] * 3)
    assert findings(path) == []


def test_a_lost_input_names_the_module_that_lost_it(tmp_path: Path) -> None:
    steps = [chain(fc2=C("fc2", g_in=None, lost=[0]), act=C("act", g_out=None),
                   fc1=C("fc1", g_out=None))] * 3
    (f,) = findings(write_log(tmp_path / "log.jsonl", steps))
    assert (f.cause, f.module, f.step) == ("no-grad", "fc2", 0)
    assert f.message.startswith("fc2 (Linear): its input needed a gradient and none came back")
    assert f.evidence["starved"] == ["fc1"]


def test_no_input_gradient_without_lost_is_the_first_layer(tmp_path: Path) -> None:
    """fc1 passes nothing back (its input is the data, which needs no gradient): healthy."""
    steps = [chain(fc1=C("fc1", g_in=None, lost=None))] * 3
    assert findings(write_log(tmp_path / "log.jsonl", steps)) == []


def test_dead_relu(tmp_path: Path) -> None:
    steps = [chain(act=C("act", g_in=0.0), fc1=C("fc1", g_out=0.0, g_in=None))] * 3
    (f,) = findings(write_log(tmp_path / "log.jsonl", steps))
    assert (f.cause, f.severity, f.module, f.step) == ("dead-activation", "warning", "act", 0)
    assert f.evidence == {"starved": ["fc1"], "steps": [0, 1, 2], "grad_output_norm": 0.5,
                          "grad_input_norm": 0.0}


def test_a_relu_dead_in_one_early_step_only_is_a_note(tmp_path: Path) -> None:
    dead = chain(act=C("act", g_in=0.0), fc1=C("fc1", g_out=0.0, g_in=None))
    (f,) = findings(write_log(tmp_path / "log.jsonl", [dead, chain(), chain()]))
    assert (f.cause, f.severity, f.step) == ("dead-activation", "note", 0)
    assert "not in the 2 later steps" in f.message


def test_zero_weights_name_the_layer(tmp_path: Path) -> None:
    steps = [chain(fc2=C("fc2", g_in=0.0), act=C("act", g_out=0.0),
                   fc1=C("fc1", g_out=0.0, g_in=None))] * 3
    (f,) = findings(write_log(tmp_path / "log.jsonl", steps))
    assert (f.cause, f.severity, f.module, f.step) == ("zero-gradient", "warning", "fc2", 0)
    assert "its weights are zero" in f.message


def test_saturated_sigmoid(tmp_path: Path) -> None:
    steps = [chain(act=C("act", g_in=1e-9), fc1=C("fc1", g_out=1e-9, g_in=None))] * 3
    path = write_log(tmp_path / "log.jsonl", steps, modules=SIGMOID)
    assert summary(path) == [("saturated", "warning", "act", 0)]


def test_a_sigmoid_passing_back_a_usual_share_is_healthy(tmp_path: Path) -> None:
    steps = [chain(act=C("act", g_in=0.1), fc1=C("fc1", g_out=0.1, g_in=None))] * 3
    assert summary(write_log(tmp_path / "log.jsonl", steps, modules=SIGMOID)) == []


def test_a_sigmoid_before_bce_loss_cancels_the_exploding_gradient_it_gets(
        tmp_path: Path) -> None:
    """BCELoss's gradient divides by p (1 - p): where some predictions are confidently wrong
    the sigmoid receives 1e10 and passes back the logits' usual gradient (pytorch/examples'
    siamese network): nothing starves. A sigmoid passing back a vanishing gradient of an
    exploding one still does."""
    usable = [chain(act=C("act", g_out=1e10, g_in=0.05), fc1=C("fc1", g_out=0.05, g_in=None))]
    assert summary(write_log(tmp_path / "log.jsonl", usable * 3, modules=SIGMOID)) == []
    vanishing = [chain(act=C("act", g_out=1e10, g_in=1e-8),
                       fc1=C("fc1", g_out=1e-8, g_in=None))]
    path = write_log(tmp_path / "bad.jsonl", vanishing * 3, modules=SIGMOID)
    assert summary(path) == [("saturated", "warning", "act", 0)]


def test_small_gain_of_a_linear_is_vanishing_at_that_layer(tmp_path: Path) -> None:
    steps = [chain(fc2=C("fc2", g_in=1e-8), act=C("act", g_out=1e-8),
                   fc1=C("fc1", g_out=1e-8, g_in=None))] * 3
    (f,) = findings(write_log(tmp_path / "log.jsonl", steps))
    assert (f.cause, f.module) == ("vanishing", "fc2")
    assert "it passes back only 2.0e-08 of the gradient it receives" in f.message


@pytest.mark.parametrize(("gain", "want"), [
    (1e-6, [("vanishing", "warning", "fc2", 0)]),  # at the threshold: a boundary
    (1e-3, []),  # a gain far above it: a usual layer
])
def test_the_gain_threshold(tmp_path: Path, gain: float,
                            want: list[tuple[str, str, str, int]]) -> None:
    g = 0.5 * gain
    steps = [chain(fc2=C("fc2", g_in=g), act=C("act", g_out=g), fc1=C("fc1", g_out=g,
                                                                      g_in=None))] * 3
    assert summary(write_log(tmp_path / "log.jsonl", steps)) == want


def test_a_lower_gain_threshold_moves_the_boundary_inside_the_root(tmp_path: Path) -> None:
    steps = [chain(fc2=C("fc2", g_in=1e-8), act=C("act", g_out=1e-8),
                   fc1=C("fc1", g_out=1e-8, g_in=None))] * 3
    path = write_log(tmp_path / "log.jsonl", steps)
    assert summary(path, thresholds=Thresholds(gain=1e-9)) == [("saturated", "warning", "", 0)]


def test_a_child_under_no_grad_in_a_training_model(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [chain(fc1=C("fc1", no_grad=True))] * 3)
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module) == ("no-grad-under-no_grad", "warning", "")
    assert "torch.no_grad() covers fc1" in f.message


def test_a_validation_pass_under_no_grad_is_healthy(tmp_path: Path) -> None:
    """The whole model run again under no_grad after its training pass (an evaluation)."""
    again = [C(c.name, no_grad=True) for c in chain()]
    path = write_log(tmp_path / "log.jsonl", [chain() + again] * 3)
    assert findings(path) == []


def test_a_frozen_teacher_under_no_grad_is_a_note(tmp_path: Path) -> None:
    teacher = [C("enc", model=1, g_in=None, no_grad=True), C("", model=1, no_grad=True)]
    path = write_log(tmp_path / "log.jsonl", [teacher + chain()] * 3,
                     others=[("teacher", TEACHER)])
    assert [(f.cause, f.severity, f.model, f.module) for f in findings(path)] == [
        ("frozen", "note", "teacher", "enc")]


def test_a_model_an_optimizer_steps_that_no_backward_reaches(tmp_path: Path) -> None:
    student = [("", "Student", 0), ("enc", "Linear", 30)]
    held = signal("optimizers", model=1, held=["enc"], not_held=[])
    path = write_log(tmp_path / "log.jsonl",
                     [[C("enc", model=1, g_out=None), C("", model=1, g_out=None), *chain()]] * 3,
                     others=[("student", student)], signals=[held])
    got = [(f.cause, f.severity, f.model, f.module) for f in findings(path)]
    assert got[0] == ("never-reached", "error", "student", "")


def test_shared_module_called_twice_is_a_note_not_a_loss(tmp_path: Path) -> None:
    step = [C("fc1", g_in=None), C("act"), C("fc2"), C("act"), C("")]
    path = write_log(tmp_path / "log.jsonl", [step] * 3)
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module) == ("called-several-times", "note", "act")
    assert f.evidence == {"modules": {"act": 2}}


def test_flow_judges_only_the_steps_asked_for(tmp_path: Path) -> None:
    dead = chain(act=C("act", g_in=0.0), fc1=C("fc1", g_out=0.0, g_in=None))
    path = write_log(tmp_path / "log.jsonl", [chain(), dead, chain()], modules=CHAIN)
    assert summary(path, step=0) == []
    assert summary(path, step=1) == [("dead-activation", "warning", "act", 1)]


@pytest.mark.parametrize(("sources", "want"), [(True, "train.py:10 (Net.forward)"), (False, None)])
def test_a_torch_modules_finding_points_at_the_forward_around_it(tmp_path: Path, sources: bool,
                                                                 want: str | None) -> None:
    """act is torch's ReLU (no source of its own): the root's forward, which calls it, is where
    to look, where the log has it."""
    steps = [chain(act=C("act", g_in=0.0), fc1=C("fc1", g_out=0.0, g_in=None))] * 3
    (f,) = findings(write_log(tmp_path / "log.jsonl", steps, sources=sources))
    assert f.source == want


WRAPPED = [("", "Wrapper", 0), ("model", "Net", 0), ("model.fc1", "Linear", 40),
           ("model.act", "ReLU", 0), ("model.fc2", "Linear", 18)]


def _wrapped(no_grad: bool = False, eval_mode: bool = False) -> list[C]:
    """One pass of the model inside the wrapper, called through the wrapper (training) or
    alone under no_grad, or in eval mode with gradients on and no backward (validation)."""
    if no_grad or eval_mode:
        return [C(name, g_out=None, g_in=None, no_grad=no_grad, eval_mode=eval_mode)
                for name in ("model.fc1", "model.act", "model.fc2", "model")]
    return [C("model.fc1", g_in=None), C("model.act"), C("model.fc2"), C("model"), C("")]


def test_a_validation_pass_of_the_model_inside_its_wrapper_is_healthy(tmp_path: Path) -> None:
    """timm validates the model inside its wrapper under inference_mode when an epoch ends:
    those calls fall in the next step, before its training pass through the wrapper, which
    the log takes as their enclosing call (issue 38: 'torch.no_grad() covers model')."""
    steps = [_wrapped(), _wrapped(True) + _wrapped(True) + _wrapped(), _wrapped()]
    assert findings(write_log(tmp_path / "log.jsonl", steps, modules=WRAPPED)) == []


def test_a_training_pass_under_no_grad_beside_a_validation_pass_is_found(tmp_path: Path) -> None:
    """The look-alike that is a bug: fc1's training call under no_grad too, in a step with a
    validation pass: fc1 gets a gradient in no call of the step."""
    train = [C("model.fc1", no_grad=True), *_wrapped()[1:]]
    steps = [_wrapped(True) + train] * 3
    (f,) = findings(write_log(tmp_path / "log.jsonl", steps, modules=WRAPPED))
    assert (f.cause, f.severity, f.module) == ("no-grad-under-no_grad", "warning", "model")
    assert f.evidence["starved"] == ["model.fc1"]


def test_a_validation_pass_in_eval_mode_with_gradients_on_is_healthy(tmp_path: Path) -> None:
    """The same validation with gradients on, after model.eval() only: its calls get no
    backward; they ran in eval mode, and the model trained in another call of the step (issue
    38: 'the output of model, model (call 1) gets no gradient back')."""
    steps = [_wrapped(), _wrapped(eval_mode=True) * 2 + _wrapped(), _wrapped()]
    assert findings(write_log(tmp_path / "log.jsonl", steps, modules=WRAPPED)) == []


def test_a_pass_in_train_mode_without_backward_is_still_judged(tmp_path: Path) -> None:
    """The same calls in train mode: nothing says they are a validation pass."""
    steps = [_wrapped(), [C(c.name, g_out=None, g_in=None) for c in _wrapped(eval_mode=True)]
             + _wrapped(), _wrapped()]
    [f] = [f for f in findings(write_log(tmp_path / "log.jsonl", steps, modules=WRAPPED))
           if f.severity != "note"]
    assert (f.cause, f.severity, f.module, f.step) == ("no-grad", "warning", "", 1)


def test_an_unused_call_inside_a_forward_trained_in_eval_mode_is_found(tmp_path: Path) -> None:
    """A model trained in eval mode on purpose (frozen BatchNorm) whose forward calls fc1 twice
    and throws the first result away: that call, in eval mode with no backward, is inside a
    forward that trained, not a validation pass."""
    step = [C("fc1", g_out=None, g_in=None, eval_mode=True), C("fc1", g_in=None, eval_mode=True),
            C("act", eval_mode=True), C("fc2", eval_mode=True), C("", eval_mode=True)]
    [f] = [f for f in findings(write_log(tmp_path / "log.jsonl", [step] * 3))
           if f.severity != "note"]
    assert (f.cause, f.module, f.evidence["starved"]) == ("no-grad", "", ["fc1"])
    assert "gets no gradient back while another call of the same module does" in f.message
