"""The log's kinds spelled once: each set of kinds is a namespace of constants in ``hooktrace/log/``
(``SignalKind``, ``AnomalyKind``, ``EndStatus``, ``DropUnit``) from which its record's tuple of
kinds is derived. That no literal of a kind stands outside its home is a rule of the package,
with the others in tests/project/test_one_home.py."""

from __future__ import annotations

from hooktrace.log import schema
from hooktrace.log.signals import Signal, SignalKind, kinds_of


def test_each_home_derives_its_kinds_from_its_constants() -> None:
    assert kinds_of(SignalKind) == Signal.KINDS
    assert kinds_of(schema.AnomalyKind) == schema.Anomaly.KINDS
    assert kinds_of(schema.EndStatus) == schema.END_STATUSES == ("ok", "error", "interrupted")
    assert kinds_of(schema.DropUnit) == schema.Module.DROP_UNITS == (
        "batch", "sample", "channel", "element")
