"""hooktrace: see what ran, in what order, with what shapes, and where the gradient stopped.

``trace`` imports torch; it is loaded on first use so that reading a log (render, check) works
without torch installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hooktrace.log.version import __version__

if TYPE_CHECKING:
    from hooktrace.tracing.api import Trace, trace

__all__ = ["Trace", "__version__", "trace"]


def __getattr__(name: str) -> Any:
    if name in ("trace", "Trace"):
        from hooktrace.tracing import api

        return getattr(api, name)
    raise AttributeError(f"module 'hooktrace' has no attribute {name!r}")
