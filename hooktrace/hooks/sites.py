"""Where code is: the file and line of a class's ``forward``, and of an error raised into the
script (with the module whose call raised it). Paths under the working directory are relative."""

from __future__ import annotations

import inspect
import linecache
import os
from types import TracebackType

from torch import nn
from torch.nn.modules import module as nn_module

from hooktrace.hooks.owners import is_library

_CALL_FILE = nn_module.__file__


def shown(path: str) -> str:
    """``path`` relative to the working directory when under it."""
    here = os.getcwd()
    return os.path.relpath(path, here) if path.startswith(here + os.sep) else path


def forward_site(cls: type) -> tuple[str, int] | None:
    """Where ``cls`` defines ``forward``; None for torch's own classes and compiled code."""
    forward = getattr(cls, "forward", None)
    code = getattr(forward, "__code__", None)
    if code is None or cls.__module__.startswith("torch."):
        return None
    path = inspect.getsourcefile(forward) or code.co_filename  # type: ignore[arg-type]
    return shown(path), code.co_firstlineno


def error_site(error: BaseException) -> tuple[nn.Module | None, str | None, int | None]:
    """The innermost module whose call the error came out of (None: raised outside any module
    call, ``loss.backward()`` for one), and the innermost line of the user's code it passed."""
    module: nn.Module | None = None
    path: str | None = None
    line: int | None = None
    tb: TracebackType | None = error.__traceback__
    while tb is not None:  # outermost frame first
        code = tb.tb_frame.f_code
        if code.co_name == "_call_impl" and code.co_filename == _CALL_FILE:
            called = tb.tb_frame.f_locals.get("self")
            if isinstance(called, nn.Module):
                module = called
        elif not is_library(code.co_filename):
            path, line = shown(code.co_filename), tb.tb_lineno
        tb = tb.tb_next
    return module, path, line


def source_line(error: BaseException, line: int | None) -> str:
    """The text of the user's line ``error_site`` found (``line``), stripped; "" if unread."""
    tb: TracebackType | None = error.__traceback__
    found = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if tb.tb_lineno == line and not is_library(code.co_filename):
            found = linecache.getline(code.co_filename, tb.tb_lineno).strip()
        tb = tb.tb_next
    return found[:200]
