"""Files written by a default name: what hooktrace writes carries a mark it recognises, and a
default name never replaces a file without one (``-o`` names a file to replace on purpose).

The mark: ``written by hooktrace`` in a comment of the DOT text (its graph's ``comment``, which
``dot`` writes into the SVG as an XML comment) and of the HTML page, in a ``tEXt`` chunk of a
PNG; an export is recognised by its own header row (``show/export.py``). A PDF cannot carry a mark
without rewriting its offsets: an existing one is never replaced by a default name.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from pathlib import Path

from hooktrace.log.errors import HooktraceError

MARK = "written by hooktrace"  # the DOT graphs' ``comment``
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHUNK = b"tEXt" + b"Software\x00" + MARK.encode()
_HEAD_BYTES = 4096  # the marks sit at the start of a file


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
