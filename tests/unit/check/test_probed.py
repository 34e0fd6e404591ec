"""Who may see whom (``run --probe``) on hand-built logs: the ``probe`` signals as findings.
Samples mixed by a reshape and masks that leak are warnings naming the module; what holds,
BatchNorm's mixing (unless the loss compares the samples of a batch with each other), every
sample seeing the whole batch and what the probe cannot decide are notes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .logbuild import findings, healthy, signal, write_log


def probe(name: str = "", **detail: Any) -> Any:
    return signal("probe", 0, name, **detail)


MIXED = {"what": "batch", "axis": 1, "samples": 8, "sample": 0, "sees": [1, 2, 3, 4],
         "count": 4, "mixers": []}
BN = {"what": "batch", "verdict": "all", "axis": 0, "samples": 16, "sample": 0,
      "sees": list(range(1, 9)), "count": 15, "mixers": ["fc1"]}
CONTRASTIVE = signal("loss-ops", 0, "", loss="NllLoss", ops=["LogSoftmax", "Div", "Mm"],
                     out="Div")
CLASSIFIER = signal("loss-ops", 0, "", loss="NllLoss", ops=["LogSoftmax"], out="Addmm")


def one(tmp_path: Path, *signals: Any) -> list[Any]:
    path = write_log(tmp_path / "log.jsonl", healthy(), signals=signals)
    return [f for f in findings(path) if f.cause in ("probe", "samples-mixed", "sees-later",
                                                       "sees-padding")]


@pytest.mark.parametrize(("signals", "severity", "module", "says"), [
    ((probe(**MIXED, verdict="some"),), "warning", "",
     "in model 'net' the output for sample 0 depends on 4 other samples (1, 2, 3, 4) of its "
     "batch of 8 (input axis 1) and not on the others"),
    ((probe(**MIXED, verdict="all"),), "note", "", "every sample sees the whole batch"),
    ((probe("fc1", **BN), CLASSIFIER), "note", "fc1",
     "the probe: fc1 (Linear) is a BatchNorm in train mode: it mixes the samples"),
    ((probe("fc1", **BN), CONTRASTIVE), "warning", "fc1",
     "(1, 2, 3, 4, 5, 6, 7, 8, ...) of its batch of 16 (input axis 0)), and the loss "
     "compares the model's outputs of one batch with each other"),
    ((probe(what="batch", verdict="apart", axis=0, samples=8),), "note", "",
     "depends on its own sample only (input axis 0, 8 samples)"),
    ((probe(what="undecided", why="its first input is not a tensor"),), "note", "",
     "could not tell who sees whom in model 'net': its first input is not a tensor"),
])
def test_samples(tmp_path: Path, signals: tuple[Any, ...], severity: str, module: str,
                 says: str) -> None:
    (f,) = one(tmp_path, *signals)
    assert (f.severity, f.module, f.step) == (severity, module, 0)
    assert says in f.message


CAUSAL = {"what": "causal", "positions": 6, "is_causal": False, "next_step": True}


def test_a_mask_that_lets_a_position_see_the_future(tmp_path: Path) -> None:
    (f,) = one(tmp_path, probe("fc1", **CAUSAL, masks={"attn_mask": "torch.triu(ones, 2)"},
                               verdict="leaks", position=0, sees=[1], count=1))
    assert (f.cause, f.severity, f.module) == ("sees-later", "warning", "fc1")
    assert f.message.startswith("fc1 (Linear): its attn_mask hides torch.triu(ones, 2), yet "
                                "its output at position 0 depends on 1 later position (1) of "
                                "its input: the mask lets position t see the future")


def test_no_mask_in_next_step_prediction(tmp_path: Path) -> None:
    (f,) = one(tmp_path, probe("fc1", **CAUSAL, masks={}, verdict="leaks", position=0,
                               sees=[1, 2, 3, 4, 5], count=5))
    assert f.severity == "warning"
    assert f.message.startswith("fc1 (Linear) is called without a causal mask in a model fed "
                                "x[:, :-1]")


def test_a_mask_that_holds(tmp_path: Path) -> None:
    (f,) = one(tmp_path, probe("fc1", **{**CAUSAL, "is_causal": True}, verdict="holds",
                               masks={"mask": "torch.triu(ones, 1)"}))
    assert (f.cause, f.severity) == ("probe", "note")
    assert "keeps each position from later ones (its mask hides torch.triu(ones, 1), " \
           "is_causal=True; measured)" in f.message


PADDING = {"what": "padding", "source": "padding_idx 0", "padded": 19, "positions": 48}


@pytest.mark.parametrize(("name", "detail", "severity", "says"), [
    ("", {"verdict": "leaks", "seen": 16, "masks": []}, "warning",
     "the output at real positions depends on 16 padded positions (19 of 48 positions padded "
     "(ids equal to the padding_idx 0 of the Embedding that reads them)): a mean or sum"),
    ("fc1", {"verdict": "leaks", "seen": 19, "masks": [
        {"module": "fc1", "arg": "key_padding_mask", "reads": "inverted", "hidden": 29}]},
     "warning", "fc1 (Linear): its key_padding_mask is inverted: True at the real positions"),
    ("fc1", {"verdict": "leaks", "seen": 3, "masks": [
        {"module": "fc1", "arg": "key_padding_mask", "reads": "other", "hidden": 4}]},
     "warning", "its key_padding_mask is hiding 4 positions, not the 19 padded ones"),
    ("", {"verdict": "holds", "seen": 0, "masks": [
        {"module": "fc1", "arg": "key_padding_mask", "reads": "same", "hidden": 19}]},
     "note", "the output at real positions depends on no padded position"),
])
def test_padding(tmp_path: Path, name: str, detail: dict[str, Any], severity: str,
                 says: str) -> None:
    (f,) = one(tmp_path, probe(name, **PADDING, **detail))
    assert (f.severity, f.module) == (severity, name)
    assert says in f.message
    if severity == "warning":
        assert f.cause == "sees-padding"
