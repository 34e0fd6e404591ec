"""The names table a reader keeps (``LogNames``): each model's name, each module's class, where
each class's ``forward`` is, the models with parameters; the models that prepare data, with the
rule "none when no other model ran" stated once; and how fqns nest (``ancestors``)."""

from __future__ import annotations

from hooktrace.log import schema
from hooktrace.log.names import LogNames, ancestors


def _names() -> LogNames:
    """Model 0 prepares data (a transform, no parameters), model 1 has parameters, model 2
    (a loss called as a model) has none."""
    names = LogNames()
    for record in [
        schema.Model(model=0, name="prep", cls="Compose"),
        schema.Module(model=0, fqn="", cls="Compose"),
        schema.Module(model=0, fqn="0", cls="Normalize"),
        schema.Model(model=1, name="net", cls="Net"),
        schema.Module(model=1, fqn="", cls="Net"),
        schema.Module(model=1, fqn="fc", cls="Linear", params=10, trainable=10),
        schema.Model(model=2, name="criterion", cls="MSELoss"),
        schema.Module(model=2, fqn="", cls="MSELoss"),
        schema.Source(cls="Net", file="train.py", line=12),
        schema.Source(cls="Net", file="other.py", line=3),
    ]:
        names.take(record)
    return names


def test_the_table_holds_what_the_records_name() -> None:
    names = _names()
    assert names.models == {0: "prep", 1: "net", 2: "criterion"}
    assert names.classes[(0, "0")] == "Normalize"
    assert names.classes[(1, "fc")] == "Linear"
    assert names.sources == {"Net": "train.py:12"}  # the first source of a class
    assert names.with_params == {1}


def test_models_that_prepare_data_have_no_parameters_and_no_backward() -> None:
    names = _names()
    assert names.data_models({0, 1, 2}, reached={1, 2}) == {0}
    assert names.data_models({0, 1, 2}, reached={1}) == {0, 2}  # the loss: no backward seen
    assert names.data_models({0, 1, 2}, reached=set()) == {0, 2}  # one with parameters ran
    assert names.data_models([0, 0, 1], reached=set()) == {0}  # any iterable of models


def test_none_prepare_data_when_no_other_model_ran() -> None:
    names = _names()
    assert names.data_models({0, 2}, reached=set()) == set()
    assert names.data_models({0}, reached=set()) == set()
    assert names.data_models({0, 2}, reached={0}) == {2}
    assert names.data_models(set(), reached={1}) == set()


def test_ancestors_are_outermost_first() -> None:
    assert ancestors("a.b.c") == ["", "a", "a.b"]
    assert ancestors("") == []
