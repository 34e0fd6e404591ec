"""An output file of ``render``, ``view`` and ``export``: its format (``choose_format``, one
chooser for the three), and writing it whole (``whole``), never over the log it was read
from (``write_file``). Default names that never replace a file hooktrace did not write:
``show/owned.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from hooktrace.log.errors import HooktraceError


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
