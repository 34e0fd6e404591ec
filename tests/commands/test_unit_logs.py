"""The logs the unit tier reads (tests/unit/logs/) are what ``hooktrace run`` writes today: each
is traced again, as ``tests/unit/logs/make.py`` traces it, and compared record by record with
the checked-in one, numbers aside (they follow the machine's kernels, and its clock). After a
change to what the tracer writes, ``python tests/unit/logs/make.py`` rewrites them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from helpers import Traced
from unit.logs.make import HERE, LOGS, constant_header


def masked(value: Any) -> Any:
    """The value with every float replaced by one mark."""
    if isinstance(value, float):
        return "#"
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    return value


def timed(record: Any) -> Any:
    """A ``call-times`` signal with its times masked: they follow the machine too (integers)."""
    if record.get("kind") == "call-times":
        record["detail"] = {k: v if k == "seq" else
                            [None if t is None else "#" for t in v] if isinstance(v, list)
                            else "#" for k, v in record["detail"].items()}
    return record


def records(data: bytes) -> list[Any]:
    return [masked(timed(orjson.loads(line))) for line in data.splitlines() if line]


@pytest.mark.parametrize("name", sorted(LOGS))
def test_checked_in_log_is_what_the_tracer_writes(traced: Traced, name: str) -> None:
    cwd, script, options, args = LOGS[name]
    log = traced(script, *args, options=options, cwd=cwd, status=1 if name == "crash" else 0)
    fresh = records(constant_header(log.read_bytes()))
    kept = records((HERE / f"{name}.jsonl").read_bytes())
    assert fresh[0] == kept[0], "the header differs"
    assert len(fresh) == len(kept), (len(fresh), len(kept))
    for number, (now, then) in enumerate(zip(fresh, kept, strict=True), 1):
        assert now == then, f"line {number} of {name}.jsonl: python tests/unit/logs/make.py {name}"


def test_every_log_has_its_recipe() -> None:
    assert {p.stem for p in HERE.glob("*.jsonl")} == set(LOGS)
