"""A default output name never replaces a file hooktrace did not write: ``render``, ``view`` and
``export`` refuse in one line naming ``-o`` (before anything is drawn), write over their own
files, and ``-o`` replaces what it names. The marks that say a file is hooktrace's."""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hooktrace.cli import cli
from hooktrace.show.output import mark, marked
from unit.logs import LOGS

MINE = b"mine, by hand\n"


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "a.jsonl"
    shutil.copyfile(LOGS / "mnist.jsonl", path)
    return path


def hooktrace(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, list(map(str, args)))


def refused(result: Result, path: Path) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"hooktrace: error: {path} exists and hooktrace did not write it; "
                             f"not replacing it: -o {path} replaces it, or -o names another "
                             "file\n")
    assert path.read_bytes() == MINE


@pytest.mark.parametrize(("command", "name"), [
    (["render"], "a.svg"),  # refused before dot is run: no dot needed
    (["render", "--format", "dot"], "a.dot"),
    (["render", "--format", "png"], "a.png"),
    (["render", "--format", "pdf"], "a.pdf"),  # a pdf carries no mark: never replaced
    (["view"], "a.html"),
    (["view", "--format", "png"], "a.heatmap.png"),
    (["export"], "a.csv"),
])
def test_a_default_name_never_replaces_a_users_file(log: Path, command: list[str],
                                                    name: str) -> None:
    path = log.with_name(name)
    path.write_bytes(MINE)
    refused(hooktrace(command[0], log, *command[1:]), path)


def test_export_writes_over_its_own_and_o_replaces(log: Path) -> None:
    csv = log.with_suffix(".csv")
    for _ in range(2):
        result = hooktrace("export", log)
        assert result.exit_code == 0, result.output
    rows = csv.read_bytes()
    csv.write_bytes(MINE)
    assert hooktrace("export", log, "-o", csv).exit_code == 0  # -o: the old rule
    assert csv.read_bytes() == rows
    other = log.rename(log.with_name("b.log"))
    for _ in range(2):  # jsonl: recognised by its first row's columns
        result = hooktrace("export", other, "--format", "jsonl")
        assert result.exit_code == 0, result.output
    jsonl = other.with_suffix(".jsonl")
    jsonl.write_bytes(b'{"rank":0,"seq":1}\n')
    refused_jsonl = hooktrace("export", other, "--format", "jsonl")
    assert refused_jsonl.exit_code == 2 and jsonl.read_bytes() == b'{"rank":0,"seq":1}\n'


def test_render_writes_over_its_own_dot_and_o_replaces(log: Path) -> None:
    dot = log.with_suffix(".dot")
    for _ in range(2):
        result = hooktrace("render", log, "--format", "dot")
        assert result.exit_code == 0, result.output
    text = dot.read_bytes()
    assert b'comment="written by hooktrace"' in text.splitlines()[1]
    dot.write_bytes(MINE)
    assert hooktrace("render", log, "-o", dot).exit_code == 0
    assert dot.read_bytes() == text


def test_an_empty_file_loses_nothing(log: Path) -> None:
    csv = log.with_suffix(".csv")
    csv.touch()
    assert hooktrace("export", log).exit_code == 0
    assert csv.read_bytes().startswith(b"rank,seq,step,phase,model,")


def _chunks(png: bytes) -> list[bytes]:
    """The chunk types of a PNG, each one's CRC checked."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    found, i = [], 8
    while i < len(png):
        size = struct.unpack(">I", png[i:i + 4])[0]
        body = png[i + 4:i + 8 + size]
        assert struct.unpack(">I", png[i + 8 + size:i + 12 + size])[0] == zlib.crc32(body)
        found.append(body[:4])
        i += 12 + size
    return found


def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    pixel = zlib.compress(b"\x00\x00\x00\x00")
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", pixel) + chunk(b"IEND", b""))


def test_the_marks() -> None:
    png = mark(_png(), "png")
    assert _chunks(png) == [b"IHDR", b"tEXt", b"IDAT", b"IEND"] and marked(png)
    assert not marked(_png())
    page = mark(b"<!DOCTYPE html>\n<html></html>", "html")
    assert page.startswith(b"<!DOCTYPE html>\n<!-- written by hooktrace -->\n") and marked(page)
    assert mark(b"%PDF-1.5\n", "pdf") == b"%PDF-1.5\n"
    assert mark(b"digraph {}\n", "dot") == b"digraph {}\n"  # the DOT text carries its own
