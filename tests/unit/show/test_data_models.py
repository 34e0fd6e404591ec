"""The models that prepare data (torchvision transforms are modules: no parameters, no backward)
are one idea (``LogNames.data_models``) that check, the view page and a drawn step share, each
over its own scope: the whole log (check's notes, the view's models and rows) or the step drawn.
Where nothing else ran, none is left out."""

from __future__ import annotations

from pathlib import Path

from hooktrace.check.collect import collect
from hooktrace.log.reader import LogReader
from hooktrace.show.steplog import load_step
from hooktrace.show.view.data import gather
from unit.show.handlog import Builder, chain


def _prep(b: Builder, step: int) -> None:
    """A transform model's call: its module, then its root; no backward."""
    b.forward(step, "0", model=0)
    b.forward(step, "", model=0)


def _log(path: Path, train: bool) -> Path:
    b = Builder()
    b.model(0, "prep", "Compose", {"0": "Normalize"}, params=0)
    if train:
        b.model(1, "net", "Net", {"fc1": "Linear", "fc2": "Linear"})
    for step in range(2):
        _prep(b, step)
        if train:
            chain(b, step, ["fc1", "fc2"], model=1)
    return b.write(path)


def test_a_transform_beside_a_trained_model_prepares_data_in_every_reader(tmp_path: Path
                                                                         ) -> None:
    log = _log(tmp_path / "log.jsonl", train=True)
    assert collect(log).data_models() == {0}
    data = gather(LogReader(log))
    assert data.data_models() == {0}
    assert data.model_names() == ["net"]
    assert {model for model, _ in data.rows()} == {1}
    assert {e.model for e in load_step(log).events} == {1}
    assert {e.model for e in load_step(log, model="prep").events} == {0}  # asked for: drawn


def test_a_run_of_transforms_alone_has_none_that_prepare_data(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.jsonl", train=False)
    assert collect(log).data_models() == set()
    data = gather(LogReader(log))
    assert data.data_models() == set()
    assert data.model_names() == ["prep"]
    assert {e.model for e in load_step(log).events} == {0}
