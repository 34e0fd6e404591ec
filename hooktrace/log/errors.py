"""The project's error types, and the plain text of an error raised in a traced script.

A ``HooktraceError`` carries a one-line message and an exit code for the CLI. It and the log's
own errors live here; a subclass that belongs to one output lives beside the code that raises
it (``SelectionError``: no such step or model to show; ``DotMissingError``: Graphviz missing).
"""

from __future__ import annotations

import re


class HooktraceError(Exception):
    """Bad input or usage: shown as one line on stderr, exit status 2."""

    exit_code = 2


class LogError(HooktraceError):
    """A log file that cannot be read or written as a hooktrace log."""


class LogWriteError(LogError):
    """Writing the log failed while the program ran (disk full, file system gone)."""


class SchemaError(ValueError):
    """A record does not have the shape the schema defines (the reader makes it a ``LogError``
    naming the line)."""


class NonFiniteError(RuntimeError):
    """Raised into the traced program by ``--break-on nan`` when there is no terminal for pdb."""


_COLOUR = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # terminal escape sequences (ANSI CSI)


def plain(message: str) -> str:
    """An error message without terminal colour codes (some libraries colour theirs)."""
    return _COLOUR.sub("", message) if "\x1b" in message else message
