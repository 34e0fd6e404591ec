"""A run that records nothing never replaces a log with records: the writer writes beside it and
moves over it at its first record after the header."""

from __future__ import annotations

from pathlib import Path

from hooktrace.log import schema
from hooktrace.log.reader import has_records
from hooktrace.log.writer import LogWriter, rank_path
from tests.unit.log.test_logio import HEADER, HEADER_LINE, RECORDS, lines, write_log

END = schema.End(status="error", exit_code=2)


def test_a_run_that_records_nothing_keeps_the_previous_log(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, RECORDS)
    before = path.read_bytes()
    writer = LogWriter(path)
    writer.write(HEADER)
    writer.write(END)
    writer.close()
    assert writer.kept_previous
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["log.jsonl"]  # the empty log dropped


def test_the_new_log_takes_the_place_of_the_previous_at_its_first_record(tmp_path: Path) -> None:
    path = rank_path(tmp_path / "run.jsonl", 0, 2)
    write_log(path, RECORDS)
    before = path.read_bytes()
    writer = LogWriter(path)
    writer.write(HEADER)
    writer.flush()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.glob("run.rank*.jsonl")) == ["run.rank0.jsonl"]
    writer.write(RECORDS[0])
    writer.flush()  # killed now: this run's own partial log is in place
    assert path.read_bytes() == HEADER_LINE + lines(RECORDS[0])
    writer.write(END)
    writer.close()
    assert not writer.kept_previous
    assert path.read_bytes() == HEADER_LINE + lines(RECORDS[0], END)
    assert [p.name for p in tmp_path.iterdir()] == ["run.rank0.jsonl"]


def test_a_log_without_records_is_replaced_by_one_without(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, [schema.End(status="ok")])
    write_log(path, [END])
    assert path.read_bytes() == HEADER_LINE + lines(END)


def test_has_records(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    assert not has_records(path)  # no file
    write_log(path, [])
    assert not has_records(path)  # a header only
    write_log(path, [END])
    assert not has_records(path)
    write_log(path, RECORDS)
    assert has_records(path)
    path.write_bytes(b"model,fqn\n1,2\n")
    assert not has_records(path)  # not a log


def test_a_link_to_the_log_stays_a_link(tmp_path: Path) -> None:
    real, link = tmp_path / "real.jsonl", tmp_path / "log.jsonl"
    write_log(real, RECORDS)
    link.symlink_to(real)
    write_log(link, [RECORDS[0]])
    assert link.is_symlink() and real.read_bytes() == HEADER_LINE + lines(RECORDS[0])
