"""Where code is: the file and line of a class's ``forward``, and of an error raised into the
script (with the module whose call raised it). Paths under the working directory are relative."""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import sysconfig
from pathlib import Path
from types import TracebackType

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from hooktrace.hooks.owners import is_library

_CALL_FILE = nn_module.__file__
OURS = str(Path(__file__).parent.parent)  # hooktrace's own code: its operations are not the user's
TORCH = str(Path(torch.__file__).parent)
#: where no user code is: torch and the standard library
NOT_USERS = (TORCH, "<frozen ", *sorted({
    sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}))


def shown(path: str) -> str:
    """``path`` relative to the working directory when under it."""
    here = os.getcwd()
    return os.path.relpath(path, here) if path.startswith(here + os.sep) else path


def forward_site(cls: type) -> tuple[str, int] | None:
    """Where ``cls`` defines ``forward`` (its ``def`` line); None for torch's own classes and
    compiled code. A decorated ``forward`` (``@torch.autocast(...)``, transformers'
    ``@can_return_tuple``) is the user's function the decorators wrap, not the decorator's."""
    forward = getattr(cls, "forward", None)
    if forward is None or cls.__module__.startswith("torch."):
        return None
    with contextlib.suppress(ValueError):  # a cycle of __wrapped__: take it as it is
        forward = inspect.unwrap(forward)
    code = getattr(forward, "__code__", None)
    if code is None:
        return None
    path = inspect.getsourcefile(forward) or code.co_filename
    return shown(path), _def_line(code.co_filename, code.co_firstlineno)


def _def_line(path: str, first: int) -> int:
    """The ``def`` line of a function whose code starts at ``first``: a decorated function's
    code starts at its first decorator."""
    for line in range(first, first + 32):  # decorators span a few lines
        text = linecache.getline(path, line).lstrip()
        if text.startswith(("def ", "async def ")):
            return line
        if not text:  # past the end of the file, or source not readable
            break
    return first


def error_site(error: BaseException
               ) -> tuple[nn.Module | None, str | None, int | None, str]:
    """The innermost module whose call the error came out of (None: raised outside any module
    call, ``loss.backward()`` for one), and the innermost line of the user's code it passed:
    its file, number and text (stripped; "" if unread)."""
    module: nn.Module | None = None
    path: str | None = None
    line: int | None = None
    text = ""
    tb: TracebackType | None = error.__traceback__
    while tb is not None:  # outermost frame first
        code = tb.tb_frame.f_code
        if code.co_name == "_call_impl" and code.co_filename == _CALL_FILE:
            called = tb.tb_frame.f_locals.get("self")
            if isinstance(called, nn.Module):
                module = called
        elif not is_library(code.co_filename):
            path, line = shown(code.co_filename), tb.tb_lineno
            text = linecache.getline(code.co_filename, line).strip()[:200]
        tb = tb.tb_next
    return module, path, line, text
