"""An output file of ``render``, ``view`` and ``export``: its format (``choose_format``, one
chooser for the three), writing it whole (``whole``), never over the log it was read from
(``write_file``), and default names that never replace a file hooktrace did not write.

What hooktrace writes carries a mark it recognises, and a default name never replaces a file
without one (``-o`` names a file to replace on purpose). The mark: ``written by hooktrace`` in a
comment of the DOT text (its graph's ``comment``, which ``dot`` writes into the SVG as an XML
comment) and of the HTML page, in a ``tEXt`` chunk of a PNG; an export is recognised by its own
header row (``show/export.py``). A PDF cannot carry a mark without rewriting its offsets: an
existing one is never replaced by a default name.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from hooktrace.log.errors import HooktraceError

MARK = "written by hooktrace"  # the DOT graphs' ``comment``
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHUNK = b"tEXt" + b"Software\x00" + MARK.encode()
_HEAD_BYTES = 4096  # the marks sit at the start of a file


def choose_format(fmt: str | None, output: Path | None, formats: Sequence[str], default: str,
                  *, strict: bool = False) -> str:
    """The format to write: ``fmt``, else the extension of ``output`` where it is one of
    ``formats``, else ``default``. ``strict`` (``render``): any extension of ``output`` names
    the format, and one of ``formats`` other than ``fmt`` is an error."""
    suffix = output.suffix.lstrip(".").lower() if output else ""
    named = suffix if strict or suffix in formats else ""
    chosen = (fmt or named or default).lower()
    if chosen not in formats:
        raise HooktraceError(f"unknown format {chosen!r}; choose one of {', '.join(formats)}")
    if strict and fmt and suffix in formats and suffix != chosen:
        raise HooktraceError(f"the output {output} has the extension of {suffix}, not {chosen}")
    return chosen


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def refuse_log(path: Path, log: Path, what: str = "picture") -> None:
    """A one-line error where ``path`` is the log itself."""
    if _same_file(path, log):
        raise HooktraceError(f"refusing to write the {what} over the log {log}; "
                             "give another output path")


def refuse_dir(path: Path, what: str = "picture") -> None:
    if path.is_dir():
        raise HooktraceError(f"{path} is a directory; give a file name for the {what}")


@contextmanager
def whole(target: Path) -> Iterator[Path]:
    """A temporary file beside ``target`` for the block to write: it replaces ``target`` when
    the block ends, and is removed when the block fails. A failure to remove it (a read-only
    folder, where it was never made) never hides the error that stopped the block."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, target)
    finally:
        with suppress(OSError):
            temporary.unlink(missing_ok=True)


def cannot_write(path: Path, error: OSError) -> HooktraceError:
    """The one line of an output that could not be written."""
    return HooktraceError(f"cannot write {path}: {error.strerror or error}")


def write_file(path: Path, data: bytes, log: Path) -> None:
    """Write ``data`` to ``path`` whole or not at all; never over the log. A device or pipe
    (``/dev/stdout``) is written into, never replaced."""
    refuse_log(path, log)
    refuse_dir(path)
    target = path.resolve() if path.is_symlink() else path  # replace the file, not the link
    try:
        if path.exists() and not path.is_file():
            with path.open("wb") as f:
                f.write(data)
            return
        if not target.parent.exists():  # a file there is "not a directory", below
            target.parent.mkdir(parents=True)
        with whole(target) as temporary:
            temporary.write_bytes(data)
    except OSError as e:
        raise cannot_write(path, e) from None


def _png_text() -> bytes:
    data = _PNG_CHUNK[4:]
    return struct.pack(">I", len(data)) + _PNG_CHUNK + struct.pack(">I", zlib.crc32(_PNG_CHUNK))


def mark(data: bytes, fmt: str) -> bytes:
    """``data`` of format ``fmt`` with hooktrace's mark: the page and a PNG; DOT and SVG carry
    it from the DOT text, and a PDF cannot."""
    if fmt == "html":
        first, newline, rest = data.partition(b"\n")
        comment = f"<!-- {MARK} -->\n".encode()
        if first.lower().startswith(b"<!doctype") and newline:
            return first + newline + comment + rest  # the doctype stays first
        return comment + data
    if fmt == "png" and data.startswith(_PNG_SIGNATURE):
        ihdr_end = len(_PNG_SIGNATURE) + 8 + struct.unpack(">I", data[8:12])[0] + 4
        return data[:ihdr_end] + _png_text() + data[ihdr_end:]  # PNG wants IHDR first
    return data


def marked(head: bytes) -> bool:
    """Whether the start of a file holds hooktrace's mark."""
    return MARK.encode() in head


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(_HEAD_BYTES)
    except OSError:
        return b""


def default_output(path: Path, ours: Callable[[bytes], bool] = marked) -> Path:
    """``path``, a default output name, when writing there loses nothing: it is free, empty, or
    a file hooktrace wrote (``ours`` of its first bytes); else a one-line error naming ``-o``."""
    if not path.exists() or not path.is_file() or path.stat().st_size == 0:
        return path
    if ours(_head(path)):
        return path
    raise HooktraceError(f"{path} exists and hooktrace did not write it; not replacing it: "
                         f"-o {path} replaces it, or -o names another file")
