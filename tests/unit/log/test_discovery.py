"""Log discovery: quoted globs expanded, the logs of several ranks opened in rank order and
checked to be one run, one rank's log picked."""

from __future__ import annotations

from pathlib import Path

import pytest

from hooktrace.log import schema
from hooktrace.log.discovery import expand, open_ranks, pick_rank
from hooktrace.log.errors import HooktraceError
from hooktrace.log.writer import LogWriter


def _log(path: Path, rank: int, world_size: int = 2, argv: tuple[str, ...] = ("t.py",)) -> Path:
    writer = LogWriter(path)
    writer.write(schema.Header(schema=schema.SCHEMA_VERSION, hooktrace="0.2.0", rank=rank,
                               world_size=world_size, argv=list(argv)))
    writer.write(schema.End(status="ok", events=0, steps=0))
    writer.close()
    return path


def test_expand_globs_in_order_without_duplicates(tmp_path: Path) -> None:
    b, a = _log(tmp_path / "run.rank1.jsonl", 1), _log(tmp_path / "run.rank0.jsonl", 0)
    assert expand([str(tmp_path / "run.rank*.jsonl"), a]) == [a, b]
    with pytest.raises(HooktraceError, match=r"no log matches .*nothing"):
        expand([str(tmp_path / "nothing*.jsonl")])


def test_open_ranks_sorts_by_rank_and_pick_rank_picks(tmp_path: Path) -> None:
    one, zero = _log(tmp_path / "b.jsonl", 1), _log(tmp_path / "a2.jsonl", 0)
    assert [r.path for r in open_ranks([one, zero])] == [zero, one]
    assert pick_rank([one, zero], None) == zero
    assert pick_rank([one, zero], 1) == one
    with pytest.raises(HooktraceError, match="no log of rank 5 among the logs given; their "
                                             "ranks: 0, 1"):
        pick_rank([one, zero], 5)


@pytest.mark.parametrize(("other", "problem"), [
    ({"rank": 0}, "two logs are rank 0"),
    ({"rank": 1, "world_size": 3}, r"world sizes differ \(\[2, 3\]\)"),
    ({"rank": 1, "argv": ("u.py",)}, "they ran different commands"),
])
def test_open_ranks_refuses_logs_of_other_runs(tmp_path: Path, other: dict[str, object],
                                               problem: str) -> None:
    zero = _log(tmp_path / "a.jsonl", 0)
    odd = _log(tmp_path / "b.jsonl", **other)  # type: ignore[arg-type]
    with pytest.raises(HooktraceError, match=f"not the ranks of one run: {problem}"):
        open_ranks([zero, odd])
