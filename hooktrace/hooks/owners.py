"""Where a module first seen lives, found from the calling frames: the owner whose tree holds
it (the outermost ``self`` that does), the holder whose variables reach it, the variable the
calling code has for it, and the place an unregistered one is kept in (a plain list or dict
attribute) or the attribute a forward registered it under. ``naming`` names modules by them.
Which code is the user's (``is_library``), and which module is a graph ``torch.compile`` made
(``compiled_graph``), are said here too."""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import torch
from torch import nn

_TRACER_DIRS = (str(Path(torch.__file__).parent), str(Path(__file__).parent.parent))  # and ours
# installed packages and the standard library (runpy, and "<frozen runpy>" when frozen)
_LIBRARY_DIRS = (*_TRACER_DIRS, "<frozen ", *sorted({
    sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}))
# where torch.compile's runtime calls the graphs it compiled
_COMPILE_DIRS = tuple(str(Path(_TRACER_DIRS[0]) / d) for d in ("_dynamo", "_functorch"))
_COMPILE_FRAMES = 64


_MODULE_ATTRS = frozenset(vars(nn.Module()))  # nn.Module's own: _modules, _parameters, ...
_PLACES_SCANNED = 1024  # items per list, tuple or dict attribute: a dataset kept on a model is not


def place(holder: nn.Module | None, module: nn.Module) -> str | None:
    """Where ``holder`` keeps an unregistered ``module``: ``blocks[0]`` for a plain list, tuple
    or dict attribute (keys without dots), None when it is in none (one built in forward)."""
    if holder is None:
        return None
    for key, value in vars(holder).items():
        if key in _MODULE_ATTRS:
            continue
        if isinstance(value, (list, tuple)) and len(value) <= _PLACES_SCANNED:
            for i, item in enumerate(value):
                if item is module:
                    return f"{key}[{i}]"
        elif isinstance(value, dict) and len(value) <= _PLACES_SCANNED:
            for k, item in value.items():
                if item is module and isinstance(k, (str, int)) and "." not in str(k):
                    return f"{key}[{k!r}]"
    return None


def registered(holder: nn.Module | None, module: nn.Module) -> str | None:
    """The attribute ``holder`` registers ``module`` under (``self.fc = nn.Linear(...)`` in its
    forward), None when it does not."""
    children = holder._modules.items() if holder is not None else ()
    return next((key for key, child in children if child is module), None)


def is_library(filename: str) -> bool:
    """Whether code in ``filename`` is torch's, hooktrace's, the standard library's or an
    installed package's, not the user's."""
    return filename.startswith(_LIBRARY_DIRS)


def _user_frames(skip: tuple[str, ...], limit: int = 4) -> Iterator[FrameType]:
    """The first ``limit`` calling frames whose file is in none of the directories ``skip``."""
    frame: FrameType | None = sys._getframe(1)
    found = 0
    while frame is not None and found < limit:
        if not frame.f_code.co_filename.startswith(skip):
            found += 1
            yield frame
        frame = frame.f_back


def caller_frame() -> FrameType | None:
    """The innermost calling frame outside torch and hooktrace: the code that called the module
    whose hook runs (its parent's ``forward``, a library's, or the script)."""
    return next(_user_frames(_TRACER_DIRS, 1), None)


def variable_name(module: nn.Module) -> str | None:
    """The name the calling code has for ``module`` (``generator``, ``self.teacher``), if any.

    The user's own frames are asked first: a LightningModule is ``model`` in the script, not
    ``pl_module`` in Lightning's loop; then the libraries' frames too (``self.model`` of a
    pipeline object). ``self`` is no name: a model inside its own ``encode`` is found further
    out, or in the globals of the file that defines it."""
    for skip in (_LIBRARY_DIRS, _TRACER_DIRS):
        for frame in _user_frames(skip):
            for scope in (frame.f_locals, frame.f_globals):
                for key, value in scope.items():
                    if value is module and not key.startswith("_") and key != "self":
                        return key
            holder = frame.f_locals.get("self")
            attrs = getattr(holder, "__dict__", None)
            if isinstance(attrs, dict):  # not an nn.Module's _modules: that one is the owner
                for key, value in attrs.items():
                    if value is module and not key.startswith("_"):
                        return f"self.{key}"
    return None


def _holds(candidate: nn.Module, module: nn.Module) -> bool:
    return candidate is module or any(m is module for m in candidate.modules())


def owner_of(module: nn.Module) -> nn.Module:
    """The outermost ``nn.Module`` that is ``self`` in a calling frame and whose tree holds
    ``module``; ``module`` itself when there is none (its own ``_call_impl`` frame is one)."""
    selves: list[nn.Module] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":  # f_locals only where it may pay
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, nn.Module) and all(candidate is not s for s in selves):
                selves.append(candidate)
        frame = frame.f_back
    for candidate in reversed(selves):  # outermost first
        if _holds(candidate, module):
            return candidate
    return module


def holder_of(module: nn.Module) -> nn.Module | None:
    """For a module the calling code reaches through an expression, not a variable of its own
    (``model.get_input_embeddings()(ids)``, ``self.model.encoder(x)`` in a plain class, a
    helper given ``vae``): the largest ``nn.Module`` its variables hold (locals, globals, a
    plain ``self``'s attributes) whose tree holds ``module``; None when there is none."""
    best: nn.Module | None = None
    size = 0
    for frame in _user_frames(_LIBRARY_DIRS):
        holder = frame.f_locals.get("self")
        attrs = getattr(holder, "__dict__", None) if not isinstance(holder, nn.Module) else None
        for scope in (frame.f_locals, frame.f_globals, attrs or {}):
            for value in scope.values():
                if isinstance(value, nn.Module) and value is not module and _holds(value, module):
                    n = sum(1 for _ in value.modules())
                    if n > size:
                        best, size = value, n
    return best


def compiled_graph(module: nn.Module) -> bool:
    """Whether ``module`` is a graph ``torch.compile`` made and its runtime calls (aot_eager's
    ``GraphModule``, which global module hooks see as a new top-level module in every step that
    runs compiled): part of the compiled code, not a model of the program's."""
    if not isinstance(module, torch.fx.GraphModule) or "torch._dynamo" not in sys.modules:
        return False
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_COMPILE_FRAMES):
        if frame is None:
            return False
        if frame.f_code.co_filename.startswith(_COMPILE_DIRS):
            return True
        frame = frame.f_back
    return False
