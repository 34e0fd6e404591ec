"""The first NaN/Inf of a run on hand-built logs: in a forward output, in a gradient produced or
received, in a watched step's anomaly record; skipped steps of a loss scaler as a note; and
finite look-alikes that stay silent."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from hooktrace.log import schema

from .logbuild import NAN, C, chain, findings, healthy, summary, write_log

NF = [[0, 5, 0]]  # output 0: 5 NaN, 0 Inf


def nan_backward() -> list[C]:
    """fc2's backward turns a finite gradient into NaN: it and fc1 receive NaN after it."""
    return chain(fc2=C("fc2", g_in=NAN), act=C("act", g_out=NAN),
                 fc1=C("fc1", g_out=NAN, g_in=None))


def test_nan_in_one_forward_output_names_that_module(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [chain(), chain(act=C("act", nonfinite=NF)),
                                              chain()])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("nonfinite-forward", "error", "act", 1)
    assert f.evidence["outputs"] == [{"index": 0, "shape": [4, 8], "dtype": "float32",
                                      "nan": 5, "inf": 0}]
    assert f.message == "first NaN/Inf in a forward output: act (ReLU) at step 1"


def test_the_first_in_forward_order_is_named_and_later_steps_listed(tmp_path: Path) -> None:
    """NaN in fc2 and the root too (they follow from act's): act is the first."""
    bad = chain(act=C("act", nonfinite=NF), fc2=C("fc2", nonfinite=NF),
                root=C("", nonfinite=NF))
    path = write_log(tmp_path / "log.jsonl", [chain(), bad, bad, bad])
    (f,) = findings(path)
    assert (f.module, f.step) == ("act", 1)
    assert "(again in steps 2, 3)" in f.message


def test_an_earlier_step_wins_over_an_earlier_module(tmp_path: Path) -> None:
    steps = [chain(), chain(fc2=C("fc2", nonfinite=NF)), chain(fc1=C("fc1", nonfinite=NF))]
    assert summary(write_log(tmp_path / "log.jsonl", steps)) == [
        ("nonfinite-forward", "error", "fc2", 1)]


def test_inf_only_is_nonfinite_too(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [chain(fc1=C("fc1", g_in=None,
                                                          nonfinite=[[0, 0, 3]]))])
    (f,) = findings(path)
    assert f.evidence["outputs"][0]["inf"] == 3 and f.evidence["outputs"][0]["nan"] == 0


def test_finite_outputs_with_large_gradients_are_not_nonfinite(tmp_path: Path) -> None:
    steps = [chain(fc2=C("fc2", g_out=1e30, g_in=1e30), act=C("act", g_out=1e30),
                   fc1=C("fc1", g_out=1e30, g_in=None), root=C("", g_out=1e30))] * 2
    kinds = [f.cause for f in findings(write_log(tmp_path / "log.jsonl", steps))]
    assert not any(k.startswith("nonfinite") for k in kinds)


def test_nan_gradient_produced_in_the_last_step_is_an_error(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [chain(), chain(), nan_backward()],
                     params={2: {"fc1": NAN, "fc2": 0.5}})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("nonfinite-backward", "error", "fc2", 2)
    assert f.evidence["produced"] is True
    assert f.evidence["grad_input"] == [{"index": 0, "nan": 32, "inf": 0}]
    assert f.message == "first NaN/Inf gradient produced by fc2 (Linear) at step 2"


def test_nan_gradients_followed_by_finite_steps_are_a_scalers_skip(tmp_path: Path) -> None:
    """The look-alike: NaN gradients in one step, every forward finite, finite gradients after
    (a GradScaler skipping an overflowed step): a note."""
    path = write_log(tmp_path / "log.jsonl", [chain(), nan_backward(), chain()],
                     params={1: {"fc1": NAN, "fc2": 0.5}})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("nonfinite-backward", "note", "fc2", 1)
    assert f.evidence["steps"] == [1]


def test_backward_nan_after_a_forward_nan_follows_it(tmp_path: Path) -> None:
    bad = chain(act=C("act", g_out=NAN, nonfinite=NF), fc2=C("fc2", nonfinite=NF, g_out=NAN),
                fc1=C("fc1", g_out=NAN, g_in=None), root=C("", g_out=NAN, nonfinite=NF))
    forward, backward = findings(write_log(tmp_path / "log.jsonl", [chain(), bad]))
    assert (forward.cause, forward.module) == ("nonfinite-forward", "act")
    assert (backward.cause, backward.module, backward.step) == ("nonfinite-backward", "", 1)
    assert backward.evidence["follows"] == "nonfinite-forward"
    assert backward.evidence["produced"] is False
    assert backward.message.endswith("(follows from the forward NaN/Inf)")


def test_a_nan_parameter_norm_alone_is_a_gradient_produced(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(), params={2: {"fc1": math.inf}})
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("nonfinite-backward", "error", "fc1", 2)
    assert f.evidence["produced"] is True
    assert f.evidence["parameter_grad_norm"] == "inf"
    assert "--ops fc1 --ops 'fc1.*' train.py" in f.evidence["rerun"]


def anomaly(step: int, name: str, kind: str, **detail: object) -> schema.Anomaly:
    return schema.Anomaly(step=step, model=0, fqn=name, kind=kind, detail=dict(detail))


def test_nan_in_a_watched_step(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(2), end_steps=50, extra=[
        anomaly(40, "act", "nonfinite-forward", outputs=[{"index": 0, "nan": 3, "inf": 0}]),
        anomaly(40, "", "nonfinite-backward", produced=False)])
    assert summary(path) == [("nonfinite-forward", "error", "act", 40),
                             ("nonfinite-backward", "error", "", 40)]


def test_a_recorded_nan_comes_before_a_later_watched_one(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [chain(), chain(fc2=C("fc2", nonfinite=NF))],
                     end_steps=50, extra=[anomaly(40, "act", "nonfinite-forward")])
    (f,) = findings(path)
    assert (f.module, f.step) == ("fc2", 1)
    assert "(again in step 40)" in f.message


def test_lost_gradient_in_a_watched_step(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", healthy(2), end_steps=50, extra=[
        anomaly(40, "fc1", "no-grad"), anomaly(41, "fc1", "no-grad")])
    (f,) = findings(path)
    assert (f.cause, f.severity, f.module, f.step) == ("no-grad", "warning", "fc1", 40)
    assert f.evidence == {"steps": [40, 41]}
    assert "then none from step 40 on" in f.message


@pytest.mark.parametrize("weights", [["weight"], None])
def test_nan_weights_at_the_first_step_say_where_they_came_from(tmp_path: Path,
                                                                weights: list[str] | None
                                                                ) -> None:
    detail: dict[str, Any] = {"outputs": [{"index": 0, "nan": 4, "inf": 0}]}
    if weights:
        detail |= {"weights": weights, "weights_dtypes": ["float32"]}
    path = write_log(tmp_path / "log.jsonl", [], end_steps=5,
                     extra=[schema.Anomaly(step=3, model=0, fqn="fc1",
                                           kind="nonfinite-forward", detail=detail)])
    (f,) = findings(path)
    assert f.cause == "nonfinite-forward"
    assert ("its own weights (weight) already held NaN/Inf" in f.message) == bool(weights)


# -- a NaN made in a module's own functional code is that module's (issue 36, item 6) --------

VAE = [("", "VAE", 0), ("enc", "Linear", 40), ("dec", "Sequential", 0), ("dec.0", "Linear", 18)]


def vae_step(nan_at: str = "dec.0") -> list[C]:
    """enc, then dec.0 inside dec, then the root; NaN from ``nan_at`` on (its outputs only,
    the later calls' follow)."""
    names = ["enc", "dec.0", "dec", ""]
    bad = names[names.index(nan_at):]
    return [C(name, nonfinite=NF if name in bad else None, g_in=None if name == "enc" else "same")
            for name in names]


def inputs_signal(name: str = "dec.0") -> schema.Signal:
    return schema.Signal(0, 0, name, "nonfinite-inputs", {"inputs": [[0, 12, 0]]})


def test_a_nan_received_is_the_forward_around_it_that_made_it(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [vae_step()], modules=VAE,
                     signals=[inputs_signal()])
    (f, *_) = findings(path)
    assert (f.cause, f.module) == ("nonfinite-forward", "")
    assert f.message == (
        "first NaN/Inf in a forward output: dec.0 (Linear) at step 0, whose input already held "
        "NaN/Inf: made in the forward of (root) (VAE), by its own code after enc returned and "
        "before dec.0 was called (or in the forward of dec before it calls dec.0)")
    assert f.evidence["received_by"] == "dec.0" and f.evidence["after"] == "enc"


def test_a_nan_the_module_made_itself_stays_its_own(tmp_path: Path) -> None:
    """No ``nonfinite-inputs``: its inputs were finite."""
    path = write_log(tmp_path / "log.jsonl", [vae_step()], modules=VAE)
    (f, *_) = findings(path)
    assert (f.module, f.message) == (
        "dec.0", "first NaN/Inf in a forward output: dec.0 (Linear) at step 0")


def test_a_nan_in_the_data_is_said_to_come_with_it(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [vae_step("enc")], modules=VAE,
                     signals=[inputs_signal("enc")])
    (f, *_) = findings(path)
    assert f.module == "enc" and "it came with the data" in f.message
